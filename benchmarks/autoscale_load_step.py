"""Benchmark: a load step on a continuous model, at fixed parallelism and scaled from lag.

    .venv/bin/python benchmarks/autoscale_load_step.py [--rate 2000] [--step 10] [--phases 20 40 40]
        [--out benchmarks/results/autoscale_load_step] [--master spark://127.0.0.1:7077]
        [--local-engine spark] [--heavy]

On a standalone cluster (``consistent-stream-testing cluster start --workers 2``, ``--master``) the
parallelism is also the number of executors (1 core each); ``--local-engine spark`` runs the
batches' delta queries as Spark tasks there (with the default, DuckDB, they run on the driver
and executors do not matter); ``--heavy`` adds a CPU-heavy aggregate (string work per order
row) so that a batch's cost is mostly per-row work.

Sources (Delta, Change Data Feed): ``customers(cust, region)`` (20,000 rows) and ``orders(o_id,
cust, amount)`` (200,000 rows, then appended to every 0.5 s by a writer thread). The model
(Spark defaults, ``trigger='processing_time:1'``):

    select c.region, count(*) as n, sum(o.amount) as total
    from src.orders o join src.customers c on c.cust = o.cust group by c.region

``recompute_threshold`` is out of reach: at 10x a batch would pass the default 0.25 of the
sources and be recomputed from snapshots, a cost that follows the tables, not the change (and
a slow batch makes the next one larger still).

Load: ``--rate`` order rows per second for the first phase, ``--step`` times that for the
second, ``--rate`` again for the third (``--phases`` seconds each). Two variants in one
process, one after the other, each with its own tables and the same schedule:

* ``fixed``: ``autoscale`` with min = max = 1 (the policy runs and logs, the parallelism stays);
* ``scaled``: ``autoscale`` from 1 to the session's cores, ``lag_threshold_s`` 2,
  ``stable_s`` 5, ``window`` 2, ``scale_down_ratio`` 1.5, ``safety_factor`` 2 (short, for a
  benchmark of minutes; with the seed's factor 3 and ratio 6 a 2-core machine never scales
  down: ``target = ceil(utilization x parallelism x safety_factor)``).

Per batch: time since the variant started, change rows, seconds, parallelism, lag (rows and
seconds, measured by the autoscaler after the batch), and freshness (target commit time minus
the commit time of the cut's newest source commit). Prints one JSON line with each variant's
batches and summary (peak lag, seconds from the end of the step until the lag is back under
the threshold, parallelism reached) and writes ``<out>.json`` and ``<out>.png`` (lag,
parallelism and freshness over time, both variants). Every variant's target is verified
against batch evaluation at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

SQL = """
select c.region, count(*) as n, sum(o.amount) as total
from src.orders o join src.customers c on c.cust = o.cust
group by c.region
"""
HEAVY_SQL = """
select c.region, count(*) as n, sum(o.amount) as total,
       sum(length(regexp_replace(repeat(cast(o.o_id as string), 400), '[13579]', 'ab'))) as digits
