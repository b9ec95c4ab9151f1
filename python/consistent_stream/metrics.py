"""What a micro-batch cost: wall time per phase, Spark jobs, state rows read, target rows
rewritten. Logged per batch at info level and summed into the run summary; benchmarks print
them. Nothing here changes behaviour."""
from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field


@dataclass
class BatchMetrics:
    """One batch's costs. ``phases``: seconds per phase (read, evaluate, commit_state,
    commit_target); ``spark_jobs``: Spark jobs the batch ran (from the status tracker);
    ``state_rows_read``/``state_files_read``: rows and files of state the keyed reads opened;
    ``state_rows_compacted``: rows rewritten by state compaction; ``target_rows_rewritten``:
    target rows the commit copied into new files plus the rows it changed;
    ``strategy``: ``incremental`` or ``recompute``, and ``reason``: why; ``local_queries``:
    delta queries the local engine (DuckDB) ran, ``spark_queries``: those it left to Spark."""
    phases: dict = field(default_factory=dict)
    spark_jobs: int = 0
    state_rows_read: int = 0
    state_files_read: int = 0
    state_rows_compacted: int = 0
    target_rows_rewritten: int = 0
    strategy: str = "incremental"
    reason: str = ""
    local_queries: int = 0
    spark_queries: int = 0

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


@contextmanager
def counted_jobs(spark, label: str):
    """Run the block in its own Spark job group; yields a callable returning the number of
    Spark jobs started in the block so far (the status tracker's jobs of the group)."""
    sc = spark.sparkContext
    group = f"consistent_stream:{label}:{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, label, interruptOnCancel=False)
    try:
        yield lambda: len(sc.statusTracker().getJobIdsForGroup(group))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
