"""Settings every layer shares: how much a driver may hold, and the Spark session confs a
change-sized query runs with.

The bounds are read at call time (``settings.MAX_DRIVER_ROWS``, not bound into a default
argument), so a test can lower them for one run. What each bound costs and saves is measured
in ``benchmarks/`` (``keyed_read.py``, ``driver_rebuild.py``), not restated here.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager

from pyspark.sql import SparkSession

from .changelog import SINGLE_PARTITION_ROWS
from .connect import default_parallelism

MAX_DRIVER_ROWS = 1_000_000
"""Rows a result held on the driver may have: the state rows an incremental operator may read
and still keep its change on the driver, the rows the driver's DuckDB may return before the
executors write the result instead, and the rows a keyed scan of the target may keep."""
DRIVER_SCAN_ROWS = 50_000_000
"""A keyed read whose picked files hold at most this many rows is a scan on the driver
(multi-threaded) that keeps only the rows at the keys: the driver holds the matches, never the
files. Above it, Spark's executors run a semi join over the files."""
REWRITE_ROWS = 5_000_000
"""Target rows a change-sized MERGE done on the driver (:mod:`consistent_stream.sink.rewrite`)
may rewrite: the rows of the files it touches, held whole while they are rewritten. Above it
delta-rs' MERGE, which streams them, applies the change."""
DV_MIN_ROWS = int(os.environ.get("CONSISTENT_STREAM_DV_MIN_ROWS") or 20_000)
"""A target file of at least this many rows whose matched rows a MERGE retracts keeps them,
marked in its deletion vector (:mod:`consistent_stream.sink.rewrite`, with
``target_deletion_vectors``); a smaller one is rewritten (its rows cost less to write again
than a vector costs every reader). The environment's ``CONSISTENT_STREAM_DV_MIN_ROWS`` sets it
(the crash campaign's small tables get vectors so)."""
DV_PURGE_SHARE = 0.25
"""A target file whose deletion vector would mark more than this share of its rows is
rewritten instead (a purge, as ``REORG TABLE .. APPLY (PURGE)`` does): its readers stop
decoding rows that are gone."""
DV_INLINE_BYTES = 256
"""A deletion vector of at most this many bytes is kept in the commit itself (``storageType``
"i"); a larger one goes into the commit's vector file."""
ROWS_PER_TASK = 100_000
"""Rows per shuffle partition of a change-sized query."""
STATE_FILE_ROWS = 1_000_000
"""Default ``state_file_rows``: rows per state (and rebuilt target) file."""
CODEGEN_ROWS = 500_000
"""Rows below which a query runs without whole-stage code generation: compiling the generated
Java of each stage costs more than it saves on a change-sized query."""


def shuffle_partitions(spark: SparkSession, rows: int, parallelism: int | None = None) -> int:
    """Shuffle partitions for a query processing ``rows`` rows: one per ``ROWS_PER_TASK``,
    at least 1, at most twice the cores, or at most ``parallelism`` when the autoscaler
    (:mod:`consistent_stream.autoscale`) set one."""
    cap = parallelism or 2 * default_parallelism(spark)
    return max(1, min(cap, math.ceil(rows / ROWS_PER_TASK)))


def small_query_confs(spark: SparkSession, rows: int, parallelism: int | None = None) -> dict[str, str]:
    """Session confs for a change-sized query over ``rows`` rows (inputs plus state read):
    shuffle parallelism from the rows (capped by ``parallelism``), whole-stage code
    generation only when it pays."""
    confs = {"spark.sql.shuffle.partitions": str(shuffle_partitions(spark, rows, parallelism)),
             "spark.sql.codegen.wholeStage": "true" if rows >= CODEGEN_ROWS else "false"}
    if rows <= SINGLE_PARTITION_ROWS:
        # every relation is one driver-side partition: a join needs no exchange, and a
        # broadcast Spark would choose on its own is one more job
        confs["spark.sql.autoBroadcastJoinThreshold"] = "-1"
    return confs


@contextmanager
def spark_confs(spark: SparkSession, confs: dict[str, str]):
    """Run with session confs ``confs`` (conf name -> value) set, restoring the previous
    values afterwards (unsetting those that were unset)."""
    old = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
