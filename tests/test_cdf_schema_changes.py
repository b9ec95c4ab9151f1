"""Change Data Feed ranges that hold a schema change (issue 44): several commits between two
runs, one of them a column renamed, dropped, added or a schema overwritten, with inserts,
updates and deletes before and after it, so ONE batch's range crosses the change.

* Column mapping (``name`` and ``id``), read by delta-spark: a model that does not read the
  renamed or dropped column goes on incrementally, and the target equals batch evaluation at
  every run. delta-spark alone refuses such a range (``DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_*``);
  the engine reads it in parts, one per schema, its columns matched by physical name.
* A model that reads the renamed column fails with the schema drift error; for one that reads
  a column dropped and added again under the same name, the drift check sees its new physical
  name: rebuilt by default, refused with ``on_schema_change: fail``.
* Without column mapping, read by delta-rs (``load_cdf``): a column added and the schema
  overwritten inside one range read as they are, without splitting.
"""
from __future__ import annotations

import pytest

from consistent_stream.delta import DeltaTableRef
from consistent_stream.delta.deltars import DELTA_RS, DELTA_SPARK
from consistent_stream.errors import ConfigError
from consistent_stream.job import run_job
from consistent_stream.spec import JobSpec
from helpers import assert_target_equals_batch_evaluation, job_for
from spark_written import SparkWritten


def _merge(rows: str, delete: str, update: str, note: str | None = "note") -> str:
    """One commit of orders (a MERGE) that inserts ``rows`` (o_id, cust, amount and, unless
    None, the column ``note`` as it is named now), deletes the orders ``delete`` and adds 100
    to the amount of the orders ``update`` (lists of ids)."""
    cols, pad = ("o_id, cust, amount" + (f", {note}" if note else ""), ", ''" if note else "")
    return (f"MERGE INTO {{orders}} t USING (SELECT {cols}, 'i' AS op FROM VALUES {rows} AS v({cols}) "
            f"UNION ALL SELECT id, 0, 0{pad}, 'd' FROM VALUES {delete} AS d(id) "
            f"UNION ALL SELECT id, 0, 0{pad}, 'u' FROM VALUES {update} AS u(id)) s ON t.o_id = s.o_id "
            f"WHEN MATCHED AND s.op = 'd' THEN DELETE WHEN MATCHED THEN UPDATE SET amount = t.amount + 100 "
            f"WHEN NOT MATCHED THEN INSERT *")


RENAME = [_merge("(101, 1, 5, 'a'), (102, 2, 7, 'b')", "(3)", "(1)"),
          "ALTER TABLE {orders} RENAME COLUMN note TO remark",
          _merge("(103, 3, 9, 'c')", "(102)", "(2), (101)", note="remark"),
          "ALTER TABLE {customers} ADD COLUMNS (segment STRING)",
          "UPDATE {customers} SET segment = 's', region = 'r7' WHERE c_id = 1",
          "ALTER TABLE {customers} RENAME COLUMN segment TO seg"]
"""One batch's range: a rename of a column the model does not read (orders.note) between
commits that insert, update and delete rows from before and after it; on customers, a column
added and renamed around an update of a column the model reads."""
DROP = [_merge("(104, 4, 1, 'd')", "(5)", "(4), (103)", note="remark"),
        "ALTER TABLE {orders} DROP COLUMN remark",
        _merge("(105, 5, 2)", "(101)", "(6)", note=None),
        "ALTER TABLE {customers} DROP COLUMN seg"]
"""The next batch's range: the renamed column dropped (column mapping allows DROP COLUMN), with
changes on both sides of it."""


def _run(spark, job, label: str) -> None:
    summary = run_job(spark, job)
    assert summary["batches"] == 1 and summary["strategies"] == ["incremental"], (label, summary)
    assert_target_equals_batch_evaluation(spark, job, label)


