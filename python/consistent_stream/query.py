"""The streaming query of one run: planned cuts in, one micro-batch per cut, each batch the
exactly-once protocol of :mod:`consistent_stream.runtime`.

The query's source is the cut log (:class:`~consistent_stream.sources.stream.CutLog`): one
file per planned cut, whose offsets are cuts; its ``foreachBatch`` (:meth:`StreamingQuery.
on_batch`) reads the batch's planned cut and hands it to :func:`process_batch`. Cuts are
planned one at a time (:func:`plan_next_cut`), so a micro-batch is exactly one planned cut.

Two triggers share everything but the loop that drives the query:

* available-now (:meth:`StreamingQuery.run_available_now`, ``dbt run``): plan the next cut,
  run an available-now query that processes it, repeat until the cut taken at the run's start
  is reached. Each planned incremental batch is read and evaluated on a thread while Spark
  plans its micro-batch (:meth:`~consistent_stream.runtime.QueryRuntime.prepare`);
* processing-time (:meth:`StreamingQuery.run_continuous`): one query, and a planning thread
  that plans the next cut once the query has processed the last one; it stops between
  batches when ``timeout_s`` is reached.

After each committed batch: maintenance (Delta checkpoints, retention) and, in a continuous
run with ``autoscale``, the next batch's parallelism (:class:`Scaling`).
"""
from __future__ import annotations

import json
import logging
import threading
import time

from pyspark.sql import SparkSession

from . import spark_checkpoint
from .errors import CommitError, ConsistentStreamError
from .runtime import BatchMeta, BatchResult, QueryRuntime
from .settings import spark_confs
from .sources import Cut
from .sources.backlog import BacklogPlanner
from .sources.dag import latest_cut
from .sources.formats import open_source
from .sources.spec import INITIAL
from .sources.stream import CutLog
from .spec import JobSpec

log = logging.getLogger("consistent_stream")

KEEP_BATCH_RESULTS = 1000
"""A run keeps the results of its last this many batches (the summary's ``metrics``); older
ones only count in the summary's totals, so a continuous run's driver memory does not grow
with the number of its batches."""
_METRICS = ("spark_jobs", "state_rows_read", "state_files_read", "state_rows_compacted", "target_rows_rewritten")


def query_id(job: JobSpec) -> str | None:
    """The id of the query Spark's checkpoint holds (the txn app id of its commits)."""
    return spark_checkpoint.query_id(job.spark_checkpoint)


def last_spark_commit(job: JobSpec) -> int | None:
    """The newest batch Spark's checkpoint records as committed."""
    return spark_checkpoint.last_committed(job.spark_checkpoint)


def process_batch(runtime: QueryRuntime, app_id: str, batch_id: int, start: Cut, end: Cut) -> BatchResult:
    """One micro-batch of ``runtime``'s query (a seam for tests that slow a batch down)."""
    return runtime.process_batch(app_id, batch_id, start, end)


def pending(job: JobSpec, cuts: CutLog) -> bool:
    """Whether the cut log holds a planned cut that Spark's checkpoint has not recorded as a
    committed batch yet (cut file ``seq`` is micro-batch ``seq``: one file per batch)."""
    last = cuts.last()
    if last is None:
        return False
    done = last_spark_commit(job)
    return done is None or last[0] > done


