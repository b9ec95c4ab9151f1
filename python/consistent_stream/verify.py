"""``consistent-stream verify``: check the central contract on a target's latest commit (or
any retained version).

Reads the base cut from the target's latest consistent_stream commit, evaluates the model's
SQL in batch (Spark) over the sources at that cut (an upstream model of a ``ref()`` chain
recomputed from its own SQL at the same base cut, recursively), and diffs the result against the target at
that version as multisets. Floating-point columns are compared at 9 significant digits
(sums of doubles depend on the order of addition); every other type exactly.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, FloatType

from . import location
from .delta import DeltaTableRef
from .errors import ConsistentStreamError
from .oracle import batch_dataframe
from .sources import Cut
from .spec import JobSpec
from .storage import replace_text

INDEX_DIR = os.path.join(".consistent_stream", "models")


def index_path(project_root: str, model: str) -> str:
    """Where a dbt project records which target and checkpoint a model has."""
    return os.path.join(project_root, INDEX_DIR, f"{model}.json")


def record_model(project_root: str, job: JobSpec) -> None:
    replace_text(index_path(project_root, job.model),
                 json.dumps({"target_path": job.target_path, "checkpoint_location": job.checkpoint_location}))


@dataclass
class VerifyResult:
    model: str
    target_version: int
    batch_id: int
    cut: dict
    base_cut: dict
    rows_target: int
    rows_expected: int
    missing: int      # rows batch evaluation has that the target lacks
    unexpected: int   # rows the target has that batch evaluation lacks
    ok: bool
    examples: list

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)


def _normalized(df: DataFrame) -> DataFrame:
    cols = []
    for f in df.schema.fields:
        c = F.col(f"`{f.name}`")
        if isinstance(f.dataType, (DoubleType, FloatType)):
            mag = F.floor(F.log10(F.abs(c)))
            c = F.when(c.isNull() | (c == 0) | F.isnan(c), c.cast("double")).otherwise(
                F.round(c / F.pow(F.lit(10.0), mag), 8) * F.pow(F.lit(10.0), mag))
        cols.append(c.alias(f.name))
    return df.select(*cols)


def latest_commit(target: DeltaTableRef):
    for c in target.history(100):
        if "cut" in c.metadata:
            return c
    raise ConsistentStreamError(f"{target.path} has no consistent_stream commit in its last 100 versions")


def commit_of_version(target: DeltaTableRef, version: int):
    """The commit of ``version`` of ``target``, which must be a consistent_stream batch still
    in the log. Raises ConsistentStreamError naming the version otherwise."""
    latest = target.latest_version()
    if not 0 <= version <= latest:
        raise ConsistentStreamError(f"{target.path} has versions 0..{latest}, not {version}")
    try:
        commit = target.commit_at(version)
    except ConsistentStreamError as e:
        raise ConsistentStreamError(f"version {version} of {target.path} is no longer retained: {e} (the model's "
                                    f"log_retention_hours decides how long versions stay)") from e
    if "cut" not in commit.metadata:
        raise ConsistentStreamError(f"version {version} of {target.path} was not written by a consistent_stream "
                                    f"batch (no cut in its commit)")
    return commit


def verify_target(spark: SparkSession, target_path: str, examples: int = 5,
                  version: int | None = None) -> VerifyResult:
    """Diff the target's latest committed version (or ``version``, any retained one) against
    batch evaluation of the whole chain at its base cut. The sources' versions of that cut
    must still be readable (not vacuumed)."""
    target = DeltaTableRef(target_path)
    commit = latest_commit(target) if version is None else commit_of_version(target, version)
    meta = commit.metadata
    job = JobSpec.load(os.path.join(meta["checkpoint_location"], "_consistent_stream", "job.json"))
    # an object store's settings (endpoint, credentials, s3:// as S3A) on the session
    location.apply_to_spark(spark, [target_path, job.checkpoint_location, *[s.location for s in job.sources]])
    cut = Cut.from_json(meta["cut"])
    base = Cut.from_json(meta.get("base_cut") or meta["cut"])
    expected = _normalized(batch_dataframe(spark, job.sql, job.sources, base, chain=True))
    got = _normalized(target.read_snapshot(spark, commit.version).select(*[f"`{c}`" for c in expected.columns]))
    missing = expected.exceptAll(got).persist()
    unexpected = got.exceptAll(expected).persist()
    n_missing, n_unexpected = missing.count(), unexpected.count()
    ex = [{"missing": r.asDict()} for r in missing.limit(examples).collect()] + \
         [{"unexpected": r.asDict()} for r in unexpected.limit(examples).collect()]
    missing.unpersist()
    unexpected.unpersist()
    return VerifyResult(model=job.model, target_version=commit.version, batch_id=int(meta.get("batch_id", -1)),
                        cut=cut.versions, base_cut=base.versions, rows_target=got.count(), rows_expected=expected.count(),
                        missing=n_missing, unexpected=n_unexpected, ok=(n_missing == 0 and n_unexpected == 0),
                        examples=ex)
