"""datafusion-sets from Python: list intersection, a similarity join and BM25 search over the
764 Debian packages of examples/data/ (the same data as examples/quickstart.sql).

    pip install datafusion==55.* pyarrow maturin
    (cd python && maturin develop --release)        # or: pip install the built wheel
    python examples/python_quickstart.py
"""

from pathlib import Path

import pyarrow as pa
from datafusion import col, lit

import datafusion_sets as dfs

data = Path(__file__).parent / "data"
ctx = dfs.session_context()
ctx.sql(f"CREATE EXTERNAL TABLE packages STORED AS JSON LOCATION '{data}/debian-packages.json'").collect()

# 1. Intersection and similarity as DataFrame expressions.
pkgs = ctx.table("packages")
[postfix] = pkgs.filter(col("package") == lit("postfix")).select(col("depends")).to_pydict()["depends"]
postfix = lit(pa.scalar(postfix, pa.list_(pa.string())))
closest = (
    pkgs.select(
        col("package"),
        dfs.list_intersect_count(col("depends"), postfix).alias("common"),
        dfs.jaccard(col("depends"), postfix).alias("jaccard"),
    )
    .filter(col("package") != lit("postfix"))
    .sort(col("jaccard").sort(ascending=False), col("package").sort())
    .limit(3)
)
closest.show()

# 2. An exact similarity join over the dependency names (lists of strings), in SQL: the
#    pairs of packages whose dependencies are near duplicates.
ctx.sql(
    "SELECT count(*) AS pairs FROM similarity_join('packages', 'id', 'depends', 'jaccard', 0.8)"
).show()
#    The same join written as a SQL join, in a session with the crate's query planner (which
#    plans it as the similarity join; such a session cannot write files: docs/python.md).
planned = dfs.session_context(planner=True)
planned.sql(f"CREATE EXTERNAL TABLE packages STORED AS JSON LOCATION '{data}/debian-packages.json'").collect()
planned.sql(
    "SELECT count(*) AS pairs FROM packages r JOIN packages u"
    " ON r.id < u.id AND jaccard(r.depends, u.depends) >= 0.8"
).show()

# 3. BM25 search over the package descriptions.
ctx.sql(
    "CREATE TABLE idx AS SELECT * FROM bm25_index('packages', 'id', 'description',"
    " 'stopwords=english, stem=english')"
).collect()
ctx.sql(
    "SELECT r.rank, p.package, round(r.score, 3) AS score FROM topk_bm25('idx', 'IMAP server', 3) r"
    " JOIN packages p ON p.id = r.doc_id ORDER BY r.rank"
).show()

# 4. The same index over a column of queries: register_index makes the scalar topk_bm25
#    work (SQL as in Rust) and returns its DataFrame form.
search = dfs.register_index(ctx, "idx")
queries = ctx.from_pydict({"q": ["IMAP server", "mail transport agent", "web browser"]})
queries.select(col("q"), search(col("q"), 2).alias("hits")).show()
