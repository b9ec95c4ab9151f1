"""What the stateful delta rules share: the state they read (a :class:`Lookup` of an
arrangement, read at the keys a batch touches), and key equality with SQL ``=`` or
null-safe ``<=>`` semantics."""
from __future__ import annotations

from typing import Protocol

import pyarrow as pa
from pyspark.sql import Column, DataFrame

from ..changelog import Changelog, KeySet, consolidate


class Lookup(Protocol):
    """An arrangement as of the previous batch (a delta rule's ``A_old``).

    ``empty``: it holds no row (terms over it are skipped without reading anything).
    ``read(keys)``: its rows whose key columns equal one of ``keys`` (columns named like the
    arrangement's keys; NULLs equal when ``null_safe``), possibly with rows of other keys too
    and not consolidated (every rule is correct on such a superset: rows of untouched keys
    cancel). Columns: the arrangement's.
    """

    @property
    def empty(self) -> bool: ...

    def read(self, keys: KeySet | None, null_safe: bool = True) -> Changelog: ...


class FrameLookup:
    """A :class:`Lookup` over a DataFrame (tests, and delta rules evaluated by hand)."""

    def __init__(self, df: DataFrame | None):
        self.df = df

    @property
    def empty(self) -> bool:
        return self.df is None

    def read(self, keys: KeySet | None, null_safe: bool = True) -> Changelog:
        if keys is None:
            return Changelog(self.df)
        return Changelog(restrict_to_keys(self.df, list(keys.columns), keys.frame(), list(keys.columns), null_safe))


def key_condition(a: DataFrame, a_cols: list[str], b: DataFrame, b_cols: list[str],
                  null_safe: bool) -> Column:
    """``a[a_cols[i]] = b[b_cols[i]]`` for all i (``<=>`` when ``null_safe``)."""
    cond = None
    for x, y in zip(a_cols, b_cols):
        c = a[f"`{x}`"].eqNullSafe(b[f"`{y}`"]) if null_safe else (a[f"`{x}`"] == b[f"`{y}`"])
        cond = c if cond is None else cond & c
    return cond


def restrict_to_keys(df: DataFrame, cols: list[str], keys: DataFrame, key_cols: list[str],
                     null_safe: bool = True) -> DataFrame:
    """Rows of ``df`` whose ``cols`` equal some row of ``keys[key_cols]`` (a semi join).

    ``null_safe``: NULL keys match NULL keys (GROUP BY and PARTITION BY semantics); else
    SQL ``=`` (join keys: a NULL key matches nothing). No columns: ``df`` unchanged.
    In and out: ``df``'s columns.
    """
    if not cols:
        return df
    k = keys.select(*[keys[f"`{c}`"].alias(f"__key{i}") for i, c in enumerate(key_cols)])
    return df.join(k, key_condition(df, cols, k, [f"__key{i}" for i in range(len(cols))], null_safe),
                   "left_semi")


def union_keys(sets: list[KeySet]) -> KeySet:
    """One key set holding the tuples of all ``sets`` (same columns), distinct."""
    if len(sets) == 1:
        return sets[0]
    if all(s.arrow is not None for s in sets):
        t = pa.concat_tables([s.arrow.cast(sets[0].arrow.schema) for s in sets])
        cols = list(t.column_names)
        return KeySet(sets[0].spark, t.group_by(cols, use_threads=False).aggregate([]) if t.num_rows else t, None)
    df = sets[0].frame()
    for s in sets[1:]:
        df = df.unionByName(s.frame())
    return KeySet(sets[0].spark, None, df.distinct())


__all__ = ["Lookup", "FrameLookup", "key_condition", "restrict_to_keys", "union_keys", "consolidate"]
