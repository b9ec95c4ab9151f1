"""Catch-up throughput over Debezium topics on Kafka: a consistent_stream model (``format:
kafka``, transaction-consistent cuts) against Flink SQL (its Kafka connector and the
``debezium-json`` format, ``benchmarks/flink_sql.py``), side by side in one run, the same query
over the same topics, both answers checked against PostgreSQL's:

    SELECT a.bid, COUNT(*) AS n, SUM(h.delta) AS delta_sum
    FROM pgbench_history h JOIN pgbench_accounts a ON h.aid = a.aid GROUP BY a.bid

Set-up (once per run): PostgreSQL 15 (``consistent_stream_testing.localpg``), Kafka + Kafka Connect +
Debezium (``consistent_stream_testing.kafka_stack``), ``pgbench -i -s SCALE`` with REPLICA IDENTITY FULL,
Debezium registered with transaction metadata, ``pgbench -c 4 -T SECONDS`` (unthrottled), and a
wait until Connect has written every change. Then, ``--runs`` times, each engine catches up from
the topics' start:

* consistent_stream: ``run_job`` of the model with ``trigger: available_now`` and a full
  refresh, in this process, whose Spark session (``local[*]``, no tuning) is already up:
  ``seconds`` from the call to its return (the Kafka reads, on the driver or through Spark
  by the sources' ``driver_read_records``, the transaction assembly, the first batch and its
  Delta commit); with ``--spark-reads`` once more with every read through Spark's Kafka source
  (``driver_read_records: 0``, the summary's ``spark_reads_*``);
  ``driver_peak_rss_mib`` (this Python process) and ``jvm_peak_rss_mib`` (Spark's JVM) are
  the peaks of resident memory during the call (the high-water marks reset at its start),
  ``python_workers_peak_rss_mib`` the peak of pyspark's Python workers' summed RSS (where the
  table as of a position is typed when it is computed from the topics, sampled every 0.25 s),
  ``driver_cpu_s``, ``jvm_cpu_s`` and ``python_workers_cpu_s`` the CPU seconds each spent in
  it (where the parsing runs), ``changes_on_disk_mib`` the reader's Parquet copies of the
  changes it dropped from memory at the end (``sources/chunk_files.py``, in ``TMPDIR``);
* Flink: ``flink_sql.py`` under ``.venv-flink`` (``benchmarks/flink_setup.sh``), bounded at the
  end offsets, ``seconds`` from job submission (which starts its local MiniCluster) to the end.

``events`` are the messages of the two data topics (both engines read them; consistent_stream
also reads the transaction topic, counted apart). Prints one JSON line per engine and run and a
summary with the ratio; appends them to ``benchmarks/results/kafka_catch_up.jsonl``.

    .venv/bin/python benchmarks/kafka_catch_up.py [--scale 1] [--seconds 30] [--runs 2] [--partitions 1] [--spark-reads]
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import flink_sql  # noqa: E402
from flink_sql import pgbench_topics  # noqa: E402

RESULTS = HERE / "results" / "kafka_catch_up.jsonl"
MODEL_SQL = """
select a.bid, count(*) as n, sum(h.delta) as delta_sum
from pg.pgbench_history h join pg.pgbench_accounts a on h.aid = a.aid
group by a.bid
"""
HISTORY_COLUMNS = {"tid": "int", "bid": "int", "aid": "int", "delta": "int", "mtime": "timestamp_ntz",
                   "filler": "string"}


def run_ours(spark, bootstrap: str, prefix: str, work: str, driver_read_records: int | None = None) -> dict:
    from consistent_stream.job import run_job
    from consistent_stream.sources.kafka import forget_readers
    from consistent_stream.spec import JobSpec
    from deltalake import DeltaTable
    forget_readers()   # every run reads the topics from their start, as a new process does
    gc.collect()       # and the readers' copies of their changes go with them
    sources = [{"source_name": "pg", "name": t, "relation": f"pg.{t}",
                "meta": {"format": "kafka", "bootstrap_servers": bootstrap, "topic": f"{prefix}.public.{t}",
                         **({"columns": HISTORY_COLUMNS} if t == "pgbench_history" else {}),
                         **({} if driver_read_records is None else {"driver_read_records": driver_read_records})}}
               for t in ("pgbench_accounts", "pgbench_history")]
    job = JobSpec.from_dbt(project_root=work, schema="bench", identifier="history_by_branch",
                           model_name="history_by_branch", sql=MODEL_SQL, sources=sources,
                           config={"unique_key": "bid", "location_root": os.path.join(work, "targets"),
                                   "trigger": "available_now"},
                           warehouse_dir=os.path.join(work, "wh"))
    from refresh_vs_full import PeakRSS
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    cpu0, jvm0 = _cpu_s(), flink_sql.cpu_seconds(jvm)
    t0 = time.perf_counter()
    with PeakRSS(spark, workers=True) as rss:
        run_job(spark, job, full_refresh=True)
    seconds = time.perf_counter() - t0
    cpu, jvm_cpu = _cpu_s() - cpu0, flink_sql.cpu_seconds(jvm) - jvm0
    copies = glob.glob(os.path.join(tempfile.gettempdir(), "consistent-stream-changes-*", "*.parquet"))
    rows = sorted([int(r["bid"]), int(r["n"]), int(r["delta_sum"])]
                  for r in DeltaTable(job.target_path).to_pyarrow_table().to_pylist())
    return {"engine": "consistent_stream", "seconds": round(seconds, 2), "rows": rows,
            "driver_read_records": "default" if driver_read_records is None else driver_read_records,
            "driver_peak_rss_mib": rss.peak["python"], "jvm_peak_rss_mib": rss.peak["jvm"],
            "python_workers_peak_rss_mib": rss.peak["workers"], "python_workers_cpu_s": rss.workers_cpu_s,
            "driver_cpu_s": round(cpu, 2), "jvm_cpu_s": round(jvm_cpu, 2),
            "changes_on_disk_mib": round(sum(os.path.getsize(f) for f in copies) / 2 ** 20, 1)}


def _cpu_s() -> float:
    """CPU seconds (user + system) of this Python process so far."""
    t = os.times()
    return t.user + t.system


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--partitions", type=int, default=1, help="partitions of the data topics")
    ap.add_argument("--driver-read-records", type=int, default=None,
                    help="the sources' driver_read_records for the first consistent_stream run (default: the default)")
    ap.add_argument("--spark-reads", action="store_true",
                    help="also run consistent_stream with every read on Spark's executors (driver_read_records: 0)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent / "python"))
    from consistent_stream.session import with_delta
    from pyspark.sql import SparkSession

    out = []
    with pgbench_topics(a.scale, a.seconds, a.clients, a.timeout, partitions=a.partitions) as env:
        stack, prefix, expected = env["stack"], env["prefix"], env["postgres_rows"]
        tx_topic = f"{prefix}.transaction"
        tx_messages = flink_sql.topic_messages(stack.bootstrap, [tx_topic])[tx_topic]
        events = sum(env["topic_messages"].values())
        spark = (with_delta(SparkSession.builder).master("local[*]").appName("kafka-catch-up")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
        common = {"scale": a.scale, "partitions": a.partitions, "pgbench_transactions": env["pgbench_transactions"],
                  "pgbench": env["pgbench_tps"],
                  "events": events, "transaction_topic_messages": tx_messages, "date": time.strftime("%Y-%m-%d")}
        work = tempfile.mkdtemp(prefix="cs-kafka-catch-up-")
        try:
            for run in range(a.runs):
                ours = [run_ours(spark, stack.bootstrap, prefix, os.path.join(work, f"ours{run}"),
                                 a.driver_read_records)]
                if a.spark_reads:
                    ours.append(run_ours(spark, stack.bootstrap, prefix, os.path.join(work, f"spark{run}"), 0))
                    ours[-1]["variant"] = "spark_reads"
                flink = flink_sql.run_flink_script(stack.bootstrap, prefix)
                for r in ours + [flink]:
                    rows = r.pop("rows")
                    r.update(common, run=run, rows_match=rows == expected, result_rows=len(rows),
                             events_per_s=round(events / r["seconds"]))
                    print(json.dumps(r))
                    out.append(r)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    ours_s = statistics.median(r["seconds"] for r in out if r["engine"] == "consistent_stream"
                               and "variant" not in r)
    flink_s = statistics.median(r["seconds"] for r in out if r["engine"] == "flink")
    summary = {"summary": True, **common, "driver_read_records": out[0]["driver_read_records"],
               "consistent_stream_median_s": ours_s, "flink_median_s": flink_s,
               "consistent_stream_events_per_s": round(events / ours_s),
               "flink_events_per_s": round(events / flink_s),
               "flink_s_over_consistent_stream_s": round(flink_s / ours_s, 2),
               "all_rows_match_postgres": all(r["rows_match"] for r in out)}
    if a.spark_reads:
        spark_s = statistics.median(r["seconds"] for r in out if r.get("variant") == "spark_reads")
        summary.update(spark_reads_median_s=spark_s, spark_reads_s_over_default_s=round(spark_s / ours_s, 2),
                       flink_s_over_spark_reads_s=round(flink_s / spark_s, 2))
    print(json.dumps(summary))
    out.append(summary)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
    return 0 if summary["all_rows_match_postgres"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
