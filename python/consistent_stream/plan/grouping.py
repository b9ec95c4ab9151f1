"""Grouping sets: ``GROUP BY ROLLUP(..)``, ``CUBE(..)``, ``GROUPING SETS(..)``, ``WITH
ROLLUP`` / ``WITH CUBE``, mixed with plain keys, and ``grouping()`` / ``grouping_id()``.

Planned as Spark plans them: an :class:`~.logical.Expand` turns each input row into one row
per grouping set (the keys outside the set NULL, the set's position in a column of its own),
and one Aggregate groups by the keys and that position. The Expand is linear and the
Aggregate keeps one state per group of every set, so a batch updates, in each set, only the
groups its change touches. Grouping by the set's position rather than by ``grouping_id``
keeps a grouping set that appears twice (``GROUPING SETS ((a), (a))``) as two groups, as
Spark does. With no input rows there are no groups, also for the empty set ``()`` (Spark's
answer; a plain ``GROUP BY ()`` still gives its one row).

``grouping(k)`` is 1 in the rows of the sets without ``k`` (a TINYINT), ``grouping_id()`` the
bits ``grouping(k1) .. grouping(kn)`` of every key, in the order they first appear in GROUP
BY, read as a binary number (a BIGINT; Spark takes explicit arguments only when they are
exactly those keys); both are constants per set, so above the Aggregate they are a CASE over
the set's position.

Example: ``select a, b, grouping_id() as g, sum(x) from t group by rollup(a, b)`` plans to::

    Project `__g_a` AS a, `__g_b` AS b, CAST(CASE `__g_set` WHEN 0 THEN 0 WHEN 1 THEN 1 ELSE 3 END AS BIGINT) AS g, ..
      Aggregate by ['`__k_a`', '`__k_b`', '`__set`']: sum(`t__x`)
        Expand (__k_a, __k_b, __set = 0) | (__k_a, __set = 1) | (__set = 2)
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from sqlglot import exp

from .logical import Expand, Node
from .parse import err


@dataclass
class GroupingSets:
    """The grouping sets of one GROUP BY: ``keys``, every distinct key expression in order of
    first appearance; ``sets``, each set as the positions in ``keys`` it groups by, in Spark's
    order (a ROLLUP from all its elements to none, a CUBE from all to none)."""
    keys: list[exp.Expression]
    sets: list[tuple[int, ...]]

    def bits(self, args: list[int], s: int) -> int:
        """``grouping(k)`` of the key at position ``k`` when ``args == [k]``, ``grouping_id()``
        when ``args`` are every position: the bits, in the rows of set ``s``."""
        v = 0
        for i in args:
            v = (v << 1) | (0 if i in self.sets[s] else 1)
        return v


def _elements(e: exp.Expression) -> list[exp.Expression]:
    """The key expressions of one element of ROLLUP, CUBE or GROUPING SETS: a tuple's items,
    a parenthesized expression's inside, else the expression itself."""
    if isinstance(e, exp.Tuple):
        return list(e.expressions)
    if isinstance(e, exp.Paren):
        return [e.this]
    return [e]


def grouping_sets(group: exp.Group | None) -> GroupingSets | None:
    """The grouping sets of ``group``, or None when it has none (plain GROUP BY keys). Several
    items combine as their cross product (``GROUP BY a, ROLLUP(b, c)``: ``(a, b, c), (a, b),
    (a)``)."""
    if group is None:
        return None
    items = list(group.expressions)
    if group.args.get("rollup"):
        items = [exp.Rollup(expressions=items)]
    elif group.args.get("cube"):
        items = [exp.Cube(expressions=items)]
    if not any(isinstance(i, (exp.Rollup, exp.Cube, exp.GroupingSets)) for i in items):
        return None
    choices: list[list[list[exp.Expression]]] = []
    for item in items:
        if isinstance(item, exp.Rollup):
            els = [_elements(e) for e in item.expressions]
            choices.append([sum(els[:n], []) for n in range(len(els), -1, -1)])
        elif isinstance(item, exp.Cube):
            els = [_elements(e) for e in item.expressions]
            subsets = itertools.product(*[(True, False)] * len(els))
            choices.append([sum((el for el, on in zip(els, keep) if on), []) for keep in subsets])
        elif isinstance(item, exp.GroupingSets):
            choices.append([_elements(e) for e in item.expressions])
        else:
            choices.append([[item]])
    keys: list[exp.Expression] = []
    for c in choices:
        for s in c:
            for k in s:
                if k not in keys:
                    keys.append(k)
    sets = [tuple(sorted({keys.index(k) for part in combo for k in part})) for combo in itertools.product(*choices)]
    return GroupingSets(keys=keys, sets=sets)


def plan_expand(child: Node, key_sqls: list[str], key_names: list[str], set_name: str,
                sets: list[tuple[int, ...]]) -> Expand:
    """``child``'s rows once per grouping set: its columns unchanged, then the keys
    (``key_sqls`` over ``child``, as ``key_names``; NULL of the key's type outside the set),
    then the set's position as ``set_name``."""
    keep = [f"`{c}`" for c in child.columns]
    projections = [keep + [k if i in s else f"CASE WHEN FALSE THEN {k} END" for i, k in enumerate(key_sqls)]
                   + [str(n)] for n, s in enumerate(sets)]
    return Expand(columns=list(child.columns) + key_names + [set_name], child=child, projections=projections)


def grouping_call(n: exp.Expression, gs: GroupingSets | None, set_column: str, sql: str) -> exp.Expression | None:
    """``n`` as an expression over the Aggregate's set column when it is ``grouping(k)`` or
    ``grouping_id(..)``, else None.

    Raises CompileError for either without grouping sets (as Spark does) or of an expression
    that is not a key."""
    if not isinstance(n, (exp.Grouping, exp.GroupingId)):
        return None
    name = "grouping" if isinstance(n, exp.Grouping) else "grouping_id"
    if gs is None:
        raise err(f"{name}()", "needs GROUP BY ROLLUP, CUBE or GROUPING SETS (as in Spark)", n, sql)
    args = list(n.expressions) or ([] if isinstance(n, exp.Grouping) else list(gs.keys))
    if isinstance(n, exp.Grouping) and len(args) != 1:
        raise err("grouping() of several columns", "give grouping() one key; grouping_id() takes several", n, sql)
    for a in args:
        if a not in gs.keys:
            raise err(f"{name}({a.sql(dialect='spark')})", "its argument must be a GROUP BY key", n, sql)
    if isinstance(n, exp.GroupingId) and args != gs.keys:
        raise err("grouping_id() of other columns than GROUP BY's", "Spark requires every GROUP BY column, in "
                  "order ([GROUPING_ID_COLUMN_MISMATCH]); write grouping_id() or combine grouping() calls", n, sql)
    positions = [gs.keys.index(a) for a in args]
    values = [gs.bits(positions, s) for s in range(len(gs.sets))]
    if len(set(values)) == 1:
        value = str(values[0])
    else:
        whens = " ".join(f"WHEN {s} THEN {v}" for s, v in enumerate(values[:-1]))
        value = f"CASE `{set_column}` {whens} ELSE {values[-1]} END"
    typ = "TINYINT" if isinstance(n, exp.Grouping) else "BIGINT"
    return exp.maybe_parse(f"CAST({value} AS {typ})", dialect="spark")
