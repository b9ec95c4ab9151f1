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


#: A comparison operator read from the other side: ``a op b`` is ``b FLIPPED[op] a``.
FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclass(frozen=True)
class Band:
    """One conjunct ``left op right`` of a join's residual that bounds a column of one side
    by a value of the other (``o.day between p.valid_from and p.valid_to`` is two):
    ``left``/``right`` are expressions over each side's columns, ``op`` one of ``<``,
    ``<=``, ``>``, ``>=``. A range join's sides are arranged by their first band's
    expression, so a change reads only the other side's files whose range of it can meet
    the change's values (:mod:`consistent_stream.operators.join`)."""
    left: str
    op: str
    right: str

    def sql(self) -> str:
        return f"{self.left} {self.op} {self.right}"


@dataclass(eq=False)
class Join(Node):
    """Equi-join. ``kind`` in :data:`JOIN_KINDS` (right joins are planned as mirrored left
    joins). ``left_keys[i] = right_keys[i]`` (expressions over each side's columns; NULL
    never equals, unless ``null_safe``: then ``<=>``, as set operations compare rows);
    ``residual``: an extra predicate over the joined row, part of the join condition (for
    outer joins it decides matching, not filtering). ``bands``: the residual's conjuncts
    that bound one side by the other, for an inner join without an equality (a range join;
    the residual still holds them). Output: left then right columns (left columns only for
    semi and anti joins)."""
    left: Node = None
    right: Node = None
    kind: str = "inner"
    left_keys: list[str] = field(default_factory=list)
    right_keys: list[str] = field(default_factory=list)
    residual: str | None = None
    null_safe: bool = False
    bands: list[Band] = field(default_factory=list)

    @property
    def children(self):
        return [self.left, self.right]

    def key_columns(self, role: str) -> list[tuple[str, str]]:
        """The computed key columns of side ``role`` (``left``/``right``): ``(name, expr)``
        for each join key that is not a plain column of the side, then for a range join each
        band expression that is not (``<id>__lk0``, ``<id>__lb0``, ..)."""
        child, keys = (self.left, self.left_keys) if role == "left" else (self.right, self.right_keys)
        out = []
        for i, e in enumerate(keys):
            if plain_column(e) not in child.columns:
                out.append((f"{self.id}__{role[0]}k{i}", e))
        for i, b in enumerate(self.bands):
            e = b.left if role == "left" else b.right
            if plain_column(e) not in child.columns:
                out.append((f"{self.id}__{role[0]}b{i}", e))
        return out

    def join_key(self, role: str) -> list[str]:
        """The columns side ``role``'s join keys are read by (plain columns, or computed)."""
        child, keys = (self.left, self.left_keys) if role == "left" else (self.right, self.right_keys)
        return [plain_column(e) if plain_column(e) in child.columns else f"{self.id}__{role[0]}k{i}"
                for i, e in enumerate(keys)]

    def band_columns(self, role: str) -> list[str]:
        """Per band, the column holding side ``role``'s expression."""
        child = self.left if role == "left" else self.right
        out = []
        for i, b in enumerate(self.bands):
            e = b.left if role == "left" else b.right
            out.append(plain_column(e) if plain_column(e) in child.columns else f"{self.id}__{role[0]}b{i}")
        return out

    def arrangement_key(self, role: str) -> list[str]:
        """The key side ``role``'s arrangement is sorted and looked up by: its join keys, or
        for a range join its first band column (files then hold disjoint ranges of it)."""
        return self.band_columns(role)[:1] if self.bands else self.join_key(role)


@dataclass(eq=False)
class Union(Node):
    """UNION ALL: the inputs' rows, the right side's columns taken by position."""
    left: Node = None
    right: Node = None

    @property
    def children(self):
        return [self.left, self.right]


@dataclass(eq=False)
class Expand(Node):
    """Spark's Expand: each input row becomes one output row per projection,
    ``columns[i] = projections[k][i]`` for ``k`` in order, with the input row's weight
    (GROUP BY grouping sets: one projection per grouping set, the keys outside it NULL).
    Linear: ``d(expand(A)) = expand(dA)``."""
    child: Node = None
    projections: list[list[str]] = field(default_factory=list)

    @property
    def children(self):
        return [self.child]


