"""Rule: window functions as :class:`~.logical.Window` operators, and ranking filters as top-Ns.

A query's window expressions (in its SELECT list, QUALIFY and ORDER BY) are computed after
its WHERE, GROUP BY and HAVING (:func:`plan_windows`): their PARTITION BY and ORDER BY
expressions and arguments are columns of a projection below, and the calls sharing one set of
partition columns are one Window (its state is keyed by them: a batch recomputes the
partitions it touches). Each window expression is marked with the column holding its value
(``meta[WINDOW_VALUE]``), which :func:`.expressions.translate` reads, so the expressions above
refer to it.

Ties. A function whose result depends on the order of rows whose ORDER BY values tie
(``ROW_NUMBER``, ``NTILE``, ``LAG``, ``LEAD``, ``FIRST_VALUE``, ``NTH_VALUE`` and ``LAST_VALUE``
with a frame ending at the partition's end, and any ROWS frame) has its ORDER BY completed
by the other columns, ascending (:attr:`.logical.WindowCall.tiebreak`): Spark's answer is
then one of those it may give, always the same. ``LAST_VALUE`` and ``NTH_VALUE`` over a RANGE
frame that ends at the current row cannot be completed so (the frame would change); they are
refused unless the ORDER BY and PARTITION BY cover a unique key of the input.

Top-N (:func:`keep_ranks`, after lowering): a filter on a ``ROW_NUMBER``, ``RANK`` or
``DENSE_RANK`` column (``rn <= 3``, ``rn = 1``, ``rn BETWEEN 2 AND 5``, through projections
and filters, as QUALIFY or an enclosing WHERE writes it) becomes the Window's rank range
(``keep``): the Window's output holds only those rows, so a change below the boundary costs
nothing downstream.

Example::

    select k, x, rank() over (partition by k order by x desc) as r from src.a qualify r <= 2

plans to (:func:`.logical.explain`)::

    Project `a__k` AS k, `a__x` AS x, `__w` AS r
      Filter `__w` <= 2
        Window RANK() OVER (PARTITION BY `a__k` ORDER BY `a__x` DESC NULLS LAST) AS __w keep `__w` >= 1 AND `__w` <= 2
          Scan src.a ['k', 'x']
"""
from __future__ import annotations

from collections.abc import Callable

import sqlglot
from sqlglot import exp

from .clock import uses_clock
from .expressions import WINDOW_VALUE, conjuncts, own
from .logical import Filter, Node, Project, RankRange, SortKey, Window, WindowCall, plain_column
from .parse import err, no_rule
from .scope import Lowering, quote

Translate = Callable[[exp.Expression], str]
"""Spark SQL text of an expression over the columns of the plan built so far."""

_TIEBREAK = (exp.RowNumber, exp.Ntile, exp.Lag, exp.Lead)
_VALUE = (exp.FirstValue, exp.LastValue, exp.NthValue)
_NEEDS_ORDER = (exp.RowNumber, exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist, exp.Ntile, exp.Lag, exp.Lead)
RANKING = ("ROW_NUMBER()", "RANK()", "DENSE_RANK()")
"""Window functions whose filter by a constant range is a top-N (:func:`keep_ranks`)."""


def query_windows(sel: exp.Select) -> list[exp.Window]:
    """The window expressions of ``sel``'s own scope: SELECT list, QUALIFY and ORDER BY,
    each distinct expression once (in order)."""
    found: list[exp.Window] = []
    parts = list(sel.expressions)
    for key in ("qualify", "order"):
        if sel.args.get(key) is not None:
            parts.append(sel.args[key])
    for part in parts:
        for w in own(part, exp.Window):
            if all(w is not f for f in found):
                found.append(w)
    return found


def _function(w: exp.Window) -> exp.Expression:
    f = w.this
    while isinstance(f, (exp.IgnoreNulls, exp.RespectNulls)):
        f = f.this
    return f


