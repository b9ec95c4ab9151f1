"""Evaluate a logical plan for one micro-batch: bottom-up, each operator maps its inputs'
changelogs to its output changelog (the delta rules of ``consistent_stream.operators``).

Every changelog is a relation of Spark SQL (see :mod:`consistent_stream.changelog`): the
rules compose query texts, so the plan up to a materialization is one ``spark.sql`` call.

Where changes live. Linear operators (filter, project, union, reweight) only extend a query.
A stateful operator *materializes* what it reads more than once (its input, which is also
what it appends to its arrangement; an aggregate's partial accumulators) exactly once per
batch:

* incremental batch: on the driver as Arrow (one Spark job), so that sizes, emptiness and
  the touched keys are known without another job, a term over an empty change is skipped
  with its state read, and the change joins state as a broadcast relation. A change that
  would not be change-sized (the state rows its operator read exceed ``max_driver_rows``, or
  its own rows do: a join whose key has many rows on both sides) is written by the executors
  to scratch files instead;
* rebuild (first batch, full refresh, or a batch recomputed from snapshots): by the
  executors, as the arrangement's new base files (read back for the rest of the plan), so
  nothing table-sized passes through the driver. A rebuild of small sources is not one of
  these: the runtime evaluates it as an incremental batch whose change is the snapshots,
  over empty state (``rebuild=False, first=True``); an intermediate result of more than
  ``max_driver_rows`` rows still goes to the executors' files.

A change known to be empty (an empty source change, or a rule with nothing to compute) costs
no Spark job at all; its types come from :class:`PlanTypes`, computed once per plan by
analyzing the plan over empty sources without running anything.

Each materialization runs with a shuffle parallelism sized from the rows it processes
(:func:`~consistent_stream.settings.shuffle_partitions`): a few thousand rows need one task, not Spark's default 200.
Driver-side changes of up to ``SINGLE_PARTITION_ROWS`` are single partitions, so a query over
them only runs as one stage with no shuffle. A change known to be consolidated (a source's
change, an aggregate's output, and filters and column-keeping projections of them) is not
consolidated again: each consolidation is a shuffle.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from .. import settings, storage
from ..changelog import WEIGHT, Changelog, KeySet, Views, cols_sql, consolidate_sql, q
from ..operators.aggregate import AggregateSpec, OutputLookup, aggregate_delta, output_from_accumulators
from ..operators.dedup import dedup_delta
from ..operators.join import JoinSide, join_delta, whole_outer
from ..operators.keyed import RelationLookup, key_in, union_keys
from ..operators.linear import expand_sql, filter_sql, generate_sql, project_sql, reweight_sql, union_sql
from ..operators.recompute import RecomputeInput, recompute_delta
from ..operators.temporal import temporal_delta
from ..operators.window import TopPrefix, window_delta
from ..plan.clock import Instant, bind, clock_values, uses_clock
from ..plan.keys import unique_keys
from ..plan.logical import (Aggregate, Dedup, Expand, Filter, Generate, Join, Node, Project, Recompute, Reweight,
                            Scan, TemporalFilter, TemporalProject, Union, Window, plain_column, walk)
from ..settings import small_query_confs
from ..state import Arrangement, StateStore
from .local import LocalEngine, TooLarge
from .spark import SparkEngine

log = logging.getLogger(__name__)


def _nullable(schema: StructType) -> StructType:
    return StructType([StructField(f.name, f.dataType, True) for f in schema.fields])


@dataclass
class PlanTypes:
    """The Spark types of a plan: each node's changelog schema (columns + ``__weight``;
    ``<id>/input`` for an aggregate's projected input) and every arrangement of its stateful
    operators. Computed once per plan (:func:`type_plan`) and kept beside the checkpoint."""
    nodes: dict[str, StructType]
    arrangements: dict[str, Arrangement]

    def to_json(self) -> str:
        return json.dumps({
            "nodes": {k: json.loads(v.json()) for k, v in self.nodes.items()},
            "arrangements": {k: {"schema": json.loads(a.schema.json()), "key": list(a.key),
                                 "additive": list(a.additive), "live": a.live,
                                 "compensated": [list(p) for p in a.compensated]}
                             for k, a in self.arrangements.items()},
        }, sort_keys=True)

    @staticmethod
    def from_json(s: str) -> "PlanTypes":
        d = json.loads(s)
        return PlanTypes(
            {k: StructType.fromJson(v) for k, v in d["nodes"].items()},
            {k: Arrangement(k, StructType.fromJson(v["schema"]), tuple(v["key"]), tuple(v["additive"]), v["live"],
                            tuple(tuple(p) for p in v.get("compensated", ())))
             for k, v in d["arrangements"].items()})


class _OperatorState:
    """The :class:`~consistent_stream.operators.aggregate.OperatorState` of one plan node:
    arrangements named ``<node id>_<role>`` in the query's state store."""

    def __init__(self, ev: "BatchEvaluator", op_id: str):
        self.ev, self.op_id = ev, op_id

    def arrangement(self, role: str, sql: str, key: list[str], additive, live, compensated=()) -> Arrangement:
        name = f"{self.op_id}_{role}"
        if not self.ev.dry:
            return self.ev.types.arrangements[name]
        schema = self.ev.views.sql(sql).schema
        a = Arrangement(name, _nullable(schema), tuple(key), tuple(additive), live, tuple(compensated))
        self.ev.arrangements[name] = a
        return a

    def stage(self, role: str, sql: str, columns: list[str], key: list[str], additive: tuple[str, ...] = (WEIGHT,),
              live: str | None = None, consolidated: bool = False,
              compensated: tuple[tuple[str, str], ...] = (), rebuild_consolidated: bool = True) -> Changelog:
        """The batch's rows of arrangement ``role`` (a SELECT ``sql``): consolidated unless
        ``consolidated`` says they are, materialized and staged for the state commit; a
        rebuild writes them as the arrangement's base (consolidated there unless they are
        already or ``rebuild_consolidated`` is False: :meth:`StateStore.rebuild`). Returns them."""
        a = self.arrangement(role, sql, key, additive, live, compensated)
        casts = ", ".join(f"CAST({q(f.name)} AS {f.dataType.simpleString()}) AS {q(f.name)}" for f in a.schema.fields)
        typed = f"SELECT {casts} FROM ({sql})"
        if self.ev.dry:
            return _typed_stand_in(self.ev.views, a.schema)
        if self.ev.rebuild:
            return self.ev.store.rebuild(a, typed, consolidate=rebuild_consolidated, consolidated=consolidated)
        change = self.ev.materialize(typed if consolidated else a.consolidate_sql(f"({typed})", complete=False),
                                     a.schema)
        change.consolidated = True
        self.ev.store.stage(a, change)
        return change

    def old(self, role: str):
        name = f"{self.op_id}_{role}"
        if name in self.ev.shared_reads:
            return self.ev.shared_reads[name]
        if self.ev.dry:
            a = self.ev.arrangements[name]
            rows = Changelog.of_query(self.ev.views, Changelog.empty(self.ev.views, a.schema).sql[1:-1],
                                      a.schema.fieldNames())
            return RelationLookup(rows, list(a.key))
        return self.ev.store.lookup(self.ev.types.arrangements[name])