MOMENT_AGGS = ("var_samp", "var_pop", "stddev_samp", "stddev_pop")
"""Aggregates computed from the first two moments (count, sum, sum of squares)."""
COMOMENT_AGGS = ("covar_pop", "covar_samp", "corr")
"""Aggregates of two arguments computed from their co-moments (the count of rows where both
are non-NULL, the sums of each, of their squares and of their products); their ``arg`` is
``named_struct('x', CAST(x AS DOUBLE), 'y', CAST(y AS DOUBLE))``."""


@dataclass(eq=False)
class Generate(Node):
    """Spark's Generate (``LATERAL VIEW [OUTER] explode(..) g AS c``): each input row followed
    by each row of ``generator`` (a Spark SQL generator over the input's columns) as
    ``names``, with the input row's weight; ``outer``: an input row the generator gives no row
    for is kept once, ``names`` NULL. Output: the input's columns, then ``names``. Linear:
    ``d(generate(A)) = generate(dA)``."""
    child: Node = None
    generator: str = ""
    outer: bool = False
    names: list[str] = field(default_factory=list)

    @property
    def children(self):
        return [self.child]


LINEAR_AGGS = ("sum", "count", "avg") + MOMENT_AGGS + COMOMENT_AGGS
"""Aggregates computed from linear accumulators (sums of weighted values, of their squares)."""
MULTISET_AGGS = ("min", "max", "count_distinct", "sum_distinct", "avg_distinct", "percentile", "collect_list",
                 "collect_set", "percentile_disc", "percentile_disc_desc")
"""Aggregates computed from the per-group multiset of argument values (kept as state)."""


@dataclass(frozen=True)
class AggCall:
    """One aggregate: ``func`` in count_star, :data:`LINEAR_AGGS` or :data:`MULTISET_AGGS`
    over ``arg`` (Spark SQL; a FILTER clause is already folded into it as a CASE);
    ``param``: the fraction of ``percentile`` and ``percentile_disc`` (a numeric literal;
    ``percentile_disc_desc`` is ``PERCENTILE_DISC(p) WITHIN GROUP (ORDER BY arg DESC)``),
    else None. The two arguments of a :data:`COMOMENT_AGGS` aggregate are one struct ``arg``."""
    name: str
    func: str
    arg: str | None
    param: str | None = None


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


@dataclass(frozen=True)
class WindowCall:
    """One window function of a :class:`Window`: output column ``name`` =
    ``func OVER (PARTITION BY <the node's partition> ORDER BY order [tie-breakers] frame)``.

    ``func``: the function over the child's columns in Spark SQL (``ROW_NUMBER()``,
    ``SUM(`x`)``, ``LAG(`x`, 1)``, ``FIRST_VALUE(`x`) IGNORE NULLS``); ``order``: its ORDER BY
    (child columns); ``frame``: its frame clause as written (``ROWS BETWEEN 1 PRECEDING AND
    CURRENT ROW``), None for the default; ``tiebreak``: the function's result depends on the
    order of rows whose ORDER BY values tie (ROW_NUMBER, NTILE, LAG, LEAD, FIRST_VALUE and
    ROWS frames), so the ORDER BY is completed with every other child column ascending (as
    :class:`Dedup` breaks ties), which makes the result one of the answers Spark may give,
    always the same one."""
    name: str
    func: str
    order: tuple[SortKey, ...] = ()
    frame: str | None = None
    tiebreak: bool = False


@dataclass(frozen=True)
class RankRange:
    """A top-N: keep only the rows whose rank column ``column`` (a ``ROW_NUMBER``, ``RANK`` or
    ``DENSE_RANK`` call of the same Window) lies in ``[lo, hi]`` (``hi`` None: no upper
    bound)."""
    column: str
    lo: int = 1
    hi: int | None = None

    def sql(self) -> str:
        """The predicate over the rank column."""
        c = "`" + self.column + "`"
        return f"{c} >= {self.lo}" + (f" AND {c} <= {self.hi}" if self.hi is not None else "")


