"""Key matching shared by the stateful operators: restricting an arrangement to the keys a
batch touches, and equality conditions with SQL ``=`` or null-safe ``<=>`` semantics."""
from __future__ import annotations

from pyspark.sql import Column, DataFrame


def key_condition(a: DataFrame, a_cols: list[str], b: DataFrame, b_cols: list[str],
                  null_safe: bool) -> Column:
    """``a[a_cols[i]] = b[b_cols[i]]`` for all i (``<=>`` when ``null_safe``)."""
    cond = None
    for x, y in zip(a_cols, b_cols):
        c = a[x].eqNullSafe(b[y]) if null_safe else (a[x] == b[y])
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
    k = keys.select(*[keys[c].alias(f"__key{i}") for i, c in enumerate(key_cols)])
    return df.join(k, key_condition(df, cols, k, [f"__key{i}" for i in range(len(cols))], null_safe),
                   "left_semi")
