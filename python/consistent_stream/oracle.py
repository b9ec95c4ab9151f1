"""Batch evaluation of a model's SQL over its sources at a cut: the oracle of the central
contract ``target@v == batch_eval(model SQL, sources@C_v)``.

The incremental path and the oracle share the SQL, not code: here the SQL runs unchanged
except that each source relation is replaced by that source's snapshot at the cut, once in
Spark and once in DuckDB (an independent engine; the SQL is transpiled by sqlglot).

With ``chain=True`` the cut is a *base cut* (base source -> position, as a target version
records it) and an upstream model (``ref()``) is not read from its target but recomputed the
same way from its own SQL over the base sources at that cut, recursively: the whole chain in
batch, which is what a version of a downstream model must equal.
"""
from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from .connect import sql_over
from .plan.clock import Instant, bind
from .plan.inexact import inexact_columns
from .sources import Cut, SourceSpec
from .sources.formats import analysis_dataframe, snapshot_arrow, snapshot_dataframe
from .sources.model import MODEL_FORMAT


def view_name(source: SourceSpec, version: int | str) -> str:
    return f"__cs_{source.key.replace('.', '__')}_v{version}"


def rewrite_relations(sql: str, mapping: dict[tuple[str, ...], str], dialect: str = "spark") -> str:
    """Replace every table reference whose (lower-cased) parts are in ``mapping`` by the
    unqualified name ``mapping[parts]``, keeping its alias. Returns SQL in ``dialect``.

    Spark's ``date_add``/``date_sub`` return a DATE; sqlglot writes them for DuckDB as
    ``DATE + INTERVAL``, a TIMESTAMP there, so for DuckDB they are cast back to DATE. sqlglot
    writes ``LATERAL VIEW OUTER explode(a)`` for DuckDB as an inner ``UNNEST(a)``, dropping
    the rows whose array is NULL or empty; for DuckDB such an ``a`` is ``[NULL]`` instead,
    which keeps them once with a NULL, as Spark's OUTER does. Spark's ``max_by``/``min_by``
take a row whose value is NULL (its result is then NULL); DuckDB's ``arg_max``/``arg_min``
skip those rows, so for DuckDB they are ``arg_max_null``/``arg_min_null``. Spark's ``corr``
of one pair of values is NULL, DuckDB's NaN: for DuckDB it is NULL below two pairs
(``regr_count``)."""
    ast = sqlglot.parse_one(sql, read="spark")

    def fn(n):
        if dialect == "duckdb" and isinstance(n, exp.TsOrDsAdd) and not isinstance(n.parent, exp.Cast):
            return exp.cast(n.copy(), exp.DataType.build("date"))
        if dialect == "duckdb" and isinstance(n, exp.Lateral) and n.args.get("outer") \
                and type(n.this) is exp.Explode:
            arg = n.this.this.sql(dialect="spark")
            outer = n.copy()
            outer.set("outer", False)
            outer.this.set("this", sqlglot.parse_one(f"CASE WHEN {arg} IS NULL OR SIZE({arg}) = 0 THEN ARRAY(NULL) "
                                                     f"ELSE {arg} END", read="spark"))
            return outer
        if dialect == "duckdb" and isinstance(n, (exp.ArgMax, exp.ArgMin)) and not n.args.get("count"):
            name = "arg_max_null" if isinstance(n, exp.ArgMax) else "arg_min_null"
            return exp.Anonymous(this=name, expressions=[n.this.copy(), n.expression.copy()])
        if dialect == "duckdb" and (isinstance(n, exp.Corr) or isinstance(n, exp.Filter)
                                    and isinstance(n.this, exp.Corr)):
            corr = n.this if isinstance(n, exp.Filter) else n

            def call(name: str, *args) -> exp.Expression:
                f = exp.Anonymous(this=name, expressions=[a.copy() for a in args])
                return exp.Filter(this=f, expression=n.expression.copy()) if isinstance(n, exp.Filter) else f
            return exp.Case(ifs=[exp.If(this=exp.LT(this=call("regr_count", corr.expression, corr.this),
                                                    expression=exp.Literal.number(2)), true=exp.Null())],
                            default=call("corr", corr.this, corr.expression))
        if isinstance(n, exp.Table):
            parts = tuple(p.name.lower() for p in n.parts)
            if parts in mapping:
                alias = n.alias or n.name
                return exp.Table(this=exp.to_identifier(mapping[parts]),
                                 alias=exp.TableAlias(this=exp.to_identifier(alias)))
        return n
    return ast.transform(fn).sql(dialect=dialect)


def _upstream(source: SourceSpec):
    from .sources.formats import open_source
    return open_source(source).definition()


def _position(source: SourceSpec, cut: Cut) -> int:
    """``source``'s position in ``cut``; SourceError when the cut has none."""
    if source.key not in cut.versions:
        from .errors import SourceError
        raise SourceError(f"the cut {cut.versions} has no position for source {source.key}")
    return cut.versions[source.key]


