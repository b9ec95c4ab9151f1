"""Benchmark: a small batch over a source without the Change Data Feed against the same batch
with it, at Spark's defaults.

    .venv/bin/python benchmarks/no_cdf_batch.py --sf 1 [--rounds 5] [--orders 100]

TPC-H ``orders`` and ``lineitem`` at ``--sf`` are generated (``consistent-stream-testing
tpch-generate``, under ``benchmarks/.data``) and copied by delta-spark into four tables each:
with and without the Change Data Feed, with deletion vectors on (merge-on-read, as Databricks
writes by default) and off (copy-on-write). Two models run over each copy, a grouped aggregate
over ``orders`` and one over ``lineitem`` joined to ``orders``. Then ``--rounds`` times: the same
UPDATE of ``--orders`` orders' ``o_totalprice`` and their lines' ``l_quantity`` (delta-spark SQL)
on every copy, and one incremental run (``run_job``) of every model, timed; the target is then
verified against batch evaluation. Reported per (model, layout): the median run seconds with
and without the feed, their ratio, and the source rows each read (``changes_read``).

Prints one JSON line per (model, layout) and a summary line, on stdout.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
DATA = REPO / "benchmarks" / ".data"

MODELS = {
    "orders_by_customer": ("select o_custkey, count(*) as n, sum(o_totalprice) as total "
                           "from src.orders group by o_custkey", "o_custkey"),
    "lines_by_priority": ("select o.o_orderpriority, l.l_returnflag, count(*) as n, sum(l.l_quantity) as qty "
                          "from src.lineitem l join src.orders o on l.l_orderkey = o.o_orderkey "
                          "group by o.o_orderpriority, l.l_returnflag", None),
}
KEYS = {"orders": ["o_orderkey"], "lineitem": ["l_orderkey", "l_linenumber"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--orders", type=int, default=100, help="orders updated per round (and their lines)")
    args = ap.parse_args()

    import consistent_stream  # noqa: F401  (PYSPARK_PYTHON before the session)
    from pyspark.sql import SparkSession

    from consistent_stream.job import run_job
    from consistent_stream.session import with_delta
    from consistent_stream.verify import verify_target
    from helpers import job_for

    root = DATA / f"no_cdf_sf{args.sf:g}"
    gen = root / "tpch"
    if not (gen / "lineitem" / "_delta_log").exists():
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run([str(REPO / ".venv" / "bin" / "consistent-stream-testing"), "tpch-generate", "--sf",
                        str(args.sf), "--dir", str(gen), "--tables", "orders,lineitem"], check=True)
    work = root / "work"
    shutil.rmtree(work, ignore_errors=True)
    spark = (with_delta(SparkSession.builder, master="local[*]").appName("no-cdf-batch")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.warehouse.dir", str(work / "wh")).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    layouts = {}
    for dv in (True, False):
        for cdf in (True, False):
            name = f"{'mor' if dv else 'cow'}_{'cdf' if cdf else 'nocdf'}"
            props = (f"'delta.enableDeletionVectors' = '{str(dv).lower()}', "
                     f"'delta.enableChangeDataFeed' = '{str(cdf).lower()}'")
            for table in ("orders", "lineitem"):
                spark.sql(f"CREATE TABLE delta.`{work / name / table}` USING delta TBLPROPERTIES ({props}) "
                          f"AS SELECT * FROM delta.`{gen / table}`")
            layouts[name] = work / name
    jobs = {}
    for model, (sql, key) in MODELS.items():
        for name, path in layouts.items():
            sources = [{"source_name": "src", "name": t, "relation": f"src.{t}",
                        "meta": {"location": str(path / t), "primary_key": KEYS[t]}} for t in ("orders", "lineitem")
                       if f"src.{t}" in sql]
            job = job_for(f"{model}_{name}", sql, sources, key, work / "models")
            run_job(spark, job)
            jobs[(model, name)] = job
    seconds = {k: [] for k in jobs}
    changes = {k: [] for k in jobs}
    max_key = spark.sql(f"SELECT max(o_orderkey) FROM delta.`{gen / 'orders'}`").first()[0]
    for r in range(args.rounds):
        lo = (r * 7919 * args.orders) % max(1, max_key - 4 * args.orders)
        hi = lo + 4 * args.orders   # o_orderkey is sparse (a quarter of the range)
        for path in layouts.values():
            spark.sql(f"UPDATE delta.`{path / 'orders'}` SET o_totalprice = o_totalprice + 1 "
                      f"WHERE o_orderkey BETWEEN {lo} AND {hi}")
            spark.sql(f"UPDATE delta.`{path / 'lineitem'}` SET l_quantity = l_quantity + 1 "
                      f"WHERE l_orderkey BETWEEN {lo} AND {hi}")
        for k, job in jobs.items():
            t0 = time.perf_counter()
            summary = run_job(spark, job)
            seconds[k].append(time.perf_counter() - t0)
            changes[k].append(int(summary.get("changes_read") or 0))
    verified = {k: bool(verify_target(spark, job.target_path).ok) for k, job in jobs.items()}
    out = []
    for model in MODELS:
        for dv in ("mor", "cow"):
            with_cdf, without = (model, f"{dv}_cdf"), (model, f"{dv}_nocdf")
            command = " ".join(["benchmarks/no_cdf_batch.py", *sys.argv[1:]])
            layout = "merge-on-read (deletion vectors)" if dv == "mor" else "copy-on-write"
            row = {"date": time.strftime("%Y-%m-%d"), "commit": _commit(), "command": command, "sf": args.sf,
                   "model": model, "layout": layout, "rounds": args.rounds, "orders_per_round": args.orders,
                   "cdf_median_s": round(statistics.median(seconds[with_cdf]), 3),
                   "no_cdf_median_s": round(statistics.median(seconds[without]), 3),
                   "cdf_changes_read": changes[with_cdf], "no_cdf_changes_read": changes[without],
                   "verified": verified[with_cdf] and verified[without]}
            row["ratio_no_cdf_to_cdf"] = round(row["no_cdf_median_s"] / row["cdf_median_s"], 2)
            print(json.dumps(row), flush=True)
            out.append(row)
    print(json.dumps({"summary": True, "sf": args.sf, "max_ratio": max(r["ratio_no_cdf_to_cdf"] for r in out),
                      "all_verified": all(r["verified"] for r in out)}), flush=True)


def _commit() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


if __name__ == "__main__":
    main()