@dataclass(eq=False)
class Window(Node):
    """Window functions ``calls`` over the partitions of ``partition`` (child columns; empty:
    the whole input is one partition), optionally keeping only a rank range (``keep``: a
    top-N per partition, ``ORDER BY .. LIMIT``). Output: the child's columns, then one column
    per call (the rows ``keep`` drops are not in the output)."""
    child: Node = None
    partition: list[str] = field(default_factory=list)
    calls: list[WindowCall] = field(default_factory=list)
    keep: RankRange | None = None

    @property
    def children(self):
        return [self.child]

    def call_sql(self, call: WindowCall, columns: list[str] | None = None) -> str:
        """``call`` as a Spark SQL window expression; its tie-breakers are the child's
        ``columns`` (default: the child's columns) outside the partition and the ORDER BY."""
        def q(c: str) -> str:
            return "`" + c.replace("`", "``") + "`"

        keys = [f"{q(k.column)} {'DESC' if k.descending else 'ASC'} "
                f"NULLS {'FIRST' if k.effective_nulls_first else 'LAST'}" for k in call.order]
        if call.tiebreak:
            ordered = {k.column for k in call.order} | set(self.partition)
            keys += [f"{q(c)} ASC NULLS FIRST" for c in (columns or self.child.columns) if c not in ordered]
        over = []
        if self.partition:
            over.append("PARTITION BY " + ", ".join(q(p) for p in self.partition))
        if keys:
            over.append("ORDER BY " + ", ".join(keys))
        if call.frame:
            over.append(call.frame)
        return f"{call.func} OVER ({' '.join(over)})"


@dataclass(eq=False)
class Recompute(Node):
    """The floor under the compiler, DBSP's ``D . Q . I``: ``sql`` (a Spark SQL query) is
    evaluated over the whole of its ``inputs`` each batch that changes one of them (or moves
    the clock it reads) and differenced against its result over their previous contents.
    ``sql`` reads input ``i`` as the relation named ``names[i]``, whose columns are
    ``input_columns[i]`` (``(name in sql, input column)`` pairs); its result's columns are
    ``columns``, by position. ``reason``: the construct without a delta rule."""
    inputs: list[Node] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    input_columns: list[list[tuple[str, str]]] = field(default_factory=list)
    sql: str = ""
    reason: str = ""
    keys: list[list[str]] = field(default_factory=list)
    """Unique keys of the result (output columns), when its SQL shows them (GROUP BY)."""

    @property
    def children(self):
        return list(self.inputs)


@dataclass(eq=False)
class TemporalFilter(Node):
    """A filter whose ``predicate`` reads the clock (``current_date()``, ``current_timestamp()``
    ..., bound to each batch's instant): rows enter and leave as time passes. ``time_key``: a
    child-column expression such that the predicate of a row can only change between two
    instants if its time key lies between the ``bounds`` (clock-only expressions) at those
    instants; None when the predicate has no such form (then a moving clock re-reads every
    row)."""
    child: Node = None
    predicate: str = ""
    time_key: str | None = None
    bounds: list[str] = field(default_factory=list)

    @property
    def children(self):
        return [self.child]


@dataclass(eq=False)
class TemporalProject(Node):
    """A projection whose ``exprs`` read the clock: when the clock's values move, every row's
    output is computed again."""
    child: Node = None
    exprs: list[str] = field(default_factory=list)

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


def column_origins(root: Node) -> dict[str, tuple[str, str]]:
    """Plan column -> ``(source key, source column)`` for every column of ``root``'s plan that
    holds a source column's values as they are: a scan's columns, and the names a projection
    or a GROUP BY gives a plain column of one (every other operator passes its columns on
    under their names, which are unique in the plan). A union's or an outer join's column may
    hold other values too (the other input's, NULLs): what the origin says of its values'
    distribution is a hint, not a fact."""
    out: dict[str, tuple[str, str]] = {}
    for n in walk(root):
        if isinstance(n, Scan):
            out.update({c: (n.source.key, s) for c, s in zip(n.columns, n.source_columns)})
        elif isinstance(n, Project):
            out.update({c: out[p] for c, e in zip(n.columns, n.exprs) if (p := plain_column(e)) in out})
        elif isinstance(n, Aggregate):
            out.update({c: out[p] for c, e in zip(n.group_names, n.group_exprs) if (p := plain_column(e)) in out})
    return out


def assign_ids(root: Node) -> None:
    """Deterministic operator ids (post-order position + kind); state tables are named by
    them, so the same SQL always maps to the same state."""
    for i, n in enumerate(walk(root)):
        n.id = f"{i:02d}_{type(n).__name__.lower()}"


