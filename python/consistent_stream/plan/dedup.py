"""Rule: ``ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..)`` filtered to 1 is a dedup.

The query computing the row number is planned as a :class:`~.logical.Dedup` (the first row
per partition) and its row number as the constant 1 (:func:`plan_dedup`), which is right
only because the query reading it keeps ``rn = 1`` alone: that condition is removed there
(:func:`take_rank_filters`), and a row number no enclosing query filters to 1 is an error
(:func:`check_ranks_filtered`). The passes talk through the ROW_NUMBER() registry of the
context, ``Lowering.rank_columns`` and ``Lowering.rank_filtered``.

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

from sqlglot import exp

from .expressions import has_aggregate, translate
from .logical import Dedup, Node, Project, SortKey
from .parse import err
from .scope import Lowering, Rel, output_names, quote


def take_rank_filters(lw: Lowering, where_conj: list[exp.Expression], rels: list[Rel]) -> list[exp.Expression]:
    """Remove ``alias.rn = 1`` conditions from ``where_conj`` (a query's WHERE conjuncts) on
    relations of ``rels`` whose ``rn`` is a ROW_NUMBER() (in ``lw.rank_columns``: planned as a
    dedup, so the condition always holds), and record those columns in ``lw.rank_filtered``.
    Returns the other conjuncts.

    Raises CompileError for a ranked relation without such a condition (other row numbers
    are not maintained).
    """
    for r in rels:
        ranked = [k for k, v in r.cols.items() if v in lw.rank_columns]
        if not ranked:
            continue
        hits = [c for c in where_conj if _is_eq_one(c, r.alias.lower(), ranked)]
        if not hits:
            raise err(f"window function ROW_NUMBER() in {r.alias}",
                      f"filter it to 1 in the query that reads it (WHERE {r.alias}.{ranked[0]} = 1): "
                      "only the first row per partition is maintained (dedup)",
                      lw.rank_columns[r.cols[ranked[0]]], lw.sql)
        where_conj = [c for c in where_conj if all(c is not h for h in hits)]
        lw.rank_filtered.update(r.cols[k] for k in ranked)
    return where_conj


def plan_dedup(lw: Lowering, sel: exp.Select, current: Node, scope: dict[tuple[str, str], str],
               windows: list[exp.Expression], top: bool) -> tuple[Node, list[tuple[str, str]]]:
    """``SELECT .., ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rn FROM ..`` (``sel``,
    whose FROM and WHERE are planned as ``current`` with columns ``scope``; ``windows``: its
    select-list items holding a window): a Dedup of the other columns (plus p and o as hidden
    columns); ``rn`` is the constant 1, valid because the enclosing query must keep only
    ``rn = 1``. Registers ``rn``'s internal column in ``lw.rank_columns``. Returns the node
    and the outputs ``[(name, internal column)]``.

    Raises CompileError for several windows, a window inside an expression, aggregates,
    GROUP BY, HAVING or DISTINCT in the same query, a model that is this query itself
    (``top``) and a window without ORDER BY.
    """
    w = windows[0]
    if (len(windows) > 1 or not isinstance(w, exp.Alias) or not isinstance(w.this, exp.Window)
            or sel.args.get("group") or sel.args.get("having") or sel.args.get("distinct")
            or any(has_aggregate(e) for e in sel.expressions)):
        raise err("window function ROW_NUMBER()", "write it as one select-list item "
                  "`ROW_NUMBER() OVER (PARTITION BY .. ORDER BY ..) AS rn` of a query without "
                  "aggregates or DISTINCT", w, lw.sql)
    if top:
        raise err("window function ROW_NUMBER()", "filter it to 1 in an enclosing query: only "
                  "the first row per partition is maintained (see the dedup_before_join macro)", w, lw.sql)
    win = w.this
    order = win.args.get("order")
    if order is None or not order.expressions:
        raise err("ROW_NUMBER() without ORDER BY", "say which row of a partition is kept", w, lw.sql)
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
    lw.rank_columns[rn] = w
    node = Project(columns=internal, child=dedup,
                   exprs=["CAST(1 AS INT)" if n == rn else quote(n) for n in internal])
    return node, list(zip(lowered, internal))


def check_ranks_filtered(lw: Lowering) -> None:
    """After the whole model is planned: raise CompileError for the first ROW_NUMBER()
    column of ``lw.rank_columns`` that no enclosing query filters to 1 (not in
    ``lw.rank_filtered``)."""
    for rn, window in lw.rank_columns.items():
        if rn not in lw.rank_filtered:
            raise err("window function ROW_NUMBER()", "filter it to 1 in the query that reads it "
                      "(FROM (..) d WHERE d.rn = 1): only the first row per partition is maintained",
                      window, lw.sql)


def _is_eq_one(c: exp.Expression, alias: str, cols: list[str]) -> bool:
    """``alias.col = 1`` (either order) for one of ``cols``."""
    if not isinstance(c, exp.EQ):
        return False
    for a, b in ((c.this, c.expression), (c.expression, c.this)):
        if (isinstance(a, exp.Column) and a.table.lower() == alias and a.name.lower() in cols
                and isinstance(b, exp.Literal) and not b.is_string and b.this == "1"):
            return True
    return False
