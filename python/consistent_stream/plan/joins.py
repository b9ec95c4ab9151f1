"""Rule: the FROM clause's joins, with predicate pushdown.

WHERE conditions on one relation are pushed into it (not into the null-supplying side of an
outer join); equalities between the two sides of a join become its keys (for inner joins
also those written in WHERE: comma joins); other ON conditions are the join's residual,
except those on the null-supplying side alone, which are pushed into that side. RIGHT joins
are planned as mirrored LEFT joins; LEFT SEMI/ANTI joins hide their right side.

Example::

    select o.oid, c.name from src.orders o, src.customers c where o.cid = c.id and o.amount > 1

plans to (:func:`.logical.explain`)::

    Project `o__oid` AS oid, `c__name` AS name
      Join inner on `o__cid` = `c__id`
        Project `o__oid` AS o__oid, `o__cid` AS o__cid
          Filter `o__amount` > 1
            Scan src.orders ['oid', 'cid', 'amount']
        Scan src.customers ['id', 'name']
"""
from __future__ import annotations

from sqlglot import exp

from .expressions import aliases, conjuncts, translate
from .logical import Filter, Join, Node
from .parse import err
from .scope import Lowering, Rel


def plan_from_clause(lw: Lowering, joins: list[exp.Join], rels: list[Rel],
                     where_conj: list[exp.Expression]) -> tuple[Node, dict[tuple[str, str], str], list[exp.Expression]]:
    """Join ``rels`` (the planned relations of FROM, then of each of ``joins``) left to right.

    ``where_conj``: the WHERE conjuncts without subqueries. Pushes the single-relation ones
    into their relation (replacing ``Rel.node`` of ``rels``) and takes the join keys of inner
    joins from them. Returns the joined node, its scope (semi and anti joins' right sides not
    visible) and the conjuncts left for a Filter above the joins.

    Raises CompileError for JOIN .. USING, a join without an equality between its sides and a
    subquery in a join condition.
    """
    null_supplied, hidden = _join_sides(lw, joins, rels)
    where_conj = _push_down(lw, where_conj, rels, null_supplied)
    scope: dict[tuple[str, str], str] = {}
    for k, v in rels[0].cols.items():
        scope[(rels[0].alias.lower(), k)] = v
    current = rels[0].node
    left_aliases = {rels[0].alias.lower()}
    for j, r in zip(joins, rels[1:]):
        current, where_conj = plan_join(lw, j, r, current, scope, left_aliases, where_conj)
        if r.alias.lower() not in hidden:
            scope.update({(r.alias.lower(), k): v for k, v in r.cols.items()})
            left_aliases.add(r.alias.lower())
    return current, scope, where_conj


def _join_sides(lw: Lowering, joins: list[exp.Join], rels: list[Rel]) -> tuple[set[str], set[str]]:
    """The aliases of ``rels`` on the null-supplying side of an outer join, and those on the
    right of a semi or anti join (not visible after it)."""
    null_supplied: set[str] = set()
    hidden: set[str] = set()  # right sides of semi/anti joins: not visible after the join
    for i, j in enumerate(joins):
        side, kind = (j.side or "").upper(), (j.kind or "").upper()
        if j.args.get("using"):
            raise err("JOIN .. USING", "not supported yet; write the equality in ON", j, lw.sql)
        if kind in ("SEMI", "ANTI"):
            hidden.add(rels[i + 1].alias.lower())
        elif side == "LEFT":
            null_supplied.add(rels[i + 1].alias.lower())
        elif side == "RIGHT":
            null_supplied.update(r.alias.lower() for r in rels[: i + 1])
        elif side == "FULL":
            null_supplied.update(r.alias.lower() for r in rels[: i + 2])
    return null_supplied, hidden


def _push_down(lw: Lowering, where_conj: list[exp.Expression], rels: list[Rel],
               null_supplied: set[str]) -> list[exp.Expression]:
    """Push single-relation WHERE predicates into their relation (a Filter over its node),
    not below outer joins; returns the others."""
    by_alias = {r.alias.lower(): r for r in rels}
    remaining = []
    for c in where_conj:
        al = aliases(c)
        if (len(al) == 1 and next(iter(al)) in by_alias and next(iter(al)) not in null_supplied
                and not c.find(exp.AggFunc, exp.Subquery)):
            r = by_alias[next(iter(al))]
            r.node = Filter(columns=r.node.columns, child=r.node,
                            predicate=translate(c, {(r.alias.lower(), k): v for k, v in r.cols.items()}, lw.sql))
        else:
            remaining.append(c)
    return remaining


