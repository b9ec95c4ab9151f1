"""Sources that delta-spark itself writes, with the table features Spark and Databricks turn on:
deletion vectors (UPDATE, DELETE and MERGE that write only deletion vectors, then OPTIMIZE),
column mapping (``name`` and ``id``, a renamed column), v2 checkpoints, in-commit
timestamps, partitioned and liquid-clustered tables (each layout with one of the features).

After every change and run, the target's newest version equals batch evaluation at its cut
(the central check, in Spark and DuckDB), and delta-spark's reads of the target (every
version, ``VERSION AS OF``, and its Change Data Feed between consecutive versions) agree with
the target as the engine wrote it."""
from __future__ import annotations

import pytest

from consistent_stream.delta import DeltaTableRef
from consistent_stream.delta.deltars import DELTA_SPARK, QUERY_BUILDER
from spark_written import SparkWritten

STEPS = {
    "update": ["UPDATE {orders} SET amount = amount + 1 WHERE o_id % 5 = 0"],
    "delete": ["DELETE FROM {orders} WHERE o_id % 7 = 0", "UPDATE {customers} SET region = 'r9' WHERE c_id = 2"],
    "merge": ["MERGE INTO {orders} t USING (SELECT id AS o_id, id % 6 + 1 AS cust, id AS amount FROM range(35, 46)) s "
              "ON t.o_id = s.o_id WHEN MATCHED THEN UPDATE SET amount = s.amount "
              "WHEN NOT MATCHED THEN INSERT (o_id, cust, amount, note) VALUES (s.o_id, s.cust, s.amount, 'm')"],
    "optimize": [*(f"INSERT INTO {{orders}} VALUES ({100 + i}, {i + 1}, 1, 'c')" for i in range(3)),
                 "OPTIMIZE {orders}"],
    "rename": ["ALTER TABLE {orders} RENAME COLUMN note TO remark",
               "UPDATE {orders} SET remark = 'x', amount = amount * 2 WHERE o_id < 4"],
}
"""Changes delta-spark makes to the sources, each followed by a run and the checks. With
deletion vectors an UPDATE, DELETE or MERGE writes only deletion vectors; the inserts before
OPTIMIZE pass a checkpoint (the tables' ``checkpointInterval`` is 2 or 3 where it matters);
the rename is of a column the model does not read."""

FEATURES = {   # name: (table properties, layout of orders, steps)
    "deletion_vectors": ("'delta.enableDeletionVectors' = 'true'", "CLUSTER BY (cust)",
                         ["update", "delete", "merge", "optimize"]),
    "column_mapping_name": ("'delta.columnMapping.mode' = 'name'", "PARTITIONED BY (cust)", ["merge", "rename"]),
    "column_mapping_id": ("'delta.columnMapping.mode' = 'id', 'delta.enableDeletionVectors' = 'true'", "",
                          ["delete", "rename"]),
    "v2_checkpoint": ("'delta.checkpointPolicy' = 'v2', 'delta.checkpointInterval' = '2', "
                      "'delta.enableDeletionVectors' = 'true'", "PARTITIONED BY (cust)", ["update", "optimize"]),
    "in_commit_timestamps": ("'delta.enableInCommitTimestamps' = 'true', 'delta.checkpointInterval' = '3'", "",
                             ["delete", "optimize"]),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_a_source_spark_wrote_with_a_feature_stays_exact_through_its_changes(spark, tmp_path, feature):
    props, layout, steps = FEATURES[feature]
    sw = SparkWritten(spark, tmp_path / feature, props, layout)
    job = sw.job()
    sw.run_and_check(job, "first run")
    for step in steps:
        for statement in STEPS[step]:
            sw.sql(statement)
        sw.run_and_check(job, step)
    plan = DeltaTableRef(sw.path("orders")).read_plan()
    if "DeletionVectors" in props:
        assert plan.snapshot_executors == DELTA_SPARK and plan.snapshot_driver == QUERY_BUILDER
    if feature.startswith("column_mapping"):
        assert plan.change_feed == DELTA_SPARK
