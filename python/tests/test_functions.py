"""datafusion_sets in datafusion-python: each function's answers on cases of the SQL suites
(sql-tests/*.slt), NULLs, errors, options, and the DataFrame API."""

import pyarrow as pa
import pytest
from datafusion import SessionContext, col, lit

import datafusion_sets as dfs


@pytest.fixture(params=[False, True], ids=["host-planner", "sets-planner"])
def ctx(request):
    """A session planned by the host's planner, and one planned by ours
    (``dfs.extension()``): the functions answer alike in both."""
    return dfs.session_context(planner=request.param)


def rows(ctx, sql):
    """The query's rows as tuples."""
    table = ctx.sql(sql).to_arrow_table()
    return list(zip(*(c.to_pylist() for c in table.columns)))


def one(ctx, sql):
    [row] = rows(ctx, sql)
    return row


def test_similarity_functions(ctx):
    j, c, d, o, t = one(
        ctx,
        "SELECT jaccard([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]), cosine([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]),"
        " dice([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]), overlap([1, 2, 3, 4, 5], [1, 2, 3, 4, 9]),"
        " arrow_typeof(overlap([1], [1]))",
    )
    assert (round(j, 12), c, d, o, t) == (0.666666666667, 0.8, 0.8, 4, "UInt64")
    # Empty sets are 0; a NULL list is NULL; NULL elements are not members.
    assert one(ctx, "SELECT jaccard([], []), cosine([], [1]), dice([], []), overlap([], [])") == (0, 0, 0, 0)
    assert one(
        ctx, "SELECT jaccard(NULL, [1, 2]), cosine([1], NULL), dice(NULL, NULL), overlap(NULL, [1])"
    ) == (None, None, None, None)
    assert one(
        ctx,
        "SELECT jaccard([NULL], [NULL]), overlap([1, NULL], [NULL, 1]),"
        " list_intersect_count([1, NULL], [NULL, 1]), jaccard([1, NULL, 2], [2, 1])",
    ) == (0, 1, 2, 1)


def test_integer_widths_and_list_types(ctx):
    got = one(
        ctx,
        "SELECT jaccard(arrow_cast([1, 2, 3], 'List(Int8)'), arrow_cast([3, 2], 'List(Int8)')),"
        " cosine(arrow_cast([1, 2, 3], 'LargeList(UInt32)'), arrow_cast([3, 2, 1], 'List(UInt32)')),"
        " dice(arrow_cast([1, 2, 3], 'FixedSizeList(3, Int16)'), arrow_cast([3, 7, 1], 'FixedSizeList(3, Int16)')),"
        " overlap(arrow_cast([1, 2, 3], 'List(UInt64)'), arrow_cast([3, 4], 'LargeList(UInt64)'))",
    )
    assert [round(v, 12) for v in got] == [0.666666666667, 1, 0.666666666667, 1]


def test_string_sets(ctx):
    assert one(ctx, "SELECT jaccard(['a', 'b', 'c'], ['b', 'c', 'd']), overlap(['x'], ['x', 'y'])") == (0.5, 1)


def test_list_intersect_and_count(ctx):
    assert one(ctx, "SELECT list_intersect([5, 1, 3, 9], [9, 3, 4])") == ([3, 9],)
    assert one(ctx, "SELECT list_intersect(NULL, [1]), list_intersect_count([1, 2], NULL)") == (None, None)
    assert one(ctx, "SELECT list_intersect_count([1, 2, 3, 4], [2, 4, 6])") == (2,)


def test_list_intersect_agg(ctx):
    ctx.sql(
        "CREATE TABLE g(k INT, l INT[]) AS VALUES"
        " (1, [1, 2, 3]), (1, [2, 3, 4]), (1, [3, 2]), (2, [7, 8]), (2, NULL), (3, [])"
    ).collect()
    got = rows(ctx, "SELECT k, list_intersect_agg(l) FROM g GROUP BY k ORDER BY k")
    assert [(k, sorted(v) if v is not None else None) for k, v in got] == [(1, [2, 3]), (2, [7, 8]), (3, [])]