class _SharedRead:
    """One arrangement as two operators of a batch read it (an aggregate's ``acc`` and a join
    over its output, :class:`~consistent_stream.operators.aggregate.OutputLookup`): the first
    read also takes the keys registered with :meth:`read_ahead` (a superset, which every delta
    rule allows: the rows of keys it did not ask for cancel or meet nothing), and a later read
    whose keys that read covered (checked on the driver) gets the same rows instead of reading
    the files again. Any other read goes to the arrangement."""

    def __init__(self, lookup):
        self.lookup = lookup
        self.ahead: list[KeySet] = []
        self.followers: list[Callable[[KeySet], None]] = []
        self.done: tuple[KeySet, bool, Changelog] | None = None   # (keys, null_safe, rows) of the first read

    @property
    def empty(self) -> bool:
        return self.lookup.empty

    def read_ahead(self, keys: KeySet) -> None:
        """Also read ``keys`` (the arrangement's key columns, in its order) at the first read."""
        if self.done is None and not keys.empty:
            self.ahead.append(keys)

    def on_first_read(self, follow: Callable[[KeySet], None]) -> None:
        """Call ``follow`` with the keys the first read asks for (on the driver), right before
        it reads: a join over the aggregate's output starts reading its other side at the
        aggregate's groups then (:meth:`BatchEvaluator._join`), beside the aggregate's read."""
        if self.done is None:
            self.followers.append(follow)

    def read(self, keys: KeySet | None, null_safe: bool = True) -> Changelog:
        if self.done is not None:
            at, safe, rows = self.done
            if keys is not None and (safe or not null_safe) and at.covers(keys):
                return rows
            return self.lookup.read(keys, null_safe=null_safe)
        asked = keys
        if keys is not None and self.ahead and all(k.arrow is not None for k in [keys, *self.ahead]):
            try:
                keys = union_keys([keys, *self.ahead])
            except pa.ArrowException as e:   # keys of types that do not cast: the asked keys alone
                log.debug("keys read ahead not joined to the read of %s: %s", keys.columns, e)
        followers, self.followers = self.followers, []
        if asked is not None and asked.arrow is not None:
            for follow in followers:
                try:
                    follow(asked)
                except Exception as e:  # noqa: BLE001 (a read started early only saves time: read when asked)
                    log.debug("a read beside that of %s not started: %s", asked.columns, e)
        rows = self.lookup.read(keys, null_safe=null_safe)
        if keys is not None and keys.arrow is not None:
            self.done = (keys, null_safe, rows)
        return rows if keys is asked else _at(rows, asked)

    def prefetch(self, keys: KeySet | None, null_safe: bool = True) -> None:
        if self.done is None and not self.ahead:   # (else its first read asks for other keys)
            self.lookup.prefetch(keys, null_safe)

    def read_range(self, ranges):
        return self.lookup.read_range(ranges)

    def read_prefix(self, column, descending, nulls_first, need):
        return self.lookup.read_prefix(column, descending, nulls_first, need)


