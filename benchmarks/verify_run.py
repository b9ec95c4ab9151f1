"""Benchmark: what `consistent-stream verify` costs per example model, against the comparison
it used before (Spark's ``exceptAll`` both ways, each side persisted, then both sides
counted: the model's SQL evaluated three times), in the same process and on the same tables.

    .venv/bin/python benchmarks/verify_run.py [--sf 0.1] [--runs 3] [--models q3_revenue_per_order]

TPC-H is generated as Delta tables at ``--sf`` (under a temporary directory), every example
model is built once (``run_job``, full refresh, in DAG order), then each model is verified
``--runs`` times with each comparison, alternating, in a session that sets no tuning (no
shuffle partitions, default driver memory). Per model and comparison: the median seconds of
``verify_target`` (batch evaluation of the whole chain at the base cut, the target's
snapshot, the comparison), Spark SQL executions per verify, and the broadcast hash relations
built per verify (each holds one memory page on the driver, 32 MiB on a default local
session, until Spark's cleaner finds it unreachable). Every verify must report OK.

Prints one JSON line per model and a summary line (medians, ratio old / new) on stdout.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def exceptall_compare(got, expected, *, tolerance, inexact, unit, examples=5):
    """The comparison ``verify`` used before: ``exceptAll`` both ways (each persisted and
    counted), then both sides counted; what is left matched by the driver's rule."""
    from consistent_stream.compare import compare_tables
    missing = expected.exceptAll(got).persist()
    unexpected = got.exceptAll(expected).persist()
    try:
        missing.count(), unexpected.count()
        rows_target, rows_expected = got.count(), expected.count()
        result = compare_tables(unexpected.toArrow(), missing.toArrow(), tolerance=tolerance, inexact=inexact,
                                unit=unit, examples=examples)
        result.rows_target, result.rows_expected = rows_target, rows_expected
        return result
    finally:
        missing.unpersist()
        unexpected.unpersist()


def _counts(spark) -> tuple[int, int]:
    """(SQL executions so far, broadcasts made so far) of the session."""
    jvm = spark._jvm
    executions = spark._jsparkSession.sharedState().statusStore().executionsCount()
    manager = jvm.org.apache.spark.SparkEnv.get().broadcastManager()
    field = manager.getClass().getDeclaredField("nextBroadcastId")
    field.setAccessible(True)
    made = field.get(manager)
    return executions, int(made if isinstance(made, int) else made.get())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=0.1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", nargs="*", help="default: every example model")
    args = ap.parse_args()

    import consistent_stream  # noqa: F401  (PYSPARK_PYTHON before the session)
    from pyspark.sql import SparkSession
    from consistent_stream import verify
    from consistent_stream.job import run_job
    from consistent_stream.session import with_delta
    from consistent_stream_testing.tpch.generate import generate
    import test_tpch_models as tpch_models

    root = Path(tempfile.mkdtemp(prefix="verify-bench-")) / "tpch"
    spark = (with_delta(SparkSession.builder).master("local[*]").appName("consistent-stream-verify-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.warehouse.dir", str(root.parent / "warehouse")).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    generate(args.sf, root / "data")
    jobs = {}
    for name in tpch_models.dag_order():
        jobs[name] = tpch_models.job_of(name, root)
        run_job(spark, jobs[name], full_refresh=True)

    new_compare = verify.compare_frames
    summary = {}
    for name in args.models or list(jobs):
        rec = {"sf": args.sf, "model": name, "runs": args.runs}
        for _ in range(args.runs):
            for label, compare in (("exceptall", exceptall_compare), ("one_aggregation", new_compare)):
                verify.compare_frames = compare
                before = _counts(spark)
                t0 = time.perf_counter()
                res = verify.verify_target(spark, jobs[name].target_path)
                seconds = time.perf_counter() - t0
                after = _counts(spark)
                if not res.ok:
                    raise SystemExit(f"{name}: verify with {label} failed: {res.to_json()}")
                rec.setdefault(f"{label}_s", []).append(round(seconds, 3))
                rec[f"{label}_sql_executions"] = after[0] - before[0]
                rec[f"{label}_broadcasts"] = after[1] - before[1]
        verify.compare_frames = new_compare
        for label in ("exceptall", "one_aggregation"):
            rec[f"{label}_median_s"] = round(statistics.median(rec[f"{label}_s"]), 3)
        rec["ratio_exceptall_over_one_aggregation"] = round(rec["exceptall_median_s"] / rec["one_aggregation_median_s"],
                                                            2)
        summary[name] = rec["ratio_exceptall_over_one_aggregation"]
        print(json.dumps(rec), flush=True)
    print(json.dumps({"summary": "verify seconds, exceptall / one_aggregation (median of runs)", "sf": args.sf,
                      "ratios": summary}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