def plan_next_cut(job: JobSpec, cuts: CutLog, planner: BacklogPlanner, target, upto: Cut) -> bool:
    """Append to the cut log the next batch from the last planned cut towards ``upto``, when
    the query has processed every planned cut: it ends at the first cut of
    :func:`~consistent_stream.sources.backlog.plan_cuts` (at most ``max_batch_rows`` source
    change rows, at a transaction-consistent cut), which ``planner`` computes once per
    backlog. Returns whether the log reaches ``upto`` (nothing is left to plan after this
    batch).

    One planned cut at a time: Spark's file source may admit every file it sees into one
    micro-batch (``maxFilesPerTrigger`` limits the files of one offset request, and a batch's
    offset can span two requests), and ``cleanSource`` then deletes the batch's last file
    only; with two files planned ahead, a batch processed cut ``n`` while the file of cut
    ``n + 1`` was deleted unprocessed (crash campaign, seed 5, trial 39). With one file, a
    micro-batch is exactly one planned cut."""
    if pending(job, cuts):
        return False
    last = cuts.last()
    if last is not None:
        seq, start = last
    else:
        seq, start = -1, Cut({k: INITIAL for k in upto.versions})
        meta = BatchMeta.from_commit(target.latest_commit()) if target.exists() else None
        if meta is not None and meta.app_id == query_id(job) and set(meta.cut) == set(upto.versions):
            done = last_spark_commit(job)
            seq, start = done if done is not None else -1, Cut(meta.cut)
    current = {k: v for k, v in start.versions.items()}
    for end in planner.cuts(current, upto.versions):
        end = {k: max(int(v), int(current.get(k, INITIAL))) for k, v in end.items()}
        if end == current:
            continue
        cuts.append(seq + 1, Cut(current), Cut(end))
        return all(int(end.get(k, INITIAL)) >= int(v) for k, v in upto.versions.items())
    return True


