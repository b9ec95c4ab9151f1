"""Which output columns of a model are computed from floating point in an order-dependent
way: the columns a check of the central contract compares with a tolerance
(:mod:`consistent_stream.compare`) although their type may be exact.

Floating-point addition is not associative, so an aggregate that adds floating-point values
(``SUM``, ``AVG``, ``STDDEV``, ``VARIANCE`` of a FLOAT or DOUBLE argument) may differ in its last
bits between an incremental evaluation (accumulated batch by batch) and a batch one (another
order). Whatever is computed from such a value inherits that: ``CAST(SUM(d) AS DECIMAL(18,
2))`` or ``FLOOR(SUM(d))`` may round to a neighbouring value, through any number of CTEs,
derived tables, set operations and scalar subqueries. Everything else is deterministic and
compared exactly: a source's value as stored, arithmetic on it, ``AVG`` of integers (an exact
sum over an exact count), ``MIN``/``MAX`` of stored values, ``COUNT``. (Columns whose *type* is
FLOAT or DOUBLE are compared with the tolerance whatever this module says; the caller adds
them.)

In: the model SQL (Spark dialect), the relations it reads as ``{relation: {column: Spark SQL
type}}`` (relation names as the SQL writes them, ``schema.table``). Out: ``{output column:
its type as sqlglot types it}`` for the inexact ones. Pure: sqlglot only.

>>> inexact_columns(
...     "select g, sum(x) s, cast(sum(x) as decimal(18, 2)) d, count(*) n from src.t group by g",
...     {"src.t": {"g": "bigint", "x": "double"}})
{'s': 'DOUBLE', 'd': 'DECIMAL(18, 2)'}
"""
from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, build_scope

FLOATING = {exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE}
ORDER_DEPENDENT = (exp.Sum, exp.Avg, exp.Stddev, exp.StddevPop, exp.StddevSamp, exp.Variance, exp.VariancePop)
"""Aggregates whose floating-point result depends on the order their inputs are added in."""


def _floating(e: exp.Expression) -> bool:
    return e.type is not None and e.type.this in FLOATING


def _nested_schema(relations: dict[str, dict[str, str]]) -> dict:
    out: dict = {}
    for name, columns in relations.items():
        node = out
        parts = name.lower().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = {c.lower(): t for c, t in columns.items()}
    return out


def inexact_columns(sql: str, relations: dict[str, dict[str, str]],
                    inexact_inputs: dict[str, set[str]] | None = None) -> dict[str, str]:
    """The output columns of ``sql`` computed from floating point in an order-dependent way
    (module docstring), with their types. ``inexact_inputs``: per relation, its columns that
    are themselves inexact (an upstream model's, by this function over its own SQL). An
    argument sqlglot cannot type counts as exact, and so does every column of a query it
    cannot qualify (relations named with different numbers of parts): a check then compares
    more strictly, never less."""
    schema = _nested_schema(relations)
    try:
        ast = qualify(sqlglot.parse_one(sql, read="spark"), schema=schema, dialect="spark",
                      validate_qualify_columns=False)
        ast = annotate_types(ast, schema=schema, dialect="spark")
    except (sqlglot.errors.SqlglotError, ValueError):
        return {}
    root = build_scope(ast)
    if root is None:
        return {}
    lineage = _Lineage({k.lower(): {c.lower() for c in v} for k, v in (inexact_inputs or {}).items()})
    out = {}
    for i, projection in enumerate(_projections(root.expression)):
        if lineage.projection_inexact(root, i):
            out[projection.alias_or_name] = projection.type.sql("spark").upper() if projection.type else "UNKNOWN"
    return out


def _projections(query: exp.Expression) -> list[exp.Expression]:
    while isinstance(query, exp.SetOperation):
        query = query.this
    return list(query.selects)


class _Lineage:
    """Memoized walk from a projection back through CTEs, derived tables and set operations
    to the sources."""

    def __init__(self, inputs: dict[str, set[str]]):
        self.inputs = inputs
        self.memo: dict[tuple[int, int], bool] = {}

    def projection_inexact(self, scope: Scope, index: int) -> bool:
        """Whether output ``index`` of ``scope``'s query (every branch of a set operation) is
        computed from floating point."""
        key = (id(scope), index)
        if key not in self.memo:
            self.memo[key] = False   # a recursive CTE's cycle counts as exact until shown otherwise
            self.memo[key] = any(self._expression_inexact(branch, e)
                                 for branch, e in self._branches(scope, index))
        return self.memo[key]

    def _branches(self, scope: Scope, index: int):
        if isinstance(scope.expression, exp.SetOperation):
            for child in scope.set_operation_scopes:
                yield from self._branches(child, index)
            return
        selects = scope.expression.selects
        if index < len(selects):
            yield scope, selects[index]

    def _expression_inexact(self, scope: Scope, e: exp.Expression) -> bool:
        if isinstance(e, exp.Count):
            return False   # how many values, never which: exact
        if isinstance(e, ORDER_DEPENDENT) and any(_floating(a) for a in e.iter_expressions()):
            return True
        if isinstance(e, exp.Column):
            return self._column_inexact(scope, e)
        if isinstance(e, exp.Subquery):
            inner = next((s for s in scope.subquery_scopes if s.expression is e.this), None)
            return inner is not None and any(self.projection_inexact(inner, i)
                                             for i in range(len(_projections(inner.expression))))
        return any(self._expression_inexact(scope, c) for c in e.iter_expressions())

    def _column_inexact(self, scope: Scope, column: exp.Column) -> bool:
        source = scope.sources.get(column.table)
        if isinstance(source, Scope):
            for i, p in enumerate(_projections(source.expression)):
                if p.alias_or_name.lower() == column.name.lower():
                    return self.projection_inexact(source, i)
            return False
        if isinstance(source, exp.Table):   # a relation's value as stored: exact unless computed upstream
            name = ".".join(p.name.lower() for p in source.parts)
            return column.name.lower() in self.inputs.get(name, ())
        return False
