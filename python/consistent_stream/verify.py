"""``consistent-stream verify``: check the central contract on a target's latest commit (or
any retained version).

Reads the base cut from the target's latest consistent_stream commit, evaluates the model's
SQL in batch (Spark) over the sources at that cut (an upstream model of a ``ref()`` chain
recomputed from its own SQL at the same base cut, recursively), and compares the result with
the target at that version by :mod:`consistent_stream.compare`'s rule: a multiset matching in
which exact columns are equal and floating-point columns (FLOAT, DOUBLE, and columns computed
from an order-dependent floating-point aggregate, :mod:`consistent_stream.plan.inexact`)
agree within a tolerance.

On the executors: the multiset difference both ways in one aggregation over both sides (the
model's SQL runs once), which cancels every row equal in all columns. The rows left (usually
none, or the few whose floating-point values differ in their last bits) are matched on the
driver with the tolerance, up to ``DRIVER_MATCH_ROWS`` of them; past that, Spark pairs them
within each group of equal exact columns in the order of their floating-point values (exact
where a group holds one row a side, as it does under a unique key) and checks each pair.

The SQL runs with the clock's calls returning the instant the version recorded
(:mod:`consistent_stream.plan.clock`). A model whose outermost query is an ``ORDER BY ..
LIMIT`` that differs from batch evaluation is compared again as SQL allows: rows tied at the
LIMIT's boundary by their ORDER BY values only (:func:`~consistent_stream.compare.compare_top_n`).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, DoubleType, FloatType, IntegralType, StructType

from . import location
from .compare import Comparison, FloatTolerance, TopN, compare_tables, compare_top_n
from .delta import DeltaTableRef
from .errors import ConsistentStreamError
from .oracle import batch_evaluation
from .plan.clock import commit_instants
from .plan.topn import model_top_n
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


DRIVER_MATCH_ROWS = 1_000_000
"""Rows left after the exact multiset difference that are matched on the driver."""


@dataclass
class VerifyResult:
    """What ``verify`` found at one target version. ``missing``: rows batch evaluation has
    that the target lacks; ``unexpected``: rows the target has that batch evaluation lacks
    (after the matching of :mod:`consistent_stream.compare`); ``float_tolerance``: relative
    and absolute; ``inexact_columns``: the columns compared with it;
    ``exact_columns_from_floats``: columns computed from floating point whose type admits no
    distance (a BOOLEAN or STRING), compared exactly; ``largest_difference``: the largest
    floating-point difference between matched rows (``column``, ``target``, ``expected``,
    ``absolute``, ``relative``), None when every matched value was equal."""
    model: str
    target_version: int
    batch_id: int
    cut: dict
    base_cut: dict
    rows_target: int
    rows_expected: int
    missing: int
    unexpected: int
    ok: bool
    examples: list
    float_tolerance: dict
    inexact_columns: list
    exact_columns_from_floats: list
    largest_difference: dict | None

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)


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


def verify_target(spark: SparkSession, target_path: str, examples: int = 5, version: int | None = None,
                  tolerance: FloatTolerance | None = None, model: str = "<model>") -> VerifyResult:
    """Compare the target's latest committed version (or ``version``, any retained one) with
    batch evaluation of the whole chain at its base cut (module docstring), floating-point
    columns within ``tolerance`` (default relative 1e-9, absolute 1e-12). The sources'
    versions of that cut must still be readable (not vacuumed). Raises ConsistentStreamError
    when the target does not exist (naming ``model`` and the command that rebuilds it), or the
    version is not a consistent_stream commit or is no longer retained."""
    tolerance = tolerance or FloatTolerance()
    target = DeltaTableRef(target_path)
    if not target.exists():
        raise ConsistentStreamError(
            f"model {model}: its target {target_path} does not exist (deleted or moved, or never built): nothing to "
            f"verify. dbt run -s {model} builds it; when it was deleted after batches were committed, dbt run "
            f"--full-refresh -s {model} rebuilds it from the sources")
    commit = latest_commit(target) if version is None else commit_of_version(target, version)
    meta = commit.metadata
    job = JobSpec.load(os.path.join(meta["checkpoint_location"], "_consistent_stream", "job.json"))
    # an object store's settings (endpoint, credentials, s3:// as S3A) on the session
    location.apply_to_spark(spark, [target_path, job.checkpoint_location, *[s.location for s in job.sources]])
    cut = Cut.from_json(meta["cut"])
    base = Cut.from_json(meta.get("base_cut") or meta["cut"])
    instant, upstream_instants = commit_instants(meta)
    evaluated = batch_evaluation(spark, job.sql, job.sources, base, chain=True, instant=instant,
                                 upstream_instants=upstream_instants)
    expected = evaluated.frame
    got = target.read_snapshot(spark, commit.version).select(*[f"`{c}`" for c in expected.columns])
    inexact, units, exact_from_floats = inexact_comparison(expected.schema, evaluated.inexact)
    result = compare_frames(got, expected, tolerance=tolerance, inexact=inexact, unit=units, examples=examples)
    top = model_top_n(job.sql)
    if not result.ok and top is not None:   # an ORDER BY .. LIMIT: rows tied at the boundary may differ
        result = compare_top_n(got.toArrow(), expected.toArrow(), TopN(*top), tolerance=tolerance, inexact=inexact,
                               unit=units, examples=examples)
    return VerifyResult(model=job.model, target_version=commit.version, batch_id=int(meta.get("batch_id", -1)),
                        cut=cut.versions, base_cut=base.versions, rows_target=result.rows_target,
                        rows_expected=result.rows_expected, missing=result.missing, unexpected=result.unexpected,
                        ok=result.ok, examples=result.examples, float_tolerance=tolerance.to_json(),
                        inexact_columns=result.inexact_columns, exact_columns_from_floats=exact_from_floats,
                        largest_difference=result.largest_difference)


def inexact_comparison(schema: StructType, derived: dict[str, str]) -> tuple[list[str], dict[str, float], list[str]]:
    """From batch evaluation's Spark ``schema`` and the columns computed from floating point
    (``derived``, :func:`~consistent_stream.plan.inexact.inexact_columns`): the columns to
    compare with the tolerance (FLOAT, DOUBLE, and derived numeric ones), one unit in the last
    place of each derived DECIMAL (``10 ** -scale``) or integer (1) column, and the derived
    columns compared exactly (no numeric type)."""
    inexact, units, exact = [], {}, []
    for f in schema.fields:
        t = f.dataType
        if isinstance(t, (DoubleType, FloatType)):
            inexact.append(f.name)
        elif f.name in derived:
            if isinstance(t, DecimalType):
                inexact.append(f.name)
                units[f.name] = 10.0 ** -t.scale
            elif isinstance(t, IntegralType):
                inexact.append(f.name)
                units[f.name] = 1.0
            else:
                exact.append(f.name)
    return inexact, units, exact


def compare_frames(got: DataFrame, expected: DataFrame, *, tolerance: FloatTolerance, inexact: list[str],
                   unit: dict[str, float], examples: int = 5) -> Comparison:
    """:func:`~consistent_stream.compare.compare_tables` for two DataFrames of the same columns
    (module docstring: the exact difference on the executors, the matching of what is left on
    the driver or, past ``DRIVER_MATCH_ROWS`` rows, by Spark).

    The multiset difference both ways in one aggregation (Spark's own ``exceptAll`` rule, both
    directions at once): the rows of both sides grouped by every column (NULLs equal, NaN and
    -0.0 normalised as Spark groups them), each group's rows counted per side; a group with
    ``e`` expected and ``t`` target rows leaves ``e - t`` rows missing or ``t - e``
    unexpected. Batch evaluation (``expected``) runs once: each run of a model's joins builds
    its broadcast relations anew on the driver's heap, where they stay until Spark's cleaner
    finds them unreachable."""
    cols = [f"`{c}`" for c in expected.columns]
    tagged = (expected.select(*cols, F.lit(1).alias("__e"), F.lit(0).alias("__t"))
              .unionByName(got.select(*cols, F.lit(0).alias("__e"), F.lit(1).alias("__t"))))
    groups = tagged.groupBy(*cols).agg(F.sum("__e").alias("__e"), F.sum("__t").alias("__t"))
    totals = groups.agg(F.sum("__e"), F.sum("__t"), F.sum(F.greatest(F.col("__e") - F.col("__t"), F.lit(0))),
                        F.sum(F.greatest(F.col("__t") - F.col("__e"), F.lit(0)))).first()
    rows_expected, rows_target, n_missing, n_unexpected = (int(v or 0) for v in totals)
    if n_missing + n_unexpected == 0:
        return Comparison(rows_target=rows_target, rows_expected=rows_expected, missing=0, unexpected=0,
                          tolerance=tolerance,
                          inexact_columns=[f.name for f in expected.schema.fields
                                           if isinstance(f.dataType, (DoubleType, FloatType)) or f.name in inexact])
    diffs = groups.where(F.col("__e") != F.col("__t")).persist()
    try:
        def side(more: str, less: str) -> DataFrame:
            return (diffs.where(F.col(more) > F.col(less))
                    .select(*cols, F.explode(F.sequence(F.lit(1), F.col(more) - F.col(less))).alias("__i"))
                    .select(*cols))
        missing, unexpected = side("__e", "__t"), side("__t", "__e")
        if n_missing + n_unexpected <= DRIVER_MATCH_ROWS:
            result = compare_tables(unexpected.toArrow(), missing.toArrow(), tolerance=tolerance, inexact=inexact,
                                    unit=unit, examples=examples)
        else:
            result = _paired_by_spark(unexpected, missing, tolerance, inexact, unit, examples)
        result.rows_target, result.rows_expected = rows_target, rows_expected
        return result
    finally:
        diffs.unpersist()


def _paired_by_spark(unexpected: DataFrame, missing: DataFrame, tolerance: FloatTolerance, inexact: list[str],
                     unit: dict[str, float], examples: int) -> Comparison:
    """The matching of many leftover rows on the executors: within each group of equal exact
    columns, the i-th row of each side in the order of the floating-point columns are paired,
    and a pair whose values agree within the tolerance matches."""
    cols = list(missing.columns)
    floats = [c for c in cols if c in inexact]
    exact = [c for c in cols if c not in inexact]

    def ranked(df: DataFrame, side: str) -> DataFrame:
        order = [F.col(f"`{c}`").asc_nulls_first() for c in floats]
        w = Window.partitionBy(*[F.col(f"`{c}`") for c in exact]) if exact else Window.partitionBy(F.lit(1))
        df = df.withColumn("__rank", F.row_number().over(w.orderBy(*order)))
        return df.select(*[F.col(f"`{c}`").alias(f"{side}{i}") for i, c in enumerate(df.columns)])

    n = len(missing.columns)
    t, e = ranked(unexpected, "t"), ranked(missing, "e")
    on = [F.col(f"t{cols.index(c)}").eqNullSafe(F.col(f"e{cols.index(c)}")) for c in exact]
    on.append(F.col(f"t{n}") == F.col(f"e{n}"))
    pairs = t.join(e, on=on, how="full")
    close, rel = F.lit(True), []
    for c in floats:
        x, y = F.col(f"t{cols.index(c)}").cast("double"), F.col(f"e{cols.index(c)}").cast("double")
        scale = F.greatest(F.abs(x), F.abs(y))
        bound = F.greatest(scale * tolerance.relative, F.lit(tolerance.absolute), F.lit(unit.get(c, 0.0)))
        same = (x.isNull() & y.isNull()) | (F.isnan(x) & F.isnan(y)) | (x == y) | (F.abs(x - y) <= bound)
        close = close & F.coalesce(same, F.lit(False))
        rel.append(F.when(scale > 0, F.abs(x - y) / scale).otherwise(F.lit(0.0)).alias(c))
    both = F.col(f"t{n}").isNotNull() & F.col(f"e{n}").isNotNull()
    pairs = pairs.withColumn("__matched", both & close).persist()
    try:
        counts = pairs.agg(F.sum(F.when(~F.col("__matched") & F.col(f"e{n}").isNotNull(), 1).otherwise(0)),
                           F.sum(F.when(~F.col("__matched") & F.col(f"t{n}").isNotNull(), 1).otherwise(0))).first()
        result = Comparison(rows_target=0, rows_expected=0, missing=int(counts[0] or 0), unexpected=int(counts[1] or 0),
                            tolerance=tolerance, inexact_columns=floats)
        diffs = pairs.where("__matched").select(*rel)
        for c in floats:
            row = diffs.orderBy(F.col(f"`{c}`").desc_nulls_last()).limit(1).collect()
            if row and row[0][0] and (result.largest_difference is None
                                      or row[0][0] > result.largest_difference["relative"]):
                result.largest_difference = {"column": c, "relative": row[0][0]}
        for side, kind in (("e", "missing"), ("t", "unexpected")):
            lone = pairs.where(~F.col("__matched") & F.col(f"{side}{n}").isNotNull())
            for r in lone.select(*[F.col(f"{side}{i}").alias(c) for i, c in enumerate(cols)]).limit(examples).collect():
                result.examples.append({kind: r.asDict()})
        return result
    finally:
        pairs.unpersist()

