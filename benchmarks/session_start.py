"""Benchmark: what delta-spark's, the S3A connector's and Kafka's jars, and a Hive metastore,
add to a session's start.

    .venv/bin/python benchmarks/session_start.py [--runs 5]

Starts a fresh Python process per sample, alternating four variants, each building a local
SparkSession at Spark's defaults (``local[*]``, no tuning), running its first query
(``SELECT 1``) and then its first catalog statement (``SHOW DATABASES``, dbt's first), as a
`dbt run` or the ``consistent-stream`` command does at its start:

* ``plain``: the builder alone;
* ``delta``: the builder with delta-spark's cached jars by path, its SQL extension and
  catalog, and nothing else;
* ``all``: the builder with ``consistent_stream.session.delta_confs()``, what every session
  of this project starts with: delta-spark's as above plus the S3A connector's and Spark's
  Kafka source's jars;
* ``hive``: ``all`` with Hive support and an embedded Derby metastore, as the example
  project's profile and dbt-spark's ``session`` method build it (so that a later `dbt test`
  process sees the tables a `dbt run` registered); the metastore is made by a first session
  that is not counted, and every sample opens it again, as each `dbt run` of a project does.

Prints one JSON line per sample (variant, seconds from the builder to the first query's
result, seconds of the first catalog statement after it, seconds to import pyspark before
them) and a summary line with the medians of start + catalog and their differences
(``delta_adds_s``: delta against plain; ``s3a_kafka_add_s``: all against delta;
``hive_adds_s``: hive against all).
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
if sys.argv[1] == "delta":
    from consistent_stream import session
    b = (b.config("spark.jars", ",".join(session.delta_jars()))
         .config("spark.sql.extensions", session.DELTA_EXTENSION)
         .config("spark.sql.catalog.spark_catalog", session.DELTA_CATALOG))
elif sys.argv[1] in ("all", "hive"):
    from consistent_stream.session import with_delta
    b = with_delta(b)
if sys.argv[1] == "hive":
    d = sys.argv[2]
    b = (b.enableHiveSupport().config("spark.sql.warehouse.dir", d + "/warehouse")
         .config("spark.hadoop.javax.jdo.option.ConnectionURL",
                 f"jdbc:derby:;databaseName={d}/metastore_db;create=true")
         .config("spark.driver.extraJavaOptions", f"-Dderby.stream.error.file={d}/derby.log"))
s = b.getOrCreate()
s.sql("SELECT 1").collect()
t2 = time.time()
s.sql("SHOW DATABASES").collect()
t3 = time.time()
print(json.dumps({"variant": sys.argv[1], "import_s": round(t1 - t0, 3), "start_s": round(t2 - t1, 3),
                  "catalog_s": round(t3 - t2, 3)}))
s.stop()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    samples: dict[str, list[float]] = {"plain": [], "delta": [], "all": [], "hive": []}
    metastore = tempfile.mkdtemp(prefix="cs-session-start-")
    subprocess.run([sys.executable, "-c", CHILD, "hive", metastore], capture_output=True, text=True, check=True)
    for _ in range(args.runs):
        for variant in samples:
            out = subprocess.run([sys.executable, "-c", CHILD, variant, metastore], capture_output=True, text=True,
                                 check=True)
            rec = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
            samples[variant].append(rec["start_s"] + rec["catalog_s"])
            print(json.dumps(rec), flush=True)
    med = {k: round(statistics.median(v), 3) for k, v in samples.items()}
    print(json.dumps({"summary": {"median_start_and_catalog_s": med,
                                  "delta_adds_s": round(med["delta"] - med["plain"], 3),
                                  "s3a_kafka_add_s": round(med["all"] - med["delta"], 3),
                                  "hive_adds_s": round(med["hive"] - med["all"], 3),
                                  "runs": args.runs}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
