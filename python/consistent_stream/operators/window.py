"""Window functions and top-N under retractions: recompute the partitions a batch touches.

State: arrangement ``rows``, the input Z-set keyed by the partition columns (no key: the
whole input is one partition; a top-N over the whole input keys it by its first ORDER BY
column and reads only a prefix of it, :class:`TopPrefix`).

Delta rule, for the set P of partitions the batch's change touches:

    d(window(A)) = window(A_old|P + dA) - window(A_old|P)

where ``window`` evaluates the calls over the live rows of each partition (a row of weight w
counted w times, as batch evaluation sees w copies), keeps the node's rank range when it is a
top-N, and gives each output row weight 1; consolidated, so every row of a touched partition
whose value did not move cancels: a change below a top-N's boundary, or one that leaves a
running total's earlier rows alone, emits nothing for them. Any window function Spark
evaluates has this rule; its cost is the rows of the touched partitions (``rows recomputed``
in the run log), which for a window without PARTITION BY is the whole input.

Example (``ROW_NUMBER() OVER (PARTITION BY k ORDER BY x) AS rn``): A_old = {(k=1, x=5)},
dA = {(1, 3): +1} -> window(A_old|P + dA) = {(1, 3, rn 1), (1, 5, rn 2)}, window(A_old|P) =
{(1, 5, rn 1)}: d = {(1, 3, 1): +1, (1, 5, 2): +1, (1, 5, 1): -1}.

In: the input changelog (columns + ``__weight``), consolidated. Out: the input columns, one
column per call, ``__weight``; consolidated; None when the change is known to be empty.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..changelog import WEIGHT, Changelog, cols_sql, consolidate_sql, q
from .keyed import Lookup

W = q(WEIGHT)


def live_rows(relation: str, columns: list[str], bag: bool) -> str:
    """The live rows of a Z-set (``relation`` with data ``columns``) as a plain relation: each
    row of positive weight once, or ``bag``: as many times as its weight (a table with
    duplicates)."""
    live = f"SELECT * FROM ({consolidate_sql(relation, columns)}) WHERE {W} > 0"
    if not bag:
        return f"SELECT {cols_sql(columns)} FROM ({live})"
    return (f"SELECT {cols_sql(columns, 'l')} FROM ({live}) l "
            f"LATERAL VIEW explode(sequence(1, CAST(l.{W} AS INT))) `__copies` AS `__copy`")


def windowed(relation: str, columns: list[str], calls: list[tuple[str, str]], keep: str | None, bag: bool,
             weight: int = 1) -> str:
    """The calls ``[(name, window SQL)]`` over the live rows of ``relation``, each output row
    with ``__weight`` = ``weight``, only those ``keep`` (SQL over the calls' columns) holds
    when given."""
    sel = ", ".join([cols_sql(columns)] + [f"{sql} AS {q(name)}" for name, sql in calls])
    out = f"SELECT {sel} FROM ({live_rows(relation, columns, bag)})"
    if keep:
        out = f"SELECT * FROM ({out}) WHERE {keep}"
    names = columns + [n for n, _ in calls]
    return f"SELECT {cols_sql(names)}, CAST({weight} AS BIGINT) AS {W} FROM ({out})"


@dataclass(frozen=True)
class TopPrefix:
    """A top-N over the whole input (no PARTITION BY) whose rank range ends at ``hi``, ranked
    by ``ROW_NUMBER`` or ``RANK`` over an ORDER BY whose first key is ``column``: its state is
    kept in the order of ``column``, and a batch reads only a prefix of it. With R rows
    retracted by the change, the top ``hi`` of ``A_old + dA`` are among the rows of ``A_old``
    before any bound past which at least ``hi + R`` live rows lie (each later row keeps at
    least ``hi`` rows before it), so the rule over that prefix and ``dA`` is exact."""
    column: str
    descending: bool
    nulls_first: bool
    hi: int

    def need(self, delta: Changelog) -> int | None:
        """``hi`` plus the rows the change retracts (None: the change is not on the driver)."""
        if delta.arrow is None:
            return None
        import pyarrow.compute as pc
        w = delta.arrow.column(WEIGHT)
        return self.hi + int(pc.sum(pc.max_element_wise(pc.negate(w), 0)).as_py() or 0)


def window_delta(delta: Changelog, old: Lookup, partition: list[str], calls: list[tuple[str, str]],
                 keep: str | None, bag: bool, prefix: TopPrefix | None = None) -> tuple[str | None, Changelog | None]:
    """The window's output changelog for one batch, as a SELECT, and the old rows it read
    (``old``: the ``rows`` arrangement as of the previous batch; ``calls``: ``[(output column,
    window SQL)]``; ``keep``: the top-N's rank predicate; ``bag``: the input may hold a row more
    than once; ``prefix``: a top-N over the whole input, which reads only the prefix of its
    state :class:`TopPrefix` needs). ``(None, None)`` when the change is known to be empty."""
    if delta.is_empty:
        return None, None
    cols = delta.data_columns
    before = None
    if not old.empty:
        need = prefix.need(delta) if prefix is not None and not partition else None
        if partition:
            read = old.read(delta.keys(partition))
        elif need is not None:
            read = old.read_prefix(prefix.column, prefix.descending, prefix.nulls_first, need)
        else:
            read = old.read(None)
        before = None if read.is_empty else read
    out_cols = cols + [n for n, _ in calls]
    if before is None:
        return windowed(delta.sql, cols, calls, keep, bag), None
    c = cols_sql(cols + [WEIGHT])
    new = windowed(f"(SELECT {c} FROM {before.sql} UNION ALL SELECT {c} FROM {delta.sql})", cols, calls, keep, bag)
    old_out = windowed(before.sql, cols, calls, keep, bag, weight=-1)
    return consolidate_sql(f"(SELECT * FROM ({new}) UNION ALL SELECT * FROM ({old_out}))", out_cols), before