def _at(rows: Changelog, keys: KeySet) -> Changelog:
    """``rows`` (read at a superset of ``keys``, whose columns they hold) less the rows of
    other keys, where both are on the driver: the first reader of a :class:`_SharedRead` then
    does not carry the keys read ahead for the other one (an aggregate would finalize their
    groups, to cancel them). NULLs compare equal (:func:`key_in`): for a read with SQL ``=``
    keys, a superset, which every delta rule allows, as is ``rows`` itself when they are not
    on the driver."""
    if rows.arrow is None or keys.arrow is None or rows.is_empty:
        return rows
    keep = key_in(rows.arrow, keys.arrow, list(keys.columns))
    if pc.all(keep).as_py():
        return rows
    return Changelog.of_arrow(rows.views, rows.arrow.filter(keep))


def _read_other_side(other, output: OutputLookup, keys: list[str], other_keys: list[str],
                     null_safe: bool) -> Callable[[KeySet], None]:
    """For :meth:`_SharedRead.on_first_read`: given an aggregate's groups (a :class:`KeySet`
    of its group columns), start the read of a join's ``other`` side (its key columns
    ``other_keys``) at the same values, through the join's keys on the output side (``keys``,
    which ``output`` maps to group columns). The join's own read of that side later asks for
    the groups whose output changed, covered by these (:meth:`StateStore.read`)."""
    def follow(groups: KeySet) -> None:
        at = groups.arrow.select([output.key_map[k] for k in keys]).rename_columns(list(other_keys))
        other.prefetch(KeySet(groups.views, list(other_keys), at, None), null_safe)
    return follow


