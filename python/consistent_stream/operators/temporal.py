"""Temporal filters and projections: operators whose expressions read the clock, evaluated at
each batch's instant (:mod:`consistent_stream.plan.clock`).

For a filter ``F_t`` (the predicate at instant ``t``), between the previous batch's instant
``t0`` and this batch's ``t1``:

    d(F(A)) = F_t1(A_old + dA) - F_t0(A_old) = F_t1(dA) + F_t1(A_old|R) - F_t0(A_old|R)

where ``R`` is the rows whose verdict may differ between ``t0`` and ``t1``: those whose time
key lies between a bound's values at the two instants (Materialize's temporal filters; the
plan's :class:`~consistent_stream.plan.logical.TemporalFilter` has the key and the bounds),
or every row when the predicate has no time key. When the clock's values are the same at both
instants (``current_date()`` within one day) the last two terms are empty and no state is
read. A projection is the same rule with ``R`` every row.

State: arrangement ``rows``, the input Z-set with its time key as a column, keyed (sorted)
by it, so a batch reads only the files whose key range meets ``R``.

Example (``d >= current_date() - 7``): A_old = {(d=2024-01-01)}; t0 = 2024-01-07, t1 =
2024-01-09 -> the bound moves from 2023-12-31 to 2024-01-02, R holds the row, F_t0 keeps it,
F_t1 drops it: d = {(2024-01-01): -1}.

In: the input changelog (columns + ``__weight``). Out: a SELECT of the output columns and
``__weight`` (not consolidated); None when the change is known to be empty.
"""
from __future__ import annotations

from collections.abc import Callable

from ..changelog import WEIGHT, Changelog, cols_sql, q

W = q(WEIGHT)


def temporal_delta(delta: Changelog, old: Changelog | None, at_now: Callable[[str], str],
                   at_before: Callable[[str], str], columns: list[str]) -> str | None:
    """The operator's change: ``at_now(rel)`` / ``at_before(rel)`` are its SELECT over a FROM
    item of input rows at this batch's and the previous batch's instant (output ``columns`` +
    ``__weight``); ``old``: the input's previous rows whose output may have moved (None: none,
    or the clock did not move)."""
    parts = []
    if not delta.is_empty:
        parts.append(at_now(delta.sql))
    if old is not None:
        parts.append(at_now(old.sql))
        parts.append(f"SELECT {cols_sql(columns)}, -{W} AS {W} FROM ({at_before(old.sql)})")
    if not parts:
        return None
    return " UNION ALL ".join(f"SELECT * FROM ({p})" for p in parts) if len(parts) > 1 else parts[0]
