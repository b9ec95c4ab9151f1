"""Column pruning across operators: every node keeps only the columns some operator above it
reads, so arrangements store (and keyed reads scan) nothing the view does not need.

Needs a compiled plan whose expressions are Spark SQL over backticked internal column names
(:mod:`.compile`). Rules, top-down from the model's output columns:

* a scan reads only the needed source columns (at least one: COUNT(*) needs rows, not
  columns);
* a filter needs its predicate's columns too; a projection or an expand drops the outputs
  nobody reads (keeping one); a generator keeps its outputs (their rows are its rows) and
  needs its arguments;
* a join needs its keys and residual from each side (a semi or anti join's right side only
  those), and reads each side through a projection to exactly that;
* an aggregate needs its group and argument expressions; a dedup needs all of its input (its
  ties are broken by every column); a window its partition, its calls' arguments and orders
  (a call nothing reads is dropped; ties are broken by the columns that are left: rows equal
  in all of them are equal in the output too); a recomputed block every column it reads of
  its inputs; a union (by position) keeps the same positions on both sides; a reweight needs
  its count.

The output keeps every column. Multiplicities never change: dropping a column only merges
rows of a Z-set, whose weights add.

Example: ``select l.k, sum(l.x) from (scan l: k, x, shipdate) where shipdate > d join o ...``
-> the join's right arrangement stores ``k, x``, not ``shipdate``.
"""
from __future__ import annotations

import sqlglot
from sqlglot import exp

from .logical import (Aggregate, Dedup, Expand, Filter, Generate, Join, Node, Project, Recompute, Reweight, Scan,
                      TemporalFilter, TemporalProject, Union, Window, plain_column)


def referenced(sql: str | None) -> set[str]:
    """The column names a Spark SQL expression reads (sqlglot's parse)."""
    if not sql:
        return set()
    plain = plain_column(sql)
    if plain is not None:
        return {plain}
    return {c.name for c in sqlglot.parse_one(sql, read="spark").find_all(exp.Column)}


def prune_columns(root: Node) -> Node:
    """Prune ``root``'s plan in place (see the module docstring); returns ``root``."""
    _prune(root, set(root.columns), keep_all=True)
    return root


def _narrowed(child: Node, need: set[str]) -> Node:
    """``child``, under a projection to the ``need`` columns when it has more (the input of a
    join: what its arrangement stores)."""
    keep = [c for c in child.columns if c in need]
    if len(keep) == len(child.columns) or not keep:
        return child
    return Project(columns=keep, child=child, exprs=[f"`{c}`" for c in keep])


def _prune(node: Node, needed: set[str], keep_all: bool = False) -> None:
    if isinstance(node, Scan):
        keep = [(s, c) for s, c in zip(node.source_columns, node.columns) if c in needed or keep_all]
        if not keep:
            keep = [(node.source_columns[0], node.columns[0])]
        node.source_columns, node.columns = [s for s, _ in keep], [c for _, c in keep]
    elif isinstance(node, (Filter, TemporalFilter)):
        _prune(node.child, needed | referenced(node.predicate), keep_all)
        node.columns = list(node.child.columns)
    elif isinstance(node, (Project, TemporalProject)):
        keep = [(c, e) for c, e in zip(node.columns, node.exprs) if keep_all or c in needed]
        if not keep and node.columns:   # rows without columns (under a COUNT(*)): keep one
            keep = [(node.columns[0], node.exprs[0])]
        node.columns, node.exprs = [c for c, _ in keep], [e for _, e in keep]
        need = set()
        for _, e in keep:
            need |= referenced(e)
        _prune(node.child, need)
    elif isinstance(node, Generate):
        _prune(node.child, (needed & set(node.child.columns)) | referenced(node.generator))
        node.columns = list(node.child.columns) + list(node.names)
    elif isinstance(node, Expand):
        keep = [i for i, c in enumerate(node.columns) if keep_all or c in needed] or [0]
        node.columns = [node.columns[i] for i in keep]
        node.projections = [[p[i] for i in keep] for p in node.projections]
        need = set()
        for p in node.projections:
            for e in p:
                need |= referenced(e)
        _prune(node.child, need)
    elif isinstance(node, Join):
        uses = referenced(node.residual)
        lneed = (needed | uses | set().union(*[referenced(k) for k in node.left_keys])) & set(node.left.columns)
        rneed = (uses | set().union(*[referenced(k) for k in node.right_keys])) & set(node.right.columns)
        if node.kind not in ("semi", "anti"):
            rneed |= needed & set(node.right.columns)
        _prune(node.left, lneed)
        _prune(node.right, rneed)
        node.left, node.right = _narrowed(node.left, lneed), _narrowed(node.right, rneed)
        node.columns = list(node.left.columns) + ([] if node.kind in ("semi", "anti") else list(node.right.columns))
    elif isinstance(node, Aggregate):
        need = set()
        for e in node.group_exprs:
            need |= referenced(e)
        for a in node.aggs:
            need |= referenced(a.arg)
        _prune(node.child, need)
    elif isinstance(node, Dedup):
        _prune(node.child, set(node.child.columns), keep_all=True)
    elif isinstance(node, Union):
        positions = [i for i, c in enumerate(node.columns) if keep_all or c in needed] or [0]
        for side in (node.left, node.right):
            _prune(side, {side.columns[i] for i in positions})
            # a union's sides are projections: keep exactly the chosen positions, in order
            if isinstance(side, Project) and len(side.columns) != len(positions):
                raise AssertionError("union side pruned to other positions")
        node.columns = [node.columns[i] for i in positions]
    elif isinstance(node, Window):
        calls = [c for c in node.calls if keep_all or c.name in needed
                 or (node.keep is not None and c.name == node.keep.column)]
        need = (needed & set(node.child.columns)) | set(node.partition)
        for c in calls:
            need |= {k.column for k in c.order} | referenced(c.func)
        _prune(node.child, need)
        node.calls = calls
        node.columns = list(node.child.columns) + [c.name for c in calls]
    elif isinstance(node, Recompute):
        for child, cols in zip(node.inputs, node.input_columns):
            _prune(child, {internal for _, internal in cols})
    elif isinstance(node, Reweight):
        _prune(node.child, needed | {node.count})
        node.columns = [c for c in node.child.columns if c != node.count]
    else:
        raise TypeError(f"column pruning of {type(node).__name__}")
