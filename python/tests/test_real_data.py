"""Real data from Python gives the answers of the Rust CLI (`dfsets`), row for row: a
similarity join on gcide_words and BM25 searches on gcide with real terabyte05 queries.

The data sets come from benches/data/build.sh (`$SETS_BENCH_DATA`, else bench-data/ at the
repository root); the CLI is `$DFSETS`, else the debug build `cargo test --all-features`
leaves in the target directory. Missing either is a skip, or a failure under
`SETS_REQUIRE_DATA=1` (as `.ci/run` sets)."""

import csv
import os
import subprocess
from pathlib import Path

import pytest

import datafusion_sets as dfs

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("SETS_BENCH_DATA", ROOT / "bench-data"))


def need(path: Path) -> Path:
    if not path.exists():
        why = f"{path} is missing (benches/data/build.sh builds the data; cargo test --all-features the CLI)"
        if os.environ.get("SETS_REQUIRE_DATA") == "1":
            pytest.fail(why + "; SETS_REQUIRE_DATA=1")
        pytest.skip(why)
    return path


def dfsets() -> Path:
    if "DFSETS" in os.environ:
        return need(Path(os.environ["DFSETS"]))
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return need(target / "debug" / "dfsets")


def cli_rows(setup: list[str], query: str, tmp_path: Path) -> list[tuple[str, ...]]:
    """`query`'s rows as the CLI computes them (written to CSV); the queries cast every
    column to text, so both sides format numbers alike (Arrow's casts)."""
    out = tmp_path / "cli.csv"
    script = ";\n".join([*setup, f"COPY ({query}) TO '{out}' STORED AS CSV"]) + ";\n"
    sql = tmp_path / "cli.sql"
    sql.write_text(script)
    subprocess.run([str(dfsets()), "-q", "-f", str(sql)], check=True, capture_output=True)
    with open(out, newline="") as f:
        return [tuple(r) for r in list(csv.reader(f))[1:]]


def py_rows(ctx, query: str) -> list[tuple[str, ...]]:
    table = ctx.sql(query).to_arrow_table()
    return [tuple("" if v is None else str(v) for v in row) for row in zip(*(c.to_pylist() for c in table.columns))]


def run_both(setup: list[str], query: str, tmp_path: Path, planner: bool = False):
    ctx = dfs.session_context(planner=planner)
    for s in setup:
        ctx.sql(s).collect()
    return py_rows(ctx, query), cli_rows(setup, query, tmp_path)


def test_similarity_join_on_gcide_words_equals_the_cli(tmp_path):
    sets = need(DATA / "gcide_words" / "sets.parquet")
    # The table function reads the Parquet file through the host (see docs/python.md).
    setup = [f"CREATE EXTERNAL TABLE words STORED AS PARQUET LOCATION '{sets}'"]
    query = (
        "SELECT CAST(left_id AS VARCHAR) AS l, CAST(right_id AS VARCHAR) AS r,"
        " CAST(round(similarity, 9) AS VARCHAR) AS s"
        " FROM similarity_join('words', 'id', 'tokens', 'jaccard', 0.5) ORDER BY 1, 2"
    )
    got, want = run_both(setup, query, tmp_path)
    # 189,857 pairs, as tests/string_join_real_data.rs finds on this data.
    assert len(got) == 189_857
    assert got == want


def test_sql_similarity_join_with_the_planner_equals_the_cli(tmp_path):
    """`JOIN ... ON jaccard(...) >= t` on gcide_words, planned by our planner in Python and
    rewritten by the CLI in Rust: the same pairs."""
    sets = need(DATA / "gcide_words" / "sets.parquet")
    setup = [
        f"CREATE EXTERNAL TABLE words STORED AS PARQUET LOCATION '{sets}'",
        "CREATE TABLE mem AS SELECT id, tokens FROM words",
    ]
    query = (
        "SELECT CAST(r.id AS VARCHAR), CAST(u.id AS VARCHAR) FROM {t} r JOIN {t} u"
        " ON r.id < u.id AND jaccard(r.tokens, u.tokens) >= 0.8 ORDER BY 1, 2"
    )
    for t in ("words", "mem"):
        got, want = run_both(setup, query.format(t=t), tmp_path, planner=True)
        # 441 pairs, as benches/README.md's gcide_words Jaccard >= 0.8 join finds.
        assert len(got) == 441
        assert got == want


def test_bm25_search_on_gcide_equals_the_cli(tmp_path):
    docs = need(DATA / "gcide" / "docs.parquet")
    queries = need(DATA / "queries" / "queries.parquet")
    setup = [
        f"CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '{docs}'",
        f"CREATE EXTERNAL TABLE queries STORED AS PARQUET LOCATION '{queries}'",
        "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text', 'stem=english')",
    ]
    ctx = dfs.session_context()
    for s in setup:
        ctx.sql(s).collect()
    texts = [r[0] for r in py_rows(ctx, "SELECT text FROM queries ORDER BY qid LIMIT 40")]
    assert len(texts) == 40
    for mode in ("or", "and"):
        union = " UNION ALL ".join(
            f"SELECT {i} AS q, rank, doc_id, round(score, 9) AS score"
            f" FROM topk_bm25('idx', '{t.replace(chr(39), chr(39) * 2)}', 10, '{mode}')"
            for i, t in enumerate(texts)
        )
        query = (
            "SELECT CAST(q AS VARCHAR), CAST(rank AS VARCHAR), CAST(doc_id AS VARCHAR),"
            f" CAST(score AS VARCHAR) FROM ({union}) ORDER BY q, rank"
        )
        got = sorted(py_rows(ctx, query))
        want = sorted(cli_rows(setup, query, tmp_path))
        assert got == want
        assert len(got) > (200 if mode == "or" else 10)
    # The scalar form over a column of 2,000 queries: the same (query, doc, score) hits as
    # the CLI's.
    dfs.register_index(ctx, "idx")
    for mode in ("or", "and"):
        query = (
            "SELECT CAST(qid AS VARCHAR), CAST(get_field(h, 'doc_id') AS VARCHAR),"
            " CAST(round(get_field(h, 'score'), 9) AS VARCHAR) FROM (SELECT qid, unnest(hits) AS h"
            f" FROM (SELECT qid, topk_bm25('idx', text, 10, '{mode}') AS hits"
            " FROM (SELECT * FROM queries ORDER BY qid LIMIT 2000)))"
        )
        got = py_rows(ctx, query)
        want = cli_rows(setup, query, tmp_path)
        assert sorted(got) == sorted(want)
        assert len(got) > (2000 if mode == "or" else 100)