def _frame(w: exp.Window) -> tuple[str | None, str | None, str | None]:
    """``(kind, start, end)`` of the window's frame (lower case; None without one)."""
    spec = w.args.get("spec")
    if spec is None:
        return None, None, None
    start = spec.args.get("start")
    end = spec.args.get("end")
    s = f"{start.sql() if isinstance(start, exp.Expression) else start} {spec.args.get('start_side') or ''}".strip()
    e = f"{end.sql() if isinstance(end, exp.Expression) else end} {spec.args.get('end_side') or ''}".strip()
    return str(spec.args.get("kind") or "").lower(), s.lower(), e.lower() if end is not None else "current row"


def _needs_tiebreak(w: exp.Window, covered: bool, sql: str) -> tuple[bool, str | None]:
    """Whether the window's ORDER BY must be completed by the other columns, and the frame
    it runs with then (see the module docstring). Raises CompileError for a function that
    cannot be made deterministic."""
    f = _function(w)
    kind, start, end = _frame(w)
    ordered = w.args.get("order") is not None and bool(w.args["order"].expressions)
    frame = w.args["spec"].sql(dialect="spark") if w.args.get("spec") is not None else None
    if covered:
        return False, frame
    if isinstance(f, _TIEBREAK):
        return True, frame
    if isinstance(f, _VALUE) or kind == "rows":
        if not ordered:   # the whole partition in an arbitrary order: one made up, the frame kept whole
            return True, frame or "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING"
        if kind == "rows" or (start == "unbounded preceding" and end == "unbounded following"):
            return True, frame
        if isinstance(f, exp.FirstValue) and (kind is None or start == "unbounded preceding"):
            return True, frame
        name = f.sql_name() if hasattr(f, "sql_name") else type(f).__name__
        raise err(f"{name.upper()}() over a RANGE frame ending at the current row",
                  "rows whose ORDER BY values tie make its value depend on the engine's order: add "
                  "columns to its ORDER BY that make it unique, or use a ROWS frame", w, sql)
    return False, frame


def plan_windows(lw: Lowering, current: Node, windows: list[exp.Window], tr: Translate,
                 unique: list[frozenset[str]]) -> Node:
    """Window operators computing ``windows`` over ``current`` (whose expressions ``tr``
    translates; ``unique``: its unique keys, as column sets): a projection of their partition
    and order expressions, then one Window per set of partition columns. Marks each window
    expression with its value column (``meta[WINDOW_VALUE]``). Returns the top node (its
    columns: ``current``'s, the projected ones and the calls').

    Raises NoDeltaRule for a window that reads the clock, CompileError for a ranking or offset
    function without ORDER BY (Spark refuses it too) and one that cannot be made deterministic
    (:func:`_needs_tiebreak`)."""
    cols, exprs = list(current.columns), [quote(c) for c in current.columns]
    by_expr = {quote(c): c for c in current.columns}

    def column(e: exp.Expression, base: str) -> str:
        sql = tr(e)
        if sql not in by_expr:
            name = lw.names.new(base)
            by_expr[sql] = name
            cols.append(name)
            exprs.append(sql)
        return by_expr[sql]

    groups: dict[tuple[str, ...], list[WindowCall]] = {}
    seen: list[tuple[exp.Window, str]] = []
    for w in windows:
        same = next((name for other, name in seen if other == w), None)
        if same is not None:
            w.meta[WINDOW_VALUE] = same
            continue
        if uses_clock(w):
            raise no_rule("current_date()/current_timestamp() in a window function",
                          "compute it in a filter or the select list", w, lw.sql)
        ordered = w.args.get("order") is not None and bool(w.args["order"].expressions)
        if isinstance(_function(w), _NEEDS_ORDER) and not ordered:
            name = _function(w).sql_name() if hasattr(_function(w), "sql_name") else "window function"
            raise err(f"{name.upper()}() without ORDER BY", "a ranking or offset window function needs an ORDER "
                      "BY that says the order of each partition's rows", w, lw.sql)
        part = tuple(column(p, "__wp") for p in w.args.get("partition_by") or [])
        order = tuple(SortKey(column(o.this, "__wo"), bool(o.args.get("desc")), o.args.get("nulls_first"))
                      for o in (w.args["order"].expressions if w.args.get("order") is not None else []))
        covered = any(k <= set(part) | {o.column for o in order} for k in unique)
        tiebreak, frame = _needs_tiebreak(w, covered, lw.sql)
        name = lw.names.new("__w")
        call = WindowCall(name, tr(w.this), order, frame, tiebreak)
        groups.setdefault(tuple(sorted(set(part))), []).append(call)
        w.meta[WINDOW_VALUE] = name
        seen.append((w, name))
    node: Node = current
    if len(cols) > len(current.columns):
        node = Project(columns=cols, child=current, exprs=exprs)
    for part, calls in groups.items():
        node = Window(columns=list(node.columns) + [c.name for c in calls], child=node, partition=list(part),
                      calls=calls)
    return node


