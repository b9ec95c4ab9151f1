"""Logical plan nodes. Column names inside a plan are *internal* names, unique in the whole
plan; expressions are Spark SQL text over those names (backticked)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..sources import SourceSpec


@dataclass(eq=False)
class Node:
    columns: list[str]
    id: str = field(default="", init=False)

    @property
    def children(self) -> list["Node"]:
        return []


@dataclass(eq=False)
class Scan(Node):
    """Read a source changelog. ``source_columns[i]`` is read as ``columns[i]``."""
    source: SourceSpec = None
    source_columns: list[str] = field(default_factory=list)


@dataclass(eq=False)
class Filter(Node):
    """Keep rows whose ``predicate`` is TRUE (SQL WHERE semantics)."""
    child: Node = None
    predicate: str = ""

    @property
    def children(self):
        return [self.child]


@dataclass(eq=False)
class Project(Node):
    """``columns[i] = exprs[i]`` evaluated per row."""
    child: Node = None
    exprs: list[str] = field(default_factory=list)

    @property
    def children(self):
        return [self.child]


JOIN_KINDS = ("inner", "left", "full", "semi", "anti")


@dataclass(eq=False)
class Join(Node):
    """Equi-join. ``kind`` in :data:`JOIN_KINDS` (right joins are planned as mirrored left
    joins). ``left_keys[i] = right_keys[i]`` (expressions over each side's columns; NULL
    never equals, unless ``null_safe``: then ``<=>``, as set operations compare rows);
    ``residual``: an extra predicate over the joined row, part of the join condition (for
    outer joins it decides matching, not filtering). Output: left then right columns (left
    columns only for semi and anti joins)."""
    left: Node = None
    right: Node = None
    kind: str = "inner"
    left_keys: list[str] = field(default_factory=list)
    right_keys: list[str] = field(default_factory=list)
    residual: str | None = None
    null_safe: bool = False

    @property
    def children(self):
        return [self.left, self.right]


@dataclass(eq=False)
class Union(Node):
    """UNION ALL: the inputs' rows, the right side's columns taken by position."""
    left: Node = None
    right: Node = None

    @property
    def children(self):
        return [self.left, self.right]


LINEAR_AGGS = ("sum", "count", "avg")
"""Aggregates computed from linear accumulators (sums of weighted values)."""
MULTISET_AGGS = ("min", "max", "count_distinct", "sum_distinct", "avg_distinct")
"""Aggregates computed from the per-group multiset of argument values (kept as state)."""


@dataclass(frozen=True)
class AggCall:
    """One aggregate: ``func`` in count_star, :data:`LINEAR_AGGS` or :data:`MULTISET_AGGS`
    over ``arg`` (Spark SQL; a FILTER clause is already folded into it as a CASE)."""
    name: str
    func: str
    arg: str | None


@dataclass(eq=False)
class Aggregate(Node):
    """GROUP BY ``group_exprs`` (output ``group_names``) computing ``aggs``. No group
    expressions means a global aggregate (always exactly one output row)."""
    child: Node = None
    group_names: list[str] = field(default_factory=list)
    group_exprs: list[str] = field(default_factory=list)
    aggs: list[AggCall] = field(default_factory=list)

    @property
    def children(self):
        return [self.child]


@dataclass(frozen=True)
class SortKey:
    """One ORDER BY item of a dedup: ``column`` (a child column), direction and NULL
    placement (Spark's defaults: NULLS FIRST ascending, NULLS LAST descending)."""
    column: str
    descending: bool = False
    nulls_first: bool | None = None

    @property
    def effective_nulls_first(self) -> bool:
        return (not self.descending) if self.nulls_first is None else self.nulls_first


@dataclass(eq=False)
class Dedup(Node):
    """``ROW_NUMBER() OVER (PARTITION BY partition ORDER BY order) = 1``: per partition, the
    first row by ``order``, ties broken by the remaining columns ascending (so the choice
    is deterministic). Output: the child's columns."""
    child: Node = None
    partition: list[str] = field(default_factory=list)
    order: list[SortKey] = field(default_factory=list)

    @property
    def children(self):
        return [self.child]


@dataclass(eq=False)
class Reweight(Node):
    """Multiply each row's multiplicity by the non-negative integer in column ``count`` of
    the row, and drop that column (INTERSECT ALL / EXCEPT ALL: a row appears min(m, n) or
    max(m - n, 0) times). Linear in its input."""
    child: Node = None
    count: str = ""

    @property
    def children(self):
        return [self.child]


def plain_column(expr: str) -> str | None:
    """``name`` when the plan expression (Spark SQL) is just the backticked column ``name``."""
    if expr.startswith("`") and expr.endswith("`") and expr.count("`") == 2:
        return expr[1:-1]
    return None


def walk(node: Node):
    """Post-order traversal (children first)."""
    for c in node.children:
        yield from walk(c)
    yield node


def assign_ids(root: Node) -> None:
    """Deterministic operator ids (post-order position + kind); state tables are named by
    them, so the same SQL always maps to the same state."""
    for i, n in enumerate(walk(root)):
        n.id = f"{i:02d}_{type(n).__name__.lower()}"


def explain(node: Node, indent: int = 0) -> str:
    """Readable plan tree, one operator a line."""
    pad = "  " * indent
    if isinstance(node, Scan):
        head = f"Scan {node.source.key} {node.source_columns}"
    elif isinstance(node, Filter):
        head = f"Filter {node.predicate}"
    elif isinstance(node, Project):
        head = "Project " + ", ".join(f"{e} AS {c}" for c, e in zip(node.columns, node.exprs))
    elif isinstance(node, Join):
        eq = " <=> " if node.null_safe else " = "
        keys = ", ".join(f"{a}{eq}{b}" for a, b in zip(node.left_keys, node.right_keys))
        head = f"Join {node.kind} on {keys}" + (f" and {node.residual}" if node.residual else "")
    elif isinstance(node, Aggregate):
        head = f"Aggregate by {node.group_exprs}: " + ", ".join(f"{a.func}({a.arg})" for a in node.aggs)
    elif isinstance(node, Union):
        head = "Union all"
    elif isinstance(node, Dedup):
        order = ", ".join(f"{k.column} {'desc' if k.descending else 'asc'}" for k in node.order)
        head = f"Dedup first by ({order}) per {node.partition}"
    elif isinstance(node, Reweight):
        head = f"Reweight by {node.count}"
    else:
        head = type(node).__name__
    return "\n".join([f"{pad}{node.id} {head}"] + [explain(c, indent + 1) for c in node.children])
