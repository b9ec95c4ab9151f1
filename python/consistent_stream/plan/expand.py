"""``ref()`` of a dbt ``view`` model, expanded into the model's SQL.

A view holds no data of its own: a consistent_stream model that reads one is maintained over
the sources underneath, so the view's SQL replaces its relation as a subquery (keeping the
alias), the way dbt already inlines ``ephemeral`` models as CTEs. The views' SQL is given
(the run reads it from Spark's catalog, ``View Text``: what dbt's run of the view created,
:func:`consistent_stream.job.run_model`); views of views are expanded until only sources and
consistent_stream models remain. Pure: no session, no I/O.

Example, with ``stg_lineitem`` a view ``select l_orderkey, l_extendedprice * (1 - l_discount)
as net from tpch.lineitem``::

    select l_orderkey, sum(net) from ex.stg_lineitem s group by l_orderkey
    -> select l_orderkey, sum(net) from (select l_orderkey, l_extendedprice * (1 - l_discount)
       as net from tpch.lineitem) as s group by l_orderkey
"""
from __future__ import annotations

import sqlglot
from sqlglot import exp

from ..errors import SourceError

MAX_DEPTH = 32
"""Views of views expanded at most this deep (a cycle is impossible in dbt's DAG)."""


def expand_views(sql: str, views: dict[tuple[str, ...], str]) -> str:
    """``sql`` with every relation in ``views`` (normalized relation parts -> the view's SQL)
    replaced by the view's SQL as an aliased subquery, recursively. Spark SQL in and out."""
    ast = sqlglot.parse_one(sql, read="spark")
    parsed = {k: sqlglot.parse_one(v, read="spark") for k, v in views.items()}
    for _ in range(MAX_DEPTH):
        hit = False

        def fn(n):
            nonlocal hit
            if isinstance(n, exp.Table):
                parts = tuple(p.name.lower() for p in n.parts)
                if parts in parsed:
                    hit = True
                    return exp.Subquery(this=parsed[parts].copy(),
                                        alias=exp.TableAlias(this=exp.to_identifier(n.alias or n.name)))
            return n
        ast = ast.transform(fn)
        if not hit:
            return ast.sql(dialect="spark")
    raise SourceError(f"views nested deeper than {MAX_DEPTH} levels in the model's SQL")