class BatchEvaluator:
    """One batch's evaluation of a plan.

    ``sources``: source key -> the source's changelog for the batch (source columns +
    ``__weight``); ``rebuild``: the state is rebuilt from these (snapshot) changelogs;
    ``first``: no earlier version of the output exists; ``scratch``: a directory for changes
    kept on the executors (removed by :meth:`close`); ``types``: the plan's types (None only
    for :func:`type_plan`'s dry run, which runs no Spark job); ``instant`` and
    ``previous_instant``: this batch's and the previous batch's instant, which the clock's
    calls are bound to (:mod:`consistent_stream.plan.clock`).
    """

    def __init__(self, spark: SparkSession, store: StateStore | None, sources: dict[str, Changelog], views: Views, *,
                 rebuild: bool, first: bool, scratch: str, types: PlanTypes | None,
                 max_driver_rows: int | None = None, local: LocalEngine | None = None,
                 parallelism: int | None = None, instant: Instant | None = None,
                 previous_instant: Instant | None = None):
        self.spark, self.store, self.sources, self.views = spark, store, sources, views
        self.instant, self.previous_instant = instant, previous_instant
        self.rows_recomputed = 0   # rows of touched partitions and recomputed blocks evaluated again
        self.parallelism = parallelism
        self.rebuild, self.first, self.scratch, self.types = rebuild, first, scratch, types
        self.dry = types is None
        self.max_driver_rows = settings.MAX_DRIVER_ROWS if max_driver_rows is None else max_driver_rows
        self.local = None if rebuild or self.dry else local
        self.engine = SparkEngine(spark, views, scratch)
        self.local_queries = self.spark_queries = 0
        self.changes_on_executors = 0   # materialized changes too large for the driver
        self.memo: dict[str, Changelog] = {}
        self.arrangements: dict[str, Arrangement] = {}   # filled by the dry run
        self.shared_reads: dict[str, _SharedRead] = {}   # arrangements two operators read this batch
        self._read_at_last = 0

    def close(self) -> None:
        if self.engine.wrote:   # (nothing to remove otherwise: on an object store, no listing)
            storage.remove_tree(self.scratch, ignore_errors=True)

    # ---- materialization ----------------------------------------------------------------------
    def materialize(self, sql: str, schema: StructType) -> Changelog:
        """Run the SELECT ``sql`` (whose result has the Spark types ``schema``) once.
        Incremental batches keep the result on the driver: computed there by the local engine
        when every relation it reads is on the driver and it is eligible
        (:mod:`~consistent_stream.exec.local`), else with Spark and ``toArrow`` when the state
        its operator read is change-sized, else the executors write it to scratch files first
        and only a result of at most ``max_driver_rows`` rows is then read by the driver.
        A result of more than ``max_driver_rows`` rows is never held on the driver: the local
        engine stops at that many (``TooLarge``) and the executors write it instead; a rebuild
        on the driver, whose state reads bound nothing, writes every Spark result first.
        Rebuilds keep it on the executors."""
        if self.dry:
            return _typed_stand_in(self.views, self.views.sql(sql).schema)
        read = self.store.metrics.rows_read - self._read_at_last
        self._read_at_last = self.store.metrics.rows_read
        large = False
        if self.local is not None and self.views.arrow:
            try:
                data = self.local.run(sql, self.views.arrow, schema, max_out=self.max_driver_rows)
            except TooLarge:
                data, large = None, True
                log.info("a change of more than %d rows is written by the executors, not held on the driver",
                         self.max_driver_rows)
            if data is not None:
                self.local_queries += 1
                return Changelog.of_arrow(self.views, data, schema=schema)
        self.spark_queries += 1
        rows = read + sum(c.rows or 0 for c in self.sources.values() if c.arrow is not None)
        confs = {} if self.rebuild else small_query_confs(self.spark, rows, self.parallelism)
        # a rebuild on the driver (``first``, not ``rebuild``) read no state: its results are
        # bounded by writing them first, as a result known to be large is
        collect = not self.rebuild and not self.first and not large and read <= self.max_driver_rows
        change, written = self.engine.run(sql, confs, collect=collect,
                                          read_back_rows=None if self.rebuild else self.max_driver_rows)
        if written is not None and written > self.max_driver_rows:
            self.changes_on_executors += 1
        return change

    # ---- the plan -----------------------------------------------------------------------------
    def output_sql(self, root: Node, columns: list[str], schema: StructType) -> str | None:
        """The SELECT of the batch's consolidated change of the model's output (None: known to
        be empty); ``columns``: the root's columns taken, by position, as ``schema``'s names
        and types."""
        rows = self.output_rows(root, columns, schema)
        if rows is None:
            return None
        sql, consolidated, _ = rows
        return sql if consolidated else consolidate_sql(f"({sql})", schema.fieldNames())

    def output_rows(self, root: Node, columns: list[str], schema: StructType) -> tuple[str, bool, bool] | None:
        """The SELECT of the batch's change of the model's output, typed as :meth:`output_sql`'s,
        whether it is consolidated (else a row may appear several times, its weights to be
        summed, and a weight may be 0 after summing) and whether it is positive
        (``Changelog.positive``: copies of rows, never a retraction, under any cast); None:
        known to be empty. A rebuild's writer consolidates rows that are neither where it
        partitions them anyway (:func:`~consistent_stream.sink.target.commit_rebuild`)."""
        d = self.delta(root)
        if d.is_empty:
            return None
        sel = ", ".join(f"CAST({q(c)} AS {f.dataType.simpleString()}) AS {q(f.name)}"
                        for c, f in zip(columns, schema.fields))
        typed = f"SELECT {sel}, {q(WEIGHT)} FROM {d.sql}"
        # distinct rows under casts that change nothing stay consolidated
        return typed, d.consolidated and not self.dry and self._same_types(root, columns, schema), d.positive

    def _same_types(self, root: Node, columns: list[str], schema: StructType) -> bool:
        have = {f.name: f.dataType for f in self.types.nodes[root.id].fields}
        return len(set(columns)) == len(columns) and all(have.get(c) == f.dataType
                                                         for c, f in zip(columns, schema.fields))

    def output(self, root: Node, columns: list[str], schema: StructType) -> Changelog:
        """The batch's consolidated change of the model's output, materialized."""
        sql = self.output_sql(root, columns, schema)
        out_schema = StructType(list(schema.fields) + [StructField(WEIGHT, LongType(), True)])
        if sql is None:
            import pyarrow as pa
            from ..delta.deltars import arrow_schema
            return Changelog.of_arrow(self.views, pa.Table.from_batches([], schema=arrow_schema(out_schema)),
                                      schema=out_schema, consolidated=True)
        ch = self.materialize(sql, out_schema)
        ch.consolidated = True
        return ch

    def delta(self, node: Node) -> Changelog:
        if node.id not in self.memo:
            ch = self._delta(node)
            self.memo[node.id] = _analyzed_stand_in(ch) if self.dry else ch
        return self.memo[node.id]

    def _empty(self, node_id: str) -> Changelog:
        return Changelog.empty(self.views, self.types.nodes[node_id])

    def _lazy(self, node: Node, sql: str | None, columns: list[str]) -> Changelog:
        if sql is None:
            return self._empty(node.id)
        return Changelog.of_query(self.views, sql, columns)

    def _delta(self, node: Node) -> Changelog:
        cols = list(node.columns) + [WEIGHT]
        if isinstance(node, Scan):
            src = self.sources[node.source.key]
            if src.is_empty and not self.dry:
                return self._empty(node.id)
            sel = ", ".join(f"{q(s)} AS {q(c)}" for s, c in zip(node.source_columns, node.columns))
            out = Changelog.of_query(self.views, f"SELECT {sel}, {q(WEIGHT)} FROM {src.sql}", cols)
            # a scan of every column of a consolidated change is consolidated
            out.consolidated = src.consolidated and len(set(node.source_columns)) == len(src.data_columns)
            out.local, out.positive = src.local, src.positive
            return out
        if isinstance(node, (Filter, Project, Expand, Generate, Reweight)):
            child = self.delta(node.child)
            if child.is_empty:
                return self._empty(node.id)
            if isinstance(node, Filter):
                out = Changelog.of_query(self.views, filter_sql(child.sql, node.predicate), child.columns)
                out.consolidated = child.consolidated  # a subset of distinct rows stays distinct
                out.unique_by = child.unique_by
                out.local, out.positive = child.local, child.positive
                return out
            if isinstance(node, Project):
                out = Changelog.of_query(self.views, project_sql(child.sql, node.columns, node.exprs), cols)
                # only a projection that keeps every column (renamed, reordered), or columns that
                # tell the rows apart, keeps rows distinct
                kept = {plain_column(e) for e in node.exprs}
                out.consolidated = child.consolidated and (set(child.data_columns) <= kept or (
                    child.unique_by is not None and set(child.unique_by) <= kept))
                out.local, out.positive = child.local, child.positive
                return out
            if isinstance(node, Generate):
                sql = generate_sql(child.sql, child.data_columns, node.generator, node.outer, node.names)
                out = Changelog.of_query(self.views, sql, cols)
                out.positive = child.positive   # each row's weight on each of its generated rows
                return out
            if isinstance(node, Expand):
                out = Changelog.of_query(self.views, expand_sql(child.sql, node.columns, node.projections), cols)
                out.local, out.positive = child.local, child.positive
                return out
            out = Changelog.of_query(self.views, reweight_sql(child.sql, child.columns, node.count), cols)
            out.local = child.local
            out.positive = child.positive   # (times a count >= 1: rows of count 0 are dropped)
            return out
        if isinstance(node, Union):
            # linear: d(A union all B) = dA union all dB
            a, b = self.delta(node.left), self.delta(node.right)
            if a.is_empty and b.is_empty:
                return self._empty(node.id)
            if a.is_empty or b.is_empty:
                only = b if a.is_empty else a
                sel = ", ".join(f"{q(x)} AS {q(y)}" for x, y in zip(only.columns, cols))
                out = Changelog.of_query(self.views, f"SELECT {sel} FROM {only.sql}", cols)
                out.positive = only.positive
                return out
            out = Changelog.of_query(self.views, union_sql(a.sql, b.sql, cols), cols)
            out.positive = a.positive and b.positive
            return out
        if isinstance(node, Join):
            return self._join(node)
        if isinstance(node, Dedup):
            st = _OperatorState(self, node.id)
            child = self.delta(node.child)
            rows = self._input(st, "rows", child, list(node.partition))
            return self._lazy(node, dedup_delta(rows, st.old("rows"), node.partition, node.order), cols)
        if isinstance(node, Aggregate):
            return self._aggregate(node)
        if isinstance(node, Window):
            return self._window(node)
        if isinstance(node, (TemporalFilter, TemporalProject)):
            return self._temporal(node)
        if isinstance(node, Recompute):
            return self._recompute(node)
        raise TypeError(f"no delta rule for {type(node).__name__}")

    def _bag(self, node: Node) -> bool:
        """Whether ``node``'s output may hold a row more than once (no unique key)."""
        return not unique_keys(node)

    def _counted(self, *changes: Changelog | None) -> None:
        """Count the rows a recomputing rule evaluated again (``rows_recomputed``)."""
        self.rows_recomputed += sum((c.rows or 0) for c in changes if c is not None)

    def _window(self, node: Window) -> Changelog:
        st = _OperatorState(self, node.id)
        child = self.delta(node.child)
        prefix = _top_prefix(node)
        rows = self._input(st, "rows", child, list(node.partition) or ([prefix.column] if prefix else []))
        calls = [(c.name, node.call_sql(c)) for c in node.calls]
        out, before = window_delta(rows, st.old("rows"), list(node.partition), calls,
                                   node.keep.sql() if node.keep is not None else None, self._bag(node.child),
                                   prefix)
        if out is not None:
            self._counted(rows, before)
        ch = self._lazy(node, out, list(node.columns) + [WEIGHT])
        ch.consolidated = out is not None
        return ch

    def _clock_moved(self, *sqls: str) -> bool:
        """Whether the clock calls of the expressions ``sqls`` take other values at this
        batch's instant than at the previous batch's (False on a first batch; True in the dry
        run, which builds every term)."""
        if self.dry:
            return True
        if self.first or self.previous_instant is None:
            return False
        return any(clock_values(s, self.previous_instant) != clock_values(s, self.instant) for s in sqls)

    def _temporal(self, node: TemporalFilter | TemporalProject) -> Changelog:
        st = _OperatorState(self, node.id)
        child = self.delta(node.child)
        key_col = f"{node.id}__tk"
        time_key = getattr(node, "time_key", None)
        extra = [(key_col, time_key)] if time_key else []
        self._input(st, "rows", child, [key_col] if time_key else [], extra)
        out_cols = list(node.columns)
        if isinstance(node, TemporalFilter):
            texts = [node.predicate]

            def at(i):
                pred = bind(node.predicate, i)
                return lambda rel: f"SELECT {cols_sql(out_cols)}, {q(WEIGHT)} FROM {rel} WHERE {pred}"
        else:
            texts = [e for e in node.exprs if uses_clock(e)]

            def at(i):
                exprs = [bind(e, i) for e in node.exprs]
                return lambda rel: project_sql(rel, out_cols, exprs)
        old = None
        lookup = st.old("rows")
        if self._clock_moved(*texts) and not lookup.empty:
            ranges = self._crossing(node) if time_key and not self.dry else None
            old = lookup.read_range({key_col: ranges}) if ranges is not None else lookup.read(None)
            old = None if old.is_empty else old
            self._counted(old)
        now, before = at(self.instant), at(self.previous_instant)
        return self._lazy(node, temporal_delta(child, old, now, before, out_cols), list(node.columns) + [WEIGHT])

    def _crossing(self, node: TemporalFilter) -> list[tuple[object, object]] | None:
        """The ranges of the time key a row must lie in for the filter's verdict to move
        between the two instants: per bound, its values at both; None when one is NULL (every
        row is read)."""
        sel = ", ".join(f"{bind(b, i)} AS `b{n}_{k}`" for n, b in enumerate(node.bounds)
                        for k, i in enumerate((self.previous_instant, self.instant)))
        row = self.views.sql(f"SELECT {sel}").toArrow().to_pylist()[0]
        ranges = []
        for n in range(len(node.bounds)):
            a, b = row[f"b{n}_0"], row[f"b{n}_1"]
            if a is None or b is None:
                return None
            try:
                ranges.append((min(a, b), max(a, b)))
            except TypeError:
                return None
        return ranges

    def _recompute(self, node: Recompute) -> Changelog:
        st = _OperatorState(self, node.id)
        deltas = [self.delta(c) for c in node.inputs]
        staged = [self._input(st, f"in{i}", d, []) for i, d in enumerate(deltas)]
        if all(d.is_empty for d in deltas) and not self._clock_moved(node.sql) and not self.first:
            return self._empty(node.id)   # Q of unchanged inputs at unchanged clock values: no change
        inputs = []
        for i, (d, child, cols) in enumerate(zip(staged, node.inputs, node.input_columns)):
            lookup = st.old(f"in{i}")
            old = None if lookup.empty else lookup.read(None)
            old = None if old is None or old.is_empty else old
            self._counted(d, old)
            inputs.append(RecomputeInput(d, old, cols, self._bag(child)))
        before = None if self.first else bind(node.sql, self.previous_instant)
        out = recompute_delta(inputs, bind(node.sql, self.instant), before, list(node.columns))
        ch = self._lazy(node, out, list(node.columns) + [WEIGHT])
        ch.consolidated = out is not None
        return ch

    def _input(self, st: _OperatorState, role: str, child: Changelog, key: list[str],
               extra: list[tuple[str, str]] = (), rebuild_consolidated: bool = True) -> Changelog:
        """A stateful operator's input (``child`` plus ``extra`` computed columns): consolidated,
        materialized once and appended to its arrangement ``role`` (rebuild: written as the
        arrangement, consolidated unless ``rebuild_consolidated`` is False)."""
        data = [c for c in child.columns if c != WEIGHT]
        if child.is_empty:
            a = self.types.arrangements[f"{st.op_id}_{role}"]
            return Changelog.empty(self.views, a.schema)
        sel = ", ".join([q(c) for c in data] + [f"{e} AS {q(n)}" for n, e in extra] + [q(WEIGHT)])
        # computed key columns are functions of the row: a consolidated child stays consolidated
        out = st.stage(role, f"SELECT {sel} FROM {child.sql}", data + [n for n, _ in extra] + [WEIGHT], key,
                       consolidated=child.consolidated, rebuild_consolidated=rebuild_consolidated)
        out.positive = child.positive   # (its rows, consolidated or not)
        return out

    def _types_of(self, node: Node) -> dict[str, str]:
        schema = self.delta(node).df.schema if self.dry else self.types.nodes[node.id]
        return {f.name: f.dataType.simpleString() for f in schema.fields}

    def _join(self, node: Join) -> Changelog:
        st = _OperatorState(self, node.id)
        roles = {"left": node.left, "right": node.right}
        if self.dry:   # (the dry run types an aggregate's spec and arrangement as it evaluates it)
            for child in roles.values():
                self.delta(child)
        shared = {role: None if node.bands else self._aggregate_output(child, node.join_key(role))
                  for role, child in roles.items()}
        # the side that is not shared first: its keys are read ahead (below)
        order = ["right", "left"] if shared["left"] is not None and shared["right"] is None else ["left", "right"]
        sides, olds = {}, {}
        for role in order:
            child_node, other_role = roles[role], "right" if role == "left" else "left"
            if shared[role] is not None:
                other_old = olds.get(other_role)
                # the other side's old rows are read at this side's change keys, and for the
                # unmatched rows of an outer side at its own change's keys too (join_delta)
                own_keys_too = node.kind == "full" or (other_role == "right" and node.kind != "inner")
                if other_old is not None and shared[other_role] is None and isinstance(shared[role].acc, _SharedRead) \
                        and not (own_keys_too and not sides[other_role].delta.is_empty):
                    # this side's change is at the aggregate's changed groups, a subset of those
                    # it reads its accumulators at: the other side's old rows are read there,
                    # beside that read, instead of after it (join_delta's read takes them)
                    shared[role].acc.on_first_read(_read_other_side(other_old, shared[role], node.join_key(role),
                                                                    node.join_key(other_role), node.null_safe))
                delta = self._output_change(child_node)
                olds[role] = shared[role]
            else:
                # a key that is a column of the input is looked up by that column; others are
                # computed. A rebuild writes the side as its rows come (its lookups take a Z-set),
                # except for an outer join's side of rows not known to be positive: that rebuild
                # is SQL's outer join of two relations (whole_outer)
                child = self.delta(child_node)
                delta = self._input(st, role, child, node.arrangement_key(role), node.key_columns(role),
                                    rebuild_consolidated=node.kind in ("left", "full") and not child.positive)
                olds[role] = st.old(role)
            types = self._types_of(child_node)
            side = sides[role] = JoinSide(delta, node.join_key(role), list(child_node.columns),
                                          [types[c] for c in child_node.columns], node.band_columns(role))
            other = shared[other_role]
            if other is not None and isinstance(other.acc, _SharedRead) and not delta.is_empty and not other.empty:
                # the aggregate reads its accumulators at its groups and at the keys this
                # side's change looks up on the other: one read for both operators
                keys = side.change_keys(node.null_safe)
                other.acc.read_ahead(other.group_keys(keys.renamed(node.join_key(other_role))))
        bands = [b.op for b in node.bands] if node.kind == "inner" else []
        whole = whole_outer(node.kind, sides["left"], sides["right"], olds["left"], olds["right"])
        out = join_delta(node.kind, sides["left"], sides["right"], olds["left"], olds["right"], node.residual,
                         node.null_safe, bands)
        ch = self._lazy(node, out, list(node.columns) + [WEIGHT])
        dl, dr = sides["left"].delta, sides["right"].delta
        if whole and not ch.is_empty:
            # SQL's outer join of two relations: positive weights; a left one of two
            # consolidated ones, distinct rows (join.py's docstring); when the right side is an
            # aggregate's output looked up by its groups (one row per key), each left row meets
            # at most one right row, so its columns tell rows apart
            ch.positive = True
            ch.consolidated = node.kind == "left" and dl.consolidated and dr.consolidated
            ch.unique_by = tuple(node.left.columns) if ch.consolidated and shared["right"] is not None else None
        elif node.kind == "inner" and olds["left"].empty and olds["right"].empty:
            ch.positive = dl.positive and dr.positive   # dL join dR alone: products of positive weights
        return ch

    def _aggregate_output(self, side: Node, keys: list[str]) -> OutputLookup | None:
        """A join side that is an aggregate's output (directly, or through a projection of
        plain columns), looked up by exactly its group columns, shares the aggregate's ``acc``
        arrangement (:class:`~consistent_stream.operators.aggregate.OutputLookup`) instead of
        keeping its own: the lookup over it, or None when the side is not one (other
        aggregates, other keys, computed keys)."""
        project = side if isinstance(side, Project) else None
        agg = side.child if project is not None else side
        if not isinstance(agg, Aggregate):
            return None
        source = dict(zip(project.columns, (plain_column(e) for e in project.exprs))) if project is not None \
            else {c: c for c in agg.columns}
        key_map = {k: source.get(k) for k in keys}
        spec = self._aggregate_spec(agg)
        if not output_from_accumulators(spec) or None in key_map.values() or \
                sorted(key_map.values()) != sorted(agg.group_names) or len(set(keys)) != len(keys):
            return None
        name = f"{agg.id}_acc"
        acc = _OperatorState(self, agg.id).old("acc")
        if not self.dry and name not in self.shared_reads:
            acc = self.shared_reads[name] = _SharedRead(acc)
        move = (lambda rel: project_sql(rel, project.columns, project.exprs)) if project is not None else None
        return OutputLookup(spec, acc, key_map, list(side.columns) + [WEIGHT], move)

    def _output_change(self, side: Node) -> Changelog:
        """The batch's change of a join side that reads its old rows from an aggregate's
        arrangement: consolidated, and on the driver in an incremental batch (where a join
        side's change is, to find its keys); a rebuild's stays a query over the aggregate's
        base files."""
        d = self.delta(side)
        if d.is_empty or self.dry:
            return d
        cols = [c for c in d.columns if c != WEIGHT]
        sql = f"SELECT {cols_sql(cols)}, {q(WEIGHT)} FROM {d.sql}" if d.consolidated else \
            consolidate_sql(d.sql, cols)
        if self.rebuild:
            out = Changelog.of_query(self.views, sql, cols + [WEIGHT])
        else:
            out = self.materialize(sql, self.types.nodes[side.id])
        out.consolidated = True
        return out

    def _aggregate_spec(self, node: Aggregate) -> AggregateSpec:
        """What aggregate ``node`` computes (:class:`AggregateSpec`); its input's types from
        the plan's types (the dry run: from its input's change, analyzed)."""
        args, arg_cols = self._aggregate_args(node)
        input_id = node.id + "/input"
        if self.dry:
            in_schema = self.memo[input_id].df.schema
            out_types = {}
        else:
            in_schema = self.types.nodes[input_id]
            out_types = {f.name: f.dataType.simpleString() for f in self.types.nodes[node.id].fields}
        return AggregateSpec(node.id, list(node.group_names), list(node.aggs), args,
                             {f.name: f.dataType for f in in_schema.fields}, out_types)

    @staticmethod
    def _aggregate_args(node: Aggregate) -> tuple[dict[str, str], dict[str, str]]:
        """Per aggregate the input column holding its argument, and per distinct argument
        expression that column."""
        args: dict[str, str] = {}
        arg_cols: dict[str, str] = {}
        for a in node.aggs:
            if a.arg is not None:
                arg_cols.setdefault(a.arg, f"{node.id}__x{len(arg_cols)}")
                args[a.name] = arg_cols[a.arg]
        return args, arg_cols

    def _aggregate(self, node: Aggregate) -> Changelog:
        st = _OperatorState(self, node.id)
        child = self.delta(node.child)
        _, arg_cols = self._aggregate_args(node)
        in_cols = list(node.group_names) + list(arg_cols.values()) + [WEIGHT]
        input_id = node.id + "/input"
        if child.is_empty:
            pre = self._empty(input_id)
        else:
            sel = ", ".join([f"{e} AS {q(n)}" for n, e in zip(node.group_names, node.group_exprs)]
                            + [f"{e} AS {q(n)}" for e, n in arg_cols.items()] + [q(WEIGHT)])
            pre = Changelog.of_query(self.views, f"SELECT {sel} FROM {child.sql}", in_cols)
            pre.local = child.local
        if self.dry:
            self.memo[input_id] = pre
        spec = self._aggregate_spec(node)
        out = aggregate_delta(spec, pre, st, self.first, self.materialize)
        ch = self._lazy(node, out, list(node.columns) + [WEIGHT])
        ch.consolidated = True  # at most -old and +new per group, distinct (aggregate_delta's contract)
        if self.first and not ch.is_empty:
            # no old rows: one row of weight +1 per group, told apart by its group columns
            ch.positive, ch.unique_by = True, tuple(node.group_names)
        return ch


