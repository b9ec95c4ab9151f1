"""What a micro-batch cost: wall time per phase, Spark jobs, state rows read, target rows
rewritten. Logged per batch at info level and summed into the run summary; benchmarks print
them. A batch that runs long (a first batch over big sources) reports its progress while it
runs, as lines of the ``consistent_stream.progress`` logger (the dbt adapter shows them in
dbt's output). Nothing here changes behaviour."""
from __future__ import annotations

import logging
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from .connect import is_connect


@dataclass
class BatchMetrics:
    """One batch's costs. ``phases``: seconds per phase (read, evaluate, commit_state,
    commit_target); ``spark_jobs``: Spark jobs the batch ran (from the status tracker; None
    over Spark Connect, whose client cannot see the server's jobs);
    ``state_rows_read``/``state_files_read``: rows and files of state the keyed reads opened;
    ``state_rows_compacted``: rows rewritten by state compaction; ``target_rows_rewritten``:
    target rows the commit copied into new files plus the rows it changed;
    ``strategy``: ``incremental`` or ``recompute``, and ``reason``: why; ``local_queries``:
    delta queries the local engine (DuckDB) ran, ``spark_queries``: those it left to Spark;
    ``changes_on_executors``: materialized changes of more than ``MAX_DRIVER_ROWS`` rows, kept
    in files the executors wrote instead of on the driver; ``rows_recomputed``: rows the
    rules that recompute evaluated again (a window's touched partitions, a temporal
    operator's rows whose bound moved, a recomputed block's inputs); ``object_store_requests``: the
    object-store requests the batch made, counted by the clients
    (:meth:`consistent_stream.location.RequestCounter.since`: total, by method, by what)."""
    phases: dict = field(default_factory=dict)
    spark_jobs: int | None = 0
    state_rows_read: int = 0
    state_files_read: int = 0
    state_rows_compacted: int = 0
    target_rows_rewritten: int = 0
    strategy: str = "incremental"
    reason: str = ""
    local_queries: int = 0
    spark_queries: int = 0
    changes_on_executors: int = 0
    rows_recomputed: int = 0
    object_store_requests: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class Phases:
    """Wall time per phase of a batch (``mark(name)`` closes the phase that ran since the
    previous mark)."""

    def __init__(self):
        self.t, self.times = time.time(), {}

    def mark(self, name: str) -> None:
        now = time.time()
        self.times[name] = round(self.times.get(name, 0.0) + now - self.t, 3)
        self.t = now


PROGRESS_AFTER_S = 10.0
"""A batch running longer than this (seconds) starts reporting its progress..."""
PROGRESS_EVERY_S = 10.0
"""...every this many seconds."""
progress_log = logging.getLogger("consistent_stream.progress")


def bar(done: int, total: int, width: int = 20) -> str:
    """``done`` of ``total`` as a text progress bar: ``[#########-----------]  45%``."""
    filled = width * done // total if total else 0
    return f"[{'#' * filled}{'-' * (width - filled)}] {100 * done // total if total else 0:3d}%"


def progress_line(sc, group: str, label: str, elapsed_s: float) -> str | None:
    """One progress report of the Spark jobs of job group ``group`` (``label``: what runs,
    e.g. ``totals batch 0``), from the status tracker: jobs finished, and each running
    stage's tasks done of all, as a bar. None when no job of the group runs."""
    tracker = _status_tracker(sc)
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
    jobs = [j for j in jobs if j is not None]
    running = [j for j in jobs if j.status == "RUNNING"]
    if not running:
        return None
    active = set(tracker.getActiveStageIds())
    stages = []
    for j in running:
        for sid in sorted(set(j.stageIds) & active):
            st = tracker.getStageInfo(sid)
            if st is not None:
                stages.append(f"Spark job {j.jobId} stage {sid} {bar(st.numCompletedTasks, st.numTasks)} "
                              f"{st.numCompletedTasks}/{st.numTasks} tasks")
    done = sum(1 for j in jobs if j.status == "SUCCEEDED")
    return (f"{label}: running for {elapsed_s:.0f} s, {done} Spark job{'s' if done != 1 else ''} done; "
            + ("; ".join(stages) if stages else f"Spark job {running[0].jobId} starting"))