class StreamingQuery:
    """The streaming query of one run of ``job`` over ``runtime`` (the module docstring).

    ``results``: the run's last ``KEEP_BATCH_RESULTS`` batch results; ``folded``: the totals
    of older ones (:func:`fold`); ``progress``: Spark's recent progress of each query;
    ``scaler``: the autoscaler of a continuous run (None without ``autoscale``).

    A batch that raises fails the query; the run then raises that exception (not Spark's
    wrapping of it): :attr:`failure` keeps it."""

    def __init__(self, spark: SparkSession, job: JobSpec, runtime: QueryRuntime, sources: dict, target):
        from .sink.maintenance import Maintenance
        self.spark, self.job, self.runtime, self.target = spark, job, runtime, target
        self.cuts = CutLog(job.cuts_dir)
        # the planner's source handles: the run's own when it plans between available-now
        # queries (on this thread, while no batch runs); its own in a continuous run, whose
        # planning thread reads the sources beside the batches
        self.planner_sources = sources if job.trigger == "available_now" else {
            s.key: open_source(s) for s in job.sources}
        self.planner = BacklogPlanner(self.planner_sources.values(), max_rows=job.max_batch_rows,
                                      recompute_threshold=job.recompute_threshold)
        self.maintenance = Maintenance(job, target=target, state=runtime.store.table)
        self.scaler = Scaling(spark, job, runtime) if job.autoscale is not None else None
        self.results: list[BatchResult] = []
        self.folded = no_totals()
        self.progress: list[dict] = []
        self.failure: list[BaseException] = []
        self.stopping = threading.Event()   # no new batch starts (timeout_s reached, or the run ends)
        self.timeout_s: float | None = None
        self._starting: list = []          # the session confs a query starts with, until its source exists
        self._starting_lock = threading.Lock()

    def plan(self, upto: Cut, target=None) -> bool:
        """:func:`plan_next_cut` towards ``upto`` (``target``: the handle to read the last
        commit from; the run's own by default)."""
        return plan_next_cut(self.job, self.cuts, self.planner, target or self.target, upto)

    # ---- the micro-batch ---------------------------------------------------------------------
    def on_batch(self, batch_df, batch_id: int) -> None:
        """``foreachBatch``: the batch's cut is cut file ``batch_id`` (read on the driver;
        Spark's own read of the batch only when that file is gone); process it, then what
        follows a committed batch."""
        self._restore_confs()
        if self.failure:
            return
        if self.stopping.is_set():  # fails the query before the batch's commit point: replayed next run
            raise ConsistentStreamError(f"model {self.job.model}: stopping at the {self.timeout_s}s timeout")
        try:
            planned = self.cuts.read(batch_id) or CutLog.batch_cut(batch_df)
            if planned is not None:
                self._after_batch(process_batch(self.runtime, query_id(self.job), batch_id, *planned))
        except BaseException as e:  # surfaced after the query stops, with our message
            self.failure.append(e)
            raise

    def _after_batch(self, result: BatchResult) -> None:
        self.results.append(result)
        if len(self.results) > KEEP_BATCH_RESULTS:
            fold(self.folded, self.results.pop(0))
        if result.skipped:
            return
        # the batch is committed: logs, old versions, files it superseded
        self.maintenance.after_batch(result.batch_id, self.runtime.last.state_version if self.runtime.last else None)
        if self.scaler is not None:  # at the batch boundary: the next batch's parallelism
            try:
                self.scaler.after_batch(result)
            except Exception as e:  # the batch is committed: scaling must not fail the run
                log.warning("%s: autoscale after batch %d failed, parallelism stays %s: %s",
                            self.job.model, result.batch_id, self.runtime.parallelism, e)

    # ---- starting and ending a query ----------------------------------------------------------
    def start(self, trigger: dict):
        """Start the query with ``trigger`` (``DataStreamWriter.trigger``'s keywords), under
        the session confs of :data:`~consistent_stream.spark_checkpoint.QUERY_START_CONFS`
        until its first micro-batch begins."""
        confs = spark_confs(self.spark, spark_checkpoint.QUERY_START_CONFS)
        with self._starting_lock:
            confs.__enter__()
            self._starting.append(confs)
        try:
            return (self.cuts.stream(self.spark).writeStream.foreachBatch(self.on_batch)
                    .option("checkpointLocation", self.job.spark_checkpoint)
                    .queryName(f"consistent_stream_{self.job.schema}_{self.job.identifier}")
                    .trigger(**trigger).start())
        except BaseException:
            self._restore_confs()
            raise

    def _restore_confs(self) -> None:
        """Restore the session confs that :meth:`start` set: called when the query's first
        micro-batch begins (its file source and the source's log exist by then) and when the
        query ends."""
        with self._starting_lock:
            while self._starting:
                self._starting.pop().__exit__(None, None, None)

    def _ended(self, query) -> None:
        self._restore_confs()
        self.progress += _progress(query)

    def _raise_failure(self, e: Exception | None = None) -> None:
        """Raise the batch's own exception when one failed the query, else Spark's ``e``."""
        if self.failure:
            raise self.failure[0]
        if e is not None:
            raise ConsistentStreamError(f"model {self.job.model}: streaming query failed: {e}") from e

    # ---- the two triggers ---------------------------------------------------------------------
    def run_available_now(self, upto: Cut) -> None:
        """Process every change up to ``upto``, one planned cut per available-now query."""
        job, runtime = self.job, self.runtime
        while True:
            self.plan(upto)
            if not pending(job, self.cuts):
                return
            before = last_spark_commit(job)
            seq = self.cuts.last()[0]
            planned = self.cuts.read(seq)
            if planned is not None:   # read and evaluate it while the query plans its micro-batch
                runtime.prepare(query_id(job), seq, *planned)
            try:
                query = self.start({"availableNow": True})
            except BaseException:
                runtime.discard_prepared()
                raise
            runtime.start_preparing()
            try:
                query.awaitTermination()
            except Exception as e:
                self._raise_failure(e)
            finally:
                self._ended(query)
                runtime.discard_prepared()   # when no micro-batch took it
            self._raise_failure()
            if pending(job, self.cuts) and last_spark_commit(job) == before:
                raise CommitError(
                    f"model {job.model}: Spark's file source did not pick up the planned cut {self.cuts.last()} "
                    f"under {self.cuts.directory} (no micro-batch ran). Nothing was written; run again, or dbt run "
                    f"--full-refresh -s {job.model} if this repeats")

    def run_continuous(self, upto: Cut, interval_s: float, timeout_s: float | None) -> None:
        """Run the processing-time query every ``interval_s`` seconds, until it fails, or
        until ``timeout_s`` when given: then stop between batches, never inside one
        (``query.stop()`` interrupts a running batch, and Spark 4.2 can die with a
        StackOverflowError while classifying the long interruption message of a Python
        ``foreachBatch``)."""
        from .delta import DeltaTableRef
        self.timeout_s = timeout_s
        self.plan(upto)
        query = self.start({"processingTime": f"{interval_s} seconds"})
        planning = threading.Thread(target=self._plan_forever, args=(interval_s, DeltaTableRef(self.job.target_path)),
                                    name=f"consistent_stream planner {self.job.model}", daemon=True)
        planning.start()
        timed_out = False
        try:
            if not timeout_s:
                query.awaitTermination()
            elif not query.awaitTermination(timeout_s):
                timed_out = True
                self.stopping.set()
                while query.isActive and query.status.get("isTriggerActive"):
                    time.sleep(0.1)
        except Exception as e:
            if not timed_out:
                self._raise_failure(e)
        finally:
            self.stopping.set()
            if query.isActive:
                query.stop()
            self._ended(query)
        if not timed_out:
            self._raise_failure()

    def _plan_forever(self, interval_s: float, target) -> None:
        """The continuous run's planning thread (its own target handle): once the query has
        processed the planned cut, plan the next one, taking everything that arrived
        meanwhile (at once while a backlog is being worked off, else at the next interval)."""
        backlog = False
        while not self.stopping.wait(0.05 if backlog else interval_s):
            if pending(self.job, self.cuts):
                continue
            try:
                backlog = not self.plan(Cut(latest_cut(list(self.planner_sources.values()))), target)
            except Exception as e:  # surfaced by the next batch (or the run's end)
                log.warning("%s: planning the next cut failed: %s", self.job.model, e)