from src.orders o join src.customers c on c.cust = o.cust
group by c.region
"""
CUSTOMERS = 20_000
INITIAL_ORDERS = 200_000
THRESHOLD_S = 2.0
TRIGGER_S = 1.0


def run_variant(spark, root: Path, name: str, autoscale: dict, rate: int, step: int, phases: list[float],
                local_engine: str = "duckdb", sql: str = SQL) -> dict:
    import pyarrow as pa
    from deltalake import write_deltalake

    from consistent_stream.delta import DeltaTableRef
    from consistent_stream.job import run_job
    from consistent_stream.runtime import BatchMeta
    from consistent_stream.spec import JobSpec
    from consistent_stream.verify import verify_target
    from helpers import job_for

    cdf = {"delta.enableChangeDataFeed": "true"}
    src = root / name / "src"
    write_deltalake(str(src / "customers"),
                    pa.table({"cust": pa.array(range(CUSTOMERS), pa.int64()),
                              "region": pa.array([i % 25 for i in range(CUSTOMERS)], pa.int64())}),
                    configuration=cdf)
    seed = range(-INITIAL_ORDERS, 0)   # orders before the run: a step's batches stay below recompute_threshold
    write_deltalake(str(src / "orders"),
                    pa.table({"o_id": pa.array(seed, pa.int64()),
                              "cust": pa.array([(-i * 7919) % CUSTOMERS for i in seed], pa.int64()),
                              "amount": pa.array([-i % 100 for i in seed], pa.int64())}),
                    configuration=cdf)
    sources = [{"source_name": "src", "name": n, "relation": f"src.{n}",
                "meta": {"location": str(src / n), "primary_key": k}}
               for n, k in (("customers", ["cust"]), ("orders", ["o_id"]))]
    job = job_for(name, sql, sources, ["region"], root / name)
    # the step's batches stay incremental (a recomputed batch costs the tables, not the change)
    job = JobSpec(**{**job.__dict__, "local_engine": local_engine, "recompute_threshold": 1e9})
    run_job(spark, job, full_refresh=True)

    stop = threading.Event()
    t0 = time.time()
    step_window = (phases[0], phases[0] + phases[1])

    def writer():
        next_id, k = 1, 0
        while not stop.is_set():
            t = time.time() - t0
            if t >= sum(phases):
                return
            per_s = rate * (step if step_window[0] <= t < step_window[1] else 1)
            n = max(1, int(per_s * 0.5))
            ids = list(range(next_id, next_id + n))
            next_id += n
            write_deltalake(str(src / "orders"), pa.table({
                "o_id": pa.array(ids, pa.int64()), "cust": pa.array([(i * 7919) % CUSTOMERS for i in ids], pa.int64()),
                "amount": pa.array([i % 100 for i in ids], pa.int64())}), mode="append")
            k += 1
            time.sleep(max(0.0, t0 + k * 0.5 - time.time()))
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    continuous = JobSpec(**{**job.__dict__, "trigger": f"processing_time:{TRIGGER_S}", "autoscale": autoscale})
    summary = run_job(spark, continuous, timeout_s=sum(phases) + 20)
    stop.set()
    w.join()

    commits = {c.version: c for c in DeltaTableRef(job.target_path).history()}
    fresh = {}
    for c in commits.values():
        meta = BatchMeta.from_commit(c)
        if meta is not None:
            fresh[meta.batch_id] = meta.freshness_s(c.timestamp_ms)
    batches = [{"t": round(d["t"] - t0, 2), "batch_id": d["batch_id"], "rows": d["rows"], "seconds": d["seconds"],
                "parallelism": d["previous"], "next_parallelism": d["parallelism"], "action": d["action"],
                "lag_rows": d["lag_rows"], "lag_s": d["lag_s"], "freshness_s": fresh.get(d["batch_id"]),
                "reason": d["reason"], "target": d["inputs"].get("target")}
               for d in summary["autoscale"]]
    end_of_step = step_window[1]
    recovered = next((b["t"] - end_of_step for b in batches if b["t"] >= end_of_step and b["lag_s"] < THRESHOLD_S),
                     None)
    ok = verify_target(spark, job.target_path).ok
    return {"autoscale": autoscale, "batches": batches, "peak_lag_s": max((b["lag_s"] for b in batches), default=0),
            "peak_lag_rows": max((b["lag_rows"] for b in batches), default=0),
            "recovered_s_after_step": None if recovered is None else round(recovered, 2),
            "max_parallelism_used": max((b["next_parallelism"] for b in batches), default=1),
            "decisions": [{k: d[k] for k in ("t", "batch_id", "action", "previous", "parallelism", "reason", "inputs")}
                          for d in summary["autoscale"] if d["action"] != "hold"],
            "verified": ok}


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for name, style in (("fixed", "-"), ("scaled", "-")):
        bs = result[name]["batches"]
        t = [b["t"] for b in bs]
        axes[0].plot(t, [b["lag_s"] for b in bs], style, label=name)
        axes[1].step(t, [b["next_parallelism"] for b in bs], where="post", label=name)
        axes[2].plot(t, [b["freshness_s"] for b in bs], style, label=name)
    p = result["phases"]
    for ax in axes:
        ax.axvspan(p[0], p[0] + p[1], color="orange", alpha=0.15)
        ax.grid(alpha=0.3)
    axes[0].axhline(THRESHOLD_S, color="grey", linestyle=":", label="lag_threshold_s")
    axes[0].set_ylabel("lag (s)")
    axes[1].set_ylabel("parallelism")
    axes[2].set_ylabel("freshness (s)")
    axes[2].set_xlabel(f"seconds (shaded: {result['step']}x the change rate)")
    axes[0].legend()
    fig.suptitle("Load step on a continuous model: fixed parallelism vs scaled from lag\n"
                 f"({result.get('model', 'join_aggregate')} model, {result.get('master', 'local[2]')}, "
                 f"delta queries in {result.get('local_engine', 'duckdb')})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=2000, help="order rows per second outside the step")
    ap.add_argument("--step", type=int, default=10, help="the step's rate, as a multiple of --rate")
    ap.add_argument("--phases", type=float, nargs=3, default=[20, 40, 40], help="seconds before, in, after the step")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "autoscale_load_step"))
    ap.add_argument("--master", default=os.environ.get("CONSISTENT_STREAM_MASTER", "local[2]"),
                    help="local[n] (default local[2]) or a standalone cluster's spark://127.0.0.1:7077")
    ap.add_argument("--local-engine", choices=("duckdb", "spark"), default="duckdb",
                    help="where the batches' delta queries run: spark runs them as tasks (on executors)")
    ap.add_argument("--heavy", action="store_true", help="the CPU-heavy model (HEAVY_SQL)")
    a = ap.parse_args()
    os.environ["CONSISTENT_STREAM_MASTER"] = a.master
    from consistent_stream.autoscale import session_parallelism
    from consistent_stream.cli import local_spark
    spark = local_spark()
    cores = session_parallelism(spark)
    common = {"lag_threshold_s": THRESHOLD_S, "stable_s": 5, "window": 2, "scale_down_ratio": 1.5,
              "safety_factor": 2}
    result = {"rate": a.rate, "step": a.step, "phases": a.phases, "cores": cores, "master": a.master,
              "local_engine": a.local_engine, "model": "heavy" if a.heavy else "join_aggregate"}
    with tempfile.TemporaryDirectory(prefix="cs-autoscale-") as d:
        for name, bounds in (("fixed", {"min_parallelism": 1, "max_parallelism": 1}),
                             ("scaled", {"min_parallelism": 1, "max_parallelism": cores})):
            result[name] = run_variant(spark, Path(d), name, {**common, **bounds}, a.rate, a.step, a.phases,
                                       a.local_engine, HEAVY_SQL if a.heavy else SQL)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    plot(result, a.out + ".png")
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "batches"} if isinstance(v, dict) else v)
                      for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