def _top_prefix(node: Window) -> TopPrefix | None:
    """The prefix a top-N over the whole input reads (:class:`~..operators.window.TopPrefix`):
    a Window without PARTITION BY keeping ranks up to a bound of a ROW_NUMBER or RANK."""
    if node.partition or node.keep is None or node.keep.hi is None:
        return None
    call = next(c for c in node.calls if c.name == node.keep.column)
    if call.func.upper() not in ("ROW_NUMBER()", "RANK()") or not call.order:
        return None
    first = call.order[0]
    return TopPrefix(first.column, first.descending, first.effective_nulls_first, node.keep.hi)


def _typed_stand_in(views: Views, schema: StructType) -> Changelog:
    """For the dry run: an empty relation of ``schema`` standing in for a materialized change
    (so a rule that reads its inputs several times analyzes them once, not a plan that doubles
    per level), with unknown rows (so no rule skips a term)."""
    ch = Changelog.empty(views, _nullable(schema))
    ch.rows, ch.consolidated = None, False
    return ch


def _analyzed_stand_in(ch: Changelog) -> Changelog:
    """For the dry run: a node's change ``ch`` analyzed once and replaced by an empty relation
    of its schema, with its flags (so its parents' rules are the ones a batch builds). Its
    parents' SQL then reads a flat relation, not the text of every rule below it, whose
    analysis cost grew with the plan's depth."""
    out = _typed_stand_in(ch.views, ch.df.schema)
    out.columns = list(ch.columns)
    out._df = ch.df   # its schema, analyzed once (Spark keeps it), for what reads ``df`` next
    out.rows, out.consolidated, out.local = ch.rows, ch.consolidated, ch.local
    out.unique_by, out.positive = ch.unique_by, ch.positive
    return out


def type_plan(spark: SparkSession, root: Node, source_schemas: dict[str, StructType]) -> PlanTypes:
    """The plan's :class:`PlanTypes`: the plan analyzed over empty sources of the given schemas
    (source columns, without ``__weight``); no Spark job runs."""
    views = Views(spark)
    try:
        sources = {k: Changelog.empty(views, StructType(list(s.fields) + [StructField(WEIGHT, LongType())]))
                   for k, s in source_schemas.items()}
        for c in sources.values():
            c.rows = None  # analyzed as if it held rows, so that every rule is built
        ev = BatchEvaluator(spark, None, sources, views, rebuild=False, first=False, scratch="", types=None)
        for n in walk(root):
            ev.delta(n)
        nodes = {k: _nullable(c.df.schema) for k, c in ev.memo.items()}
        return PlanTypes(nodes, dict(ev.arrangements))
    finally:
        views.drop()
