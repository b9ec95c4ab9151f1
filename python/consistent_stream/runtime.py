"""One micro-batch, step by step: the exactly-once protocol of DESIGN.md.

For batch ``b`` ending at cut ``C_b`` (the previous one ended at ``C_{b-1}``):

1. read each source's changes in ``(C_{b-1}, C_b]`` as a consolidated changelog;
2. evaluate the plan bottom-up; stateful operators read their arrangements at the versions
   the target's commit of batch ``b-1`` recorded, and stage their updates;
3. commit every arrangement with txn ``(app id, b)`` (skipping those a crashed attempt
   already committed);
4. commit the target last, with txn ``(app id, b)`` and the cut, source commit time and
   arrangement versions in its commit metadata: the batch happened iff the target holds
   txn ``b``. A replay of a committed batch is skipped whole.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from .changelog import WEIGHT, consolidate
from .delta import DeltaTableRef, Txn
from .errors import CommitError
from .plan import CompiledModel
from .plan.incremental import IncrementalEvaluator
from .operators.keyed import restrict_to_keys
from .sink.target import bag_changes, commit_target, sink_changes
from .sources import Cut
from .sources.formats import commit_ms, cut_metadata, read_changelog
from .spec import JobSpec
from .state import StateStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchResult:
    """What one micro-batch did. ``changes_read``: source change rows (snapshot rows on the
    first batch); ``rows_written``: target rows upserted or deleted."""
    batch_id: int
    skipped: bool
    changes_read: int
    rows_written: int
    target_version: int | None
    seconds: float
    cut: dict


def source_commit_ms(job: JobSpec, cut: Cut) -> int:
    """Commit time (ms since epoch) of the newest source commit included in ``cut``."""
    return max(commit_ms(s, cut.versions[s.key]) for s in job.sources)


def scan_columns(compiled: CompiledModel) -> dict[str, list[str]]:
    """Per source, the union of the columns its scans read (projection pruning)."""
    from .plan.logical import Scan, walk
    cols: dict[str, list[str]] = {}
    for n in walk(compiled.root):
        if isinstance(n, Scan):
            cur = cols.setdefault(n.source.key, [])
            cur.extend(c for c in n.source_columns if c not in cur)
    return cols


class _Phases:
    """Wall time per phase of a batch, logged at the end (for tuning; no behaviour)."""

    def __init__(self):
        self.t, self.times = time.time(), {}

    def mark(self, name: str) -> None:
        now = time.time()
        self.times[name] = round(now - self.t, 3)
        self.t = now


SMALL_BATCH_ROWS = 100_000
"""Input rows (source changes, or snapshot rows on a first batch) below which a batch runs
with the small-batch settings of :func:`_small_batch_confs`."""

_SMALL_BATCH_CONFS = {
    # adaptive execution re-plans after every shuffle stage, which costs more than it saves
    # on a few thousand rows (customer_order_totals, SF 0.01, one refresh round: 17.8 s with
    # AQE, 11.0 s without)
    "spark.sql.adaptive.enabled": "false",
    # compiling generated Java for each of a batch's many small stages costs more than
    # interpreting them (correlated_scalar property shape, 4 runs: 45/12/11/12 s with
    # whole-stage codegen, 34/11/9/9 s without)
    "spark.sql.codegen.wholeStage": "false",
}


@contextmanager
def _small_batch_confs(spark: SparkSession, small: bool):
    """Run a batch of fewer than SMALL_BATCH_ROWS input rows with ``_SMALL_BATCH_CONFS``
    (restored afterwards); larger batches (e.g. a first batch over big snapshots) keep the
    session's settings."""
    if not small:
        yield
        return
    old = {k: spark.conf.get(k, None) for k in _SMALL_BATCH_CONFS}
    for k, v in _SMALL_BATCH_CONFS.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def process_batch(spark: SparkSession, job: JobSpec, compiled: CompiledModel, output_schema: StructType,
                  app_id: str, batch_id: int, start: Cut, end: Cut) -> BatchResult:
    t0 = time.time()
    target = DeltaTableRef(job.target_path)
    txn = Txn(app_id, batch_id)
    done = target.txn_version(app_id)
    if done is not None and done >= batch_id:
        log.info("%s: batch %d already committed (target txn %d); replay skipped", job.model, batch_id, done)
        return BatchResult(batch_id, True, 0, 0, None, time.time() - t0, end.versions)

    first = start.is_initial()
    key = target_key(job, compiled, output_schema)
    prev = None
    if first:
        state_versions = {}
    else:
        prev = target.find_commit(app_id, batch_id - 1)
        if prev is None:
            raise CommitError(
                f"model {job.model}: the target {job.target_path} has no commit of batch {batch_id - 1} "
                f"for query {app_id}; it was changed outside consistent_stream. Run dbt run --full-refresh")
        state_versions = {k: int(v) for k, v in _json(prev.metadata.get("state_versions", "{}")).items()}

    # 1. source changelogs
    cols = scan_columns(compiled)
    deltas, changes_read = {}, 0
    for s in job.sources:
        if s.key not in cols:
            continue
        a, b = start.versions[s.key], end.versions[s.key]
        df, n = read_changelog(spark, s, a, b, cols[s.key])
        if n < 0:
            n = DeltaTableRef(s.location).num_records(b)
        changes_read += n
        deltas[s.key] = df

    ph = _Phases()
    # 2. delta rules
    state = StateStore(spark, job.state_root, state_versions)
    ev = IncrementalEvaluator(state, deltas, first)
    with _small_batch_confs(spark, changes_read < SMALL_BATCH_ROWS):
        try:
            out = ev.delta(compiled.root)
            # output columns take Spark's analyzed names and types, by position
            out = out.select(*[F.col(f"`{c}`").cast(f.dataType).alias(f.name)
                               for c, f in zip(compiled.output_columns, output_schema.fields)], F.col(WEIGHT))
            out_arrow = consolidate(out).toArrow()  # the batch's change to the target: size of the change
            if key is not None:
                changes = sink_changes(out_arrow, key, job.model, first=first)
            else:
                old = None if first else _multiplicities(spark, target, prev.version, out_arrow)
                changes = bag_changes(out_arrow, old, job.model, first=first)
            ph.mark("evaluate")
            meta = {"app_id": app_id, "batch_id": str(batch_id), "model": job.model, "cut": end.versions,
                    "source_commit_ms": str(source_commit_ms(job, end)),
                    "checkpoint_location": job.checkpoint_location, **cut_metadata(job.sources, end)}
            # 3. arrangements, then 4. the target (the commit point)
            meta["state_versions"] = state.commit(txn, {"app_id": app_id, "batch_id": str(batch_id)})
            ph.mark("commit_state")
            version, written = commit_target(target, changes, first=first, unique_key=key,
                                             partition_by=job.partition_by, txn=txn, metadata=meta)
            ph.mark("commit_target")
        finally:
            ev.release()

    secs = time.time() - t0
    log.info("%s: batch %d phases %s", job.model, batch_id, ph.times)
    log.info("%s: batch %d committed target version %d: %d changes read, %d rows written, %.2fs",
             job.model, batch_id, version, changes_read, written, secs)
    return BatchResult(batch_id, False, changes_read, written, version, secs, end.versions)