class _ProgressReporter(threading.Thread):
    """Logs :func:`progress_line` every :data:`PROGRESS_EVERY_S` once the block has run
    :data:`PROGRESS_AFTER_S`, until stopped."""

    def __init__(self, sc, group: str, label: str):
        super().__init__(name=f"progress {label}", daemon=True)
        self.sc, self.group, self.label, self.t0 = sc, group, label, time.time()
        self.stopped = threading.Event()

    def run(self) -> None:
        wait = PROGRESS_AFTER_S
        while not self.stopped.wait(wait):
            wait = PROGRESS_EVERY_S
            try:
                line = progress_line(self.sc, self.group, self.label, time.time() - self.t0)
            except Exception as exc:  # the session went away under a dying batch: no report
                progress_log.debug("%s: no progress report (%s)", self.label, exc)
                continue
            if line:
                progress_log.info(line)


@contextmanager
def counted_jobs(spark, label: str):
    """Run the block in its own Spark job group; yields a callable returning the number of
    Spark jobs started in the block so far (the status tracker's jobs of the group). A block
    that runs long reports its progress (:func:`progress_line`) on the
    ``consistent_stream.progress`` logger. Over Spark Connect (no SparkContext, no job ids on
    the client) the callable returns None and the progress comes from Connect's progress
    handler (:class:`_ConnectProgress`)."""
    if is_connect(spark):
        with _ConnectProgress(spark, label):
            yield lambda: None
        return
    sc = spark.sparkContext
    group = f"consistent_stream:{label}:{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, label, interruptOnCancel=False)
    reporter = _ProgressReporter(sc, group, label)
    reporter.start()
    try:
        yield lambda: len(_status_tracker(sc).getJobIdsForGroup(group))
    finally:
        reporter.stopped.set()
        # the group, its description and interruptOnCancel unset in one call to the JVM
        # (each py4j call is a round trip; a small batch on the driver runs no Spark job)
        sc._jsc.clearJobGroup()


_TRACKER: tuple | None = None   # (the SparkContext, its StatusTracker)


def _status_tracker(sc):
    """``sc``'s status tracker, asked of the JVM once per SparkContext (not once a batch)."""
    global _TRACKER
    held = _TRACKER
    if held is None or held[0] is not sc:
        held = _TRACKER = (sc, sc.statusTracker())
    return held[1]


class _ConnectProgress:
    """The progress of a block over Spark Connect: Connect's client calls its progress
    handlers from the thread that runs an operation, with the operation's stages; the
    operations of this block's thread are logged as :func:`progress_line` logs a classic
    session's, after :data:`PROGRESS_AFTER_S`, every :data:`PROGRESS_EVERY_S`."""

    def __init__(self, spark, label: str):
        self.spark, self.label, self.thread = spark, label, threading.get_ident()
        self.t0 = self.last = time.time()
        self.operations: set[str] = set()

    def __call__(self, stages, inflight_tasks: int, operation_id, done: bool) -> None:
        if threading.get_ident() != self.thread:
            return
        if operation_id:
            self.operations.add(operation_id)
        now = time.time()
        if done or now - self.t0 < PROGRESS_AFTER_S or now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        running = [f"stage {st.stage_id} {bar(st.num_completed_tasks, st.num_tasks)} "
                   f"{st.num_completed_tasks}/{st.num_tasks} tasks" for st in (stages or []) if not st.done]
        progress_log.info("%s: running for %.0f s, %d Spark Connect operation%s; %s", self.label, now - self.t0,
                          len(self.operations), "s" if len(self.operations) != 1 else "",
                          "; ".join(running) if running else f"{inflight_tasks} tasks running")

    def __enter__(self):
        self.spark.registerProgressHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.spark.removeProgressHandler(self)
