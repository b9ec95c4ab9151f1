"""Benchmark: catching up a backlog of captured PostgreSQL changes (a join + aggregate model).

    .venv/bin/python benchmarks/pgbench_catchup.py [--transactions 205000] [--max-batch-rows 50000]

A real PostgreSQL 15 (its own initdb, tests/postgres_server.py), pgbench at scale 1 (100,000
accounts). ``consistent-stream capture postgres`` captures ``pgbench_accounts`` and
``pgbench_history``: the snapshot (100,000 rows), then ``--transactions`` TPC-B transactions
(each one account update and one history insert). The model (Spark defaults, no tuning):

    select a.bid, count(*) as n, sum(h.delta) as moved, sum(a.abalance) as balance
    from pg.pgbench_history h join pg.pgbench_accounts a on a.aid = h.aid group by a.bid

Three ways through the same events, each timed as model time (``run_job``), with its batches
and peak RSS (driver Python process and Spark JVM), and verified against batch evaluation:

* ``backlog``: the model was built at the snapshot before pgbench ran; one ``dbt run`` then
  catches up every transaction, in batches of at most ``--max-batch-rows`` change events
  (``recompute_threshold`` set high, so that it stays incremental). *Cold*: no process has
  read these event files before (the landing index, ``_index/``, is deleted first), so the
  run parses every JSON line (in worker processes, one per core) and indexes them;
* ``backlog_warm``: the same catch-up by a second model built at the same snapshot, after the
  first run indexed the files (a scheduled ``dbt run`` reading files an earlier run read);
* ``from_scratch``: a new model reads snapshot and all transactions at once (a rebuild).

Prints one JSON line with events, events/s of each way, batches, peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

SQL = """
select a.bid, count(*) as n, sum(h.delta) as moved, sum(a.abalance) as balance
from pg.pgbench_history h join pg.pgbench_accounts a on a.aid = h.aid
group by a.bid
"""
TABLES = ("pgbench_accounts", "pgbench_history")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transactions", type=int, default=205_000)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-batch-rows", type=int, default=50_000)
    ap.add_argument("--profile", action="store_true",
                    help="print the backlog run's Python profile (main thread, cumulative) on stderr")
    a = ap.parse_args()
    import consistent_stream  # noqa: F401
    from consistent_stream.cli import local_spark
    from consistent_stream.job import run_job
    from consistent_stream.sources.debezium.source import forget_reader, reader_for
    from consistent_stream.sources.landing_index import INDEX_DIR
    from consistent_stream.spec import JobSpec
    from consistent_stream.verify import verify_target
    from postgres_server import Database, start_capture, stop_capture, wait_for
    from refresh_vs_full import PeakRSS

    spark = local_spark()
    with tempfile.TemporaryDirectory(prefix="cs-catchup-") as d:
        tmp = Path(d)
        db = Database()
        srv = db.server
        subprocess.run([srv.bin("pgbench"), "-i", "-s", "1", "-q", "-h", "127.0.0.1", "-p", str(srv.port),
                        "-U", "postgres", db.name], check=True, capture_output=True)
        landing = str(tmp / "landing")
        cap = start_capture(db.dsn, ",".join(f"public.{t}" for t in TABLES), "s_catchup", landing,
                            "--set-replica-identity-full", log_path=str(tmp / "capture.log"))
        try:
            wait_for(lambda: json.load(open(f"{landing}/_capture.json")).get("snapshot_done"), what="the snapshot")
            sources = [{"source_name": "pg", "name": t, "relation": f"pg.{t}",
                        "meta": {"format": "debezium", "location": landing, "table": f"public.{t}"}} for t in TABLES]

            def job(name: str, **config) -> JobSpec:
                return JobSpec.from_dbt(project_root=str(tmp), schema="bench", identifier=name, model_name=name,
                                        sql=SQL, sources=sources, warehouse_dir=str(tmp / "wh"),
                                        config={"unique_key": "bid", "location_root": str(tmp / "targets"), **config})
            backlog = job("backlog", max_batch_rows=a.max_batch_rows, recompute_threshold=1000)
            backlog_warm = job("backlog_warm", max_batch_rows=a.max_batch_rows, recompute_threshold=1000)
            run_job(spark, backlog, full_refresh=True)  # built at the snapshot
            run_job(spark, backlog_warm, full_refresh=True)
            per_client = max(1, a.transactions // a.clients)
            t0 = time.time()
            subprocess.run([srv.bin("pgbench"), "-c", str(a.clients), "-j", "2", "-t", str(per_client), "-n",
                            "-h", "127.0.0.1", "-p", str(srv.port), "-U", "postgres", db.name],
                           check=True, capture_output=True)
            pgbench_s = time.time() - t0
            n_history = db.execute("select count(*) from pgbench_history")[0][0]
            forget_reader(landing)
            wait_for(lambda: reader_for(landing).changes("public.pgbench_history", -1,
                                                         reader_for(landing).latest_position(), ["tid"]).num_rows
                     == n_history, timeout=600, what="capture to land every transaction")
        finally:
            stop_capture(cap)
        forget_reader(landing)  # the runs read the landing directory themselves, as a new process would
        r = reader_for(landing)
        txs = [t for t in r.transactions() if not t.snapshot]
        snapshot_rows = sum(t.counts.get("public.pgbench_accounts", 0) for t in r.transactions() if t.snapshot)
        changes = sum(sum(t.counts.get(x, 0) for x in ("public.pgbench_accounts", "public.pgbench_history"))
                      for t in txs)
        forget_reader(landing)
        shutil.rmtree(os.path.join(landing, INDEX_DIR))  # cold: as if no process had read these files
        import cProfile
        prof = cProfile.Profile() if a.profile else None
        with PeakRSS(spark) as rss_backlog:
            if prof:
                prof.enable()
            s_backlog = run_job(spark, backlog)
            if prof:
                prof.disable()
        if prof:
            import pstats
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
        ok_backlog = verify_target(spark, backlog.target_path).ok
        index_cold = dict(reader_for(landing).index_stats)
        forget_reader(landing)
        with PeakRSS(spark) as rss_warm:
            s_warm = run_job(spark, backlog_warm)
        ok_warm = verify_target(spark, backlog_warm.target_path).ok
        index_warm = dict(reader_for(landing).index_stats)
        forget_reader(landing)
        scratch = job("from_scratch")
        with PeakRSS(spark) as rss_scratch:
            s_scratch = run_job(spark, scratch, full_refresh=True)
        ok_scratch = verify_target(spark, scratch.target_path).ok
    print(json.dumps({
        "transactions": len(txs), "snapshot_rows": snapshot_rows, "change_events": changes,
        "events": snapshot_rows + changes, "pgbench_s": round(pgbench_s, 1),
        "backlog": {"events": changes, "seconds": s_backlog["seconds"], "batches": s_backlog["batches"],
                    "events_per_s": round(changes / s_backlog["seconds"]),
                    "max_batch_rows": a.max_batch_rows, "strategies": s_backlog["strategies"],
                    "spark_jobs": s_backlog["totals"]["spark_jobs"], "peak_rss_mb": rss_backlog.peak,
                    "per_batch": [{k: m.get(k) for k in ("seconds", "changes_read", "spark_jobs", "state_rows_read",
                                                         "phases")} for m in s_backlog["metrics"]],
                    "landing_index": index_cold, "verified": ok_backlog},
        "backlog_warm": {"events": changes, "seconds": s_warm["seconds"], "batches": s_warm["batches"],
                         "events_per_s": round(changes / s_warm["seconds"]), "peak_rss_mb": rss_warm.peak,
                         "landing_index": index_warm, "verified": ok_warm},
        "from_scratch": {"events": snapshot_rows + changes, "seconds": s_scratch["seconds"],
                         "batches": s_scratch["batches"],
                         "events_per_s": round((snapshot_rows + changes) / s_scratch["seconds"]),
                         "peak_rss_mb": rss_scratch.peak, "verified": ok_scratch},
    }))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CONSISTENT_STREAM_MASTER", "local[2]")
    sys.exit(main())
