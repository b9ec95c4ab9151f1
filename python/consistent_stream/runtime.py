"""One micro-batch, step by step: the exactly-once protocol (docs/concepts/exactly-once.md).

For batch ``b`` ending at cut ``C_b`` (the previous one ended at ``C_{b-1}``):

1. read each source's changes in ``(C_{b-1}, C_b]`` as a changelog (driver-side Arrow: the
   size of the change);
2. choose the strategy: *incremental* (the delta rules, state read by key), or *recompute*
   (the batch is the first of its query, or its change is larger than
   ``recompute_threshold`` x the sources' rows: every arrangement and the target are rebuilt
   from the snapshots at ``C_b`` by Spark's executors, as Databricks Enzyme chooses per
   update) and log why. A rebuild whose sources hold at most ``driver_rebuild_rows`` rows
   (the model's config, :data:`~consistent_stream.spec.DRIVER_REBUILD_ROWS` by default)
   runs on the driver instead: the snapshots are read as changelogs of inserts and go
   through the delta rules over empty state (the view of a snapshot is its change from
   nothing), which costs a few Spark jobs, not one per arrangement;
3. evaluate the plan bottom-up; stateful operators read their arrangements at the state
   version the target's commit of batch ``b-1`` recorded, and stage their changes;
4. commit the state table once with txn ``(app id, b)`` (skipped when a crashed attempt
   already did);
5. commit the target last, with txn ``(app id, b)`` and :class:`BatchMeta` (cut, source
   commit times, state version) as commit metadata: the batch happened iff the target holds
   txn ``b``. A replay of a committed batch is skipped whole.

The state's commit of batch ``b`` records the batch's planned cut (``start``/``end`` in its
commit metadata): a run that finds the state one batch ahead of the target (the process died
between steps 4 and 5) replays exactly that batch (:func:`consistent_stream.query.resume_point`).

A :class:`QueryRuntime` lives as long as the streaming query: its source, state and target
handles, the compiled plan and its types are kept across micro-batches, and the metadata of
the last committed batch is known without reading the target's history.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from . import location
from .changelog import WEIGHT, Views, arrow_has_types, consolidate_sql
from .delta import Commit, DeltaTableRef, Docs, Txn
from .delta.deltars import arrow_schema
from .errors import CommitError
from .faults import fault_point
from .metrics import BatchMetrics, Phases, counted_jobs
from .settings import spark_confs
from .plan import CompiledModel
from .plan.clock import Instant, commit_instants, plan_reads_clock
from .plan.logical import column_origins
from .connect import default_parallelism
from .exec.evaluator import BatchEvaluator, PlanTypes
from .ranges import SourceBounds
from .exec.local import LocalEngine, Translations, session_supported
from .sink.target import (bag_changes, commit_bulk_merge, commit_changes, commit_rebuild, multiplicities, retractions,
                          sink_changes)
from .sink.constraints import ENFORCED, check_constraints
from .sink.maintenance import retention_of, state_properties, table_properties
from .sink.unique import check_new_keys
from .sources import Cut
from .sources.dag import base_cut
from .sources.formats import cut_metadata, open_source
from .sources.spec import INITIAL
from .threads import at_once
from .spec import JobSpec
from .state import StateStore
from .state.arrangement import OBJECT_STORE_POLICY

log = logging.getLogger(__name__)

INCREMENTAL_CONFS = {
    # adaptive execution re-plans after every shuffle stage and runs extra jobs, which costs
    # more than it saves on a change-sized query (the delta queries only, not the commits)
    "spark.sql.adaptive.enabled": "false",
}


@dataclass(frozen=True)
class BatchMeta:
    """The commit metadata of a target version (``consistent_stream.*`` keys): which query and
    batch wrote it, the cut it reflects, when the cut's newest source commit happened (per
    source and overall, ms since epoch), the state version the next batch reads, and how the
    batch was computed: ``changes_read`` source change rows (snapshot rows when recomputed),
    from ``started_ms`` (ms since epoch; 0 in commits of older versions) to the commit, with
    ``requests_before_commit`` object-store requests (:data:`location.REQUESTS`, until the
    state's commit: the target's commit itself not included, the target's files written
    beside the state's commit may be; 0 on local disk); ``instant``: the batch's instant
    (:class:`~consistent_stream.plan.clock.Instant` as JSON), which ``current_date()`` and the
    other clock calls of the model return in this version, and ``upstream_instants`` those of
    the upstream models' versions it read (model name -> instant, through the chain: what
    ``verify`` of a chain evaluates each at); ``rows_recomputed``: the rows its recomputing
    rules evaluated again (touched window partitions, rows a moving clock re-filtered,
    recomputed blocks' inputs)."""
    app_id: str
    batch_id: int
    model: str
    cut: dict
    source_commit_ms: int
    source_commits: dict
    state_version: int | None
    checkpoint_location: str
    strategy: str = "incremental"
    cut_lsn: dict = field(default_factory=dict)
    cut_offsets: dict = field(default_factory=dict)
    base_cut: dict = field(default_factory=dict)
    unique_key: list | None = None
    changes_read: int = 0
    started_ms: int = 0
    requests_before_commit: int = 0
    instant: dict = field(default_factory=dict)
    rows_recomputed: int = 0
    upstream_instants: dict = field(default_factory=dict)

    @property
    def clock(self) -> Instant | None:
        """The batch's instant (None in commits of releases that recorded none)."""
        return commit_instants(asdict(self))[0]

    @property
    def upstream_clocks(self) -> dict[str, Instant]:
        """The instants the upstream models' versions this batch read were computed at, by
        model name (through the whole chain)."""
        return commit_instants(asdict(self))[1]

    def to_metadata(self) -> dict:
        d = asdict(self)
        for k in ("batch_id", "source_commit_ms", "changes_read", "started_ms", "requests_before_commit",
                  "rows_recomputed"):
            d[k] = str(d[k])
        for k in ("cut_lsn", "cut_offsets", "instant", "upstream_instants"):
            if not d[k]:
                d.pop(k)
        if self.state_version is None:
            d.pop("state_version")
        return d

    def freshness_s(self, commit_ms: int | None) -> float | None:
        """Seconds from the cut's newest source commit to ``commit_ms`` (this batch's target
        commit, ms since epoch); None when either is unknown."""
        if not self.source_commit_ms or commit_ms is None:
            return None
        return round((commit_ms - self.source_commit_ms) / 1000.0, 3)

    @staticmethod
    def from_commit(c: Commit) -> "BatchMeta | None":
        m = c.metadata
        if "app_id" not in m or "cut" not in m:
            return None

        def js(v, default):
            if v is None:
                return default
            return v if isinstance(v, (dict, int)) else json.loads(v)
        sv = m.get("state_version")
        return BatchMeta(app_id=m["app_id"], batch_id=int(m["batch_id"]), model=m.get("model", ""),
                         cut=js(m["cut"], {}), source_commit_ms=int(m.get("source_commit_ms", 0)),
                         source_commits=js(m.get("source_commits"), {}),
                         state_version=None if sv is None else int(sv),
                         checkpoint_location=m.get("checkpoint_location", ""),
                         strategy=m.get("strategy", "incremental"), cut_lsn=js(m.get("cut_lsn"), {}),
                         cut_offsets=js(m.get("cut_offsets"), {}),
                         base_cut=js(m.get("base_cut"), {}) or js(m["cut"], {}),
                         unique_key=js(m.get("unique_key"), None),
                         changes_read=int(m.get("changes_read", 0)), started_ms=int(m.get("started_ms", 0)),
                         requests_before_commit=int(m.get("requests_before_commit", 0)),
                         instant=js(m.get("instant"), {}), rows_recomputed=int(m.get("rows_recomputed", 0)),
                         upstream_instants=js(m.get("upstream_instants"), {}))


@dataclass
class _Batch:
    """One micro-batch while it runs: which, where to, how far it got."""
    app_id: str
    batch_id: int
    start: Cut
    end: Cut
    first: bool = False
    instant: Instant | None = None   # the batch's instant: what the clock's calls return
    on_driver: bool = False   # a rebuild small enough to run on the driver
    source_rows: int | None = None   # the sources' rows at ``end``, once counted
    prev: "BatchMeta | None" = None
    views: Views | None = None
    phases: Phases = field(default_factory=Phases)
    metrics: BatchMetrics = field(default_factory=BatchMetrics)
    requests: collections.Counter = field(default_factory=collections.Counter)   # REQUESTS at its start

    @property
    def txn(self) -> Txn:
        return Txn(self.app_id, self.batch_id)


@dataclass
class _Evaluated:
    """A batch through step 3: whether it rebuilds, its commit metadata (with the change rows
    it read, ``meta.changes_read``), the evaluator and local engine still open, and the output
    (``out``: the materialized changelog, or the SELECT of a rebuild on the executors, or
    None)."""
    b: _Batch
    rebuild: bool
    meta: "BatchMeta"
    ev: BatchEvaluator
    local: "LocalEngine | None"
    out: object = None
    consolidated: bool = True   # a rebuild's SELECT on the executors: its rows are (else summed by the write)
    positive: bool = False   # .. or are copies of rows (Changelog.positive: written as they come)


@dataclass(frozen=True)
class BatchResult:
    """What one micro-batch did. ``changes_read``: source change rows (snapshot rows of a
    recomputed batch are not counted); ``rows_written``: target rows upserted or deleted."""
    batch_id: int
    skipped: bool
    changes_read: int
    rows_written: int
    target_version: int | None
    seconds: float
    cut: dict
    metrics: BatchMetrics = field(default_factory=BatchMetrics)
    noop: bool = False
    """A batch of a model that reads the clock, at the cut of the batch before, in which no
    row crossed a bound: nothing was committed, and its batch id is not used."""


def wall_clock_micros() -> int:
    """Now, in microseconds since the epoch: a batch's instant."""
    return time.time_ns() // 1000


def target_key(job: JobSpec, compiled: CompiledModel, output_schema: StructType) -> list[str] | None:
    """The target's merge key: the configured ``unique_key``, else the key inferred from the
    plan (as the output's column names), else None (a bag)."""
    if job.unique_key:
        return job.unique_key
    if compiled.unique_key is None:
        return None
    return [output_schema.fields[compiled.output_columns.index(c)].name for c in compiled.unique_key]


def scan_columns(compiled: CompiledModel) -> dict[str, list[str]]:
    """Per source, the union of the columns its scans read (projection pruning)."""
    from .plan.logical import Scan, walk
    cols: dict[str, list[str]] = {}
    for n in walk(compiled.root):
        if isinstance(n, Scan):
            cur = cols.setdefault(n.source.key, [])
            cur.extend(c for c in n.source_columns if c not in cur)
    return cols


class QueryRuntime:
    """Everything one running query keeps between micro-batches (see the module docstring).
    ``sources``, ``target`` and ``state``: the run's handles (one per table per run, refreshed, never
    reopened), opened here when not given."""

    def __init__(self, spark: SparkSession, job: JobSpec, compiled: CompiledModel, output_schema: StructType,
                 types: PlanTypes, *, sources: dict | None = None, target: DeltaTableRef | None = None,
                 state: DeltaTableRef | None = None):
        self.spark, self.job, self.compiled, self.output_schema, self.types = spark, job, compiled, output_schema, types
        self.key = target_key(job, compiled, output_schema)
        self.sources = sources if sources is not None else {s.key: open_source(s) for s in job.sources}
        self.columns = scan_columns(compiled)
        self.target = target if target is not None else DeltaTableRef(job.target_path)
        self.store = StateStore(spark, job.state_root, types.arrangements, file_rows=job.state_file_rows,
                                properties=state_properties(retention_of(job)), table=state,
                                policy=OBJECT_STORE_POLICY if location.is_remote(job.state_root) else None)
        self.translations = Translations(job.local_sql_path)   # the local engine's, kept across runs
        self.reads_clock = plan_reads_clock(compiled.root)
        self._time_zone: str | None = None
        self.bounds: SourceBounds | None = None   # a rebuild's key ranges on the executors (None: sampled)
        self.last: BatchMeta | None = None   # the newest committed batch, once known
        self.parallelism: int | None = None  # set by the autoscaler between batches (None: the engine's defaults)
        # called before each commit: raises when the run lost the model's writer lock (an
        # object store lock whose lease another run took over); the run sets it
        self.fence: Callable[[], None] = lambda: None

    # ---- the previous batch ------------------------------------------------------------------
    def previous(self, app_id: str, batch_id: int) -> BatchMeta:
        """The metadata of batch ``batch_id`` of ``app_id``: the target's newest commit (a
        batch is only ever followed by the next one). Raises CommitError otherwise."""
        if self.last is None or self.last.app_id != app_id or self.last.batch_id != batch_id:
            meta = BatchMeta.from_commit(self.target.latest_commit()) if self.target.exists() else None
            if meta is None or meta.app_id != app_id or meta.batch_id != batch_id:
                found = "none" if meta is None else f"batch {meta.batch_id} of query {meta.app_id}"
                raise CommitError(
                    f"model {self.job.model}: the target {self.job.target_path} should end with batch {batch_id} "
                    f"of query {app_id} but ends with {found}; it was changed outside consistent_stream. "
                    f"Run dbt run --full-refresh")
            self.last = meta
        return self.last

    # ---- one batch ---------------------------------------------------------------------------
    def process_batch(self, app_id: str, batch_id: int, start: Cut, end: Cut,
                      instant: Instant | None = None) -> BatchResult:
        """Batch ``batch_id`` of query ``app_id`` over ``(start, end]`` at ``instant`` (a
        replay's recorded one; None: now)."""
        t0 = time.time()
        requests = location.REQUESTS.snapshot()
        with counted_jobs(self.spark, f"{self.job.model} batch {batch_id}") as jobs:
            result = self._process(app_id, batch_id, start, end, t0, requests, instant)
            n = jobs()
            result.metrics.spark_jobs = None if n is None else result.metrics.spark_jobs + n
        m = result.metrics
        m.object_store_requests = location.REQUESTS.since(requests)
        if not result.skipped and not result.noop:
            log.info("%s: batch %d committed target version %s (%s%s): %d changes read, %d rows written, "
                     "%.2fs, %s Spark jobs, %d delta queries local / %d on Spark, %d state rows read, "
                     "%d rows recomputed, %d target rows rewritten, %d object-store requests, %sphases %s",
                     self.job.model, batch_id, result.target_version, m.strategy,
                     f": {m.reason}" if m.reason else "", result.changes_read, result.rows_written,
                     result.seconds, "?" if m.spark_jobs is None else m.spark_jobs, m.local_queries, m.spark_queries,
                     m.state_rows_read, m.rows_recomputed, m.target_rows_rewritten, m.object_store_requests["total"],
                     f"{m.changes_on_executors} changes too large for the driver written by the executors, "
                     if m.changes_on_executors else "", m.phases)
        return result

    def _process(self, app_id: str, batch_id: int, start: Cut, end: Cut, t0: float,
                 requests: collections.Counter, instant: Instant | None) -> BatchResult:
        if self._replayed(app_id, batch_id):
            log.info("%s: batch %d already committed (target txn %d); replay skipped", self.job.model, batch_id,
                     self.target.txn_version(app_id))
            return BatchResult(batch_id, True, 0, 0, None, time.time() - t0, end.versions, BatchMetrics())
        b = self._start(app_id, batch_id, start, end, instant)
        b.requests = requests
        try:
            e = self._steps_1_to_3(b, t0)
            if start == end and not b.first and e.out is not None and e.out.is_empty:
                self._close(e)   # the clock moved, and no row crossed a bound: nothing to commit
                log.info("%s: the clock moved to %s and no row crossed a bound: up to date", self.job.model,
                         b.instant.local().isoformat())
                return BatchResult(batch_id, True, 0, 0, None, time.time() - t0, end.versions, b.metrics, noop=True)
            version, written, rewritten, meta = self._commit(e)     # steps 4-5
        finally:
            b.views.drop()
        self.last = meta
        m, sm = b.metrics, self.store.metrics
        m.state_rows_read, m.state_files_read, m.state_rows_compacted = sm.rows_read, sm.files_read, sm.rows_compacted
        m.target_rows_rewritten = rewritten
        m.phases = b.phases.times
        return BatchResult(batch_id, False, e.meta.changes_read, written, version, time.time() - t0, end.versions, m)

    def time_zone(self) -> str:
        """The session time zone, which decides ``current_date()`` (read once per run)."""
        if self._time_zone is None:
            self._time_zone = str(self.spark.conf.get("spark.sql.session.timeZone", None) or "UTC")
        return self._time_zone

    def _replayed(self, app_id: str, batch_id: int) -> bool:
        """Whether the target already holds batch ``batch_id`` of ``app_id`` (a replay)."""
        done = self.target.txn_version(app_id) if self.target.exists() else None
        if done is not None:
            self.target.refresh()
            done = self.target.txn_version(app_id)
        return done is not None and done >= batch_id

    def _start(self, app_id: str, batch_id: int, start: Cut, end: Cut, instant: Instant | None) -> "_Batch":
        """The batch, checked to follow the target's newest batch, with its views and its
        instant (``instant``, a replay's; else now, in the session's time zone)."""
        b = _Batch(app_id, batch_id, start, end)
        b.instant = instant or Instant(wall_clock_micros(), self.time_zone())
        b.first = start.is_initial()
        b.prev = None if b.first else self.previous(app_id, batch_id - 1)
        if b.prev is not None and b.prev.cut != start.versions:
            raise CommitError(
                f"model {self.job.model}: batch {batch_id} was planned to start at cut {start.versions}, but the "
                f"target's batch {batch_id - 1} ended at {b.prev.cut}; the cut log under "
                f"{self.job.checkpoint_location}/cuts was read out of order or changed. Nothing was written; "
                f"run dbt run --full-refresh")
        b.views = Views(self.spark)
        return b

    def _steps_1_to_3(self, b: "_Batch", t0: float) -> "_Evaluated":
        """Read the changes, choose the strategy, evaluate: everything before the commits.
        Closes what it opened when it raises."""
        end = b.end
        changes, read, commit_ms = self._read_changes(b)               # step 1
        fault_point("changes_read")
        rebuild = self._choose_strategy(b, read)                        # step 2
        if rebuild:
            b.on_driver = self._rebuild_on_driver(b)
            changes = {key: self.sources[key].snapshot(b.views, end.versions[key], cols, on_driver=b.on_driver)
                       for key, cols in self.columns.items()}
            for change in changes.values():
                change.positive = True   # every row +1 (Source.snapshot)
            for key, src in self.sources.items():
                if b.first or key not in commit_ms:
                    commit_ms[key] = src.commit_ms(end.versions[key]) if end.versions[key] >= 0 else 0
        described = cut_metadata(list(self.sources.values()), end)
        meta = BatchMeta(app_id=b.app_id, batch_id=b.batch_id, model=self.job.model, cut=end.versions,
                         source_commit_ms=max(commit_ms.values(), default=0), source_commits=commit_ms,
                         state_version=None, checkpoint_location=self.job.checkpoint_location,
                         strategy=b.metrics.strategy,
                         cut_lsn=described.get("cut_lsn", {}), cut_offsets=described.get("cut_offsets", {}),
                         base_cut=base_cut(list(self.sources.values()), end.versions), unique_key=self.key,
                         changes_read=read, started_ms=int(t0 * 1000), instant=b.instant.to_json(),
                         upstream_instants=self._upstream_instants(end))
        return self._evaluate(b, changes, rebuild, meta)       # step 3

    def _upstream_instants(self, end: Cut) -> dict:
        """The instants of the upstream models' versions at ``end`` (see :class:`BatchMeta`)."""
        out: dict = {}
        for key, src in self.sources.items():
            if hasattr(src, "instants") and end.versions.get(key, -1) >= 0:
                for name, instant in src.instants(end.versions[key]).items():
                    out.setdefault(name, instant)
        return out

    def _read_changes(self, b: "_Batch") -> tuple[dict, int, dict]:
        """Step 1: every source's change in the batch's range, on the driver; returns the
        changelogs, the change rows read, and the sources' newest commit times."""
        changes, read, commit_ms = {}, 0, dict(b.prev.source_commits) if b.prev else {}
        if not b.first:
            def change(key: str):
                return self.sources[key].changes(b.views, b.start.versions[key], b.end.versions[key],
                                                 self.columns[key])
            keys = [k for k in self.sources if k in self.columns]
            # on an object store, the sources whose reads may run beside each other's: at once
            # (one round trip for all; on local disk the threads would cost more than they save)
            beside = [k for k in keys if getattr(self.sources[k], "reads_beside_others", False)
                      and location.is_remote(self.sources[k].spec.location)]
            found = dict(zip(beside, at_once(change, beside, "source-changes")))
            for key in keys:
                lo, hi = b.start.versions[key], b.end.versions[key]
                ch = found[key] if key in found else change(key)
                changes[key] = ch.changelog
                read += ch.rows
                if lo != hi:
                    commit_ms[key] = ch.commit_ms if ch.commit_ms is not None else self.sources[key].commit_ms(hi)
        b.phases.mark("read")
        return changes, read, commit_ms

    def _choose_strategy(self, b: "_Batch", read: int) -> bool:
        """Step 2: whether the batch rebuilds from snapshots (the first batch of a query, or a
        change above ``recompute_threshold`` x the sources' rows); logged with the reason."""
        rebuild, reason = b.first, "first batch of the query" if b.first else ""
        if not b.first and read > 1000:   # (the sources' rows need their snapshots' statistics)
            total = self._source_rows(b)
            threshold = self.job.recompute_threshold
            if read > threshold * max(total, 1) and read > 1000:
                rebuild = True
                reason = (f"{read} changed rows > recompute_threshold {threshold} x {total} source rows: "
                          f"recomputing from snapshots")
        b.metrics.strategy, b.metrics.reason = ("recompute" if rebuild else "incremental"), reason
        if rebuild:
            log.info("%s: batch %d is recomputed from snapshots (%s)", self.job.model, b.batch_id, reason)
        return rebuild

    def _source_rows(self, b: "_Batch") -> int:
        """Rows of the model's sources at the batch's cut (from the logs' statistics), counted
        once per batch."""
        if b.source_rows is None:
            b.source_rows = sum(self.sources[k].rows(b.end.versions[k]) for k in self.columns
                                if b.end.versions[k] >= 0)
        return b.source_rows

    def _rebuild_on_driver(self, b: "_Batch") -> bool:
        """Whether a rebuild runs on the driver: its sources hold at most
        ``driver_rebuild_rows`` rows at the batch's cut (from the logs' statistics); never
        when that config is 0."""
        limit = self.job.driver_rebuild_rows
        if limit <= 0:
            return False
        total = self._source_rows(b)
        if total > limit:
            return False
        b.metrics.reason += f"; on the driver ({total} source rows)"
        return True

    def _evaluate(self, b: "_Batch", changes: dict, rebuild: bool, meta: BatchMeta) -> "_Evaluated":
        """Step 3: the delta rules (or the rebuild) over ``changes``; the state is staged, not
        committed. Closes what it opened when it raises."""
        job, spark = self.job, self.spark
        # a rebuild on the driver is the delta rules over empty state (reads see none, the
        # state commit replaces every file); one on the executors writes base files, in key
        # ranges the sources' statistics give where they do
        executors = rebuild and not b.on_driver
        self.bounds = (SourceBounds(column_origins(self.compiled.root), self.sources, b.end.versions,
                                    default_parallelism(spark)) if executors else None)
        self.store.open(None if b.first else b.prev.state_version, b.views, rebuild=rebuild, bounds=self.bounds)
        scratch = os.path.join(job.scratch_dir, f"{b.batch_id}")
        local = (LocalEngine(threads=self.parallelism, translations=self.translations)
                 if job.local_engine == "duckdb" and not executors and session_supported(spark) else None)
        ev = BatchEvaluator(spark, self.store, changes, b.views, rebuild=executors, first=rebuild, scratch=scratch,
                            types=self.types, local=local, parallelism=self.parallelism, instant=b.instant,
                            previous_instant=b.prev.clock if b.prev is not None else None)
        e = _Evaluated(b, rebuild, meta, ev, local)
        try:
            with spark_confs(spark, {} if executors else INCREMENTAL_CONFS):
                root, cols, schema = self.compiled.root, self.compiled.output_columns, self.output_schema
                if executors:
                    e.out, e.consolidated, e.positive = ev.output_rows(root, cols, schema) or (None, True, False)
                else:
                    e.out = ev.output(root, cols, schema)
        except BaseException:
            self._close(e)
            raise
        b.phases.mark("evaluate")
        return e

    def _commit(self, e: "_Evaluated"):
        """Steps 4-5: the state commit, then the target commit (the batch's commit point).
        Returns ``(target version, rows written, target rows rewritten, metadata)``; closes
        the evaluation either way."""
        b = e.b
        try:
            # The commits run with the session's own settings: what they run on Spark is
            # table-sized (a compaction, a change too large for the driver, a bag's
            # multiplicities), and adaptive execution sizes its shuffles (a state compaction
            # with Spark's fixed 200 shuffle partitions pays 200 tasks' scheduling a shuffle).
            # the state first, the target last: the target's commit is the batch's commit point.
            # On an object store the state's commit runs on a thread while the target's MERGE
            # writes its files (round trips at once); the target's commit waits for it.
            self.fence()
            remote = location.is_remote(self.job.state_root) or location.is_remote(self.job.target_path)
            committing = _beside(self.spark, "commit-state" if remote else None, self.store.commit, b.txn, {
                "app_id": b.app_id, "batch_id": str(b.batch_id), "start": b.start.versions,
                "end": b.end.versions, "instant": b.instant.to_json()})
            done: list[BatchMeta] = []

            def state_committed() -> BatchMeta:
                """The target's metadata, once the state is committed (its version in it)."""
                if not done:
                    state_version = committing.result()
                    fault_point("state_committed")
                    done.append(BatchMeta(**{**asdict(e.meta), "state_version": state_version,
                                             "requests_before_commit": location.REQUESTS.since(b.requests)["total"],
                                             "rows_recomputed": e.ev.rows_recomputed}))
                    b.phases.mark("commit_state")
                    self.fence()
                return done[0]
            try:
                version, written, rewritten = self._commit_target(e.out, e.rebuild, b.txn, state_committed, b.views,
                                                                  e.consolidated, e.positive)
                meta = state_committed()
            finally:
                committing.exception()   # (the state's commit ends before the batch does, whatever happened)
            fault_point("target_committed")
            b.phases.mark("commit_target")
        finally:
            self._close(e)
        return version, written, rewritten, meta

    def _close(self, e: "_Evaluated") -> None:
        """End the batch's evaluation: its scratch, the state's staged changes, the local
        engine (keeping the translations it made); counts its queries."""
        b = e.b
        e.ev.close()
        self.store.end_batch()
        b.metrics.local_queries, b.metrics.spark_queries = e.ev.local_queries, e.ev.spark_queries
        b.metrics.rows_recomputed = e.ev.rows_recomputed
        b.metrics.changes_on_executors = e.ev.changes_on_executors
        if e.local is not None:
            e.local.close()
            self.translations.save()   # when this batch made new ones

    def _commit_target(self, out, rebuild: bool, txn: Txn, meta: Callable[[], BatchMeta],
                       views: Views, consolidated: bool = True, positive: bool = False) -> tuple[int, int, int]:
        """Step 5: a rebuild replaces the target (``out``: the SELECT of the whole view, its
        rows ``consolidated`` or not, ``positive`` or not, or None when empty; on the driver,
        the view's rows as a materialized changelog); an
        incremental change (``out``: the materialized changelog) is merged into it. ``meta``
        returns the target commit's metadata once the state is committed: a change merged on
        the driver asks for it once its files are written, everything else first."""
        job, spark = self.job, self.spark
        if rebuild or out.arrow is None:
            md = meta().to_metadata()
        if rebuild:
            out_schema = StructType(list(self.output_schema.fields) + [StructField(WEIGHT, LongType(), True)])
            if out is None:
                df = spark.createDataFrame([], out_schema)
            elif isinstance(out, str):
                if not consolidated and not positive and any(c["type"] in ENFORCED for c in job.constraints):
                    # the constraints are checked on the view's rows, not on rows that cancel
                    # (a row's positive copies are the row)
                    out, consolidated = consolidate_sql(f"({out})", self.output_schema.fieldNames()), True
                df = views.sql(out)
            elif out.arrow is not None and not job.partition_by and arrow_has_types(out.arrow, out_schema):
                df = out.arrow.cast(arrow_schema(out_schema))   # a rebuild on the driver: written from there
            else:
                df = out.df
            check_constraints(spark, df, job.constraints, job.model)
            return commit_rebuild(self.target, df, unique_key=self.key, partition_by=job.partition_by,
                                  file_rows=job.state_file_rows, txn=txn, metadata=md, model=job.model,
                                  properties=table_properties(retention_of(job)), docs=Docs.from_dbt(job.docs),
                                  consolidated=consolidated, positive=positive,
                                  key_bounds=self._target_bounds(df),
                                  deletion_vectors=job.target_deletion_vectors)
        check_constraints(spark, out.df if out.arrow is None else out.arrow, job.constraints, job.model)
        prev_version = self.target.version()
        if out.arrow is None:
            return commit_bulk_merge(self.target, prev_version, out.df, unique_key=self.key,
                                     partition_by=job.partition_by, file_rows=job.state_file_rows, txn=txn,
                                     metadata=md, model=job.model)
        retracted = None
        if self.key is not None:
            changes = sink_changes(out.arrow, self.key, job.model, first=False)
            check_new_keys(self.target, prev_version, out.arrow, self.key, job.model)
            retracted = retractions(out.arrow)
        else:
            changes = bag_changes(out.arrow, multiplicities(spark, self.target, prev_version, out.arrow),
                                  job.model, first=False)
        return commit_changes(self.target, changes, unique_key=self.key, txn=txn,
                              metadata=lambda: meta().to_metadata(),
                              deletion_vectors=job.target_deletion_vectors, retracted=retracted)

    def _target_bounds(self, df) -> list | None:
        """The bounds of the target's key ranges in a rebuild on the executors, from the plan
        column its first key column is (:attr:`bounds`); None: Spark samples."""
        if self.bounds is None or not self.key or not isinstance(df, DataFrame):
            return None
        internal = dict(zip(self.output_schema.fieldNames(), self.compiled.output_columns))
        first = self.key[0]
        if first not in internal or first not in df.schema.fieldNames():
            return None
        return self.bounds(internal[first], df.schema[first].dataType)


def _beside(spark: SparkSession, name: str | None, fn: Callable, *args) -> Future:
    """``fn(*args)`` started on a thread ``name`` of its own that inherits this thread's Spark
    job group (:class:`pyspark.InheritableThread`: the Spark jobs it runs count in this
    batch's metrics); its result, or what it raised, in the returned future. ``name`` None:
    run here and now (a thread, and its Spark connection, cost a few ms: worth it only where
    what it overlaps waits on round trips)."""
    from pyspark import InheritableThread
    out: Future = Future()

    def run():
        try:
            out.set_result(fn(*args))
        except BaseException as ex:  # noqa: BLE001 (handed to the caller through the future)
            out.set_exception(ex)
    if name is None:
        run()
    else:
        InheritableThread(run, name=name, daemon=True, session=spark).start()
    return out


__all__ = ["BatchMeta", "BatchResult", "QueryRuntime", "target_key", "INITIAL"]
