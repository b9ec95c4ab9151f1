"""Rule: the FROM clause's joins, with predicate pushdown.

WHERE conditions on one relation are pushed into it (not into the null-supplying side of an
outer join); equalities between the two sides of a join become its keys (for inner joins
also those written in WHERE: comma joins); other ON conditions are the join's residual,
except those on the null-supplying side alone, which are pushed into that side. RIGHT joins
are planned as mirrored LEFT joins; LEFT SEMI/ANTI joins hide their right side. Inner joins
listed in an order that leaves a relation without an equality to the ones before it are
reordered by their equalities (:func:`_reordered`); a join without any equality is a cross
or theta join, on one constant key, whose condition (in ON or, for an inner join, in WHERE)
is its residual; its comparisons of one side with the other (``<``, ``<=``, ``>``, ``>=``,
``BETWEEN``) are its bands, by which each side's state is read in ranges (a range join,
:mod:`consistent_stream.operators.join`). A condition that reads the clock is a filter above
an inner join.

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

from .clock import uses_clock
from .expressions import aliases, conjuncts, translate
from .logical import FLIPPED, Band, Filter, Join, Node
from .parse import err, no_rule
from .scope import Lowering, Rel


def plan_from_clause(lw: Lowering, joins: list[exp.Join], rels: list[Rel],
                     where_conj: list[exp.Expression]) -> tuple[Node, dict[tuple[str, str], str], list[exp.Expression]]:
    """Join ``rels`` (the planned relations of FROM, then of each of ``joins``) left to right.

    ``where_conj``: the WHERE conjuncts without subqueries. Pushes the single-relation ones
    into their relation (replacing ``Rel.node`` of ``rels``) and takes the join keys of inner
    joins from them. Returns the joined node, its scope (semi and anti joins' right sides not
    visible) and the conjuncts left for a Filter above the joins.

    Inner joins whose FROM order leaves a relation without an equality to the ones before it
    are reordered (:func:`_reordered`).

    Raises CompileError for JOIN .. USING and a subquery in a join condition.
    """
    null_supplied, hidden = _join_sides(lw, joins, rels)
    where_conj = _push_down(lw, where_conj, rels, null_supplied)
    if not _connected(joins, rels, where_conj):
        joins, rels, where_conj = _reordered(joins, rels, where_conj)
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


def _inner(j: exp.Join) -> bool:
    return (j.side or "") == "" and (j.kind or "").upper() not in ("SEMI", "ANTI")


def _connects(c: exp.Expression, left: set[str], right: str) -> bool:
    return equi(c, left, right) is not None


def _connected(joins: list[exp.Join], rels: list[Rel], where_conj: list[exp.Expression]) -> bool:
    """Whether every join, in FROM order, has an equality with the relations before it (in
    its ON, or for an inner join in WHERE): the plan then joins in that order."""
    left = {rels[0].alias.lower()}
    for j, r in zip(joins, rels[1:]):
        on = list(conjuncts(j.args["on"])) if j.args.get("on") else []
        if not any(_connects(c, left, r.alias.lower()) for c in on + (where_conj if _inner(j) else [])):
            return False
        left.add(r.alias.lower())
    return True


def _reordered(joins: list[exp.Join], rels: list[Rel], where_conj: list[exp.Expression]):
    """Inner joins whose FROM order leaves a relation without an equality to those before it
    (``FROM part, supplier, partsupp WHERE p_partkey = ps_partkey AND s_suppkey = ps_suppkey``)
    in an order where each joins the ones before on an equality, as Spark's optimizer reorders
    them: repeatedly the first relation in FROM order that has one; when none has, the next in
    FROM order (a cross join). The ON conditions of inner joins are WHERE conditions, so they
    join the WHERE conjuncts. Returns ``(joins, rels, where_conj)``; unchanged when a join is
    not inner (an outer, semi or anti join fixes the order)."""
    if not all(_inner(j) for j in joins):
        return joins, rels, where_conj
    conds = list(where_conj) + [c for j in joins if j.args.get("on") for c in conjuncts(j.args["on"])]
    order, left, todo = [rels[0]], {rels[0].alias.lower()}, list(rels[1:])
    while todo:
        r = next((r for r in todo if any(_connects(c, left, r.alias.lower()) for c in conds)), todo[0])
        todo.remove(r)
        order.append(r)
        left.add(r.alias.lower())
    return [exp.Join(this=exp.table_(r.alias)) for r in order[1:]], order, conds


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

    A join without an equality (a cross or theta join) joins every pair of rows on one
    constant key, its condition the residual: each side's change meets the other side's whole
    state.

    Raises CompileError for a subquery in ON.
    """
    ra = r.alias.lower()
    rscope = {(ra, k): v for k, v in r.cols.items()}
    side, kind = (j.side or "").upper(), (j.kind or "").upper()
    on = list(conjuncts(j.args["on"])) if j.args.get("on") else []
    inner = side == "" and kind not in ("SEMI", "ANTI")
    lkeys, rkeys, residual = [], [], []
    for c in on + (where_conj if inner else []):
        pair = None if uses_clock(c) else equi(c, left_aliases, ra)
        if pair is not None:
            lkeys.append(translate(pair[0], scope, lw.sql))
            rkeys.append(translate(pair[1], rscope, lw.sql))
            if inner:
                where_conj = [w for w in where_conj if w is not c]
        elif any(c is o for o in on):
            if c.find(exp.Subquery, exp.Exists):
                raise no_rule("subquery in a join condition", "move it to WHERE", c, lw.sql)
            if uses_clock(c):   # a temporal filter: above an inner join, where it means the same
                if not inner:
                    raise no_rule("current_date()/current_timestamp() in an outer join's condition",
                                  "filter the joined side in a derived table instead", c, lw.sql)
                where_conj = where_conj + [c]
                continue
            residual.append(c)
    bands: list[Band] = []
    if not lkeys and inner:   # a theta join: WHERE conditions over both sides are its condition
        both = [c for c in where_conj if aliases(c) <= left_aliases | {ra} and aliases(c) & {ra}
                and aliases(c) & left_aliases and not uses_clock(c) and not c.find(exp.Subquery, exp.Exists)
                and not c.find(exp.AggFunc)]
        residual += both
        where_conj = [w for w in where_conj if all(w is not c for c in both)]
        bands = [b for c in residual for b in _bands(lw, c, scope, left_aliases, rscope, ra)]
    if not lkeys:   # a cross join (and a theta join: its condition the residual): one key for all rows
        lkeys, rkeys = ["1"], ["1"]
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
                left_keys=lkeys, right_keys=rkeys, residual=res_sql, bands=bands), where_conj


_OPS = {exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}


def _bands(lw: Lowering, c: exp.Expression, scope: dict, left_aliases: set[str], rscope: dict,
           ra: str) -> list[Band]:
    """The bands of the join condition ``c`` (:class:`.logical.Band`): a comparison
    ``<, <=, >, >=`` or a ``BETWEEN`` whose one side reads only the left relations and the
    other only the right one (``ra``); none for anything else."""
    if isinstance(c, exp.Between):
        return [b for part in (exp.GTE(this=c.this.copy(), expression=c.args["low"].copy()),
                               exp.LTE(this=c.this.copy(), expression=c.args["high"].copy()))
                for b in _bands(lw, part, scope, left_aliases, rscope, ra)]
    op = _OPS.get(type(c))
    if op is None:
        return []
    a, b = c.this, c.expression
    aa, ba = aliases(a), aliases(b)
    if aa and aa <= left_aliases and ba == {ra}:
        return [Band(translate(a, scope, lw.sql), op, translate(b, rscope, lw.sql))]
    if ba and ba <= left_aliases and aa == {ra}:
        return [Band(translate(b, scope, lw.sql), FLIPPED[op], translate(a, rscope, lw.sql))]
    return []


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
