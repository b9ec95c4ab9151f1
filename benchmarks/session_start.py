"""Benchmark: what delta-spark's, the S3A connector's and Kafka's jars, and a Hive metastore,
add to a session's start.

    .venv/bin/python benchmarks/session_start.py [--runs 5]

Starts a fresh Python process per sample, alternating six variants, each building a local
SparkSession at Spark's defaults (``local[*]``, no tuning), running its first query
(``SELECT 1``, answered on the driver), its first catalog statement (``SHOW DATABASES``,
dbt's first) and its first Spark task (a ``sum`` over ``range(10)``, where a local executor
fetches the session's ``spark.jars``), as a `dbt run` or the ``consistent-stream`` command does
at its start:

* ``plain``: the builder alone;
* ``delta``: the builder with delta-spark's cached jars (less those Spark ships) on the
  driver's class path, its SQL extension and catalog, and nothing else;
* ``all``: the builder with ``consistent_stream.session.delta_confs()``, what every session
  of this project starts with: delta-spark's as above plus the S3A connector's and Spark's
  Kafka source's jars;
* ``all_without_cds``: ``all`` without the driver's class-data sharing archive
  (``CONSISTENT_STREAM_CDS=off``; ``all`` maps it when ``make .venv`` built it);
* ``all_spark_jars``: ``all`` as sessions were built before 2026-11-27: every cached jar
  (Spark's own artifacts included) in ``spark.jars``, which the local executor copies into the
  session's ``userFiles`` directory at its first task, and no class-data sharing archive;
* ``hive``: ``all`` with Hive support and an embedded Derby metastore, as the example
  project's profile and dbt-spark's ``session`` method build it (so that a later `dbt test`
  process sees the tables a `dbt run` registered); the metastore is made by a first session
  that is not counted, and every sample opens it again, as each `dbt run` of a project does.

Prints one JSON line per sample (variant, seconds from the builder to the first query's
result, seconds of the first catalog statement after it, of the first task after that,
seconds to import pyspark before them) and a summary line with the medians of start +
catalog + first task and their differences
(``delta_adds_s``: delta against plain; ``s3a_kafka_add_s``: all against delta;
``hive_adds_s``: hive against all; ``cds_saves_s``: all_without_cds against all;
``class_path_saves_s``: all_spark_jars against all_without_cds).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
t0 = time.time()
from pyspark.sql import SparkSession
t1 = time.time()
b = SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false")
if sys.argv[1] in ("delta", "all_spark_jars"):
    import os
    from consistent_stream import session
    if sys.argv[1] == "delta":
        shipped = set(session.spark_ships(session.delta_jars()))
        b = b.config("spark.driver.extraClassPath",
                     os.pathsep.join(j for j in session.delta_jars() if j not in shipped))
    else:
        b = b.config("spark.jars", ",".join(session.delta_jars() + session.s3a_jars() + session.kafka_jars()))
    b = (b.config("spark.sql.extensions", session.DELTA_EXTENSION)
         .config("spark.sql.catalog.spark_catalog", session.DELTA_CATALOG))
elif sys.argv[1] in ("all", "all_without_cds", "hive"):
    import os
    from consistent_stream.session import with_delta
    if sys.argv[1] == "all_without_cds":
        os.environ["CONSISTENT_STREAM_CDS"] = "off"
    profile = {}
    if sys.argv[1] == "hive":   # as the example profile sets it; with_delta appends to its Java options
        d = sys.argv[2]
        profile = {"spark.sql.warehouse.dir": d + "/warehouse",
                   "spark.hadoop.javax.jdo.option.ConnectionURL":
                       f"jdbc:derby:;databaseName={d}/metastore_db;create=true",
                   "spark.driver.extraJavaOptions": f"-Dderby.stream.error.file={d}/derby.log"}
        b = b.enableHiveSupport()
    for k, v in profile.items():
        b = b.config(k, v)
    b = with_delta(b, profile)
s = b.getOrCreate()
s.sql("SELECT 1").collect()
t2 = time.time()
s.sql("SHOW DATABASES").collect()
t3 = time.time()
s.range(10).selectExpr("sum(id)").collect()
t4 = time.time()
print(json.dumps({"variant": sys.argv[1], "import_s": round(t1 - t0, 3), "start_s": round(t2 - t1, 3),
                  "catalog_s": round(t3 - t2, 3), "first_task_s": round(t4 - t3, 3)}))
s.stop()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    samples: dict[str, list[float]] = {"plain": [], "delta": [], "all": [], "all_without_cds": [], "all_spark_jars": [],
                                       "hive": []}
    metastore = tempfile.mkdtemp(prefix="cs-session-start-")
    subprocess.run([sys.executable, "-c", CHILD, "hive", metastore], capture_output=True, text=True, check=True)
    for _ in range(args.runs):
        for variant in samples:
            out = subprocess.run([sys.executable, "-c", CHILD, variant, metastore], capture_output=True, text=True,
                                 check=True)
            rec = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
            samples[variant].append(rec["start_s"] + rec["catalog_s"] + rec["first_task_s"])
            print(json.dumps(rec), flush=True)
    med = {k: round(statistics.median(v), 3) for k, v in samples.items()}
    print(json.dumps({"summary": {"median_start_catalog_first_task_s": med,
                                  "delta_adds_s": round(med["delta"] - med["plain"], 3),
                                  "s3a_kafka_add_s": round(med["all"] - med["delta"], 3),
                                  "hive_adds_s": round(med["hive"] - med["all"], 3),
                                  "cds_saves_s": round(med["all_without_cds"] - med["all"], 3),
                                  "class_path_saves_s": round(med["all_spark_jars"] - med["all_without_cds"], 3),
                                  "runs": args.runs}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
