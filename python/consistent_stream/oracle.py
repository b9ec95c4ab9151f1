"""Batch evaluation of a model's SQL over its sources at a cut: the oracle of the central
contract ``target@v == batch_eval(model SQL, sources@C_v)``.

The incremental path and the oracle share the SQL, not code: here the SQL runs unchanged
except that each source relation is replaced by that source's snapshot at the cut, once in
Spark and once in DuckDB (an independent engine; the SQL is transpiled by sqlglot).
"""
from __future__ import annotations

import sqlglot
from sqlglot import exp

from .sources import Cut, SourceSpec
from .sources.formats import snapshot_arrow, snapshot_dataframe


def view_name(source: SourceSpec, version: int) -> str:
    return f"__cs_{source.key.replace('.', '__')}_v{version}"


def rewrite_relations(sql: str, mapping: dict[tuple[str, ...], str], dialect: str = "spark") -> str:
    """Replace every table reference whose (lower-cased) parts are in ``mapping`` by the
    unqualified name ``mapping[parts]``, keeping its alias. Returns SQL in ``dialect``."""
    ast = sqlglot.parse_one(sql, read="spark")

    def fn(n):
        if isinstance(n, exp.Table):
            parts = tuple(p.name.lower() for p in n.parts)
            if parts in mapping:
                alias = n.alias or n.name
                return exp.Table(this=exp.to_identifier(mapping[parts]),
                                 alias=exp.TableAlias(this=exp.to_identifier(alias)))
        return n
    return ast.transform(fn).sql(dialect=dialect)


def batch_dataframe(spark, sql: str, sources: list[SourceSpec], cut: Cut):
    """The model's SQL evaluated by Spark over the sources at ``cut`` (a lazy DataFrame).

    The snapshots are temporary views only while Spark analyzes the query (the analyzed plan
    keeps them), so nothing is left in the caller's session."""
    mapping = {}
    try:
        for s in sources:
            v = cut.versions[s.key]
            name = view_name(s, v)
            snapshot_dataframe(spark, s, v).createOrReplaceTempView(name)
            mapping[s.relation_parts] = name
        return spark.sql(rewrite_relations(sql, mapping))
    finally:
        for name in mapping.values():
            spark.catalog.dropTempView(name)


def duckdb_result(sql: str, sources: list[SourceSpec], cut: Cut):
    """The model's SQL evaluated by DuckDB over the sources at ``cut``, as a pandas DataFrame."""
    import duckdb

    con = duckdb.connect()
    mapping = {}
    for s in sources:
        v = cut.versions[s.key]
        name = view_name(s, v)
        con.register(name, snapshot_arrow(s, v))
        mapping[s.relation_parts] = name
    return con.execute(rewrite_relations(sql, mapping, dialect="duckdb")).df()