def test_tokenize(ctx):
    assert one(ctx, "SELECT tokenize('Le café est très bon', 'fold=ascii')") == (["le", "cafe", "est", "tres", "bon"],)
    assert one(ctx, "SELECT tokenize('東京タワー')") == (["東京", "京タ", "タワ", "ワー"],)


def test_errors_name_the_function_and_argument(ctx):
    with pytest.raises(Exception, match="jaccard"):
        ctx.sql("SELECT jaccard([1.5], [2.5])").collect()
    with pytest.raises(Exception, match="tokenize"):
        ctx.sql("SELECT tokenize('a b', 'stem=klingon')").collect()
    with pytest.raises(Exception, match="similarity_join"):
        ctx.sql("SELECT * FROM similarity_join('nope', 'id', 'tokens', 'jaccard', 0.5)").collect()


def similarity_join_by_hand(sets, t):
    """Every pair (i < j) of `sets` with Jaccard >= t, by a nested loop."""
    ids = sorted(sets)
    out = set()
    for x, i in enumerate(ids):
        for j in ids[x + 1 :]:
            a, b = set(sets[i]), set(sets[j])
            if a | b and len(a & b) / len(a | b) >= t:
                out.add((i, j))
    return out


def test_similarity_join_table_function(ctx):
    sets = {i: sorted({i % 7, i % 11, 20 + i % 3, 30 + i % 5}) for i in range(1, 301)}
    ctx.register_record_batches(
        "s", [[pa.record_batch({"id": list(sets), "tokens": list(sets.values())})]]
    )
    got = rows(ctx, "SELECT left_id, right_id FROM similarity_join('s', 'id', 'tokens', 'jaccard', 0.6)")
    assert {tuple(sorted(p)) for p in got} == similarity_join_by_hand(sets, 0.6)
    assert len(got) == len(set(got)) > 0


def test_bm25_index_and_topk_table_function(ctx):
    ctx.sql(
        "CREATE TABLE docs(doc_id BIGINT, body VARCHAR) AS VALUES"
        " (10, 'The quick brown fox jumps'), (20, 'the lazy dog sleeps'), (30, 'quick quick dog'),"
        " (40, 'a fox and a dog'), (50, 'nothing here at all'), (60, NULL)"
    ).collect()
    ctx.sql("CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')").collect()
    got = rows(ctx, "SELECT rank, doc_id FROM topk_bm25('idx', 'quick dog', 10, 'and')")
    assert got == [(1, 30)]
    got = rows(ctx, "SELECT rank, doc_id FROM topk_bm25('idx', 'fox', 10)")
    assert sorted(d for _, d in got) == [10, 40]
    # The host hands an in-memory table's own buffers over: the index is loaded once.
    before = dfs._internal.index_loads()
    for _ in range(3):
        assert rows(ctx, "SELECT rank, doc_id FROM topk_bm25('idx', 'quick dog', 10, 'and')") == [(1, 30)]
    assert dfs._internal.index_loads() == before
    # Replaced under the same name: the new rows are read and answer.
    ctx.sql("INSERT INTO docs VALUES (70, 'quick dog dog')").collect()
    ctx.sql("CREATE OR REPLACE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')").collect()
    got = rows(ctx, "SELECT rank, doc_id FROM topk_bm25('idx', 'quick dog', 10, 'and')")
    assert sorted(d for _, d in got) == [30, 70]
    assert dfs._internal.index_loads() == before + 1


