"""The recompute floor, DBSP's ``D . Q . I``: a query block ``Q`` without a delta rule of its own
(:class:`~consistent_stream.plan.logical.Recompute`) evaluated over its inputs' whole contents.

State: one arrangement per input, ``in<i>``, the input's Z-set (its integral ``I``), without a
key: every read reads all of it.

Delta rule, with ``I_old`` the inputs as of the previous batch and ``dI`` their changes:

    d(Q) = Q_t1(I_old + dI) - Q_t0(I_old)

each result row with weight +1 or -1, consolidated, so rows that did not move cancel; ``t0``
and ``t1`` are the two batches' instants, for a block that reads the clock. A batch that
changes no input and leaves the clock's values where they were has an empty change and reads
nothing. The first batch has no ``Q_t0`` term (the view did not exist). Each input reaches ``Q``
as a plain relation of its live rows (a row of weight w as w copies) under the names ``Q``
reads.

Example (``Q = SELECT g, percentile(x, 0.5) AS p FROM in0 GROUP BY g``): I_old = {(a, 1), (a,
3)}, dI = {(a, 5): +1} -> Q(I_old + dI) = {(a, 3)}, Q(I_old) = {(a, 2)}: d = {(a, 3): +1, (a, 2):
-1}.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..changelog import WEIGHT, Changelog, cols_sql, consolidate_sql, q
from .window import live_rows

W = q(WEIGHT)
_INPUT = re.compile(r"\b__cs_in(\d+)\b")


@dataclass
class RecomputeInput:
    """One input of a recomputed block: its change, its rows as of the previous batch (None:
    none), its ``(name in Q, column)`` pairs and whether it may hold a row twice."""
    delta: Changelog
    old: Changelog | None
    columns: list[tuple[str, str]]
    bag: bool


def _relation(rows: list[str], inp: RecomputeInput) -> str:
    """A FROM item of the live rows of the union of ``rows`` (FROM items of the input's Z-set)
    under the names ``Q`` reads."""
    cols = [c for _, c in inp.columns]
    c = cols_sql(cols + [WEIGHT])
    union = " UNION ALL ".join(f"SELECT {c} FROM {r}" for r in rows) if rows else \
        f"SELECT {c} FROM {inp.delta.sql} WHERE FALSE"
    named = ", ".join(f"{q(col)} AS {q(name)}" for name, col in inp.columns)
    return f"(SELECT {named} FROM ({live_rows(f'({union})', cols, inp.bag)}))"


def _query(sql: str, relations: list[str], columns: list[str], weight: int) -> str:
    body = _INPUT.sub(lambda m: relations[int(m.group(1))], sql)
    return f"SELECT {cols_sql(columns)}, CAST({weight} AS BIGINT) AS {W} FROM ({body}) AS `__q`({cols_sql(columns)})"


def recompute_delta(inputs: list[RecomputeInput], sql_now: str, sql_before: str | None,
                    columns: list[str]) -> str:
    """The block's change as a SELECT (``columns`` + ``__weight``, consolidated).
    ``sql_now``/``sql_before``: ``Q`` bound to this batch's and the previous batch's instant
    (None: no earlier version exists, the first batch). The caller skips a batch that changes
    no input and moves no clock value ``Q`` reads (its change is empty)."""
    new = [_relation([r for r in ((i.old.sql if i.old is not None else None),
                                  (None if i.delta.is_empty else i.delta.sql)) if r], i) for i in inputs]
    parts = [_query(sql_now, new, columns, 1)]
    if sql_before is not None:
        old = [_relation([i.old.sql] if i.old is not None else [], i) for i in inputs]
        parts.append(_query(sql_before, old, columns, -1))
    both = " UNION ALL ".join(f"SELECT * FROM ({p})" for p in parts)
    return consolidate_sql(f"({both})", columns)
