"""Sources named only by their table in Spark's catalog, as a dbt project declares them
(``schema.table``, no ``meta.consistent_stream``), written by delta-spark with deletion
vectors on and the Change Data Feed off: UPDATE, DELETE, MERGE, OPTIMIZE and an overwrite,
each followed by a run whose target equals batch evaluation; then the Change Data Feed turned
on half way (commits before it read from the log, after it from the feed). A table that is not
a Delta table, a view and a missing table are refused naming them."""
from __future__ import annotations

import logging

import pytest

from consistent_stream.errors import ConfigError
from consistent_stream.job import run_job
from consistent_stream.sink.catalog import CatalogTables
from consistent_stream.spec import JobSpec
from helpers import assert_target_equals_batch_evaluation

SQL = ("select c.region, count(*) as n, sum(o.amount) as amount, max(o.note) as note "
       "from {orders} o join {customers} c on o.cust = c.c_id group by c.region")


def _job(spark, root, name: str, sources: list[dict], sql: str) -> JobSpec:
    return JobSpec.from_dbt(project_root=str(root), schema="tests", identifier=name, model_name=name, sql=sql,
                            sources=sources, config={"unique_key": "region", "location_root": str(root / "targets")},
                            warehouse_dir=str(root / "wh"), catalog=CatalogTables(spark))


@pytest.fixture(scope="module")
def shop(spark):
    spark.sql("CREATE DATABASE IF NOT EXISTS catalog_shop")
    yield "catalog_shop"
    spark.sql("DROP DATABASE IF EXISTS catalog_shop CASCADE")


def test_a_catalog_table_without_the_feed_with_deletion_vectors_through_every_kind_of_commit(
        spark, shop, tmp_path, caplog):
    orders, customers = f"{shop}.orders", f"spark_catalog.{shop}.customers"   # two- and three-part names
    dv = "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    spark.sql(f"CREATE TABLE {orders} (o_id BIGINT, cust BIGINT, amount BIGINT, note STRING) USING delta {dv}")
    spark.sql(f"CREATE TABLE {customers} (c_id BIGINT, region STRING) USING delta {dv}")
    spark.sql(f"INSERT INTO {customers} SELECT id, concat('r', id % 3) FROM range(1, 7)")
    spark.sql(f"INSERT INTO {orders} SELECT id, id % 6 + 1, 10 * id, 'n' FROM range(1, 41)")
    sources = [{"source_name": "shop", "name": "orders", "relation": orders, "meta": {}, "primary_key": ["o_id"]},
               {"source_name": "shop", "name": "customers", "relation": customers, "meta": {},
                "primary_key": []}]
    job = _job(spark, tmp_path, "by_name", sources, SQL.format(orders=orders, customers=customers))
    assert [s.catalog_table for s in job.sources] == [f"spark_catalog.{orders}", customers]
    run_job(spark, job)
    assert_target_equals_batch_evaluation(spark, job, "first build")
    steps = [
        ("update", f"UPDATE {orders} SET amount = amount + 1, note = 'u' WHERE o_id % 7 = 0"),
        ("delete", f"DELETE FROM {orders} WHERE o_id IN (3, 4, 5)"),
        ("merge", f"MERGE INTO {orders} t USING (SELECT id AS o_id, id % 6 + 1 AS cust FROM range(38, 45)) s "
                  f"ON t.o_id = s.o_id WHEN MATCHED THEN UPDATE SET amount = 0 "
                  f"WHEN NOT MATCHED THEN INSERT (o_id, cust, amount, note) VALUES (s.o_id, s.cust, 5, 'm')"),
        ("customers", f"UPDATE {customers} SET region = 'moved' WHERE c_id = 2"),
        ("optimize", f"OPTIMIZE {orders}"),
        ("purge", f"REORG TABLE {orders} APPLY (PURGE)"),
        ("overwrite", f"INSERT OVERWRITE {orders} SELECT o_id, cust, amount * 2, note FROM {orders} WHERE o_id > 10"),
        ("feed on", f"ALTER TABLE {orders} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"),
        ("update with the feed", f"UPDATE {orders} SET note = 'f' WHERE o_id % 5 = 0"),
        ("delete with the feed", f"DELETE FROM {orders} WHERE o_id % 9 = 0"),
    ]
    for i, (label, statement) in enumerate(steps):
        spark.sql(statement)
        if label == "feed on":   # the commits before it and after it in one batch
            spark.sql(f"UPDATE {orders} SET amount = 1 WHERE o_id = 12")
            continue
        with caplog.at_level(logging.INFO, logger="consistent_stream"):
            caplog.clear()
            run_job(spark, job)
        assert_target_equals_batch_evaluation(spark, job, label)
        said = caplog.text
        if i == 0:
            assert "the Change Data Feed is off" in said, said
        if label == "overwrite":
            assert "rewrote the table whole" in said, said
        elif label not in ("optimize", "purge", "customers"):
            assert "read from the log" in said, said


def test_tables_that_are_not_delta_tables_are_refused_naming_them(spark, shop, tmp_path):
    spark.sql(f"CREATE TABLE {shop}.plain (k BIGINT) USING parquet")
    spark.sql(f"CREATE TABLE {shop}.base (k BIGINT) USING delta")
    spark.sql(f"CREATE VIEW {shop}.a_view AS SELECT k FROM {shop}.base")
    for relation, said in ((f"{shop}.plain", "is a parquet table"), (f"{shop}.a_view", "is a view"),
                           (f"{shop}.missing", "has no table"), ("nowhere.t", "has no table")):
        sources = [{"source_name": "shop", "name": "t", "relation": relation, "meta": {}, "primary_key": []}]
        with pytest.raises(ConfigError) as e:
            _job(spark, tmp_path, "refused", sources, f"select k from {relation}")
        assert "source('shop', 't')" in str(e.value) and said in str(e.value), str(e.value)