def maintenance(node: Node) -> tuple[str, str]:
    """How ``node`` is maintained: ``("incremental", what a batch reads)`` when its delta rule
    costs the change (and the state at the keys, partitions or ranges it touches), or
    ``("recompute", what it reads)`` for the floor (:class:`Recompute`) and for rules that read
    a whole input each batch."""
    if isinstance(node, Scan):
        return "incremental", "the source's changes"
    if isinstance(node, (Filter, Project, Union, Reweight)):
        return "incremental", "the change only (linear, no state)"
    if isinstance(node, Expand):
        return "incremental", f"the change only (linear, no state; {len(node.projections)} rows per row)"
    if isinstance(node, Generate):
        return "incremental", "the change only (linear, no state; the generator's rows per row)"
    if isinstance(node, Join):
        if node.bands:
            return "incremental", ("each side's change and the other side's state in the ranges the change's "
                                   "values bound: the files whose min/max statistics meet them (a range join)")
        if not node.left_keys or all(k == "1" for k in node.left_keys):
            return "incremental", "each side's change against the other side's whole state (a cross join)"
        return "incremental", "each side's change and the other side's state at the changed keys"
    if isinstance(node, Aggregate):
        if not node.group_exprs:
            return "incremental", "the change and the one group's state"
        return "incremental", "the change and the state of the groups it touches"
    if isinstance(node, Dedup):
        return "incremental", "the state of the partitions the change touches"
    if isinstance(node, Window):
        what = (f"the state of the partitions the change touches (PARTITION BY {', '.join(node.partition)})"
                if node.partition else "the whole input each batch it changes (no PARTITION BY: one partition)")
        if node.keep is not None:
            what += f", keeping ranks {node.keep.lo}..{node.keep.hi if node.keep.hi is not None else ''}"
        return "incremental", what
    if isinstance(node, TemporalFilter):
        if node.time_key is not None:
            return "incremental", f"the change, and when the clock moves the rows whose {node.time_key} crosses a bound"
        return "incremental", "the change, and every input row when the clock's value moves"
    if isinstance(node, TemporalProject):
        return "incremental", "the change, and every input row when the clock's value moves"
    if isinstance(node, Recompute):
        return "recompute", f"its whole inputs each batch that changes them ({node.reason})"
    return "incremental", ""


def explain(node: Node, indent: int = 0, costs: bool = False) -> str:
    """Readable plan tree, one operator a line; ``costs``: each line ends with how the operator
    is maintained and what a batch reads (:func:`maintenance`)."""
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
        if node.bands:
            head += " (range join: " + ", ".join(b.sql() for b in node.bands) + ")"
    elif isinstance(node, Aggregate):
        head = f"Aggregate by {node.group_exprs}: " + ", ".join(
            f"{a.func}({a.arg}{', ' + a.param if a.param else ''})" for a in node.aggs)
    elif isinstance(node, Union):
        head = "Union all"
    elif isinstance(node, Generate):
        head = f"Generate{' outer' if node.outer else ''} {node.generator} AS {', '.join(node.names)}"
    elif isinstance(node, Expand):   # per projection, what it sets (a NULL key left out)
        head = "Expand " + " | ".join("(" + ", ".join(
            c if plain_column(e) is not None else f"{c} = {e}" for c, e in zip(node.columns, p)
            if plain_column(e) != c and not e.startswith("CASE WHEN FALSE")) + ")" for p in node.projections)
    elif isinstance(node, Dedup):
        order = ", ".join(f"{k.column} {'desc' if k.descending else 'asc'}" for k in node.order)
        head = f"Dedup first by ({order}) per {node.partition}"
    elif isinstance(node, Reweight):
        head = f"Reweight by {node.count}"
    elif isinstance(node, Window):
        head = "Window " + ", ".join(f"{node.call_sql(c)} AS {c.name}" for c in node.calls)
        if node.keep is not None:
            head += f" keep {node.keep.sql()}"
    elif isinstance(node, Recompute):
        head = f"Recompute ({node.reason}) over {node.names}"
    elif isinstance(node, TemporalFilter):
        head = f"TemporalFilter {node.predicate}" + (f" (time key {node.time_key})" if node.time_key else "")
    elif isinstance(node, TemporalProject):
        head = "TemporalProject " + ", ".join(f"{e} AS {c}" for c, e in zip(node.columns, node.exprs))
    else:
        head = type(node).__name__
    if costs:
        mode, reads = maintenance(node)
        head += f"  [{mode}: reads {reads}]"
    return "\n".join([f"{pad}{node.id} {head}"] + [explain(c, indent + 1, costs) for c in node.children])
