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

from .parse import err, no_rule

SCALAR_VALUE = "cs_column"
"""Key of the mark a planned scalar subquery carries in its sqlglot ``meta``: the internal
column holding its value (written by :func:`.subqueries.plan_scalar_subqueries`, read by
:func:`translate`). A mark on the node rather than a mapping beside the AST because it must
survive the copies :func:`translate` makes, and a CTE's AST is planned once per reference, so
it cannot be rewritten in place."""


WINDOW_VALUE = "cs_window"
"""Key of the mark a planned window expression carries in its sqlglot ``meta``: the internal
column holding its value (written by :func:`.windows.plan_windows`, read by
:func:`translate`), for the same reason as :data:`SCALAR_VALUE`."""


def conjuncts(e: exp.Expression) -> Iterator[exp.Expression]:
    """The operands of ``e``'s top-level ANDs (through parentheses), left to right."""
    return _operands(e, exp.And)


def _operands(e: exp.Expression, connective: type) -> Iterator[exp.Expression]:
    """The operands of ``e``'s top-level ``connective`` (AND, OR) through parentheses."""
    if isinstance(e, connective):
        yield from _operands(e.this, connective)
        yield from _operands(e.expression, connective)
    elif isinstance(e, exp.Paren):
        yield from _operands(e.this, connective)
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


def window_of(node: exp.Expression) -> exp.Window | None:
    """The window ``node`` is the function of (``SUM(x)`` in ``SUM(x) OVER (..)``, also under
    IGNORE/RESPECT NULLS), else None."""
    p = node.parent
    while isinstance(p, (exp.IgnoreNulls, exp.RespectNulls)):
        p = p.parent
    if isinstance(p, exp.Window) and p.this is not None and (p.this is node or p.this.find(type(node)) is node):
        return p
    return None


def has_aggregate(e: exp.Expression) -> bool:
    """Whether ``e`` holds an aggregate outside nested subqueries (the function of a window,
    ``SUM(x) OVER (..)``, is not one; an aggregate in a window's arguments is)."""
    return any(window_of(a) is None for a in own(e, exp.AggFunc))


def with_aliases(e: exp.Expression, select_exprs: list[exp.Expression]) -> exp.Expression:
    """A copy of ``e`` (QUALIFY's condition, an ORDER BY key) with each unqualified reference
    to a SELECT-list alias replaced by a copy of the aliased expression, as Spark resolves
    such a name against the select list first (a window keeps its mark)."""
    aliased = {s.alias.lower(): s.this for s in select_exprs if isinstance(s, exp.Alias)}

    def fn(n):
        if isinstance(n, exp.Column) and not n.table and n.name.lower() in aliased:
            return aliased[n.name.lower()].copy()
        return n
    return e.copy().transform(fn)


def from_relations(sel: exp.Select) -> list[exp.Expression]:
    """The relations of ``sel``'s FROM clause and of its joins, in order."""
    from_ = sel.args.get("from") or sel.args.get("from_")
    return ([from_.this] if from_ else []) + [j.this for j in sel.args.get("joins") or []]


def translate(e: exp.Expression, scope: dict[tuple[str, str], str], sql: str) -> str:
    """Spark SQL text of ``e`` with column references replaced by internal names (``scope``:
    ``(alias, column)`` -> internal name) and scalar subqueries already planned replaced by
    their value column (:data:`SCALAR_VALUE`). ``e`` itself is not changed.

    Raises CompileError (located in ``sql``) for a column outside ``scope``, NoDeltaRule for
    any other subquery.
    """
    def fn(n):
        if isinstance(n, exp.Subquery) and SCALAR_VALUE in n.meta:
            return exp.column(n.meta[SCALAR_VALUE], quoted=True)
        if isinstance(n, exp.Window) and WINDOW_VALUE in n.meta:
            return exp.column(n.meta[WINDOW_VALUE], quoted=True)
        if isinstance(n, exp.Column):
            key = (n.table.lower(), n.name.lower())
            if key not in scope:
                raise err(f"column {n.sql(dialect='spark')}", "not visible here (correlated references are "
                          "supported in WHERE conditions of EXISTS, IN and scalar subqueries)", n, sql)
            return exp.column(scope[key], quoted=True)
        if isinstance(n, (exp.Subquery, exp.Exists)) or (isinstance(n, exp.In) and n.args.get("query")):
            raise no_rule("subquery here", "subqueries are supported as WHERE conditions ([NOT] EXISTS, "
                      "[NOT] IN) and as scalar values in WHERE and in the SELECT list of a query "
                      "without GROUP BY", n, sql)
        return n
    return e.copy().transform(fn).sql(dialect="spark")


def factor_or(e: exp.Expression) -> list[exp.Expression]:
    """The conjuncts of ``e`` with the conjuncts common to every branch of an OR taken out of
    it, as Spark's optimizer does (``(a AND b) OR (a AND c)`` -> ``a``, ``b OR c``), so that a
    join equality written in each branch (TPC-H Q19) is a join key. Conjuncts are compared as
    expressions (sqlglot equality); an OR is factored when its common conjuncts hold an
    equality between two relations, and stays as it is otherwise.

    >>> import sqlglot
    >>> e = sqlglot.parse_one("(a.k = b.k AND a.x > 1) OR (b.k = a.k AND a.k = b.k AND a.y < 2)")
    >>> [c.sql() for c in factor_or(e)]
    ['a.k = b.k', '(a.x > 1 OR (b.k = a.k AND a.y < 2))']
    """
    out: list[exp.Expression] = []
    for c in conjuncts(e):
        inner = c
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if not isinstance(inner, exp.Or):
            out.append(c)
            continue
        branches = [list(conjuncts(b)) for b in _operands(inner, exp.Or)]
        common = [x for x in branches[0] if all(any(x == y for y in b) for b in branches[1:])]
        if not any(isinstance(x, exp.EQ) and len(aliases(x)) > 1 for x in common):
            out.append(c)
            continue
        rest = [[y for y in b if all(y != x for x in common)] for b in branches]
        out += [x.copy() for x in common]
        if all(rest):   # a branch left with nothing is TRUE: so is the OR
            # parenthesized: conjuncts are joined with AND as text, where OR binds looser
            out.append(exp.paren(exp.or_(*[exp.and_(*[y.copy() for y in r]) for r in rest]), copy=False))
    return out