def test_table_functions_read_file_backed_tables(ctx, tmp_path):
    """The table functions over Parquet tables (several files and row groups, so the host
    scans several partitions) give the answers they give over the same rows in memory. The
    host runs its file scans itself: they used to abort the process behind datafusion-ffi."""
    import pyarrow.parquet as pq

    sets = {i: sorted({i % 7, i % 11, 20 + i % 3, 30 + i % 5}) for i in range(1, 301)}
    ids, tokens = list(sets), list(sets.values())
    (tmp_path / "sets").mkdir()
    for part in range(2):
        half = slice(part * 150, (part + 1) * 150)
        # Mixed-case column names: they reach the host quoted, as written.
        pq.write_table(pa.table({"Id": ids[half], "Tokens": tokens[half]}), tmp_path / "sets" / f"{part}.parquet", row_group_size=40)
    ctx.sql(f"CREATE EXTERNAL TABLE sets_file STORED AS PARQUET LOCATION '{tmp_path / 'sets'}/'").collect()
    ctx.sql("CREATE TABLE sets_mem AS SELECT * FROM sets_file").collect()
    join = "SELECT left_id, right_id FROM similarity_join('{t}', 'Id', 'Tokens', 'jaccard', 0.6) ORDER BY 1, 2"
    got = rows(ctx, join.format(t="sets_file"))
    assert got == rows(ctx, join.format(t="sets_mem"))
    assert {tuple(sorted(p)) for p in got} == similarity_join_by_hand(sets, 0.6)
    rs = "SELECT count(*) FROM similarity_join('sets_file', 'Id', 'Tokens', '{t}', 'Id', 'Tokens', 'jaccard', 0.6)"
    assert one(ctx, rs.format(t="sets_file")) == one(ctx, rs.format(t="sets_mem")) == (2 * len(got) + len(sets),)
    # EXPLAIN shows the plan that runs on our side, reading the host's table.
    plan = "\n".join(str(r[1]) for r in rows(ctx, "EXPLAIN " + join.format(t="sets_file")))
    assert "SimilarityJoinExec" in plan and "HostScanExec: table=datafusion.public.sets_file, columns=[Id, Tokens]" in plan

    words = ["quick", "brown", "fox", "lazy", "dog", "sleeps", "jumps", "zebra"]
    docs = pa.table({"doc_id": list(range(1, 401)), "text": [" ".join(words[(i * k) % 8] for k in range(1, 2 + i % 5)) for i in range(400)]})
    pq.write_table(docs, tmp_path / "docs.parquet", row_group_size=64)
    ctx.sql(f"CREATE EXTERNAL TABLE docs_file STORED AS PARQUET LOCATION '{tmp_path / 'docs.parquet'}'").collect()
    ctx.sql("CREATE TABLE docs_mem AS SELECT * FROM docs_file").collect()
    index = "SELECT * FROM bm25_index('{t}', 'doc_id', 'text') ORDER BY term"
    assert rows(ctx, index.format(t="docs_file")) == rows(ctx, index.format(t="docs_mem"))
    # (Written by pyarrow: a session with our planner cannot write files, see test_planner.py.)
    pq.write_table(ctx.sql("SELECT * FROM bm25_index('docs_file', 'doc_id', 'text')").to_arrow_table(), tmp_path / "idx.parquet")
    ctx.sql(f"CREATE EXTERNAL TABLE idx_file STORED AS PARQUET LOCATION '{tmp_path / 'idx.parquet'}'").collect()
    ctx.sql("CREATE TABLE idx_mem AS SELECT * FROM bm25_index('docs_mem', 'doc_id', 'text')").collect()
    search = "SELECT rank, doc_id, score FROM topk_bm25('{t}', 'lazy dog zebra', 10, '{m}') ORDER BY rank"
    for mode in ("or", "and"):
        got = rows(ctx, search.format(t="idx_file", m=mode))
        assert got == rows(ctx, search.format(t="idx_mem", m=mode))
        assert len(got) > 0

    # A file damaged since the table was created: the host's read error, naming the table,
    # not a crash.
    (tmp_path / "bad.parquet").write_bytes((tmp_path / "docs.parquet").read_bytes())
    ctx.sql(f"CREATE EXTERNAL TABLE bad STORED AS PARQUET LOCATION '{tmp_path / 'bad.parquet'}'").collect()
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all" * 64)
    with pytest.raises(Exception, match="reading table 'datafusion.public.bad' from the Python session"):
        ctx.sql("SELECT count(*) FROM bm25_index('bad', 'doc_id', 'text')").collect()


def test_table_functions_need_their_context_alive():
    """The functions hold the context they were registered into weakly (it holds them): a
    handle on the same session that outlives it gets a clear error, not a crash."""
    import gc

    ctx = dfs.session_context()
    ctx.sql("CREATE TABLE s(id INT, tokens INT[]) AS VALUES (1, [1, 2]), (2, [1, 2])").collect()
    other = ctx.with_extensions()  # another handle on the same session
    query = "SELECT count(*) FROM similarity_join('s', 'id', 'tokens', 'jaccard', 0.5)"
    assert one(other, query) == (1,)
    del ctx
    gc.collect()
    with pytest.raises(Exception, match="keep the context passed to datafusion_sets.register alive"):
        other.sql(query).collect()


