"""Benchmark: the example models' small batches with every location on local disk against
every location on an S3 API server on loopback (s3proxy, :mod:`consistent_stream_testing.s3server`),
in one process and one untuned Spark session, and the object store requests each batch makes.

    .venv/bin/python benchmarks/object_store.py [--sf 0.1] [--batches 5] [--models ...] [--latency-ms N]
                                                [--fresh] [--trace FILE]

TPC-H is generated once on local disk and copied to the store (the same Delta tables on both
sides); every example model is built on each side, then ``--batches`` small refresh rounds
(140 orders each, at most 2,000 changed source rows per model) are applied locally and copied
to the store, each followed by an incremental run of every model on both sides. The source
tables get a Delta checkpoint every 10 commits, as Delta Spark writes them (delta-rs, which
generates them, writes none by default; without one, every open of a source reads its whole
log). Per model:
the median run and batch seconds on each side and their ratio (S3 / local), and the store's
requests per incremental run, by kind (GET, PUT, LIST, HEAD, DELETE, POST) and by what they
touched (Delta logs, data files, the checkpoint's files, the lock, other), from the server's
request log. With ``--latency-ms N`` every client reaches the server through a proxy that
delays each byte by N ms in each direction (``benchmarks/latency_proxy.py``: a request and
its answer take at least 2N ms, as S3 10-30 ms away does). The source copy's own requests are
not counted (they happen between runs). Both sides are verified against batch evaluation at
the end. Beside the server's count, each run's own (``object_store_requests`` of its summary:
the requests counted by the clients this package drives, :data:`consistent_stream.location.
REQUESTS`) and how far the two are apart at most, as a fraction of the server's.

``--fresh``: each S3 run starts from what a new process holds, as each ``dbt run`` is one:
the data files earlier runs of this process wrote or read are forgotten first
(``delta.files.HELD`` and ``HELD_KEYS`` cleared), so a run reads them from the store, or from
the data files this machine keeps on disk (``local_cache.DATA_FILES``; set
``CONSISTENT_STREAM_DATA_CACHE_MB=0`` to measure without them). Without it the runs share one
process's memory, as a continuous model's batches do.

Prints one JSON line per model and a summary line, on stdout.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
DATA = REPO / "benchmarks" / ".data" / "object_store"
BUCKET = "cs-bench"
SMALL_ROUND_ORDERS = 140


def _sync(local: Path, remote: str, sent: set) -> int:
    """Upload the files under ``local`` not uploaded yet (Delta tables only grow: new log
    entries and data files) to ``remote``; returns how many."""
    from consistent_stream import storage
    n = 0
    for d, _, files in os.walk(local):
        for f in files:
            p = os.path.join(d, f)
            rel = os.path.relpath(p, local)
            if rel in sent or f.endswith(".crc"):
                continue
            storage.replace_bytes(f"{remote}/{rel}", Path(p).read_bytes())
            sent.add(rel)
            n += 1
    return n


def _checkpoint_sources(root: Path) -> None:
    """A Delta checkpoint of each source table whose newest is 10 or more commits old (Delta
    Spark's ``checkpointInterval``)."""
    from deltalake import DeltaTable
    for d in sorted(p for p in root.iterdir() if (p / "_delta_log").is_dir()):
        dt = DeltaTable(str(d))
        cps = [int(n.name[:20]) for n in (d / "_delta_log").glob("*.checkpoint.parquet")]
        if dt.version() - max(cps, default=0) >= 10:
            dt.create_checkpoint()


def _what(path: str) -> str:
    from urllib.parse import unquote
    path = unquote(path)
    if "_delta_log/" in path:
        return "source_delta_log" if path.split("?")[0].startswith(f"{BUCKET}/data/") or "prefix=data/" in path \
            else "delta_log"
    if "/_consistent_stream/" in path:
        return "checkpoint_files"
    if path.split("?")[0].endswith(".lock") or ".lock." in path:
        return "lock"
    if ".parquet" in path:
        return "data_files"
    return "other"


def _requests(server, since: int) -> dict:
    by_kind = server.requests(since)
    by_what = collections.Counter(_what(p) for _, p in server.request_log(since))
    return {"total": sum(by_kind.values()), "by_kind": dict(by_kind), "by_what": dict(by_what)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sf", type=float, default=0.1)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="delay each direction of every request by this many ms (a proxy in front of the server)")
    ap.add_argument("--fresh", action="store_true",
                    help="forget the data files this process holds before each S3 run, as a new dbt run process")
    ap.add_argument("--trace", type=Path,
                    help="write every S3 run's requests, in order, to this file (one JSON line a run)")
    args = ap.parse_args()

    import consistent_stream  # noqa: F401
    from consistent_stream import local_cache, location
    from consistent_stream.job import run_job
    from consistent_stream.spec import JobSpec
    from consistent_stream.verify import verify_target
    from consistent_stream_testing import s3server
    from consistent_stream_testing.tpch.generate import generate
    from consistent_stream_testing.tpch.refresh import refresh_round
    from consistent_stream_testing.apart import in_child
    from helpers import EXAMPLE_MODELS, render_model, tpch_sources

    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    server = s3server.start(Path(tempfile.mkdtemp(prefix="cs-bench-s3-")), buckets=(BUCKET,), request_log=True)
    env = server.env()
    proxy = None
    if args.latency_ms > 0:
        from latency_proxy import ProxyProcess
        host, port = env["AWS_ENDPOINT_URL"].split("//", 1)[1].rsplit(":", 1)
        proxy = ProxyProcess(host, int(port), args.latency_ms / 1000.0).start()
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
    os.environ.update(env)
    location.reset()
    try:
        from pyspark.sql import SparkSession
        from consistent_stream.session import with_delta
        spark = (with_delta(SparkSession.builder).master("local[*]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.warehouse.dir", str(DATA / "warehouse")).getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        local_data = DATA / "data"
        in_child(generate, args.sf, local_data)
        remote_data = f"s3://{BUCKET}/data"
        sent: set = set()
        _sync(local_data, remote_data, sent)
        # the example models over sources only, as refresh_vs_full.py takes them
        names = args.models or sorted(p.stem for p in EXAMPLE_MODELS.glob("*.sql")
                                      if not render_model(p)[3] and render_model(p)[1].get("materialized") != "view")
        sides = {"local": (str(local_data), str(DATA / "targets")), "s3": (remote_data, f"s3://{BUCKET}/targets")}
        jobs: dict[str, dict] = {side: {} for side in sides}
        for name in names:
            sql, config, used, refs = render_model(EXAMPLE_MODELS / f"{name}.sql")
            if refs:
                continue   # a ref() chain's downstream: its upstream's side would have to be built first
            for side, (data, targets) in sides.items():
                jobs[side][name] = JobSpec.from_dbt(
                    project_root=str(DATA), schema=f"bench_{side}", identifier=name, model_name=name, sql=sql,
                    sources=tpch_sources(data, used), config={"unique_key": config["unique_key"],
                                                              "location_root": targets},
                    warehouse_dir=str(DATA / "warehouse"))
        for side in sides:
            for job in jobs[side].values():
                run_job(spark, job, full_refresh=True)
        samples = {(side, m): [] for side in sides for m in jobs["local"]}
        for i in range(args.batches):
            in_child(refresh_round, local_data, 100 + i, size=SMALL_ROUND_ORDERS)
            _checkpoint_sources(local_data)
            _sync(local_data, remote_data, sent)
            for m in jobs["local"]:
                for side in sides:
                    if side == "s3" and args.fresh:
                        from consistent_stream.delta.files import HELD, HELD_KEYS
                        HELD.clear()
                        HELD_KEYS.clear()
                    since = server.log_offset()
                    t0 = time.time()
                    s = run_job(spark, jobs[side][m])
                    wall = time.time() - t0
                    time.sleep(0.2)   # the log's last lines
                    req = _requests(server, since) if side == "s3" else None
                    if req is not None and args.trace:
                        with args.trace.open("a") as f:
                            f.write(json.dumps({"model": m, "batch": i, "requests": server.request_log(since)}) + "\n")
                    samples[(side, m)].append({"run_s": wall, "batch_s": s["metrics"][0]["seconds"] if s["metrics"]
                                               else None, "batches": s["batches"], "requests": req,
                                               "client_requests": s["object_store_requests"],
                                               "changes_read": s["changes_read"]})
        summary = []
        for m in jobs["local"]:
            loc, s3 = samples[("local", m)], samples[("s3", m)]
            med = {side: round(statistics.median(x["run_s"] for x in samples[(side, m)]), 3) for side in sides}
            reqs = [x["requests"] for x in s3]
            rec = {"sf": args.sf, "model": m, "batches": args.batches, "latency_ms": args.latency_ms,
                   "fresh": args.fresh, "data_cache_mb": local_cache.data_cache_bytes() >> 20,
                   "local_run_s_median": med["local"], "s3_run_s_median": med["s3"],
                   "s3_run_s": [round(x["run_s"], 3) for x in s3],
                   "ratio_s3_to_local": round(med["s3"] / med["local"], 2),
                   "local_batch_s_median": round(statistics.median(x["batch_s"] or 0 for x in loc), 3),
                   "s3_batch_s_median": round(statistics.median(x["batch_s"] or 0 for x in s3), 3),
                   "changed_rows_max": max(x["changes_read"] for x in s3),
                   "s3_requests_per_run_median": statistics.median(r["total"] for r in reqs),
                   "s3_requests_per_run": [r["total"] for r in reqs],
                   "s3_requests_by_kind_last": reqs[-1]["by_kind"], "s3_requests_by_what_last": reqs[-1]["by_what"],
                   "client_requests_per_run": [x["client_requests"]["total"] for x in s3],
                   "client_requests_by_what_last": s3[-1]["client_requests"]["by_what"],
                   "delta_rs_opens_per_run": [x["client_requests"]["delta_rs_opens"] for x in s3],
                   "client_to_server_max_deviation": round(max(
                       abs(x["client_requests"]["total"] - x["requests"]["total"]) / max(1, x["requests"]["total"])
                       for x in s3), 3),
                   "verified_local": verify_target(spark, jobs["local"][m].target_path).ok,
                   "verified_s3": verify_target(spark, jobs["s3"][m].target_path).ok}
            summary.append(rec)
            print(json.dumps(rec), flush=True)
        print(json.dumps({"summary": True, "sf": args.sf, "latency_ms": args.latency_ms, "fresh": args.fresh,
                          "data_cache_mb": local_cache.data_cache_bytes() >> 20, "models": len(summary),
                          "ratio_s3_to_local_median": statistics.median(r["ratio_s3_to_local"] for r in summary),
                          "s3_requests_per_run_median": statistics.median(r["s3_requests_per_run_median"]
                                                                          for r in summary),
                          "all_verified": all(r["verified_local"] and r["verified_s3"] for r in summary)}))
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
