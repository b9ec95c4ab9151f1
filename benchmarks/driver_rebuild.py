"""Benchmark: where a rebuild should run, by the size of its sources.

    .venv/bin/python benchmarks/driver_rebuild.py [--sf 0.002 0.005 0.01 0.02 0.05] [--reps 3]

A rebuild (first batch, ``--full-refresh``, a recomputed batch) whose sources hold at most
``driver_rebuild_rows`` rows runs on the driver: the snapshots go through the delta
rules over empty state, and the state and target files are written from there. Larger ones
run on Spark's executors (one or more Spark jobs per arrangement). This times both, per TPC-H
scale factor and example model, in one warm SparkSession that sets no tuning (no shuffle
partitions, default memory): the ``--full-refresh`` of each model ``--reps`` times per
strategy (the fastest counts), with the sources' rows, the Spark jobs and the peak RSS of the
driver's Python process and of the Spark JVM of each, and the ratio executors / driver. Each
model's target is checked against batch evaluation after each.

Prints one JSON line per (scale factor, model) and a summary line, on stdout.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
DATA = REPO / "benchmarks" / ".data"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, nargs="+", default=[0.002, 0.005, 0.01, 0.02, 0.05])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=None)
    args = ap.parse_args()
    from refresh_vs_full import PeakRSS, _session
    from consistent_stream.spec import DRIVER_REBUILD_ROWS
    from consistent_stream.job import run_job
    from consistent_stream.sources.formats import open_source
    from consistent_stream_testing.tpch.generate import generate
    from helpers import EXAMPLE_MODELS, assert_target_equals_batch_evaluation, job_for, render_model, tpch_sources

    # by default the example models over sources only, as benchmarks/refresh_vs_full.py
    models = args.models or sorted(p.stem for p in EXAMPLE_MODELS.glob("*.sql")
                                   if not render_model(p)[3] and render_model(p)[1].get("materialized") != "view")
    spark = _session(None, DATA / "driver_rebuild" / "warehouse")
    summary = []
    for sf in args.sf:
        root = DATA / "driver_rebuild" / f"sf{sf:g}"
        shutil.rmtree(root, ignore_errors=True)
        generate(sf, root / "data")
        for name in models:
            sql, config, used, _ = render_model(EXAMPLE_MODELS / f"{name}.sql")
            job = job_for(name, sql, tpch_sources(str(root / "data"), used), config["unique_key"], root,
                          schema="bench")
            rows = sum(open_source(s).rows(open_source(s).latest_position()) for s in job.sources)
            rec = {"sf": sf, "model": name, "source_rows": rows}
            for where, limit in (("driver", 10 ** 12), ("executors", 0)):
                job.driver_rebuild_rows = limit
                best = None
                for _ in range(args.reps):
                    with PeakRSS(spark) as rss:
                        s = run_job(spark, job, full_refresh=True)
                    m = s["metrics"][0]
                    assert ("on the driver" in m["reason"]) == (where == "driver"), m
                    if best is None or m["seconds"] < best["seconds"]:
                        best = {"seconds": m["seconds"], "run_s": s["seconds"], "spark_jobs": m["spark_jobs"],
                                "peak_rss_mb": rss.peak}
                    assert_target_equals_batch_evaluation(spark, job, f"{name} at SF {sf} ({where})")
                rec[where] = best
            rec["ratio_executors_to_driver"] = round(rec["executors"]["seconds"] / rec["driver"]["seconds"], 2)
            print(json.dumps(rec), flush=True)
            summary.append(rec)
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"summary": [{k: r[k] for k in ("sf", "model", "source_rows", "ratio_executors_to_driver")}
                                  for r in summary], "driver_rebuild_rows": DRIVER_REBUILD_ROWS}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
