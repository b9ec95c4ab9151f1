"""Evaluate a logical plan for one micro-batch: bottom-up, each operator maps its inputs'
changelogs to its output changelog (the delta rules of ``consistent_stream.operators``).

Where changes live. Linear operators (filter, project, union, reweight) only extend a lazy
Spark plan. A stateful operator *materializes* what it reads more than once (its input, which
is also what it appends to its arrangement; an aggregate's partial accumulators) exactly
once per batch:

* incremental batch: on the driver as Arrow (one Spark job), so that sizes, emptiness and
  the touched keys are known without another job, a term over an empty change is skipped
  with its state read, and the change joins state as a broadcast relation. A change that
  would not be change-sized (the state rows its operator reads exceed ``max_driver_rows``)
  is written by the executors to scratch files instead;
* rebuild (first batch, full refresh, or a batch recomputed from snapshots): by the
  executors, as the arrangement's new base files (read back for the rest of the plan), so
  nothing table-sized passes through the driver.

A change known to be empty (an empty source change, or a rule with nothing to compute)
costs no Spark job at all; its types come from :class:`PlanTypes`, computed once per plan by
evaluating it over empty sources without running anything.

Each materialization runs with a shuffle parallelism sized from the rows it processes
(:func:`shuffle_partitions`): a few thousand rows need one task, not Spark's default 200.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from ..changelog import WEIGHT, Changelog, consolidate
from ..delta.files import new_dir, write_spark
from ..operators.aggregate import aggregate_delta
from ..operators.dedup import dedup_delta
from ..operators.join import join_delta
from ..operators.keyed import FrameLookup
from ..operators.linear import filter_delta, project_delta, reweight_delta
from ..state import Arrangement, StateStore
from .logical import Aggregate, Dedup, Filter, Join, Node, Project, Reweight, Scan, Union, walk

MAX_DRIVER_ROWS = 1_000_000
"""State rows an incremental operator may read and still keep its change on the driver."""
ROWS_PER_TASK = 100_000


def shuffle_partitions(spark: SparkSession, rows: int) -> int:
    """Shuffle partitions for a query processing ``rows`` rows: one per ``ROWS_PER_TASK``,
    at least 1, at most twice the cores."""
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    return max(1, min(2 * cores, math.ceil(rows / ROWS_PER_TASK)))


@contextmanager
def spark_confs(spark: SparkSession, confs: dict[str, str]):
    """Run with session confs set, restoring the previous values afterwards."""
    old = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _nullable(schema: StructType) -> StructType:
    return StructType([StructField(f.name, f.dataType, True) for f in schema.fields])


@dataclass
class PlanTypes:
    """The Spark types of a plan: each node's changelog schema (columns + ``__weight``) and
    every arrangement of its stateful operators. Computed once per plan (:func:`type_plan`)
    and kept beside the checkpoint."""
    nodes: dict[str, StructType]
    arrangements: dict[str, Arrangement]

    def to_json(self) -> str:
        return json.dumps({
            "nodes": {k: json.loads(v.json()) for k, v in self.nodes.items()},
            "arrangements": {k: {"schema": json.loads(a.schema.json()), "key": list(a.key),
                                 "additive": list(a.additive), "live": a.live}
                             for k, a in self.arrangements.items()},
        }, sort_keys=True)

    @staticmethod
    def from_json(s: str) -> "PlanTypes":
        d = json.loads(s)
        return PlanTypes(
            {k: StructType.fromJson(v) for k, v in d["nodes"].items()},
            {k: Arrangement(k, StructType.fromJson(v["schema"]), tuple(v["key"]), tuple(v["additive"]), v["live"])
             for k, v in d["arrangements"].items()})


class _OperatorState:
    """The :class:`~consistent_stream.operators.aggregate.OperatorState` of one plan node:
    arrangements named ``<node id>_<role>`` in the query's state store."""

    def __init__(self, ev: "BatchEvaluator", op_id: str):
        self.ev, self.op_id = ev, op_id

    def arrangement(self, role: str, df: DataFrame, key: list[str], additive=(WEIGHT,), live=None) -> Arrangement:
        name = f"{self.op_id}_{role}"
        if self.ev.types is not None:
            return self.ev.types.arrangements[name]
        a = Arrangement(name, _nullable(df.schema), tuple(key), tuple(additive), live)
        self.ev.arrangements[name] = a
        return a

    def stage(self, role: str, df: DataFrame, key: list[str], additive: tuple[str, ...] = (WEIGHT,),
              live: str | None = None, consolidated: bool = False) -> Changelog:
        a = self.arrangement(role, df, key, additive, live)
        df = df.select(*[F.col(f"`{f.name}`").cast(f.dataType) for f in a.schema.fields])
        if self.ev.dry:
            return Changelog(df)
        if self.ev.rebuild:
            return self.ev.store.rebuild(a, df)
        change = self.ev.materialize(df if consolidated else a.consolidate(df, complete=False))
        self.ev.store.stage(a, change)
        return change

    def old(self, role: str):
        name = f"{self.op_id}_{role}"
        if self.ev.dry:
            return FrameLookup(self.ev.spark.createDataFrame([], self.ev.arrangements[name].schema))
        return self.ev.store.lookup(self.ev.types.arrangements[name])