def target_key(job: JobSpec, compiled: CompiledModel, output_schema: StructType) -> list[str] | None:
    """The target's merge key: the configured ``unique_key``, else the key inferred from the
    plan (as the output's column names), else None (a bag)."""
    if job.unique_key:
        return job.unique_key
    if compiled.unique_key is None:
        return None
    return [output_schema.fields[compiled.output_columns.index(c)].name for c in compiled.unique_key]


def _multiplicities(spark: SparkSession, target: DeltaTableRef, version: int, delta):
    """For the rows of ``delta`` (Arrow, columns + ``__weight``) with a negative weight, their
    number of copies in the target at ``version``: columns + ``__count``. Scans the target
    (a bag has no key to look rows up by)."""
    import pyarrow.compute as pc
    neg = delta.filter(pc.less(delta.column(WEIGHT), 0)).drop_columns([WEIGHT])
    if neg.num_rows == 0:
        return None
    cols = neg.column_names
    rows = target.read_snapshot(spark, version).select(*[F.col(f"`{c}`") for c in cols])
    wanted = spark.createDataFrame(neg, schema=rows.schema)
    hit = restrict_to_keys(rows, cols, wanted, cols, null_safe=True)
    return hit.groupBy(*[F.col(f"`{c}`") for c in cols]).agg(F.count(F.lit(1)).alias("__count")).toArrow()


def _json(v):
    import json
    return v if isinstance(v, dict) else json.loads(v)
