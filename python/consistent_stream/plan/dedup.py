"""Rule: ``ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..)`` filtered to 1 is a dedup.

The query computing the row number is planned as a :class:`~.logical.Dedup` (the first row
per partition) and its row number as the constant 1 (:func:`plan_dedup`), which is right
only because the query reading it keeps ``rn = 1`` alone: that condition is removed there
(:func:`take_rank_filters`). A row number the query reading it keeps otherwise (``rn <= 3``,
or not at all) is a window function: the Dedup becomes a :class:`~.logical.Window` computing
it (:func:`as_window`), whose filter :func:`.windows.keep_ranks` turns into a top-N. The
passes talk through the ROW_NUMBER() registry of the context, ``Lowering.rank_columns``
(:class:`Ranked`) and ``Lowering.rank_filtered``.

Example::

    select oid, cid from (select oid, cid, row_number() over (partition by cid order by day desc) as rn
                          from src.orders) d where rn = 1

plans to (:func:`.logical.explain`)::

    Project `oid` AS oid, `cid` AS cid
      Project `oid` AS oid, `cid` AS cid
        Dedup first by (__order desc) per ['__part']
          Project `orders__oid` AS oid, `orders__cid` AS cid, `orders__cid` AS __part, `orders__day` AS __order
            Scan src.orders ['oid', 'cid', 'day']
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from .clock import uses_clock
from .expressions import has_aggregate, translate
from .logical import Dedup, Node, Project, SortKey, Window, WindowCall
from .parse import no_rule
from .scope import Lowering, Rel, output_names, quote


@dataclass
class Ranked:
    """A query planned as a dedup (:func:`plan_dedup`): its top projection, the Dedup below it,
    the row number's internal column and its window expression (for error positions)."""
    project: Project
    dedup: Dedup
    rn: str
    window: exp.Expression


def is_dedup(sel: exp.Select, windows: list[exp.Window], top: bool) -> bool:
    """Whether ``sel`` has the dedup shape: one SELECT-list item ``ROW_NUMBER() OVER
    (PARTITION BY .. ORDER BY ..) AS rn`` and no aggregates, GROUP BY, HAVING, DISTINCT,
    QUALIFY or ORDER BY, in a query an enclosing query reads (not the model itself)."""
    if top or len(windows) != 1 or any(sel.args.get(k) for k in ("group", "having", "distinct", "qualify", "order")):
        return False
    w = windows[0]
    item = w.parent
    return (isinstance(item, exp.Alias) and any(item is e for e in sel.expressions)
            and isinstance(w.this, exp.RowNumber) and w.args.get("order") is not None
            and bool(w.args["order"].expressions) and not any(has_aggregate(e) for e in sel.expressions))


def take_rank_filters(lw: Lowering, where_conj: list[exp.Expression], rels: list[Rel]) -> list[exp.Expression]:
    """Remove ``alias.rn = 1`` conditions from ``where_conj`` (a query's WHERE conjuncts) on
    relations of ``rels`` whose ``rn`` is a ROW_NUMBER() planned as a dedup (in
    ``lw.rank_columns``, so the condition always holds), and record those columns in
    ``lw.rank_filtered``. A ranked relation without such a condition becomes a Window
    (:func:`as_window`; its conditions stay). Returns the other conjuncts."""
    for r in rels:
        ranked = [k for k, v in r.cols.items() if v in lw.rank_columns]
        if not ranked:
            continue
        hits = [c for c in where_conj if _is_eq_one(c, r.alias.lower(), ranked)]
        if hits:
            where_conj = [c for c in where_conj if all(c is not h for h in hits)]
        else:
            for k in ranked:
                as_window(lw, lw.rank_columns[r.cols[k]])
        lw.rank_filtered.update(r.cols[k] for k in ranked)
    return where_conj


def as_window(lw: Lowering, ranked: Ranked) -> None:
    """Turn a query planned as a dedup into one computing its row number with a Window (in
    place): ``ROW_NUMBER() OVER (PARTITION BY <the partition> ORDER BY <the order>, <the other
    columns>)``, which breaks ties as the Dedup did."""
    d = ranked.dedup
    call = WindowCall(lw.names.new("__w"), "ROW_NUMBER()", tuple(d.order), None, tiebreak=True)
    ranked.project.child = Window(columns=list(d.columns) + [call.name], child=d.child,
                                  partition=list(d.partition), calls=[call])
    ranked.project.exprs[ranked.project.columns.index(ranked.rn)] = quote(call.name)


def plan_dedup(lw: Lowering, sel: exp.Select, current: Node, scope: dict[tuple[str, str], str],
               windows: list[exp.Expression], top: bool) -> tuple[Node, list[tuple[str, str]]]:
    """``SELECT .., ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rn FROM ..`` (``sel``,
    whose FROM and WHERE are planned as ``current`` with columns ``scope``; ``windows``: its
    one window expression): a Dedup of the other columns (plus p and o as hidden
    columns); ``rn`` is the constant 1, valid because the enclosing query must keep only
    ``rn = 1``. Registers ``rn``'s internal column in ``lw.rank_columns``. Returns the node
    and the outputs ``[(name, internal column)]``.

    ``sel`` has the shape :func:`is_dedup` checks. Raises NoDeltaRule for a partition or order
    that reads the clock.
    """
    w = windows[0].parent
    win = w.this
    order = win.args.get("order")
    if uses_clock(win):
        raise no_rule("current_date()/current_timestamp() in a window function",
                      "compute it in a filter or the select list", win, lw.sql)
    lowered, internal = output_names(lw, sel, sel.expressions, top)
    visible = [(n, e) for n, e in zip(internal, sel.expressions) if e is not w]
    pcols = [lw.names.new("__part") for _ in win.args.get("partition_by") or []]
    ocols = [lw.names.new("__order") for _ in order.expressions]
    exprs = ([translate(e.unalias() if isinstance(e, exp.Alias) else e, scope, lw.sql) for _, e in visible]
             + [translate(p, scope, lw.sql) for p in win.args.get("partition_by") or []]
             + [translate(o.this, scope, lw.sql) for o in order.expressions])
    pre = Project(columns=[n for n, _ in visible] + pcols + ocols, child=current, exprs=exprs)
    keys = [SortKey(c, bool(o.args.get("desc")), o.args.get("nulls_first"))
            for c, o in zip(ocols, order.expressions)]
    dedup = Dedup(columns=list(pre.columns), child=pre, partition=pcols, order=keys)
    rn = internal[sel.expressions.index(w)]
    node = Project(columns=internal, child=dedup,
                   exprs=["CAST(1 AS INT)" if n == rn else quote(n) for n in internal])
    lw.rank_columns[rn] = Ranked(node, dedup, rn, w)
    return node, list(zip(lowered, internal))


def check_ranks_filtered(lw: Lowering) -> None:
    """After the whole model is planned: every ROW_NUMBER() planned as a dedup that no query
    read through its FROM clause (:func:`take_rank_filters`) becomes a Window (:func:`as_window`)."""
    for rn, ranked in lw.rank_columns.items():
        if rn not in lw.rank_filtered:
            as_window(lw, ranked)
            lw.rank_filtered.add(rn)


def _is_eq_one(c: exp.Expression, alias: str, cols: list[str]) -> bool:
    """``alias.col = 1`` (either order) for one of ``cols``."""
    if not isinstance(c, exp.EQ):
        return False
    for a, b in ((c.this, c.expression), (c.expression, c.this)):
        if (isinstance(a, exp.Column) and a.table.lower() == alias and a.name.lower() in cols
                and isinstance(b, exp.Literal) and not b.is_string and b.this == "1"):
            return True
    return False
