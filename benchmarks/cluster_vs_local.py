"""Benchmark: the same models in local mode and on a 2-worker standalone cluster: time and
driver peak RSS of the initial build and of refresh rounds, every version verified.

    .venv/bin/python benchmarks/cluster_vs_local.py --sf 1 10 [--rounds 1] [--variants local cluster]

Per scale factor TPC-H is generated once (under ``benchmarks/.data/cluster_vs_local``) and
copied per variant, so both variants start from the same data. Each variant runs in its own
process (driver memory is per process), with a SparkSession that sets no tuning:

* ``local``: ``local[*]``, as the example project's ``local`` target;
* ``cluster``: a standalone cluster started for the run from pyspark's distribution (one
  master, ``--workers`` workers of ``--cores-per-worker`` cores, on 127.0.0.1; see
  ``consistent_stream_testing.cluster``), the driver joining it as the ``cluster`` target does.

In each: every model is built (``run_job(full_refresh=True)``), then ``--rounds`` TPC-H
refresh rounds (RF1 + RF2 + updates, 0.1 % of the orders), each followed by an incremental
run of every model, and every version a run commits is verified against batch evaluation
at its cut (``verify_target(version=...)``). Peak RSS of the driver's Python process and of
the driver's JVM (``VmHWM``, reset before each step) is printed per step; executors' memory
is not the driver's and is not counted.

``--one --master URL`` runs one variant against an existing master and prints its JSON
lines (the cluster test uses it at SF 0.01). Prints one JSON line per (scale factor,
variant, model, step) and a final summary line, on stdout.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
DATA = REPO / "benchmarks" / ".data" / "cluster_vs_local"
MODELS = ["q3_revenue_per_order", "customer_order_totals"]
"""Joins and aggregates: a three-way inner join + GROUP BY, a LEFT JOIN over a GROUP BY."""


def _session(master: str, warehouse: Path, driver_memory: str | None, executor_memory: str | None = None):
    import consistent_stream  # noqa: F401  (PYSPARK_PYTHON before the session)
    from consistent_stream.session import driver_conf
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    b = (with_delta(SparkSession.builder, master=master).appName("consistent-stream-cluster-vs-local")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC").config("spark.sql.warehouse.dir", str(warehouse)))
    if master.startswith("spark://"):
        for k, v in driver_conf(master).items():
            b = b.config(k, v)
    if driver_memory:
        b = b.config("spark.driver.memory", driver_memory)
    if executor_memory and master.startswith("spark://"):
        b = b.config("spark.executor.memory", executor_memory)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    return s


def run_variant(master: str, data: Path, root: Path, models: list[str], rounds: int,
                driver_memory: str | None, label: str, executor_memory: str | None = None,
                driver_rebuild_rows: int | None = None) -> list[dict]:
    """Build ``models`` over the TPC-H tables in ``data``, then ``rounds`` refresh rounds with
    an incremental run each; every committed version verified. One record per model and step.
    ``driver_rebuild_rows``: the models' config of that name (None: its default)."""
    from consistent_stream.delta import DeltaTableRef
    from consistent_stream.job import run_job
    from consistent_stream_testing.tpch.refresh import refresh_round
    from consistent_stream.verify import verify_target
    from helpers import EXAMPLE_MODELS, job_for, render_model, tpch_sources
    from refresh_vs_full import PeakRSS

    spark = _session(master, root / "warehouse", driver_memory, executor_memory)
    jobs = []
    for name in models:
        sql, config, used, _ = render_model(EXAMPLE_MODELS / f"{name}.sql")
        jobs.append(job_for(name, sql, tpch_sources(str(data), used), config["unique_key"], root, schema="bench"))
        if driver_rebuild_rows is not None:
            jobs[-1].driver_rebuild_rows = driver_rebuild_rows
    out = []

    def step(job, name: str, **kw) -> None:
        target = DeltaTableRef(job.target_path)
        before = target.latest_version() if target.exists() else -1
        with PeakRSS(spark) as rss:
            t0 = time.time()
            r = run_job(spark, job, **kw)
            secs = time.time() - t0
        target = DeltaTableRef(job.target_path)
        versions = list(range(before + 1, target.latest_version() + 1))
        bad = [v for v in versions if not verify_target(spark, job.target_path, version=v).ok]
        rec = {"variant": label, "master": master, "model": job.model, "step": name, "seconds": round(secs, 3),
               "batches": r["batches"], "changes_read": r.get("changes_read"), "versions": versions,
               "versions_verified": len(versions) - len(bad), "versions_wrong": bad,
               "strategies": [f"{m['strategy']}{': ' + m['reason'] if m['reason'] else ''}" for m in r["metrics"]],
               "driver_peak_rss_mb": rss.peak}
        out.append(rec)
        print(json.dumps(rec), flush=True)

    for job in jobs:
        step(job, "initial_build", full_refresh=True)
    for i in range(1, rounds + 1):
        refresh_round(data, i)
        for job in jobs:
            step(job, f"refresh_round_{i}")
    spark.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=["local", "cluster"], choices=["local", "cluster"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cores-per-worker", type=int, default=1)
    ap.add_argument("--memory-per-worker", default="4g")
    ap.add_argument("--driver-memory", default=None, help="spark.driver.memory for every variant (default: Spark's)")
    ap.add_argument("--executor-memory", default=None,
                    help="spark.executor.memory of the cluster's executors (default: Spark's, 1g)")
    ap.add_argument("--driver-rebuild-rows", type=int, default=None,
                    help="the models' driver_rebuild_rows config (0: every rebuild on the executors)")
    ap.add_argument("--one", action="store_true", help="one variant in this process: --master, --data, --root")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--label", default=None)
    ap.add_argument("--data", default=None)
    ap.add_argument("--root", default=None)
    a = ap.parse_args()
    if a.one:
        if a.data is None:  # a fresh copy of TPC-H at --sf under --root
            from consistent_stream_testing.tpch.generate import generate
            generate(a.sf[0], Path(a.root) / "data")
            a.data = str(Path(a.root) / "data")
        run_variant(a.master, Path(a.data), Path(a.root), a.models, a.rounds, a.driver_memory,
                    a.label or a.master, a.executor_memory, a.driver_rebuild_rows)
        return 0
    from consistent_stream_testing import cluster
    from consistent_stream_testing.tpch.generate import generate
    summary = []
    for sf in a.sf:
        pristine = DATA / f"sf{sf:g}" / "pristine"
        shutil.rmtree(DATA / f"sf{sf:g}", ignore_errors=True)
        generate(sf, pristine)
        for variant in a.variants:
            root = DATA / f"sf{sf:g}" / variant
            shutil.copytree(pristine, root / "data")
            c = None
            master = "local[*]"
            if variant == "cluster":
                c = cluster.start(workers=a.workers, cores_per_worker=a.cores_per_worker,
                                  memory_per_worker=a.memory_per_worker, directory=root / "cluster")
                master = c.master_url
            try:
                cmd = [sys.executable, __file__, "--one", "--master", master, "--label", variant, "--sf", str(sf),
                       "--data", str(root / "data"), "--root", str(root), "--rounds", str(a.rounds),
                       "--models", *a.models]
                if a.driver_memory:
                    cmd += ["--driver-memory", a.driver_memory]
                if a.executor_memory:
                    cmd += ["--executor-memory", a.executor_memory]
                if a.driver_rebuild_rows is not None:
                    cmd += ["--driver-rebuild-rows", str(a.driver_rebuild_rows)]
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
                for line in proc.stdout.splitlines():
                    if line.startswith("{"):
                        rec = {"sf": sf, **json.loads(line)}
                        print(json.dumps(rec), flush=True)
                        summary.append(rec)
                if proc.returncode != 0:
                    print(json.dumps({"sf": sf, "variant": variant, "error": f"exit code {proc.returncode}"}),
                          flush=True)
                if c is not None:
                    tasks = cluster.executor_tasks(root / "cluster")
                    print(json.dumps({"sf": sf, "variant": variant, "executor_tasks": tasks}), flush=True)
            finally:
                if c is not None:
                    cluster.stop(root / "cluster")
    print(json.dumps({"summary": [{k: r.get(k) for k in ("sf", "variant", "model", "step", "seconds",
                                                          "versions_verified", "versions_wrong",
                                                          "driver_peak_rss_mb")} for r in summary]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
