"""The query of one run: cuts planned one at a time, one micro-batch per cut, each batch the
exactly-once protocol of :mod:`consistent_stream.runtime`, driven by the engine's own loop.

A micro-batch is one planned cut ``(start, end]`` and one commit of the target, whose
transaction ``(query id, batch id)`` is the batch's commit point. The loop needs no other
log: where a run goes on from is in the commits themselves (:func:`resume_point`):

* the target's newest commit of this query (its :class:`~consistent_stream.runtime.BatchMeta`)
  says which batch it is and the cut it ended at: the next batch starts there;
* a batch whose state was committed but whose target was not (the process died in between)
  is found from the state table's transaction of the query, one batch ahead of the target's,
  and its state commit records the batch's planned cut: the run replays that batch at that
  cut first (the state commit is skipped, the target's made), as the exactly-once protocol
  requires (a replay evaluates exactly what the first attempt did);
* the query's id is the checkpoint's record (:mod:`consistent_stream.checkpoint`), replaced by
  a full refresh.

The next cut is planned from the start cut towards the cut a run takes at its start
(:class:`~consistent_stream.sources.backlog.BacklogPlanner`: at most ``max_batch_rows`` source
change rows, at a transaction-consistent cut), so a backlog is worked off in several batches.

Two triggers, one loop:

* available-now (:meth:`StreamingQuery.run_available_now`, ``dbt run``): batches until the
  cut taken at the run's start is reached;
* processing-time (:meth:`StreamingQuery.run_continuous`): a batch starts every
  ``interval_s`` seconds when the sources moved (at once while a backlog is worked off, and
  after a batch that took longer than the interval), taking everything that arrived; it stops
  between batches when ``timeout_s`` is reached.

After each committed batch: maintenance (Delta checkpoints, retention) and, in a continuous
run with ``autoscale``, the next batch's parallelism (:class:`Scaling`).

Why not Spark's Structured Streaming engine (what this module drove before, with a file
source over a directory of planned cuts and ``foreachBatch``): every fact its checkpoint kept
(offsets, commits, the file source's log) duplicated what the target's and the state's
commits record, and keeping it was a fixed cost of every run: an available-now query's start
and stop around each batch, and on an object store a third of a small run's requests (S3A
writes each log file under a temporary name and renames it; the file source lists its
directory). The docs' benchmark pages have the figures. The micro-batch protocol, the commits and
what they record are unchanged.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

from pyspark.sql import SparkSession

from . import checkpoint
from .errors import CommitError
from .plan.clock import Instant
from .runtime import BatchMeta, BatchResult, QueryRuntime
from .sources import Cut
from .sources.backlog import BacklogPlanner
from .sources.dag import latest_cut
from .sources.spec import INITIAL
from .spec import JobSpec

log = logging.getLogger("consistent_stream")

KEEP_BATCH_RESULTS = 1000
"""A run keeps the results of its last this many batches (the summary's ``metrics``); older
ones only count in the summary's totals, so a continuous run's driver memory does not grow
with the number of its batches."""
_METRICS = ("spark_jobs", "state_rows_read", "state_files_read", "state_rows_compacted", "target_rows_rewritten")


def query_record(job: JobSpec) -> checkpoint.QueryRecord | None:
    """The checkpoint's record of its query (None: no query started; made once from Spark's
    streaming checkpoint of an earlier release, :func:`~consistent_stream.checkpoint.migrate`).
    Raises CommitError naming the file when it is damaged."""
    return (checkpoint.read(job.query_path, job.model)
            or checkpoint.migrate(job.query_path, os.path.join(job.checkpoint_location, "spark"), job.model))


def query_id(job: JobSpec) -> str | None:
    """The id of the checkpoint's query (the txn app id of its commits), None when none
    started yet."""
    record = query_record(job)
    return record.id if record is not None else None


@dataclass(frozen=True)
class ResumePoint:
    """Where a run of a query goes on from: the next batch's id and start cut, and ``replay``,
    the planned end cut of that batch when its state was committed but its target was not
    (None otherwise), with the instant that batch had (``instant``: a replay evaluates
    exactly what the first attempt did)."""
    batch_id: int
    start: Cut
    replay: Cut | None = None
    instant: Instant | None = None


def resume_point(job: JobSpec, runtime: QueryRuntime, app_id: str, keys) -> ResumePoint:
    """The module docstring's rule, from the target's newest commit and the state table's
    transaction of ``app_id`` (``keys``: the query's cut keys, for a query that has committed
    nothing yet). Raises CommitError when the state is more than one batch ahead of the
    target, or its commit does not record the batch's cut (changed outside the engine)."""
    target = runtime.target
    meta = BatchMeta.from_commit(target.latest_commit()) if target.exists() else None
    if meta is not None and meta.app_id == app_id:
        runtime.last = meta
        nxt, start = meta.batch_id + 1, Cut(meta.cut)
    else:
        nxt, start = 0, Cut({k: INITIAL for k in keys})
    pending = runtime.store.pending_batch(app_id, nxt)
    if pending is None:
        return ResumePoint(nxt, start)
    batch_id, planned = pending
    if batch_id != nxt or planned is None or Cut.from_json(planned["start"]) != start:
        raise CommitError(
            f"model {job.model}: the state {job.state_root} holds batch {batch_id} of query {app_id}, but the target "
            f"{job.target_path} ends before batch {nxt}{'' if planned else ' and the state commit records no cut'}; "
            f"they were changed outside consistent_stream. Nothing was written; run dbt run --full-refresh -s "
            f"{job.model}")
    log.info("%s: batch %d was committed to the state but not to the target (the run before stopped between "
             "the two commits): replayed at its planned cut %s", job.model, batch_id, planned["end"])
    return ResumePoint(batch_id, start, Cut.from_json(planned["end"]), Instant.from_json(planned.get("instant")))


