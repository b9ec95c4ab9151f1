"""Benchmark: an incremental run after one TPC-H refresh round, against --full-refresh and
against the same SQL as a dbt `table` model (Spark CREATE TABLE AS SELECT over the same
source snapshots), for each example model, at each scale factor given.

    .venv/bin/python benchmarks/refresh_vs_full.py --sf 0.1 1 [--models q1_pricing_summary]

Prints one JSON object per (scale factor, model) and a final summary, all on stdout:
seconds of each variant, source rows changed by the round, target rows written, and the
ratios incremental / full refresh and incremental / table. Data goes under
benchmarks/.data (git-ignored) and is regenerated per scale factor.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import consistent_stream  # noqa: E402,F401  (PYSPARK_PYTHON before the session)
from consistent_stream.job import run_job  # noqa: E402
from consistent_stream.oracle import rewrite_relations, view_name  # noqa: E402
from consistent_stream.delta import DeltaTableRef  # noqa: E402
from consistent_stream.tpch.generate import generate  # noqa: E402
from consistent_stream.tpch.refresh import refresh_round  # noqa: E402
from helpers import EXAMPLE_MODELS, job_for, render_model, tpch_sources  # noqa: E402


def spark_session():
    from pyspark.sql import SparkSession
    s = (SparkSession.builder.master("local[2]").appName("consistent-stream-bench")
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.driver.memory", "8g")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.warehouse.dir", str(REPO / "benchmarks" / ".data" / "warehouse"))
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    return s


def table_model_seconds(spark, job) -> float:
    """What dbt's `table` materialization does: CREATE TABLE .. USING parquet AS <the SQL>,
    over each source's current snapshot (read like the engine reads it)."""
    t0 = time.time()
    mapping = {}
    for s in job.sources:
        t = DeltaTableRef(s.location)
        v = t.latest_version()
        name = view_name(s, v)
        t.read_snapshot(spark, v).createOrReplaceTempView(name)
        mapping[s.relation_parts] = name
    spark.sql("CREATE SCHEMA IF NOT EXISTS bench")
    spark.sql(f"DROP TABLE IF EXISTS bench.{job.identifier}_table")
    spark.sql(f"CREATE TABLE bench.{job.identifier}_table USING parquet AS {rewrite_relations(job.sql, mapping)}")
    return time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, nargs="+", default=[0.1, 1.0])
    ap.add_argument("--models", nargs="*", default=None)
    args = ap.parse_args()
    spark = spark_session()
    models = args.models or sorted(p.stem for p in EXAMPLE_MODELS.glob("*.sql"))
    out = []
    for sf in args.sf:
        root = REPO / "benchmarks" / ".data" / f"sf{sf:g}"
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.time()
        generate(sf, root / "data")
        gen_s = time.time() - t0
        jobs = []
        for name in models:
            sql, config, used = render_model(EXAMPLE_MODELS / f"{name}.sql")
            jobs.append(job_for(name, sql, tpch_sources(str(root / "data"), used), config["unique_key"], root,
                                schema="bench"))
        first = {}
        for job in jobs:  # the initial build (also a full refresh, from empty)
            first[job.model] = run_job(spark, job, full_refresh=True)
        t0 = time.time()
        refresh_round(root / "data", 1)
        rf_s = time.time() - t0
        for job in jobs:
            inc = run_job(spark, job)
            table_s = table_model_seconds(spark, job)
            full = run_job(spark, job, full_refresh=True)
            rec = {
                "sf": sf, "model": job.model,
                "incremental_s": inc["seconds"], "full_refresh_s": full["seconds"], "table_model_s": round(table_s, 3),
                "initial_build_s": first[job.model]["seconds"],
                "source_rows_changed": inc["changes_read"], "target_rows_written": inc["rows_written"],
                "target_rows": DeltaTableRef(job.target_path).num_records(DeltaTableRef(job.target_path).latest_version()),
                "ratio_incremental_to_full_refresh": round(inc["seconds"] / full["seconds"], 3),
                "ratio_incremental_to_table": round(inc["seconds"] / table_s, 3),
                "generate_s": round(gen_s, 3), "refresh_round_s": round(rf_s, 3),
            }
            print(json.dumps(rec), flush=True)
            out.append(rec)
    print(json.dumps({"summary": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