def plan_join(lw: Lowering, j: exp.Join, r: Rel, current: Node, scope: dict[tuple[str, str], str],
              left_aliases: set[str], where_conj: list[exp.Expression]) -> tuple[Node, list[exp.Expression]]:
    """One JOIN ``j`` of relation ``r`` onto the plan so far (``current``, whose columns are
    ``scope``, with relations ``left_aliases``). Equalities between the two sides become
    the join keys (for an inner join also those in ``where_conj``, which are removed from
    it); every other ON condition is the residual, except that a condition on the
    null-supplying side alone is pushed into that side. Returns the Join and the WHERE
    conjuncts left.

    Raises CompileError for a join without an equality and for a subquery in ON.
    """
    ra = r.alias.lower()
    rscope = {(ra, k): v for k, v in r.cols.items()}
    side, kind = (j.side or "").upper(), (j.kind or "").upper()
    on = list(conjuncts(j.args["on"])) if j.args.get("on") else []
    inner = side == "" and kind not in ("SEMI", "ANTI")
    lkeys, rkeys, residual = [], [], []
    for c in on + (where_conj if inner else []):
        pair = equi(c, left_aliases, ra)
        if pair is not None:
            lkeys.append(translate(pair[0], scope, lw.sql))
            rkeys.append(translate(pair[1], rscope, lw.sql))
            if inner:
                where_conj = [w for w in where_conj if w is not c]
        elif any(c is o for o in on):
            if c.find(exp.Subquery, exp.Exists):
                raise err("subquery in a join condition", "move it to WHERE", c, lw.sql)
            residual.append(c)
    if not lkeys:
        raise err("join without an equality condition", "every join needs at least one "
                  "`left_column = right_column` condition (cross and theta joins are not maintained)",
                  j, lw.sql)
    left_node, right_node = current, r.node
    if side == "LEFT" and kind not in ("SEMI", "ANTI"):
        pushed = [c for c in residual if aliases(c) <= {ra}]
        if pushed:
            right_node = Filter(columns=right_node.columns, child=right_node,
                                predicate=" AND ".join(translate(c, rscope, lw.sql) for c in pushed))
        residual = [c for c in residual if all(c is not p for p in pushed)]
    elif side == "RIGHT":
        pushed = [c for c in residual if aliases(c) <= left_aliases]
        if pushed:
            left_node = Filter(columns=left_node.columns, child=left_node,
                               predicate=" AND ".join(translate(c, scope, lw.sql) for c in pushed))
        residual = [c for c in residual if all(c is not p for p in pushed)]
    res_sql = " AND ".join(translate(c, {**scope, **rscope}, lw.sql) for c in residual) or None
    if side == "RIGHT":
        return Join(columns=right_node.columns + left_node.columns, left=right_node, right=left_node,
                    kind="left", left_keys=rkeys, right_keys=lkeys, residual=res_sql), where_conj
    if kind in ("SEMI", "ANTI"):
        return Join(columns=list(left_node.columns), left=left_node, right=right_node, kind=kind.lower(),
                    left_keys=lkeys, right_keys=rkeys, residual=res_sql), where_conj
    return Join(columns=left_node.columns + right_node.columns, left=left_node, right=right_node,
                kind={"LEFT": "left", "FULL": "full"}.get(side, "inner"),
                left_keys=lkeys, right_keys=rkeys, residual=res_sql), where_conj


def equi(c: exp.Expression, left_aliases: set[str],
         right_aliases: str | set[str]) -> tuple[exp.Expression, exp.Expression] | None:
    """``(left expr, right expr)`` when ``c`` is an equality between an expression over
    ``left_aliases`` only and one over ``right_aliases`` only (either order), else None."""
    right_aliases = {right_aliases} if isinstance(right_aliases, str) else right_aliases
    if not isinstance(c, exp.EQ):
        return None
    a, b = c.this, c.expression
    aa, ba = aliases(a), aliases(b)
    if aa and aa <= left_aliases and ba and ba <= right_aliases:
        return a, b
    if ba and ba <= left_aliases and aa and aa <= right_aliases:
        return b, a
    return None
