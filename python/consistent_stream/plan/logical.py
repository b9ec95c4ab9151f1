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


@dataclass(eq=False)
class Join(Node):
    """Equi-join. ``kind``: 'inner' or 'left' (right joins are planned as mirrored lefts).
    ``left_keys[i] = right_keys[i]`` (expressions over each side's columns); ``residual`` is
    an extra predicate over the joined row (inner joins only). Output: left then right
    columns."""
    left: Node = None
    right: Node = None
    kind: str = "inner"
    left_keys: list[str] = field(default_factory=list)
    right_keys: list[str] = field(default_factory=list)
    residual: str | None = None

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


@dataclass(frozen=True)
class AggCall:
    """One aggregate: ``func`` in sum, count, count_star, avg, min, max over ``arg``."""
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
        keys = ", ".join(f"{a} = {b}" for a, b in zip(node.left_keys, node.right_keys))
        head = f"Join {node.kind} on {keys}" + (f" and {node.residual}" if node.residual else "")
    elif isinstance(node, Aggregate):
        head = f"Aggregate by {node.group_exprs}: " + ", ".join(f"{a.func}({a.arg})" for a in node.aggs)
    elif isinstance(node, Union):
        head = "Union all"
    else:
        head = type(node).__name__
    return "\n".join([f"{pad}{node.id} {head}"] + [explain(c, indent + 1) for c in node.children])
