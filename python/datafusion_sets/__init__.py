"""datafusion-sets for DataFusion in Python: fast set operations on list columns, exact
similarity joins and BM25 search.

    >>> import datafusion_sets as dfs
    >>> ctx = dfs.session_context()          # or dfs.register(an_existing_context)
    >>> ctx.sql("SELECT jaccard([1, 2, 3], [2, 3, 4]) AS j").to_pandas()
         j
    0  0.5

``session_context()`` also installs the ``sets.*`` options (``SET sets.backend = 'gpu'``);
``register(ctx)`` installs the functions into a context built elsewhere, whose options it
cannot change: build its config with ``with_sets_options(SessionConfig())`` first.

The module's functions build DataFrame expressions:
``df.select(dfs.jaccard(col("a"), col("b")))``.
"""

from __future__ import annotations

from datafusion import (
    AggregateUDF,
    Expr,
    ScalarUDF,
    SessionConfig,
    SessionContext,
    TableFunction,
    col,
    lit,
)

from . import _internal

__all__ = [
    "register",
    "register_index",
    "extension",
    "session_context",
    "with_sets_options",
    "gpu_available",
    "list_intersect",
    "list_intersect_count",
    "list_intersect_agg",
    "jaccard",
    "cosine",
    "dice",
    "overlap",
    "tokenize",
]

_SCALARS = {f.name: ScalarUDF.from_pycapsule(f) for f in _internal.scalar_functions()}
_AGGREGATES = {
    f.name: AggregateUDF.from_pycapsule(f) for f in _internal.aggregate_functions()
}


def with_sets_options(config: SessionConfig | None = None) -> SessionConfig:
    """``config`` (a new one when None) with the ``sets.*`` options installed, so that
    ``SET sets.<name> = ...`` works in a context built from it."""
    config = SessionConfig() if config is None else config
    return config.with_extension(_internal.SetsOptions())


def register(ctx: SessionContext) -> SessionContext:
    """Install every function of datafusion-sets into ``ctx`` and return it: the scalar
    functions (``list_intersect`` replacing DataFusion's alias of ``array_intersect``),
    ``list_intersect_agg``, and the table functions ``similarity_join``, ``bm25_index``
    and ``topk_bm25``."""
    for udf in _SCALARS.values():
        ctx.register_udf(udf)
    for udaf in _AGGREGATES.values():
        ctx.register_udaf(udaf)
    for f in _internal.table_functions(ctx):
        ctx.register_udtf(TableFunction(f.name, f, ctx))
    return ctx


def session_context(
    config: SessionConfig | None = None, runtime=None, *, planner: bool = False
) -> SessionContext:
    """A new ``SessionContext`` on ``config`` (DataFusion's defaults when None), with the
    ``sets.*`` options and every function of datafusion-sets. With ``planner=True`` it also
    has the crate's query planner (``extension()``), so that ``JOIN ... ON jaccard(a, b) >= t``
    runs as a similarity join, as in Rust; such a session cannot write files (``COPY``,
    ``DataFrame.write_*``: see ``docs/python.md``)."""
    ctx = SessionContext(with_sets_options(config), runtime)
    # `with_extensions` returns a new handle on the session: the table functions are bound to
    # the handle the caller keeps (they hold it weakly).
    return register(ctx.with_extensions(extension()) if planner else ctx)


def extension():
    """datafusion-sets' query planner as an extension bundle, for
    ``ctx.with_extensions(datafusion_sets.extension())``: it plans the session's queries with
    DataFusion's physical planner and rules plus the crate's (the similarity join rewrite,
    the backend rule), as a Rust session with the crate installed does. Tables cross to it by
    reference, not by copy. ``session_context(planner=True)`` installs it.

    Writing files fails in such a session (``COPY ... TO``, ``DataFrame.write_parquet``):
    datafusion-ffi 55 cannot hand a file format to the planner ("FFI does not support
    decode_file_format"). Write from a context without it."""
    return _internal.SetsExtension()


def register_index(ctx: SessionContext, name: str, table=None):
    """Make the scalar ``topk_bm25(name, query, k [, mode])`` (BM25 top-k of a column of
    queries, as in Rust) work in ``ctx`` over index table ``name``, and return its
    DataFrame form: ``search(query_expr, k, mode=None)``.

        >>> search = dfs.register_index(ctx, "idx")
        >>> ctx.sql("SELECT q, topk_bm25('idx', q, 3) FROM queries")       # SQL
        >>> ctx.table("queries").select(search(col("q"), 3))               # DataFrame

    FFI gives a scalar function no session to find tables in, so this copies the rows of
    ``table`` (default: ``ctx.table(name)``; anything with ``__arrow_c_stream__``) into
    datafusion-sets, where the index is loaded once and cached. The searches see the index
    as it was when this was called: after changing the index table, call it again (which
    replaces the copy). The table form ``SELECT * FROM topk_bm25('idx', 'text', k)`` reads
    the table at every query and needs no registration."""
    indexes = getattr(ctx, "_datafusion_sets_indexes", None)
    if indexes is None:
        indexes = _internal.Bm25Indexes()
        ctx.register_udf(ScalarUDF.from_pycapsule(indexes))
        ctx._datafusion_sets_indexes = indexes
    indexes.add(name, ctx.table(name) if table is None else table)
    udf = ScalarUDF.from_pycapsule(indexes)

    def search(query: Expr, k: int, mode: str | None = None) -> Expr:
        args = [lit(name), query, lit(k)] + ([] if mode is None else [lit(mode)])
        return udf(*args)

    search.__name__ = f"topk_bm25_{name}"
    search.__doc__ = f"``topk_bm25('{name}', query, k [, mode])`` as a DataFrame expression."
    return search


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _host_table(ctx: SessionContext, catalog: str, schema: str, table: str, columns):
    """The rows a table function reads from ``ctx``'s table ``catalog.schema.table``
    (``columns`` of it, or all when None), as a DataFrame the crate reads through its Arrow C
    stream: the host runs its own scan, so file-backed tables work (see ``docs/python.md``)."""
    df = ctx.table(".".join(_quote(p) for p in (catalog, schema, table)))
    if columns is not None:
        df = df.select(*[col(_quote(c)) for c in columns])
    return df


def gpu_available() -> bool:
    """Whether the GPU backend found a usable NVIDIA GPU (CUDA is loaded at run time)."""
    return _internal.gpu_available()


def _scalar(name: str):
    udf = _SCALARS[name]

    def call(*args: Expr) -> Expr:
        return udf(*args)

    call.__name__ = name
    call.__doc__ = f"The SQL function ``{name}`` as a DataFrame expression."
    return call


list_intersect = _scalar("list_intersect")
list_intersect_count = _scalar("list_intersect_count")
jaccard = _scalar("jaccard")
cosine = _scalar("cosine")
dice = _scalar("dice")
overlap = _scalar("overlap")
tokenize = _scalar("tokenize")


def list_intersect_agg(arg: Expr) -> Expr:
    """The aggregate ``list_intersect_agg`` as a DataFrame expression."""
    return _AGGREGATES["list_intersect_agg"](arg)