@pytest.mark.parametrize("mode", ["name", "id"])
def test_a_rename_or_drop_inside_one_batch_goes_on_for_a_model_that_does_not_read_the_column(spark, tmp_path,
                                                                                           mode):
    sw = SparkWritten(spark, tmp_path / mode, f"'delta.columnMapping.mode' = '{mode}'")
    job = sw.job()
    run_job(spark, job)
    assert_target_equals_batch_evaluation(spark, job, "first run")
    orders = DeltaTableRef(sw.path("orders"))
    for label, steps in (("rename", RENAME), ("drop", DROP)):
        before = orders.latest_version()
        for statement in steps:
            sw.sql(statement)
        latest = orders.latest_version()
        changes = orders.schema_changes(before, latest)
        assert changes and changes[0].version > before + 1, f"{label}: the range does not start at its change"
        with pytest.raises(Exception, match="DELTA_CHANGE_DATA_FEED_INCOMPATIBLE"):   # delta-spark alone
            (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", before + 1)
             .option("endingVersion", latest).load(sw.path("orders")).toArrow())
        _run(spark, job, label)
    assert [c.describe().split(" ", 2)[2] for c in orders.schema_changes(1, orders.latest_version())] == \
        ["renamed column note to remark", "dropped column remark (string)"]
    assert orders.read_plan().change_feed == DELTA_SPARK


@pytest.mark.parametrize("first", [False, True], ids=["after_an_insert", "first_in_the_range"])
def test_a_column_the_model_reads_dropped_and_added_again_is_a_schema_change(spark, tmp_path, first):
    # every older row's note is NULL now, without a row in the Change Data Feed; the name and
    # type are as before, only the column mapping's physical name tells: the run says so and
    # rebuilds (on_schema_change's default), or with on_schema_change fail refuses, naming it;
    # whether or not the range starts with the drop (where delta-spark reads the range whole)
    sw = SparkWritten(spark, tmp_path / "reads", "'delta.columnMapping.mode' = 'name'")
    source = {"source_name": "src", "name": "orders", "relation": "src.orders",
              "meta": {"location": sw.path("orders"), "primary_key": ["o_id"]}}
    job = job_for("by_note", "select note, count(*) as n, sum(amount) as amount from src.orders group by note",
                  [source], ["note"], tmp_path / "reads")
    run_job(spark, job)
    steps = ["ALTER TABLE {orders} DROP COLUMN note", "ALTER TABLE {orders} ADD COLUMNS (note STRING)",
             "INSERT INTO {orders} VALUES (101, 1, 5, 'a')"]
    for statement in steps if first else [steps[2], *steps[:2]]:
        sw.sql(statement)
    target = DeltaTableRef(job.target_path).latest_version()
    with pytest.raises(ConfigError, match=r"(?s)src\.orders .*column note \(string\) was dropped and added again"):
        run_job(spark, JobSpec(**{**job.__dict__, "on_schema_change": "fail"}))
    assert DeltaTableRef(job.target_path).latest_version() == target
    summary = run_job(spark, job)
    assert summary["strategies"] == ["recompute"], summary   # rebuilt from the snapshots
    assert_target_equals_batch_evaluation(spark, job, "rebuilt")
    # renamed: the schema drift check names the column and its new name, before anything is read
    sw.sql("ALTER TABLE {orders} RENAME COLUMN note TO remark")
    with pytest.raises(ConfigError, match=r"(?s)src\.orders .*column note \(string\) is gone \(dropped or renamed; "
                                          r"its new columns: remark\).*--full-refresh -s by_note"):
        run_job(spark, JobSpec(**{**job.__dict__, "on_schema_change": "fail"}))


def test_without_column_mapping_a_range_with_an_added_column_and_an_overwritten_schema_reads_as_is(spark, tmp_path):
    sw = SparkWritten(spark, tmp_path / "plain", "'delta.checkpointInterval' = '10'")
    job = sw.job()
    run_job(spark, job)
    orders = DeltaTableRef(sw.path("orders"))
    before = orders.latest_version()
    for statement in ("INSERT INTO {orders} VALUES (101, 1, 5, 'a')",
                      "ALTER TABLE {customers} ADD COLUMNS (segment STRING)",
                      "UPDATE {customers} SET segment = 's', region = 'r7' WHERE c_id = 1"):
        sw.sql(statement)
    # the orders' schema overwritten without note (a drop without column mapping rewrites every row)
    (spark.read.format("delta").load(sw.path("orders")).where("o_id <> 2").select("o_id", "cust", "amount")
     .write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(sw.path("orders")))
    sw.sql("UPDATE {orders} SET amount = amount + 1 WHERE o_id IN (1, 101)")
    assert [c.describe().split(" ", 2)[2] for c in orders.schema_changes(before, orders.latest_version())] == \
        ["dropped column note (string)"]
    _run(spark, job, "added column and overwritten schema")
    assert orders.read_plan().change_feed == DELTA_RS
