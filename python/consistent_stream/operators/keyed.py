"""What the stateful delta rules share: the state they read (a :class:`Lookup` of an
arrangement, read at the keys a batch touches), and key equality with SQL ``=`` or
null-safe ``<=>`` semantics."""
from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..changelog import Changelog, KeySet, q


class Lookup(Protocol):
    """An arrangement as of the previous batch (a delta rule's ``A_old``).

    ``empty``: it holds no row (terms over it are skipped without reading anything).
    ``read(keys)``: its rows whose key columns equal one of ``keys`` (columns named like the
    arrangement's keys; NULLs equal when ``null_safe``; all rows when ``keys`` is None),
    possibly with rows of other keys too and not consolidated (every rule is correct on such
    a superset: rows of untouched keys cancel); ``read_range(ranges)`` likewise for
    the rows whose columns lie in ranges. Columns: the arrangement's.
    ``prefetch(keys)``: a rule that reads several lookups says so before the first read.
    """

    @property
    def empty(self) -> bool: ...

    def read(self, keys: KeySet | None, null_safe: bool = True) -> Changelog: ...

    def prefetch(self, keys: KeySet | None, null_safe: bool = True) -> None:
        """Start reading ``keys`` in the background, where this lookup can: a later
        :meth:`read` of the same ``keys`` object then waits for it instead of reading. Doing
        nothing is always correct."""
        ...

    def read_range(self, ranges: dict[str, list[tuple[object, object]]]) -> Changelog:
        """Its rows whose columns may each lie in one of their inclusive ``ranges`` (None:
        unbounded on that end); a superset."""
        ...

    def read_prefix(self, column: str, descending: bool, nulls_first: bool, need: int) -> Changelog:
        """Its rows before a bound in the order of ``column`` with at least ``need`` live rows
        before it (every row before the bound, none after it), or every row."""
        ...


class RelationLookup:
    """A :class:`Lookup` over a changelog (tests, and delta rules evaluated by hand)."""

    def __init__(self, rows: Changelog | None, key: list[str]):
        self.rows, self.key = rows, key

    @property
    def empty(self) -> bool:
        return self.rows is None or self.rows.is_empty

    def read(self, keys: KeySet | None, null_safe: bool = True) -> Changelog:
        if keys is None or not self.key:
            return self.rows
        sql = f"SELECT * FROM {self.rows.sql} s LEFT SEMI JOIN {keys.relation()} k ON " + \
            key_condition("s", self.key, "k", keys.columns, null_safe)
        return Changelog.of_query(self.rows.views, sql, self.rows.columns)

    def prefetch(self, keys: KeySet | None, null_safe: bool = True) -> None:
        return None

    def read_range(self, ranges: dict[str, list[tuple[object, object]]]) -> Changelog:
        return self.rows

    def read_prefix(self, column: str, descending: bool, nulls_first: bool, need: int) -> Changelog:
        return self.rows


def key_condition(a: str, a_cols: list[str], b: str, b_cols: list[str], null_safe: bool) -> str:
    """SQL ``a.x0 = b.y0 AND ..`` (``<=>`` when ``null_safe``)."""
    op = "<=>" if null_safe else "="
    return " AND ".join(f"{a}.{q(x)} {op} {b}.{q(y)}" for x, y in zip(a_cols, b_cols))


def union_keys(sets: list[KeySet]) -> KeySet:
    """One key set holding the tuples of all ``sets`` (same columns), distinct."""
    if len(sets) == 1:
        return sets[0]
    if all(s.arrow is not None for s in sets):
        t = pa.concat_tables([s.arrow.cast(sets[0].arrow.schema) for s in sets])
        cols = list(t.column_names)
        return KeySet(sets[0].views, cols, t.group_by(cols, use_threads=False).aggregate([]) if t.num_rows else t,
                      None)
    cols = sets[0].columns
    sel = ", ".join(q(c) for c in cols)
    union = " UNION ".join(f"SELECT {sel} FROM {s.relation()}" for s in sets)
    return KeySet(sets[0].views, cols, None, f"({union})")


