"""Parallelism from lag: the autoscaling policy of a continuous model, batch by batch.

The policy is Blink's (Alibaba's Flink fork) autoscaler, adapted
from a pipeline of vertices to a micro-batch query, which is one "vertex" per batch:

* **Target throughput.** ``tps_target = tps_current * (1 + delay_increasing_rate)``, where
  ``tps_current`` is the change rows processed per second of wall time over a window of
  batches and ``delay_increasing_rate`` is how fast the source delay (lag, in seconds) grows
  per second over that window. A lag that grows 0.5 s per second means the sources produce
  1.5x what the query processes.
* **Per-row cost.** The seed's ``taskLatency``: ``seconds x parallelism / rows`` of the
  window's batches (core-seconds per change row; Blink subtracts back-pressure time, a
  micro-batch has none).
* **Target parallelism.** ``ceil(tps_target x per-row cost x safety_factor)`` (the seed's
  factor is 3, for GC, checkpoints and load jitter), clamped to
  ``[max(min_parallelism, state minimum), max_parallelism]``; the state minimum is one task
  per ``state_rows_per_task`` rows of operator state (the seed's minimum set by state size).
* **Triggers.** Scale up when the lag passes ``lag_threshold_s`` and the target is above the
  current parallelism; scale down when current / target exceeds ``scale_down_ratio`` (the
  seed's default is 6). Either only after ``stable_s`` seconds since the last change and a
  full window of batches at the current parallelism (the seed waits for a stable job and a
  completed checkpoint: a micro-batch boundary is one), and only at a batch boundary (the
  caller applies a decision between batches).

Every decision carries its inputs, for the run log.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class AutoscaleConfig:
    """The policy's knobs (model config ``autoscale``: a dict of these names). ``lag_threshold_s``
    and ``stable_s`` in seconds; parallelism in tasks (shuffle partitions, local engine threads,
    executors on a cluster, as the caller applies it)."""
    min_parallelism: int = 1
    max_parallelism: int = 8
    lag_threshold_s: float = 10.0
    scale_down_ratio: float = 6.0
    safety_factor: float = 3.0
    stable_s: float = 60.0
    window: int = 3
    state_rows_per_task: int = 10_000_000

    def __post_init__(self):
        if not 1 <= self.min_parallelism <= self.max_parallelism:
            raise ValueError(f"autoscale: need 1 <= min_parallelism ({self.min_parallelism}) <= max_parallelism "
                             f"({self.max_parallelism})")
        for name in ("lag_threshold_s", "safety_factor", "stable_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"autoscale: {name} must be >= 0, not {getattr(self, name)}")
        if self.scale_down_ratio <= 1:
            raise ValueError(f"autoscale: scale_down_ratio must be > 1, not {self.scale_down_ratio}")
        if self.window < 1 or self.state_rows_per_task < 1:
            raise ValueError("autoscale: window and state_rows_per_task must be >= 1")


@dataclass(frozen=True)
class BatchSample:
    """What one committed micro-batch measured: its end (``t``, seconds since epoch), change
    rows processed, processing ``seconds``, the ``parallelism`` it ran with, the lag left behind
    its cut (``lag_rows`` change rows pending in the sources, ``lag_s`` seconds from the oldest
    pending commit to ``t``; 0 when none is pending) and the operator state's rows."""
    t: float
    rows: int
    seconds: float
    parallelism: int
    lag_rows: int
    lag_s: float
    state_rows: int = 0


