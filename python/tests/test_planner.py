"""datafusion_sets' query planner in datafusion-python (``dfs.extension()``,
``dfs.session_context(planner=True)``): SQL and DataFrame joins on a similarity are planned
as similarity joins, the backend rule binds the list functions, the rest of DataFusion still
works, and what does not (writing files) fails with the documented error."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datafusion import SessionContext, col, lit, udf

import datafusion_sets as dfs

SETS = {i: sorted({i % 7, i % 11, 20 + i % 3, 30 + i % 5}) for i in range(1, 301)}
JOIN = "SELECT r.id, u.id FROM {t} r JOIN {t} u ON r.id < u.id AND jaccard(r.tokens, u.tokens) >= 0.6"


def rows(ctx, sql):
    table = ctx.sql(sql).to_arrow_table()
    return list(zip(*(c.to_pylist() for c in table.columns)))


def plan(ctx, sql):
    return "\n".join(str(r[1]) for r in rows(ctx, "EXPLAIN " + sql))


def by_hand(t):
    ids = sorted(SETS)
    return {
        (i, j)
        for x, i in enumerate(ids)
        for j in ids[x + 1 :]
        if len(set(SETS[i]) & set(SETS[j])) / len(set(SETS[i]) | set(SETS[j])) >= t
    }


def sessions(tmp_path):
    """A session with our planner and one without, each with `s` in memory and `f` a
    Parquet file of the same rows (two files, several row groups)."""
    (tmp_path / "f").mkdir(exist_ok=True)
    ids, tokens = list(SETS), list(SETS.values())
    for part in range(2):
        half = slice(part * 150, (part + 1) * 150)
        pq.write_table(pa.table({"id": ids[half], "tokens": tokens[half]}), tmp_path / "f" / f"{part}.parquet", row_group_size=40)
    out = []
    for planner in (True, False):
        ctx = dfs.session_context(planner=planner)
        ctx.register_record_batches("s", [[pa.record_batch({"id": ids, "tokens": tokens})]])
        ctx.sql(f"CREATE EXTERNAL TABLE f STORED AS PARQUET LOCATION '{tmp_path / 'f'}/'").collect()
        out.append(ctx)
    return out


def test_sql_join_is_planned_as_a_similarity_join(tmp_path):
    planned, host = sessions(tmp_path)
    want = by_hand(0.6)
    assert len(want) > 100
    for t in ("s", "f"):
        assert set(rows(planned, JOIN.format(t=t))) == want
        # (Over the file, a self join: the two scans are the same plan.)
        mode = "self" if t == "f" else "r-s"
        assert f"SimilarityJoinExec: mode={mode}, function=jaccard, threshold=>= 0.6" in plan(planned, JOIN.format(t=t))
        # Without our planner the host plans a nested loop join (same pairs).
        assert "NestedLoopJoinExec" in plan(host, JOIN.format(t=t))
        assert set(rows(host, JOIN.format(t=t))) == want
    # In-memory against file, both sides by reference and by file.
    mixed = "SELECT r.id, u.id FROM s r JOIN f u ON r.id < u.id AND jaccard(r.tokens, u.tokens) >= 0.6"
    assert set(rows(planned, mixed)) == want
    # EXPLAIN ANALYZE: the join ran on our side, sealed from the host, with its metrics.
    analyzed = plan(planned, "ANALYZE " + JOIN.format(t="f"))
    assert "SealedExec: SimilarityJoinExec" in analyzed and "candidates=" in analyzed
    # The option turns the rewrite off through the host's SET.
    planned.sql("SET sets.similarity_join_rewrite = false").collect()
    assert "NestedLoopJoinExec" in plan(planned, JOIN.format(t="s"))
    assert set(rows(planned, JOIN.format(t="s"))) == want


def test_thresholds_reached_exactly_and_other_measures(tmp_path):
    planned, host = sessions(tmp_path)
    for f, t in (("jaccard", 0.5), ("dice", 0.75), ("cosine", 0.75), ("overlap", 3)):
        for op in (">=", ">"):
            q = f"SELECT r.id, u.id FROM s r JOIN s u ON r.id < u.id AND {f}(r.tokens, u.tokens) {op} {t} ORDER BY 1, 2"
            got = rows(planned, q)
            assert got == rows(host, q)
            assert f"function={f}" in plan(planned, q)
    assert len(rows(planned, "SELECT r.id FROM s r JOIN s u ON r.id < u.id AND jaccard(r.tokens, u.tokens) >= 0.5")) > len(
        rows(planned, "SELECT r.id FROM s r JOIN s u ON r.id < u.id AND jaccard(r.tokens, u.tokens) > 0.5")
    )


def test_dataframe_join_is_planned_as_a_similarity_join(tmp_path):
    planned, _ = sessions(tmp_path)
    left = planned.table("s").select(col("id").alias("a"), col("tokens").alias("ta"))
    right = planned.table("f").select(col("id").alias("b"), col("tokens").alias("tb"))
    joined = left.join_on(right, dfs.jaccard(col("ta"), col("tb")) >= lit(0.6), col("a") < col("b"), how="inner")
    got = joined.select(col("a"), col("b")).to_arrow_table()
    assert set(zip(got["a"].to_pylist(), got["b"].to_pylist())) == by_hand(0.6)
    assert "SealedExec: SimilarityJoinExec" in joined.execution_plan().display_indent()


def test_backend_rule_binds_the_list_functions(tmp_path):
    planned, host = sessions(tmp_path)
    q = "SELECT id, list_intersect(tokens, [1, 2, 3, 20]) AS i, jaccard(tokens, [1, 2, 3, 20]) AS j FROM s ORDER BY id"
    assert rows(planned, q) == rows(host, q)
    assert "SetsBackendExec" in plan(planned, q)
    assert "SetsBackendExec" not in plan(host, q)


def test_the_rest_of_datafusion_still_works(tmp_path):
    planned, host = sessions(tmp_path)
    double = udf(lambda a: pa.compute.multiply(a, 2), [pa.int64()], pa.int64(), "immutable", name="double")
    for ctx in (planned, host):
        ctx.register_udf(double)
        ctx.sql("CREATE TABLE m (x BIGINT)").collect()
        ctx.sql("INSERT INTO m VALUES (1), (2), (3)").collect()
    queries = [
        "SELECT double(x) AS d FROM m ORDER BY d",
        "SELECT count(*), sum(cardinality(tokens)) FROM f",
        "SELECT id % 5 AS g, count(*) AS n FROM s GROUP BY 1 ORDER BY 1",
        "SELECT s.id FROM s JOIN f ON s.id = f.id WHERE s.id < 4 ORDER BY 1",
        "SELECT * FROM (VALUES (1), (2)) AS v(x) UNION ALL SELECT x FROM m ORDER BY 1",
        "SELECT left_id, right_id FROM similarity_join('s', 'id', 'tokens', 'jaccard', 0.6) ORDER BY 1, 2",
    ]
    for q in queries:
        assert rows(planned, q) == rows(host, q), q
    # Python UDFs and the DataFrame API.
    assert planned.table("m").select(double(col("x"))).to_pydict() == host.table("m").select(double(col("x"))).to_pydict()


def test_writing_files_fails_with_the_documented_error(tmp_path):
    """datafusion-ffi 55 cannot hand a file format to a foreign planner: a session with ours
    cannot write files (docs/python.md says so, and to write from a session without it)."""
    planned, host = sessions(tmp_path)
    copy = f"COPY (SELECT id FROM s) TO '{tmp_path / 'out.parquet'}' STORED AS PARQUET"
    with pytest.raises(Exception, match="decode_file_format"):
        planned.sql(copy).collect()
    host.sql(copy).collect()
    assert pq.read_table(tmp_path / "out.parquet").num_rows == len(SETS)


def test_extension_installs_into_a_context_built_elsewhere(tmp_path):
    ctx = dfs.register(SessionContext(dfs.with_sets_options()).with_extensions(dfs.extension()))
    ctx.register_record_batches("s", [[pa.record_batch({"id": list(SETS), "tokens": list(SETS.values())})]])
    assert set(rows(ctx, JOIN.format(t="s"))) == by_hand(0.6)
    assert "SimilarityJoinExec" in plan(ctx, JOIN.format(t="s"))