class Scaling:
    """The autoscaler of a continuous run (:mod:`.autoscale`): after each committed batch it
    measures the lag behind the batch's cut (its own source handles: the planning thread has
    its own), asks the policy for the next batch's parallelism, applies it (the runtime's
    local engine threads and shuffle partitions; executors on a standalone cluster) and logs
    the decision with its inputs. ``log``: every decision, with its time and batch."""

    def __init__(self, spark: SparkSession, job: JobSpec, runtime: QueryRuntime):
        from .autoscale import AutoscaleConfig, Autoscaler, session_parallelism
        self.spark, self.job, self.runtime = spark, job, runtime
        offered = session_parallelism(spark)
        cfg = AutoscaleConfig(**{"max_parallelism": max(offered, int(job.autoscale.get("min_parallelism", 1))),
                                 **job.autoscale})
        self.policy = Autoscaler(cfg, initial=cfg.min_parallelism)
        self.sources = {s.key: open_source(s) for s in job.sources}
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


def _progress(query) -> list[dict]:
    """The query's recent ``StreamingQueryProgress`` (batch id, input rows, durations), each
    logged at debug level."""
    progress = [{k: p[k] for k in ("batchId", "numInputRows", "durationMs", "timestamp") if k in p}
                for p in query.recentProgress]
    for p in progress:
        log.debug("StreamingQueryProgress %s", json.dumps(p, default=str))
    return progress


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
        acc["totals"][k] += getattr(r.metrics, k)
    for p, s in r.metrics.phases.items():
        acc["totals"]["phases"][p] = round(acc["totals"]["phases"].get(p, 0.0) + s, 3)
    return acc


def no_totals() -> dict:
    """Empty running totals: batch counts, rows, strategies and the metrics' sums."""
    return {"batches": 0, "skipped_batches": 0, "changes_read": 0, "rows_written": 0, "strategies": set(),
            "totals": {**{k: 0 for k in _METRICS}, "phases": {}}}