def row_keys(t: pa.Table, cols: list[str]) -> list[tuple]:
    """The values of columns ``cols`` of each row of ``t``, as Python tuples (NULL: None)."""
    return list(zip(*[t.column(c).to_pylist() for c in cols])) if t.num_rows else []


def key_in(t: pa.Table, other: pa.Table, cols: list[str]) -> pa.Array:
    """For each row of ``t``, whether its key (columns ``cols``) is the key of a row of
    ``other``, NULLs comparing equal (as the MERGE's IS NOT DISTINCT FROM, and ``<=>``): a
    boolean array of ``t.num_rows``. Vectorized where it can be, since building a Python tuple
    per row of a target-sized key column is not: one key column with Arrow's hash set
    (``is_in``), several with Arrow's hash join on an added row number, whose rows with a NULL
    in the key (a join never matches NULLs) are compared as Python tuples, as is everything
    when a column's type does not cast to ``t``'s."""
    if not t.num_rows or not other.num_rows:
        return pa.array([False] * t.num_rows, pa.bool_())
    try:
        right = other.select(cols).cast(t.select(cols).schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        right = None
    if right is not None and len(cols) == 1:
        return pc.is_in(t.column(cols[0]), value_set=right.column(0).combine_chunks(), skip_nulls=False)
    if right is not None:
        left = t.select(cols).append_column("__row", pa.array(np.arange(t.num_rows, dtype=np.int64)))
        hit = left.join(right, keys=cols, join_type="left semi", use_threads=False)   # (each row once)
        mask = np.zeros(t.num_rows, dtype=bool)
        mask[hit.column("__row").to_numpy()] = True
        nulls = _any_null(t, cols)
        if nulls.any():
            known = set(row_keys(right.filter(pa.array(_any_null(right, cols))), cols))
            rows = np.flatnonzero(nulls)
            mask[rows] = [k in known for k in row_keys(t.take(pa.array(rows)), cols)]
        return pa.array(mask)
    known = set(row_keys(other, cols))
    return pa.array([k in known for k in row_keys(t, cols)], pa.bool_())


def sorted_key_positions(t: pa.Table, other: pa.Table, cols: list[str]) -> np.ndarray | None:
    """The positions (ascending ``int64``) of the rows of ``t`` whose key is the key of a row
    of ``other``, as :func:`key_in` gives them, found by binary search where ``t`` is sorted
    by its key: one integer key column without NULLs, ascending in ``t`` (checked, one pass).
    None when that does not hold (the caller uses :func:`key_in`). A file written sorted by
    its key (a rebuild's target files) is then searched in O(keys log rows), where a hash set
    probes each of its rows."""
    if len(cols) != 1 or not pa.types.is_integer(t.schema.field(cols[0]).type) or not t.num_rows:
        return None
    col = t.column(cols[0])
    if col.null_count:
        return None
    try:
        wanted = other.column(cols[0]).cast(col.type).drop_null()
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    keys = col.to_numpy()
    if len(keys) > 1 and not bool(np.all(keys[1:] >= keys[:-1])):
        return None
    values = np.sort(wanted.to_numpy())
    if len(values) > 1:
        values = values[np.concatenate(([True], values[1:] != values[:-1]))]
    lo = np.searchsorted(keys, values, "left")
    n = np.searchsorted(keys, values, "right") - lo
    lo, n = lo[n > 0], n[n > 0]
    # each found value's run of rows lo .. lo + n - 1, the runs ascending and disjoint
    starts = np.repeat(lo - np.concatenate(([0], np.cumsum(n)[:-1])), n)
    return (starts + np.arange(int(n.sum()), dtype=np.int64)).astype(np.int64)


def _any_null(t: pa.Table, cols: list[str]) -> np.ndarray:
    """Per row of ``t``, whether one of ``cols`` is NULL (a numpy boolean array)."""
    out = np.zeros(t.num_rows, dtype=bool)
    for c in cols:
        col = t.column(c)
        if col.null_count:
            out |= pc.is_null(col).to_numpy(zero_copy_only=False)
    return out