def test_topk_bm25_over_a_column_of_queries(ctx):
    ctx.sql(
        "CREATE TABLE docs(doc_id BIGINT, body VARCHAR) AS VALUES"
        " (10, 'The quick brown fox jumps'), (20, 'the lazy dog sleeps'), (30, 'quick quick dog'),"
        " (40, 'a fox and a dog'), (50, 'nothing here at all')"
    ).collect()
    ctx.sql("CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')").collect()
    ctx.sql(
        "CREATE TABLE queries(q VARCHAR) AS VALUES ('quick dog'), ('fox'), (NULL), ('zebra')"
    ).collect()
    search = dfs.register_index(ctx, "idx")
    # The copy is loaded once, at its first search, then served from the cache.
    before = dfs._internal.index_loads()
    for _ in range(3):
        rows(ctx, "SELECT topk_bm25('idx', q, 2) FROM queries")
    assert dfs._internal.index_loads() == before + 1
    # Each row's hits equal the table form's for the same text, best first.
    for mode in ("or", "and"):
        got = rows(ctx, f"SELECT q, topk_bm25('idx', q, 10, '{mode}') FROM queries")
        assert len(got) == 4
        for q, hits in got:
            if q is None:
                assert hits is None
                continue
            want = rows(ctx, f"SELECT doc_id, score FROM topk_bm25('idx', '{q}', 10, '{mode}') ORDER BY rank")
            assert [(h["doc_id"], h["score"]) for h in hits] == want
    assert rows(ctx, "SELECT topk_bm25('idx', q, 1) FROM queries WHERE q = 'fox'")[0][0][0]["doc_id"] in (10, 40)
    # The DataFrame form.
    out = ctx.table("queries").filter(col("q") == lit("quick dog")).select(search(col("q"), 10, "and").alias("h"))
    assert [h["doc_id"] for h in out.to_pydict()["h"][0]] == [30]
    # Re-registering after a change sees the new rows; until then the copy is searched.
    ctx.sql("INSERT INTO docs VALUES (60, 'zebra crossing')").collect()
    ctx.sql("CREATE OR REPLACE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')").collect()
    zebra = "SELECT topk_bm25('idx', 'zebra', 3) FROM queries LIMIT 1"
    assert rows(ctx, zebra) == [([],)]
    dfs.register_index(ctx, "idx")
    assert [h["doc_id"] for h in rows(ctx, zebra)[0][0]] == [60]
    # Errors name the function and the argument.
    with pytest.raises(Exception, match="nope"):
        ctx.sql("SELECT topk_bm25('nope', q, 3) FROM queries").collect()
    with pytest.raises(Exception, match="topk_bm25.*argument 3"):
        ctx.sql("SELECT topk_bm25('idx', q, 0) FROM queries").collect()
    with pytest.raises(Exception, match="not a BM25 index"):
        dfs.register_index(ctx, "queries")
        ctx.sql("SELECT topk_bm25('queries', q, 3) FROM queries").collect()


@pytest.mark.parametrize("planner", [False, True])
def test_set_options_take_effect(planner):
    ctx = dfs.session_context(planner=planner)
    ctx.sql("CREATE TABLE docs(doc_id BIGINT, body VARCHAR) AS VALUES (1, 'a a a b'), (2, 'a b b c d e f')").collect()
    ctx.sql("CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')").collect()
    query = "SELECT doc_id, score FROM topk_bm25('idx', 'a b', 2) ORDER BY doc_id"
    default = rows(ctx, query)
    ctx.sql("SET sets.bm25_b = 0").collect()
    without_length = rows(ctx, query)
    assert [d for d, _ in default] == [d for d, _ in without_length] == [1, 2]
    assert default != without_length
    ctx.sql("SET sets.backend = 'cpu'").collect()
    assert rows(ctx, query) == without_length
    # The host stores foreign options unchecked; the query that reads a bad one fails (with
    # our planner, whose rules read the options, that is the SET's own plan).
    with pytest.raises(Exception, match="sets.backend"):
        ctx.sql("SET sets.backend = 'gpx'").collect()
        ctx.sql("SELECT jaccard([1], [1])").collect()


