"""What the stateful delta rules share: the state they read (a :class:`Lookup` of an
arrangement, read at the keys a batch touches), and key equality with SQL ``=`` or
null-safe ``<=>`` semantics."""
from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from ..changelog import Changelog, KeySet, q


class Lookup(Protocol):
    """An arrangement as of the previous batch (a delta rule's ``A_old``).

    ``empty``: it holds no row (terms over it are skipped without reading anything).
    ``read(keys)``: its rows whose key columns equal one of ``keys`` (columns named like the
    arrangement's keys; NULLs equal when ``null_safe``; all rows when ``keys`` is None),
    possibly with rows of other keys too and not consolidated (every rule is correct on such
    a superset: rows of untouched keys cancel); ``read_range(ranges)`` likewise for
    the rows whose columns lie in ranges. Columns: the arrangement's.
    """

    @property
    def empty(self) -> bool: ...

    def read(self, keys: KeySet | None, null_safe: bool = True) -> Changelog: ...

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
