"""Source tables written by delta-spark's SQL, and delta-spark's reads of a target checked
against the engine's own (``test_spark_written_sources.py``, ``test_source_features.py``)."""
from __future__ import annotations

from collections import Counter

import pyarrow as pa

from consistent_stream.delta import DeltaTableRef
from consistent_stream.job import run_job
from helpers import assert_same_rows, assert_target_equals_batch_evaluation, job_for

SQL = ("select c.region, count(*) as n, sum(o.amount) as amount "
       "from src.orders o join src.customers c on o.cust = c.c_id group by c.region")


class SparkWritten:
    """Two source tables (orders, customers) created and changed by delta-spark's SQL, with
    table properties ``props`` on both and ``layout`` (``PARTITIONED BY``/``CLUSTER BY``) on
    orders."""

    def __init__(self, spark, root, props: str, layout: str = ""):
        self.spark, self.root = spark, root
        self.prefix = f"t{abs(hash(str(root))) % 10**8}"
        cdf = "'delta.enableChangeDataFeed' = 'true'"
        spark.sql(f"CREATE TABLE {self.name('orders')} (o_id BIGINT, cust BIGINT, amount BIGINT, note STRING) "
                  f"USING delta {layout} LOCATION '{self.path('orders')}' TBLPROPERTIES ({cdf}, {props})")
        spark.sql(f"CREATE TABLE {self.name('customers')} (c_id BIGINT, region STRING) USING delta "
                  f"LOCATION '{self.path('customers')}' TBLPROPERTIES ({cdf}, {props})")
        self.sql("INSERT INTO {customers} SELECT id, concat('r', id % 3) FROM range(1, 7)")
        self.sql("INSERT INTO {orders} SELECT id, id % 6 + 1, 10 * id, 'n' FROM range(1, 41)")

    def name(self, table: str) -> str:
        return f"{self.prefix}_{table}"

    def path(self, table: str) -> str:
        return str(self.root / "src" / table)

    def sql(self, statement: str) -> None:
        self.spark.sql(statement.format(orders=self.name("orders"), customers=self.name("customers")))

    def job(self):
        sources = [{"source_name": "src", "name": n, "relation": f"src.{n}",
                    "meta": {"location": self.path(n), "primary_key": [k]}}
                   for n, k in (("orders", "o_id"), ("customers", "c_id"))]
        return job_for("m", SQL, sources, ["region"], self.root)

    def run_and_check(self, job, label: str) -> None:
        run_job(self.spark, job)
        assert_target_equals_batch_evaluation(self.spark, job, label)
        self.checked = assert_spark_reads_the_target(self.spark, job.target_path, label, getattr(self, "checked", -1))


def assert_spark_reads_the_target(spark, target_path: str, label: str, checked: int = -1) -> int:
    """delta-spark's reads of the target agree with the target as delta-rs reads it: every
    version after ``checked`` (``versionAsOf``), and the Change Data Feed of each version
    equals the difference of the version and the one before (as multisets, by change type).
    Returns the newest version checked."""
    target = DeltaTableRef(target_path)
    latest = target.latest_version()
    prev = target.read_snapshot_arrow(checked) if checked >= 0 else None
    for v in range(checked + 1, latest + 1):
        mine = target.read_snapshot_arrow(v)
        theirs = spark.read.format("delta").option("versionAsOf", v).load(target_path).toArrow()
        assert_same_rows(mine, theirs.select(mine.column_names), f"{label}: version {v} read by delta-spark")
        if prev is not None:
            feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", v)
                    .option("endingVersion", v).load(target_path).toArrow())
            kinds = feed.column("_change_type").to_pylist()
            cols = mine.column_names
            added = feed.filter(pa.array([k in ("insert", "update_postimage") for k in kinds])).select(cols)
            removed = feed.filter(pa.array([k in ("delete", "update_preimage") for k in kinds])).select(cols)
            what = f"{label}: change feed of version {v}"
            assert_same_rows(_minus(mine, prev), _minus(added, removed), f"{what}, inserts")
            assert_same_rows(_minus(prev, mine), _minus(removed, added), f"{what}, deletes")
        prev = mine
    return latest


def _minus(a: pa.Table, b: pa.Table) -> pa.Table:
    """Multiset difference ``a - b`` of two tables with the same columns."""
    rows_b = Counter(tuple(sorted(r.items())) for r in b.to_pylist())
    out = []
    for r in a.to_pylist():
        k = tuple(sorted(r.items()))
        if rows_b[k]:
            rows_b[k] -= 1
        else:
            out.append(r)
    return pa.Table.from_pylist(out, schema=a.schema)