def _rank_bounds(c: exp.Expression) -> tuple[str, int | None, int | None] | None:
    """``(column, lo, hi)`` when the conjunct ``c`` bounds a plain column by integer literals."""
    def lit(e):
        if isinstance(e, exp.Literal) and not e.is_string and e.this.lstrip("-").isdigit():
            return int(e.this)
        return None

    def col(e):
        return e.name if isinstance(e, exp.Column) and not e.table else None
    if isinstance(c, exp.Between) and col(c.this) and lit(c.args["low"]) is not None \
            and lit(c.args["high"]) is not None:
        return col(c.this), lit(c.args["low"]), lit(c.args["high"])
    flip = {exp.LT: exp.GT, exp.LTE: exp.GTE, exp.GT: exp.LT, exp.GTE: exp.LTE, exp.EQ: exp.EQ}
    if type(c) not in flip:
        return None
    a, b, typ = c.this, c.expression, type(c)
    if col(a) is None:
        a, b, typ = b, a, flip[typ]
    name, v = col(a), lit(b)
    if name is None or v is None:
        return None
    return {exp.EQ: (name, v, v), exp.LT: (name, None, v - 1), exp.LTE: (name, None, v),
            exp.GT: (name, v + 1, None), exp.GTE: (name, v, None)}[typ]


def _window_of(node: Node, column: str) -> tuple[Window, str] | None:
    """The Window and call producing ``column`` of ``node``, followed down through filters
    and projections that pass it on unchanged (None when anything else is in between)."""
    while True:
        if isinstance(node, Filter):
            node = node.child
        elif isinstance(node, Project):
            src = plain_column(node.exprs[node.columns.index(column)]) if column in node.columns else None
            if src is None:
                return None
            node, column = node.child, src
        elif isinstance(node, Window):   # (a Window below another would compute over fewer rows)
            return (node, column) if any(c.name == column for c in node.calls) else None
        else:
            return None


def keep_ranks(node: Node) -> None:
    """Set the rank range of every Window whose ranking column a filter above it bounds by
    constants (see the module docstring), in place below ``node``."""
    for c in node.children:
        keep_ranks(c)
    if not isinstance(node, Filter):
        return
    bounds: dict[str, tuple[int, int | None]] = {}
    for c in conjuncts(sqlglot.parse_one(node.predicate, read="spark")):
        b = _rank_bounds(c)
        if b is None:
            continue
        name, lo, hi = b
        cur_lo, cur_hi = bounds.get(name, (1, None))
        lo = max(cur_lo, lo if lo is not None else 1)
        hi = hi if cur_hi is None else (cur_hi if hi is None else min(cur_hi, hi))
        bounds[name] = (lo, hi)
    for name, (lo, hi) in bounds.items():
        found = _window_of(node.child, name)
        if found is None:
            continue
        window, call = found
        func = next(c.func for c in window.calls if c.name == call)
        if func.upper() in RANKING and window.keep is None:
            window.keep = RankRange(call, lo, hi)
