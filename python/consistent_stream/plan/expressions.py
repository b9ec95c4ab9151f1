"""Expressions of a qualified query AST (:func:`.parse.resolve`): their conjuncts, the
columns and aggregates of their own scope, and their translation to plan expressions
(Spark SQL over internal column names, :func:`translate`).

>>> import sqlglot
>>> e = sqlglot.parse_one("o.amount > 1 and (c.name = 'x' and upper(c.name) = o.day)", read="spark")
>>> [c.sql() for c in conjuncts(e)]
['o.amount > 1', "c.name = 'x'", 'UPPER(c.name) = o.day']
>>> translate(e, {("o", "amount"): "o__amount", ("o", "day"): "o__day", ("c", "name"): "c__name"}, "")
"`o__amount` > 1 AND (`c__name` = 'x' AND UPPER(`c__name`) = `o__day`)"
"""
from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

from .parse import err

SCALAR_VALUE = "cs_column"
"""Key of the mark a planned scalar subquery carries in its sqlglot ``meta``: the internal
column holding its value (written by :func:`.subqueries.plan_scalar_subqueries`, read by
:func:`translate`). A mark on the node rather than a mapping beside the AST because it must
survive the copies :func:`translate` makes, and a CTE's AST is planned once per reference, so
it cannot be rewritten in place."""


def conjuncts(e: exp.Expression) -> Iterator[exp.Expression]:
    """The operands of ``e``'s top-level ANDs (through parentheses), left to right."""
    if isinstance(e, exp.And):
        yield from conjuncts(e.this)
        yield from conjuncts(e.expression)
    elif isinstance(e, exp.Paren):
        yield from conjuncts(e.this)
    else:
        yield e


def own(e: exp.Expression, typ) -> Iterator[exp.Expression]:
    """The nodes of type ``typ`` in ``e`` outside nested subqueries (those belong to the
    subquery's scope, except its correlated references, which its planning resolves)."""
    for n in e.walk(prune=lambda n: n is not e and isinstance(n, (exp.Subquery, exp.Exists, exp.Select))):
        if isinstance(n, typ):
            yield n


def own_columns(e: exp.Expression) -> Iterator[exp.Column]:
    """The column references of ``e`` outside nested subqueries."""
    return own(e, exp.Column)


def aliases(e: exp.Expression) -> set[str]:
    """The relation aliases (lower case) ``e``'s own columns refer to."""
    return {c.table.lower() for c in own_columns(e)}


def has_aggregate(e: exp.Expression) -> bool:
    """Whether ``e`` holds an aggregate outside nested subqueries."""
    return next(own(e, exp.AggFunc), None) is not None


def from_relations(sel: exp.Select) -> list[exp.Expression]:
    """The relations of ``sel``'s FROM clause and of its joins, in order."""
    from_ = sel.args.get("from") or sel.args.get("from_")
    return ([from_.this] if from_ else []) + [j.this for j in sel.args.get("joins") or []]


def translate(e: exp.Expression, scope: dict[tuple[str, str], str], sql: str) -> str:
    """Spark SQL text of ``e`` with column references replaced by internal names (``scope``:
    ``(alias, column)`` -> internal name) and scalar subqueries already planned replaced by
    their value column (:data:`SCALAR_VALUE`). ``e`` itself is not changed.

    Raises CompileError (located in ``sql``) for a column outside ``scope`` and for any other
    subquery.
    """
    def fn(n):
        if isinstance(n, exp.Subquery) and SCALAR_VALUE in n.meta:
            return exp.column(n.meta[SCALAR_VALUE], quoted=True)
        if isinstance(n, exp.Column):
            key = (n.table.lower(), n.name.lower())
            if key not in scope:
                raise err(f"column {n.sql(dialect='spark')}", "not visible here (correlated references are "
                          "supported in WHERE conditions of EXISTS, IN and scalar subqueries)", n, sql)
            return exp.column(scope[key], quoted=True)
        if isinstance(n, (exp.Subquery, exp.Exists)) or (isinstance(n, exp.In) and n.args.get("query")):
            raise err("subquery here", "subqueries are supported as WHERE conditions ([NOT] EXISTS, "
                      "[NOT] IN) and as scalar values in WHERE and in the SELECT list of a query "
                      "without GROUP BY", n, sql)
        return n
    return e.copy().transform(fn).sql(dialect="spark")
