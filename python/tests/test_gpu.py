"""The GPU backend from the wheel: every function family with `sets.backend = 'gpu'` gives the
answers of `sets.backend = 'cpu'`, and the GPU's batch counters show that it ran.

Skipped where no GPU is usable (CI). On the GPU machine, scripts/gpu/python-wheel.sh runs
this file as a script (the machine has no pytest): every test runs, and any failure, or no
usable GPU, exits non-zero."""

import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import datafusion_sets as dfs

try:
    import pytest
except ImportError:  # the GPU machine runs this file as a script
    pytest = None
else:
    pytestmark = pytest.mark.skipif(not dfs.gpu_available(), reason="no usable GPU (CUDA is loaded at run time)")

RNG_SEED = 7


def rows(ctx, sql):
    table = ctx.sql(sql).to_arrow_table()
    return list(zip(*(c.to_pylist() for c in table.columns)))


def on_both(ctx, sql):
    """`sql`'s rows under 'cpu' and under 'gpu'."""
    out = []
    for backend in ("cpu", "gpu"):
        ctx.sql(f"SET sets.backend = '{backend}'").collect()
        out.append(rows(ctx, sql))
    ctx.sql("SET sets.backend = 'auto'").collect()
    return out


def random_sets(rng, n, lo, hi, universe):
    return [np.unique(rng.integers(0, universe, rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def test_list_functions_gpu_equals_cpu():
    rng = np.random.default_rng(RNG_SEED)
    ctx = dfs.session_context()
    n = 20_000
    a, b = random_sets(rng, n, 0, 400, 2_000), random_sets(rng, n, 0, 400, 2_000)
    a[3], b[5] = None, None  # NULL lists give NULL, on both backends
    ctx.register_record_batches("t", [[pa.record_batch({
        "id": list(range(n)),
        "a": pa.array(a, pa.list_(pa.int32())),
        "b": pa.array(b, pa.list_(pa.int32())),
        "g": [i % 97 for i in range(n)],
    })]])
    before = dfs._internal.gpu_batches()[0]
    cpu, gpu = on_both(
        ctx,
        "SELECT id, list_intersect(a, b), list_intersect_count(a, b), jaccard(a, b), cosine(a, b),"
        " dice(a, b), overlap(a, b) FROM t ORDER BY id",
    )
    assert len(cpu) == n and cpu == gpu
    cpu, gpu = on_both(ctx, "SELECT g, list_intersect_agg(a) FROM t GROUP BY g ORDER BY g")
    assert len(cpu) == 97 and cpu == gpu
    assert dfs._internal.gpu_batches()[0] > before, "no list batch ran on the GPU"


def test_similarity_join_from_a_file_gpu_equals_cpu(tmp_path):
    rng = np.random.default_rng(RNG_SEED + 1)
    n = 30_000
    base = random_sets(rng, 300, 5, 60, 5_000)
    # Near duplicates of 300 base sets: many pairs above the threshold.
    sets = [sorted(set(base[i % 300]) | set(rng.integers(0, 5_000, 2).tolist())) for i in range(n)]
    pq.write_table(pa.table({"id": list(range(n)), "tokens": pa.array(sets, pa.list_(pa.int64()))}), tmp_path / "s.parquet")
    ctx = dfs.session_context()
    ctx.sql(f"CREATE EXTERNAL TABLE s STORED AS PARQUET LOCATION '{tmp_path / 's.parquet'}'").collect()
    sql = "SELECT left_id, right_id, similarity FROM similarity_join('s', 'id', 'tokens', '{f}', 0.8) ORDER BY 1, 2"
    for f in ("jaccard", "cosine"):
        cpu, gpu = on_both(ctx, sql.format(f=f))
        assert len(cpu) > 10_000 and cpu == gpu, f
    ctx.sql("SET sets.backend = 'gpu'").collect()
    plan = "\n".join(str(r[1]) for r in rows(ctx, "EXPLAIN ANALYZE " + sql.format(f="jaccard")))
    assert "gpu_chunks=0," not in plan and "gpu_chunks=" in plan, plan


def test_sql_join_through_the_planner_gpu_equals_cpu(tmp_path):
    """`JOIN ... ON jaccard(...) >= t` in a session with our query planner: the rewrite plans
    the similarity join, whose device path gives the CPU's pairs; the backend rule binds the
    list functions to the device."""
    rng = np.random.default_rng(RNG_SEED + 3)
    n = 20_000
    base = random_sets(rng, 200, 5, 60, 5_000)
    sets = [sorted(set(base[i % 200]) | set(rng.integers(0, 5_000, 2).tolist())) for i in range(n)]
    pq.write_table(pa.table({"id": list(range(n)), "tokens": pa.array(sets, pa.list_(pa.int64()))}), tmp_path / "s.parquet")
    ctx = dfs.session_context(planner=True)
    ctx.sql(f"CREATE EXTERNAL TABLE s STORED AS PARQUET LOCATION '{tmp_path / 's.parquet'}'").collect()
    ctx.sql("CREATE TABLE m AS SELECT * FROM s").collect()
    for t in ("s", "m"):
        sql = f"SELECT r.id, u.id FROM {t} r JOIN {t} u ON r.id < u.id AND jaccard(r.tokens, u.tokens) >= 0.8 ORDER BY 1, 2"
        cpu, gpu = on_both(ctx, sql)
        assert len(cpu) > 10_000 and cpu == gpu, t
    ctx.sql("SET sets.backend = 'gpu'").collect()
    plan = "\n".join(str(r[1]) for r in rows(ctx, "EXPLAIN ANALYZE " + sql))
    assert "SealedExec: SimilarityJoinExec" in plan and "backend=gpu" in plan, plan
    assert "gpu_chunks=0," not in plan and "gpu_chunks=" in plan, plan
    before = dfs._internal.gpu_batches()[0]
    cpu, gpu = on_both(ctx, "SELECT id, list_intersect_count(tokens, [1, 2, 3, 4, 5, 6, 7, 8]) FROM m ORDER BY id")
    assert len(cpu) == n and cpu == gpu
    ctx.sql("SET sets.backend = 'gpu'").collect()
    explained = "\n".join(str(r[1]) for r in rows(ctx, "EXPLAIN SELECT list_intersect_count(tokens, [1, 2]) FROM m"))
    assert "SetsBackendExec" in explained, explained
    assert dfs._internal.gpu_batches()[0] > before, "no list batch ran on the GPU"


def test_bm25_gpu_equals_cpu():
    rng = np.random.default_rng(RNG_SEED + 2)
    words = [f"w{i}" for i in range(3_000)]
    # Zipf-like term choice, as in text.
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    docs = [" ".join(rng.choice(words, rng.integers(5, 80), p=p)) for _ in range(20_000)]
    queries = [" ".join(rng.choice(words, rng.integers(1, 5), p=p)) for _ in range(5_000)]
    ctx = dfs.session_context()
    ctx.register_record_batches("docs", [[pa.record_batch({"doc_id": list(range(len(docs))), "text": docs})]])
    ctx.register_record_batches("q", [[pa.record_batch({"qid": list(range(len(queries))), "text": queries})]])
    ctx.sql("CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text')").collect()
    dfs.register_index(ctx, "idx")
    before = dfs._internal.gpu_batches()[1]
    for mode in ("or", "and"):
        cpu, gpu = on_both(ctx, f"SELECT qid, topk_bm25('idx', text, 10, '{mode}') FROM q ORDER BY qid")
        assert len(cpu) == len(queries) and cpu == gpu, mode
        assert sum(len(h) for _, h in cpu) > 1_000
    assert dfs._internal.gpu_batches()[1] > before, "no topk_bm25 batch ran on the GPU"


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    if not dfs.gpu_available():
        print("FAIL  no usable GPU")
        sys.exit(1)
    failed = 0
    for name, test in sorted(globals().items()):
        if not name.startswith("test_"):
            continue
        try:
            if "tmp_path" in test.__code__.co_varnames[: test.__code__.co_argcount]:
                with tempfile.TemporaryDirectory() as d:
                    test(Path(d))
            else:
                test()
            print(f"ok    {name}")
        except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:2000]}")
    print(f"gpu batches (list, topk_bm25): {dfs._internal.gpu_batches()}")
    sys.exit(1 if failed else 0)