@dataclass
class BatchEvaluation:
    """The model's SQL evaluated by Spark at a cut: ``frame`` (a lazy DataFrame) and
    ``inexact``, its columns computed from an order-dependent floating-point aggregate, through
    the chain's upstream models too (:mod:`consistent_stream.plan.inexact`: output column ->
    type), which a comparison with the target matches within a tolerance."""
    frame: object
    inexact: dict


def batch_dataframe(spark, sql: str, sources: list[SourceSpec], cut: Cut, *, chain: bool = False,
                    analysis: bool = False, instant: Instant | None = None):
    """The model's SQL evaluated by Spark over the sources at ``cut`` (a lazy DataFrame);
    with ``chain``, upstream models recomputed at base cut ``cut`` (module docstring); with
    ``analysis``, over frames that only have the sources' columns and types
    (:func:`.sources.formats.analysis_dataframe`): for its schema, never its rows;
    ``instant``: what the clock's calls return (:mod:`.plan.clock`; None: Spark's now)."""
    return batch_evaluation(spark, sql, sources, cut, chain=chain, analysis=analysis, instant=instant).frame


def batch_evaluation(spark, sql: str, sources: list[SourceSpec], cut: Cut, *, chain: bool = False,
                     analysis: bool = False, instant: Instant | None = None,
                     upstream_instants: dict[str, Instant] | None = None) -> BatchEvaluation:
    """:func:`batch_dataframe` with the columns computed from floating point
    (:class:`BatchEvaluation`). An upstream model of a chain is recomputed at the instant its
    version was computed at (``upstream_instants``, by model name; else ``instant``).

    The snapshots reach the query through :func:`consistent_stream.connect.sql_over`, so
    nothing is left in the caller's session (classic or Connect)."""
    sql = bind(sql, instant)
    mapping, types, upstream_inexact, frames = {}, {}, {}, {}
    for s in sources:
        relation = ".".join(s.relation_parts)
        if chain and s.format == MODEL_FORMAT:
            up = _upstream(s)
            ups = upstream_instants or {}
            evaluated = batch_evaluation(spark, up.sql, up.sources, cut, chain=True,
                                         instant=ups.get(s.name, instant), upstream_instants=ups)
            df, name = evaluated.frame, f"__cs_chain_{s.name}"
            upstream_inexact[relation] = set(evaluated.inexact)
        elif analysis:
            df, name = analysis_dataframe(spark, s, cut.versions.get(s.key)), view_name(s, "schema")
        else:
            v = _position(s, cut)
            df, name = snapshot_dataframe(spark, s, v), view_name(s, v)
        name = f"{name}_{len(frames)}"
        frames[name] = df
        mapping[s.relation_parts] = name
        types[relation] = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    return BatchEvaluation(sql_over(spark, rewrite_relations(sql, mapping), frames),
                           inexact_columns(sql, types, upstream_inexact))


def duckdb_result(sql: str, sources: list[SourceSpec], cut: Cut, *, chain: bool = False, arrow: bool = False,
                  instant: Instant | None = None, upstream_instants: dict[str, Instant] | None = None):
    """The model's SQL evaluated by DuckDB over the sources at ``cut``, as a pandas DataFrame
    (``arrow``: a pyarrow Table, DuckDB's own types); with ``chain``, upstream models
    recomputed (by DuckDB) at base cut ``cut``; ``instant`` and ``upstream_instants``: what
    the clock's calls return (:func:`batch_evaluation`)."""
    import duckdb

    con = duckdb.connect()
    try:
        query = _duckdb_sql(con, sql, sources, cut, chain, instant, upstream_instants or {})
        return con.sql(query).to_arrow_table() if arrow else con.execute(query).df()
    finally:
        con.close()


def _duckdb_sql(con, sql: str, sources: list[SourceSpec], cut: Cut, chain: bool,
                instant: Instant | None = None, upstream_instants: dict | None = None) -> str:
    """``sql`` in DuckDB's dialect over relations registered in ``con`` (upstream models of a
    chain as views of their own SQL), its clock bound to ``instant`` (an upstream's to its
    own, ``upstream_instants``)."""
    sql = bind(sql, instant)
    ups = upstream_instants or {}
    mapping = {}
    for s in sources:
        if chain and s.format == MODEL_FORMAT:
            up = _upstream(s)
            name = f"__cs_chain_{s.name}"   # one cut: the same model is the same relation
            con.execute(f'CREATE OR REPLACE TEMP VIEW "{name}" AS '
                        f'{_duckdb_sql(con, up.sql, up.sources, cut, True, ups.get(s.name, instant), ups)}')
        else:
            v = _position(s, cut)
            name = view_name(s, v)
            con.register(name, snapshot_arrow(s, v))
        mapping[s.relation_parts] = name
    return rewrite_relations(sql, mapping, dialect="duckdb")