@dataclass(frozen=True)
class Decision:
    """``action``: ``up``, ``down`` or ``hold``; ``parallelism`` to run the next batch with;
    ``reason`` in words; ``inputs``: every number the decision used."""
    action: str
    parallelism: int
    previous: int
    reason: str
    inputs: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class Autoscaler:
    """Feed it every committed batch (:meth:`observe`); it answers with the parallelism for the
    next one (module docstring). ``now`` is the batch's end time, so tests and replays need no
    clock."""

    def __init__(self, config: AutoscaleConfig, initial: int):
        self.config = config
        self.parallelism = min(max(initial, config.min_parallelism), config.max_parallelism)
        self.samples: deque[BatchSample] = deque(maxlen=config.window + 1)
        self.changed_at: float | None = None

    def observe(self, s: BatchSample) -> Decision:
        c = self.config
        if s.parallelism != self.parallelism:  # a batch that ran before the last change applied
            self.samples.clear()
        self.samples.append(s)
        cur = self.parallelism
        if self.changed_at is None:
            self.changed_at = s.t
        if len(self.samples) < c.window + 1:
            return Decision("hold", cur, cur, f"collecting metrics ({len(self.samples)}/{c.window + 1} batches)",
                            {"lag_s": s.lag_s, "lag_rows": s.lag_rows})
        first, window = self.samples[0], list(self.samples)[1:]
        span = max(s.t - first.t, 1e-3)
        rows = sum(b.rows for b in window)
        tps_current = rows / span
        delay_rate = (s.lag_s - first.lag_s) / span
        busy = sum(b.seconds * b.parallelism for b in window)
        cost = busy / rows if rows else 0.0
        tps_target = tps_current * (1 + max(delay_rate, 0.0))
        state_min = math.ceil(s.state_rows / c.state_rows_per_task) if s.state_rows else 1
        floor = min(max(c.min_parallelism, state_min), c.max_parallelism)
        raw = math.ceil(tps_target * cost * c.safety_factor) if rows else floor
        target = min(max(raw, floor), c.max_parallelism)
        inputs = {"tps_current": round(tps_current, 1), "delay_increasing_rate": round(delay_rate, 4),
                  "tps_target": round(tps_target, 1), "cost_core_s_per_row": cost, "safety_factor": c.safety_factor,
                  "raw_target": raw, "state_min": state_min, "target": target, "lag_s": round(s.lag_s, 3),
                  "lag_rows": s.lag_rows, "window_batches": len(window), "window_s": round(span, 3)}
        stable_for = s.t - self.changed_at
        if s.lag_s > c.lag_threshold_s and target > cur:
            action, why = "up", f"lag {s.lag_s:.1f}s > lag_threshold_s {c.lag_threshold_s}, target {target} > {cur}"
        elif target < cur and cur / max(target, 1) > c.scale_down_ratio:
            action, why = "down", f"current {cur} / target {target} > scale_down_ratio {c.scale_down_ratio}"
        elif cur < floor:
            action, why = "up", f"state of {s.state_rows} rows needs at least {floor}"
        else:
            return Decision("hold", cur, cur, f"target {target} (current {cur}): no trigger", inputs)
        if stable_for < c.stable_s:
            return Decision("hold", cur, cur, f"{why}, but only {stable_for:.1f}s since the last change "
                                              f"(stable_s {c.stable_s})", inputs)
        self.parallelism = target
        self.changed_at = s.t
        self.samples.clear()
        return Decision(action, self.parallelism, cur, why, inputs)


def session_parallelism(spark) -> int:
    """The parallelism a session offers: its default parallelism (the cores of ``local[n]``,
    the executors' cores on a cluster)."""
    from .connect import default_parallelism
    return default_parallelism(spark)


def apply_to_cluster(spark, parallelism: int) -> dict:
    """On a standalone cluster (``spark://`` master), run ``parallelism`` tasks' worth of
    executors: ``ceil(parallelism / spark.executor.cores)``. Up: SparkContext's
    ``requestTotalExecutors`` (the call dynamic allocation makes; the master launches them
    where workers have free cores). Down: ``killExecutors`` of the surplus, which also lowers
    the target (called at a batch boundary, when no task of the model runs). Elsewhere
    nothing: the batch's own threads and shuffle partitions carry the parallelism. Returns
    what was asked, for the run log. Over Spark Connect nothing either: the client has no
    SparkContext to ask (the server's own dynamic allocation may scale it)."""
    from .connect import is_connect
    if is_connect(spark):
        return {}
    sc = spark.sparkContext
    if not sc.master.startswith("spark://"):
        return {}
    cores = int(spark.conf.get("spark.executor.cores", "1") or 1)
    wanted = max(1, math.ceil(parallelism / cores))
    jsc, jvm = sc._jsc.sc(), sc._jvm
    convert = jvm.scala.jdk.javaapi.CollectionConverters
    ids = sorted(convert.asJava(jsc.getExecutorIds()), key=lambda i: (len(i), i))
    if len(ids) > wanted:
        surplus = ids[wanted:]
        ok = jsc.killExecutors(convert.asScala(jvm.java.util.ArrayList(surplus)).toSeq())
        return {"executors": wanted, "executor_cores": cores, "killed": surplus, "accepted": bool(ok)}
    empty = getattr(getattr(jvm.scala.collection.immutable, "Map$"), "MODULE$").empty()
    ok = jsc.requestTotalExecutors(wanted, 0, empty)
    return {"executors": wanted, "executor_cores": cores, "requested": bool(ok)}
