"""Unique keys inferred through a plan.

A unique key of a node is a set of its columns on which no two rows of its output agree
(NULLs compared as values), at every version. They come from the sources' primary keys
(``meta.consistent_stream.primary_key``, trusted as declared), GROUP BY keys, DISTINCT,
dedup partitions and joins:

* inner join: ``kl + kr`` for keys kl of the left and kr of the right; ``kl`` alone when
  the right join key covers a unique key kr (each left row matches at most one right row),
  and symmetrically;
* left/full outer join: ``kl + kr`` (a NULL-padded row is the only row of its left row),
  and ``kl`` alone for a left join whose right join key covers a key of the right;
* semi and anti joins, filters: the left input's keys; projections: keys whose columns are
  passed through unchanged; UNION ALL and INTERSECT/EXCEPT ALL: none (bags);
* windows: the input's keys, and for a top-N by ROW_NUMBER the partition with the row
  number (the partition alone when it keeps one row); a recomputed block: its GROUP BY
  columns when it outputs them all (:attr:`.logical.Recompute.keys`).

The empty key means "at most one row" (a global aggregate). The target's merge uses the
smallest inferred key when the model sets no ``unique_key``; a view without one is a bag.
"""
from __future__ import annotations

from .logical import (Aggregate, Dedup, Expand, Filter, Generate, Join, Node, Project, Recompute, Reweight, Scan,
                      TemporalFilter, TemporalProject, Union, Window, plain_column)

Key = frozenset


def _minimal(keys: list[Key]) -> list[Key]:
    out: list[Key] = []
    for k in sorted(set(keys), key=lambda k: (len(k), sorted(k))):
        if not any(o <= k for o in out):
            out.append(k)
    return out


def unique_keys(node: Node) -> list[Key]:
    """The minimal unique keys of ``node``'s output (column names of ``node.columns``)."""
    if isinstance(node, Scan):
        pk = node.source.primary_key
        by_source = {s.lower(): c for s, c in zip(node.source_columns, node.columns)}
        if pk and all(p in by_source for p in pk):
            return [Key(by_source[p] for p in pk)]
        return []
    if isinstance(node, Filter):
        return unique_keys(node.child)
    if isinstance(node, (Project, TemporalProject)):
        renamed: dict[str, str] = {}
        for c, e in zip(node.columns, node.exprs):
            src = plain_column(e)
            if src is not None:
                renamed.setdefault(src, c)
        return _minimal([Key(renamed[k] for k in key) for key in unique_keys(node.child)
                         if all(k in renamed for k in key)])
    if isinstance(node, Aggregate):
        return [Key(node.group_names)]
    if isinstance(node, Dedup):
        keys = [Key(node.partition)] + unique_keys(node.child)
        if isinstance(node.child, Project):
            # a hidden partition column that repeats a visible column: the visible one is a key too
            exprs = dict(zip(node.child.columns, node.child.exprs))
            alias = {}
            for p in node.partition:
                alias[p] = next((c for c in node.child.columns if c not in node.partition
                                 and exprs[c] == exprs[p]), p)
            keys.append(Key(alias[p] for p in node.partition))
        return _minimal(keys)
    if isinstance(node, Join):
        left, right = unique_keys(node.left), unique_keys(node.right)
        if node.kind in ("semi", "anti"):
            return left
        plain_l = {plain_column(k) for k in node.left_keys} - {None}
        plain_r = {plain_column(k) for k in node.right_keys} - {None}
        keys = [kl | kr for kl in left for kr in right]
        if node.kind in ("inner", "left") and any(kr <= plain_r for kr in right):
            keys += left
        if node.kind == "inner" and any(kl <= plain_l for kl in left):
            keys += right
        return _minimal(keys)
    if isinstance(node, (TemporalFilter,)):
        return unique_keys(node.child)
    if isinstance(node, Window):
        keys = unique_keys(node.child)
        if node.keep is not None:
            call = next(c for c in node.calls if c.name == node.keep.column)
            if call.func.upper() == "ROW_NUMBER()":   # one row per partition and row number
                keys.append(Key(node.partition) | {call.name})
                if node.keep.hi is not None and node.keep.hi <= node.keep.lo:
                    keys.append(Key(node.partition))
        return _minimal(keys)
    if isinstance(node, Recompute):
        return [Key(k) for k in node.keys]
    if isinstance(node, (Union, Expand, Generate, Reweight, TemporalProject)):
        return []
    raise TypeError(f"unique keys of {type(node).__name__}")


def output_unique_key(root: Node) -> list[str] | None:
    """The smallest unique key of the model's output as column names, in output order;
    all columns for a view of at most one row; None for a bag."""
    keys = unique_keys(root)
    if not keys:
        return None
    k = keys[0]
    return [c for c in root.columns if c in k] if k else list(root.columns)