class StreamingQuery:
    """The query of one run of ``job`` over ``runtime`` (the module docstring).

    ``results``: the run's last ``KEEP_BATCH_RESULTS`` batch results; ``folded``: the totals
    of older ones (:func:`fold`); ``progress``: one entry per batch (batch id, input rows,
    duration, time), as Spark's ``StreamingQueryProgress`` names them; ``scaler``: the
    autoscaler of a continuous run (None without ``autoscale``)."""

    def __init__(self, spark: SparkSession, job: JobSpec, runtime: QueryRuntime, sources: dict, target,
                 record: checkpoint.QueryRecord):
        from .sink.maintenance import Maintenance
        self.spark, self.job, self.runtime, self.target, self.record = spark, job, runtime, target, record
        self.planner = BacklogPlanner(sources.values(), max_rows=job.max_batch_rows,
                                      recompute_threshold=job.recompute_threshold)
        self.sources = sources
        self.maintenance = Maintenance(job, target=target, state=runtime.store.table)
        self.scaler = Scaling(spark, job, runtime, sources) if job.autoscale is not None else None
        self.results: list[BatchResult] = []
        self.folded = no_totals()
        self.progress: list[dict] = []
        self._next: ResumePoint | None = None
        self._clock_checked = False   # a batch at the same cut was tried for the clock (models that read it)

    # ---- planning ----------------------------------------------------------------------------
    def next_batch(self, upto: Cut) -> tuple[int, Cut, Cut] | None:
        """The next batch ``(batch id, start, end)`` towards ``upto``, or None when the last
        batch reached it: a replay first (:func:`resume_point`), then the first cut of the
        backlog plan that moves."""
        if self._next is None:
            self._next = resume_point(self.job, self.runtime, self.record.id, upto.versions)
        p = self._next
        if p.replay is not None:
            return p.batch_id, p.start, p.replay
        current = dict(p.start.versions)
        for end in self.planner.cuts(current, upto.versions):
            end = {k: max(int(v), int(current.get(k, INITIAL))) for k, v in end.items()}
            if end != current:
                return p.batch_id, p.start, Cut(end)
        if self.runtime.reads_clock and not self._clock_checked and self.runtime.last is not None:
            # the sources did not move, but time did: a batch at the same cut, committed only
            # when a row crossed a bound of a temporal filter
            self._clock_checked = True
            return p.batch_id, p.start, p.start
        return None

    # ---- one micro-batch ---------------------------------------------------------------------
    def run_batch(self, batch_id: int, start: Cut, end: Cut) -> BatchResult:
        """Process one batch (the exactly-once protocol), then what follows a committed one."""
        t0 = time.time()
        replay = self._next is not None and self._next.replay is not None and self._next.batch_id == batch_id
        result = process_batch(self.runtime, self.record.id, batch_id, start, end,
                               self._next.instant if replay else None)
        if result.noop:   # the clock moved, no row crossed a bound: the batch id is not used
            return result
        self._next = ResumePoint(batch_id + 1, end)
        self.progress.append({"batchId": batch_id, "numInputRows": result.changes_read,
                              "durationMs": {"triggerExecution": int((time.time() - t0) * 1000)},
                              "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0))})
        log.debug("progress %s", json.dumps(self.progress[-1]))
        if len(self.progress) > KEEP_BATCH_RESULTS:
            self.progress.pop(0)
        self.results.append(result)
        if len(self.results) > KEEP_BATCH_RESULTS:
            fold(self.folded, self.results.pop(0))
        if result.skipped:
            return result
        self.record = checkpoint.mark_committed(self.job.query_path, self.record)
        # the batch is committed: logs, old versions, files it superseded
        self.maintenance.after_batch(batch_id, self.runtime.last.state_version if self.runtime.last else None)
        if self.scaler is not None:  # at the batch boundary: the next batch's parallelism
            try:
                self.scaler.after_batch(result)
            except Exception as e:  # the batch is committed: scaling must not fail the run
                log.warning("%s: autoscale after batch %d failed, parallelism stays %s: %s",
                            self.job.model, result.batch_id, self.runtime.parallelism, e)
        return result

    # ---- the two triggers ---------------------------------------------------------------------
    def run_available_now(self, upto: Cut) -> None:
        """Process every change up to ``upto``, one planned cut per batch."""
        while True:
            batch = self.next_batch(upto)
            if batch is None:
                return
            self.run_batch(*batch)

    def run_continuous(self, upto: Cut, interval_s: float, timeout_s: float | None) -> None:
        """Start a batch every ``interval_s`` seconds when the sources moved (at once while a
        backlog is worked off or after a batch longer than the interval), until a batch fails,
        or until ``timeout_s`` when given: then stop between batches, never inside one."""
        deadline = None if not timeout_s else time.time() + timeout_s
        while deadline is None or time.time() < deadline:
            t0 = time.time()
            batch = self.next_batch(upto)
            if batch is not None:
                self.run_batch(*batch)
                if batch[2] != upto:
                    continue   # a backlog: its next batch at once
            wait = interval_s - (time.time() - t0)
            if deadline is not None:
                wait = min(wait, deadline - time.time())
            if wait > 0:
                time.sleep(wait)
            upto = Cut(latest_cut(list(self.sources.values())))
            self._clock_checked = False


def process_batch(runtime: QueryRuntime, app_id: str, batch_id: int, start: Cut, end: Cut,
                  instant: Instant | None = None) -> BatchResult:
    """One micro-batch of ``runtime``'s query (a seam for tests that slow a batch down)."""
    return runtime.process_batch(app_id, batch_id, start, end, instant)


class Scaling:
    """The autoscaler of a continuous run (:mod:`.autoscale`): after each committed batch it
    measures the lag behind the batch's cut (the run's source handles), asks the policy for
    the next batch's parallelism, applies it (the runtime's local engine threads and shuffle
    partitions; executors on a standalone cluster) and logs the decision with its inputs.
    ``log``: every decision, with its time and batch."""

    def __init__(self, spark: SparkSession, job: JobSpec, runtime: QueryRuntime, sources: dict):
        from .autoscale import AutoscaleConfig, Autoscaler, session_parallelism
        self.spark, self.job, self.runtime = spark, job, runtime
        offered = session_parallelism(spark)
        cfg = AutoscaleConfig(**{"max_parallelism": max(offered, int(job.autoscale.get("min_parallelism", 1))),
                                 **job.autoscale})
        self.policy = Autoscaler(cfg, initial=cfg.min_parallelism)
        self.sources = sources
        self.log: list[dict] = []
        runtime.parallelism = self.policy.parallelism
        applied = self._executors(self.policy.parallelism)   # a cluster session starts with every core
        log.info("%s: autoscale from parallelism %d (%s)%s", job.model, self.policy.parallelism, cfg,
                 f"; {applied}" if applied else "")

    def _executors(self, parallelism: int) -> dict:
        """The executors for ``parallelism`` on a standalone cluster
        (:func:`~consistent_stream.autoscale.apply_to_cluster`; ``{}`` elsewhere). A failure
        is logged and returned as ``{"error": ...}``: scaling must not fail the run."""
        from .autoscale import apply_to_cluster
        try:
            return apply_to_cluster(self.spark, parallelism)
        except Exception as e:
            log.warning("%s: autoscale could not set the executors for parallelism %d: %s", self.job.model,
                        parallelism, e)
            return {"error": str(e)}

    def after_batch(self, result: BatchResult) -> None:
        """Observe committed batch ``result`` and apply the policy's decision."""
        from .autoscale import BatchSample
        from .sources.backlog import pending as pending_rows
        now = time.time()
        latest = latest_cut(list(self.sources.values()))
        lag_rows, oldest_ms = pending_rows(list(self.sources.values()), result.cut, latest)
        sample = BatchSample(now, result.changes_read, result.seconds, self.policy.parallelism, lag_rows,
                             max(0.0, now - oldest_ms / 1000.0) if oldest_ms is not None else 0.0,
                             self.runtime.store.total_rows())
        d = self.policy.observe(sample)
        applied = {}
        if d.action != "hold":
            self.runtime.parallelism = d.parallelism
            applied = self._executors(d.parallelism)
            log.info("%s: autoscale %s %d -> %d after batch %d: %s; inputs %s%s", self.job.model, d.action,
                     d.previous, d.parallelism, result.batch_id, d.reason, json.dumps(d.inputs),
                     f"; {applied}" if applied else "")
        else:
            log.debug("%s: autoscale hold at %d after batch %d: %s", self.job.model, d.parallelism,
                      result.batch_id, d.reason)
        self.log.append({"t": round(now, 3), "batch_id": result.batch_id, "lag_rows": lag_rows,
                         "lag_s": round(sample.lag_s, 3), "rows": result.changes_read,
                         "seconds": round(result.seconds, 3), **d.as_dict(), **applied})
        if len(self.log) > KEEP_BATCH_RESULTS:
            self.log.pop(0)


def fold(acc: dict, r: BatchResult) -> dict:
    """Add batch result ``r`` to the running totals ``acc`` (:func:`no_totals`'s shape)."""
    if r.skipped:
        acc["skipped_batches"] += 1
        return acc
    acc["batches"] += 1
    acc["changes_read"] += r.changes_read
    acc["rows_written"] += r.rows_written
    acc["strategies"].add(r.metrics.strategy)
    for k in _METRICS:
        v, total = getattr(r.metrics, k), acc["totals"][k]
        acc["totals"][k] = None if v is None or total is None else total + v   # None: not countable (Connect)
    for p, s in r.metrics.phases.items():
        acc["totals"]["phases"][p] = round(acc["totals"]["phases"].get(p, 0.0) + s, 3)
    return acc


def no_totals() -> dict:
    """Empty running totals: batch counts, rows, strategies and the metrics' sums."""
    return {"batches": 0, "skipped_batches": 0, "changes_read": 0, "rows_written": 0, "strategies": set(),
            "totals": {**{k: 0 for k in _METRICS}, "phases": {}}}
