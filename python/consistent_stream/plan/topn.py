"""Rule: ``ORDER BY .. LIMIT n [OFFSET m]`` as a top-N, and ``ORDER BY`` alone as nothing.

A Delta table has no row order (a CTAS has none either), so an ``ORDER BY`` without
``LIMIT`` changes no row of the view and is dropped, in the model and in its subqueries. With
``LIMIT``, the query's rows are ranked by ``ROW_NUMBER() OVER (ORDER BY <the keys>)`` and
ranks ``m+1 .. m+n`` kept: a :class:`~.logical.Window` whose ``keep`` is that range, over one
partition (the whole input). Rows whose ORDER BY values tie at the boundary are taken in the
order of their other columns (as :class:`~.logical.Dedup` breaks ties), which is one of the
answers the SQL allows, always the same.

ORDER BY keys are the query's outputs (by name, position or as the same expression) or, for
a query without DISTINCT, any expression its SELECT list could compute (hidden columns,
dropped after the top-N).

Example::

    select cid, sum(amount) as s from src.orders group by cid order by s desc limit 3

plans to (:func:`.logical.explain`, without the node ids; the Window line wrapped)::

    Project `cid` AS cid, `s` AS s
      Window ROW_NUMBER() OVER (ORDER BY `s` DESC NULLS LAST, `cid` ASC NULLS FIRST) AS __rank
             keep `__rank` >= 1 AND `__rank` <= 3
        Project `__g_cid` AS cid, `__a_sum` AS s
          Aggregate by ['`orders__cid`']: sum(`orders__amount`)
            Scan src.orders ['cid', 'amount']
"""
from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from .expressions import with_aliases
from .logical import Node, Project, RankRange, SortKey, Window, WindowCall
from .parse import err
from .scope import Lowering, quote


def limit_of(q: exp.Expression, sql: str) -> tuple[int, int] | None:
    """``(limit, offset)`` of the query ``q`` (None without LIMIT). Raises CompileError for a
    LIMIT or OFFSET that is not a non-negative integer literal."""
    lim = q.args.get("limit")
    if lim is None:
        return None
    off = q.args.get("offset")

    def value(node, what):
        v = node.expression if isinstance(node, (exp.Limit, exp.Offset)) else node
        if not (isinstance(v, exp.Literal) and not v.is_string and v.this.isdigit()):
            raise err(f"{what} {v.sql(dialect='spark')}", f"{what} takes a non-negative integer literal", node, sql)
        return int(v.this)
    return value(lim, "LIMIT"), (value(off, "OFFSET") if off is not None else 0)


def order_keys(lw: Lowering, q: exp.Expression, outputs: list[tuple[str, str]],
               hidden: Callable[[exp.Expression], str] | None) -> tuple[list[SortKey], list[tuple[str, str]]]:
    """The ORDER BY keys of ``q`` as columns: an output (``outputs``: ``[(name, internal
    column)]``) when the key names one (a qualified query's ORDER BY refers to an output by
    its name, positions and repeated expressions included), else a hidden column computed by
    ``hidden(expression)`` (Spark SQL over the query's input, the select list's aliases in it
    replaced by their expressions; None: not allowed). Returns the
    keys and the hidden columns ``[(column, expression)]``.

    Raises CompileError for a key that is not an output when ``hidden`` is None."""
    by_name = {n.lower(): c for n, c in outputs}
    keys, extra = [], []
    selects = q.expressions if isinstance(q, exp.Select) else []
    for o in q.args["order"].expressions:
        e = o.this
        col = None
        if isinstance(e, exp.Column) and not e.table and e.name.lower() in by_name:
            col = by_name[e.name.lower()]
        else:
            bare = e.unnest()
            for (_name, c), s in zip(outputs, selects):
                if (s.unalias() if isinstance(s, exp.Alias) else s).unnest() == bare:
                    col = c
        if col is None:
            if hidden is None:
                raise err(f"ORDER BY {e.sql(dialect='spark')}", "order a SELECT DISTINCT or a set operation by "
                          "its output columns", o, lw.sql)
            col = lw.names.new("__sort")
            extra.append((col, hidden(with_aliases(e, selects))))
        keys.append(SortKey(col, bool(o.args.get("desc")), o.args.get("nulls_first")))
    return keys, extra


def top_n(lw: Lowering, node: Node, keys: list[SortKey], limit: int, offset: int, visible: list[str]) -> Node:
    """The rows of ``node`` ranked ``offset + 1 .. offset + limit`` by ``keys`` (ties by the
    other columns), projected to the ``visible`` columns."""
    rank = lw.names.new("__rank")
    window = Window(columns=list(node.columns) + [rank], child=node, partition=[],
                    calls=[WindowCall(rank, "ROW_NUMBER()", tuple(keys), None, tiebreak=True)],
                    keep=RankRange(rank, offset + 1, offset + limit))
    return Project(columns=list(visible), child=window, exprs=[quote(c) for c in visible])


def model_top_n(sql: str) -> tuple[tuple[tuple[int, bool, bool], ...], bool] | None:
    """The outermost ``ORDER BY .. LIMIT`` of the model ``sql``, for comparing its results as
    SQL allows (:func:`consistent_stream.compare.compare_top_n`): its keys as ``(output column
    position, descending, NULLs first)`` and whether it has an OFFSET. None without one, or
    when a key is not an output column (then ties at the boundary cannot be told apart)."""
    import sqlglot
    q = sqlglot.parse_one(sql, read="spark")
    if q.args.get("order") is None or q.args.get("limit") is None:
        return None
    first = q
    while isinstance(first, (exp.SetOperation, exp.Subquery)):
        first = first.this
    items = list(first.expressions)
    names = [e.alias_or_name.lower() for e in items]
    keys = []
    for o in q.args["order"].expressions:
        e = o.this
        if isinstance(e, exp.Literal) and not e.is_string and e.this.isdigit():
            pos = int(e.this) - 1
        elif isinstance(e, exp.Column) and e.name.lower() in names:
            pos = names.index(e.name.lower())
        else:
            pos = next((i for i, s in enumerate(items) if (s.unalias() if isinstance(s, exp.Alias) else s) == e), None)
        if pos is None or not 0 <= pos < len(items):
            return None
        keys.append((pos, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
    return tuple(keys), q.args.get("offset") is not None