class BatchEvaluator:
    """One batch's evaluation of a plan.

    ``sources``: source key -> the source's changelog for the batch (source columns +
    ``__weight``); ``rebuild``: the state is rebuilt from these (snapshot) changelogs;
    ``first``: no earlier version of the output exists; ``scratch``: a directory for changes
    kept on the executors (removed by :meth:`close`); ``types``: the plan's types (None only
    for :func:`type_plan`'s dry run, which runs no Spark job).
    """

    def __init__(self, spark: SparkSession, store: StateStore | None, sources: dict[str, Changelog], *,
                 rebuild: bool, first: bool, scratch: str, types: PlanTypes | None,
                 max_driver_rows: int = MAX_DRIVER_ROWS):
        self.spark, self.store, self.sources = spark, store, sources
        self.rebuild, self.first, self.scratch, self.types = rebuild, first, scratch, types
        self.dry = types is None
        self.max_driver_rows = max_driver_rows
        self.memo: dict[str, Changelog] = {}
        self.arrangements: dict[str, Arrangement] = {}   # filled by the dry run
        self._read_at_last = 0

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)

    # ---- materialization ----------------------------------------------------------------------
    def materialize(self, df: DataFrame) -> Changelog:
        """Run ``df`` once: to the driver (incremental, change-sized) or to scratch files."""
        if self.dry:
            return Changelog(df)
        read = self.store.metrics.rows_read - self._read_at_last
        self._read_at_last = self.store.metrics.rows_read
        if not self.rebuild and read <= self.max_driver_rows:
            rows = read + sum(c.rows or 0 for c in self.sources.values() if c.arrow is not None)
            with spark_confs(self.spark, {"spark.sql.shuffle.partitions": str(shuffle_partitions(self.spark, rows))}):
                data = df.toArrow()
            return Changelog.of_arrow(self.spark, data, schema=df.schema)
        files = write_spark(df, self.scratch, new_dir("change"))
        n = sum(f.num_records for f in files)
        if not files:
            return Changelog(self.spark.createDataFrame([], df.schema), rows=0)
        from ..delta.deltars import as_uri
        uris = [as_uri(os.path.join(self.scratch, f.path)) for f in files]
        return Changelog(self.spark.read.schema(df.schema).parquet(*uris), rows=n)

    # ---- the plan -----------------------------------------------------------------------------
    def output(self, root: Node, columns: list[str], schema: StructType) -> Changelog:
        """The batch's consolidated change of the model's output, materialized; ``columns``:
        the root's columns taken, by position, as ``schema``'s names and types."""
        d = self.delta(root)
        out_schema = StructType(list(schema.fields) + [StructField(WEIGHT, _long(), True)])
        if d.empty:
            from pyspark.sql.pandas.types import to_arrow_schema
            import pyarrow as pa
            return Changelog.of_arrow(self.spark, pa.Table.from_batches([], schema=to_arrow_schema(out_schema)),
                                      consolidated=True, schema=out_schema)
        out = d.df.select(*[F.col(f"`{c}`").cast(f.dataType).alias(f.name) for c, f in zip(columns, schema.fields)],
                          F.col(WEIGHT))
        ch = self.materialize(consolidate(out))
        ch.consolidated = True
        return ch

    def delta(self, node: Node) -> Changelog:
        if node.id not in self.memo:
            self.memo[node.id] = self._delta(node)
        return self.memo[node.id]

    def _empty(self, node: Node) -> Changelog:
        return Changelog(self.spark.createDataFrame([], self.types.nodes[node.id]), rows=0)

    def _delta(self, node: Node) -> Changelog:
        if isinstance(node, Scan):
            src = self.sources[node.source.key]
            if src.empty and not self.dry:
                return self._empty(node)
            df = src.df.select(*[src.df[f"`{s}`"].alias(c) for s, c in zip(node.source_columns, node.columns)],
                               F.col(WEIGHT))
            return Changelog(df)
        if isinstance(node, (Filter, Project, Reweight)):
            child = self.delta(node.child)
            if child.empty:
                return self._empty(node)
            if isinstance(node, Filter):
                return Changelog(filter_delta(child.df, node.predicate))
            if isinstance(node, Project):
                return Changelog(project_delta(child.df, node.columns, node.exprs))
            return Changelog(reweight_delta(child.df, node.count))
        if isinstance(node, Union):
            # linear: d(A union all B) = dA union all dB
            a, b = self.delta(node.left), self.delta(node.right)
            if a.empty and b.empty:
                return self._empty(node)
            if a.empty or b.empty:
                only = b if a.empty else a
                return Changelog(only.df.toDF(*node.columns, WEIGHT))
            return Changelog(a.df.unionByName(b.df))
        if isinstance(node, Join):
            return self._join(node)
        if isinstance(node, Dedup):
            st = _OperatorState(self, node.id)
            rows = self._input(st, "rows", self.delta(node.child).df, self.delta(node.child).empty,
                               list(node.partition))
            return self._result(node, dedup_delta(rows, st.old("rows"), node.partition, node.order))
        if isinstance(node, Aggregate):
            return self._aggregate(node)
        raise TypeError(f"no delta rule for {type(node).__name__}")

    def _result(self, node: Node, df: DataFrame | None) -> Changelog:
        if df is None:
            return self._empty(node)
        return Changelog(df)

    def _input(self, st: _OperatorState, role: str, df: DataFrame, empty: bool, key: list[str]) -> Changelog:
        """A stateful operator's input: consolidated, materialized once and appended to its
        arrangement ``role`` (rebuild: written as the arrangement)."""
        if empty:
            a = self.types.arrangements[f"{st.op_id}_{role}"]
            return Changelog(self.spark.createDataFrame([], a.schema), rows=0)
        return st.stage(role, df, key)

    def _join(self, node: Join) -> Changelog:
        st = _OperatorState(self, node.id)
        sides = []
        for role, child_node, exprs in (("left", node.left, node.left_keys), ("right", node.right, node.right_keys)):
            child = self.delta(child_node)
            names = [f"{node.id}__{role[0]}k{i}" for i in range(len(exprs))]
            df = None if child.empty else child.df.select(
                *[F.col(f"`{c}`") for c in child_node.columns],
                *[F.expr(e).alias(n) for e, n in zip(exprs, names)], F.col(WEIGHT))
            sides.append((self._input(st, role, df, child.empty, names), names))
        (dl, lk), (dr, rk) = sides
        out = join_delta(node.kind, dl, dr, st.old("left"), st.old("right"), lk, rk, node.residual,
                         list(node.left.columns), list(node.right.columns), node.null_safe)
        return self._result(node, out)

    def _aggregate(self, node: Aggregate) -> Changelog:
        st = _OperatorState(self, node.id)
        child = self.delta(node.child)
        args: dict[str, str] = {}
        arg_cols: dict[str, str] = {}
        for a in node.aggs:
            if a.arg is not None:
                arg_cols.setdefault(a.arg, f"{node.id}__x{len(arg_cols)}")
                args[a.name] = arg_cols[a.arg]
        if child.empty:
            pre = Changelog(self.spark.createDataFrame([], self.types.nodes[node.id + "/input"]), rows=0)
        else:
            pre = Changelog(child.df.select(*[F.expr(e).alias(n) for n, e in zip(node.group_names, node.group_exprs)],
                                            *[F.expr(e).alias(n) for e, n in arg_cols.items()], F.col(WEIGHT)))
        if self.dry:
            self.memo[node.id + "/input"] = pre
        out = aggregate_delta(node.id, pre, list(node.group_names), list(node.aggs), args, st,
                              self.first, self.materialize)
        return self._result(node, out)


def type_plan(spark: SparkSession, root: Node, source_schemas: dict[str, StructType]) -> PlanTypes:
    """The plan's :class:`PlanTypes`: the plan evaluated over empty sources of the given
    schemas (source columns, without ``__weight``), lazily; no Spark job runs."""
    from pyspark.sql.types import LongType
    sources = {k: Changelog(spark.createDataFrame([], StructType(list(s.fields) + [StructField(WEIGHT, LongType())])))
               for k, s in source_schemas.items()}
    ev = BatchEvaluator(spark, None, sources, rebuild=False, first=False, scratch="", types=None)
    for n in walk(root):
        ev.delta(n)
    nodes = {k: _nullable(c.df.schema) for k, c in ev.memo.items()}
    return PlanTypes(nodes, dict(ev.arrangements))


def _long():
    from pyspark.sql.types import LongType
    return LongType()