def test_register_into_an_existing_context():
    ctx = dfs.register(SessionContext())
    assert one(ctx, "SELECT jaccard([1, 2], [2, 3])") == (1 / 3,)
    # Without the options installed in its config, SET sets.* is refused, not ignored.
    with pytest.raises(Exception, match="sets"):
        ctx.sql("SET sets.backend = 'cpu'").collect()


def test_dataframe_api(ctx):
    batch = pa.record_batch(
        {
            "a": pa.array([[1, 2, 3], [4, 5], None], pa.list_(pa.int64())),
            "b": pa.array([[2, 3, 4], [6], [1]], pa.list_(pa.int64())),
            "g": [1, 1, 2],
        }
    )
    df = ctx.from_arrow(batch)
    out = df.select(
        dfs.jaccard(col("a"), col("b")).alias("j"),
        dfs.list_intersect(col("a"), col("b")).alias("i"),
        dfs.list_intersect_count(col("a"), col("b")).alias("n"),
        dfs.overlap(col("a"), lit(pa.scalar([1, 4], pa.list_(pa.int64())))).alias("o"),
    ).to_pydict()
    assert out == {"j": [0.5, 0.0, None], "i": [[2, 3], [], None], "n": [2, 0, None], "o": [1, 1, None]}
    agg = df.aggregate([col("g")], [dfs.list_intersect_agg(col("a")).alias("x")]).sort(col("g")).to_pydict()
    assert agg == {"g": [1, 2], "x": [[], None]}
    words = ctx.from_pydict({"t": ["Straße und Müller"]}).select(dfs.tokenize(col("t")).alias("w"))
    assert words.to_pydict() == {"w": [["straße", "und", "müller"]]}


def test_pandas_round_trip(ctx):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": [1, 2, 3], "tags": [["a", "b"], ["b", "c"], ["a", "b", "c"]]})
    ctx.from_pandas(frame, name="tagged")
    got = ctx.sql(
        "SELECT l.id AS l, r.id AS r, jaccard(l.tags, r.tags) AS j FROM tagged l JOIN tagged r"
        " ON l.id < r.id ORDER BY l, r"
    ).to_pandas()
    assert got["j"].round(6).tolist() == [round(1 / 3, 6), round(2 / 3, 6), round(2 / 3, 6)]


def test_topk_table_function_shard_by_shard(ctx):
    """`sets.topk_bm25_distribution = 'shards'`: the table form ranks a sharded index's
    partitions apart and merges the lists, as the whole index answers."""
    ctx.sql(
        "CREATE TABLE sdocs AS SELECT v AS doc_id, concat('w', v % 7, ' x', v % 5, "
        "CASE WHEN v % 11 = 0 THEN ' rare' ELSE '' END) AS body FROM generate_series(1, 3000) AS g(v)"
    ).collect()
    ctx.sql("CREATE TABLE sidx AS SELECT * FROM bm25_index('sdocs', 'doc_id', 'body', 'shards=4')").collect()
    # Batches of 16 rows, so the planner spreads the index table over the partitions.
    ctx.sql("SET datafusion.execution.batch_size = 16").collect()
    searches = [("w1 x2", "or", 10), ("rare w3", "and", 50), ("rare w3 x9", "and_or", 20)]
    sql = "SELECT rank, doc_id, score FROM topk_bm25('sidx', '{}', {}, '{}') ORDER BY rank"
    whole = [rows(ctx, sql.format(q, k, m)) for q, m, k in searches]
    ctx.sql("SET sets.topk_bm25_distribution = 'shards'").collect()
    plan = rows(ctx, "EXPLAIN " + sql.format("w1", 3, "or"))[-1][1]
    assert "TopkBm25ShardsExec" in plan and "Hash([shard" in plan, plan
    for (q, m, k), want in zip(searches, whole):
        assert want, (q, m)
        assert rows(ctx, sql.format(q, k, m)) == want, (q, m)
