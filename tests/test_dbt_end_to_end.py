"""`dbt run`, `dbt test`, `dbt run --full-refresh`, `dbt docs generate` and `dbt source
freshness` on a consistent_stream model, for real:
dbt in this process, the real engine, real Delta tables, the target read back through the
Spark catalog as `<schema>.<model>`."""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from consistent_stream.delta import DeltaTableRef
from consistent_stream.verify import index_path
from test_dbt_plugin import PROJECT, dbt, messages, profile, write

SOURCES = """
version: 2
sources:
  - name: shop
    schema: shop
    tables:
      - name: orders
        freshness: {{warn_after: {{count: 1, period: day}}}}
        meta:
          consistent_stream: {{format: delta, location: "{loc}", primary_key: [oid]}}
"""
MODEL = """
{{ config(materialized='consistent_stream', unique_key='cid', partition_by='cid') }}
select cid, count(*) as n, sum(amount) as total
from {{ source('shop', 'orders') }}
group by cid
"""
BAG_MODEL = """
{{ config(materialized='consistent_stream') }}
select cid, amount from {{ source('shop', 'orders') }}
"""
SCHEMA_YML = """
version: 2
models:
  - name: totals
    columns:
      - name: cid
        data_tests: [unique, not_null]
      - name: n
        data_tests: [not_null]
"""


def test_dbt_run_test_and_full_refresh_on_a_consistent_stream_model(spark, tmp_path):
    schema = f"e2e_{uuid.uuid4().hex[:8]}"
    src = tmp_path / "data" / "orders"
    write_deltalake(str(src), pa.table({"oid": [1, 2, 3], "cid": [1, 1, 2], "amount": [5, 6, 7]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    write(tmp_path, {
        "dbt_project.yml": PROJECT,
        "profiles.yml": profile(schema, tmp_path / "spark", "e2e"),
        "models/sources.yml": SOURCES.format(loc=src),
        "models/totals.sql": MODEL,
        "models/amounts.sql": BAG_MODEL,  # no unique_key and none inferred: a bag
        "models/schema.yml": SCHEMA_YML,
    })

    def table():
        return {r["cid"]: (r["n"], r["total"]) for r in spark.table(f"{schema}.totals").collect()}

    def bag():
        return sorted(tuple(r) for r in spark.table(f"{schema}.amounts").collect())

    r = dbt(tmp_path, "run")
    assert r.success, messages(r)
    assert table() == {1: (2, 11), 2: (1, 7)}
    assert bag() == [(1, 5), (1, 6), (2, 7)]

    DeltaTable(str(src)).delete("oid = 1")
    write_deltalake(str(src), pa.table({"oid": [4, 5], "cid": [3, 1], "amount": [1, 6]}), mode="append")
    r = dbt(tmp_path, "run")
    assert r.success, messages(r)
    assert table() == {1: (2, 12), 2: (1, 7), 3: (1, 1)}
    assert bag() == [(1, 6), (1, 6), (2, 7), (3, 1)]  # a row the SQL returns twice is stored twice
    DeltaTable(str(src)).delete("oid = 5")
    r = dbt(tmp_path, "run")
    assert r.success, messages(r)
    assert bag() == [(1, 6), (2, 7), (3, 1)]  # one copy retracted, the other kept
    assert table() == {1: (1, 6), 2: (1, 7), 3: (1, 1)}

    r = dbt(tmp_path, "run")  # no source changed: nothing runs, nothing is committed
    assert r.success, messages(r)
    assert {x.node.name: x.message.split(",")[0] for x in r.result.results} == \
        {"totals": "up to date", "amounts": "up to date"}

    r = dbt(tmp_path, "test")
    assert r.success, messages(r)

    with open(index_path(str(tmp_path), "totals")) as f:
        target = DeltaTableRef(json.load(f)["target_path"])
    app_before = target.commit_at(target.latest_version()).metadata["app_id"]
    r = dbt(tmp_path, "run", "--full-refresh")
    assert r.success, messages(r)
    assert table() == {1: (1, 6), 2: (1, 7), 3: (1, 1)}
    meta = target.commit_at(target.latest_version()).metadata
    assert meta["app_id"] != app_before and meta["batch_id"] == "0"

    # dbt docs generate: the relation's type and its statistics from the Delta log
    r = dbt(tmp_path, "docs", "generate")
    assert r.success, messages(r)
    catalog = json.loads((tmp_path / "target" / "catalog.json").read_text())
    node = catalog["nodes"]["model.plugin_test.totals"]
    assert node["metadata"]["type"] == "consistent_stream"
    # the types as dbt-spark lists any table's (SHOW TABLE EXTENDED: bigint is "long")
    assert {c["name"]: c["type"] for c in node["columns"].values()} == {"cid": "long", "n": "long", "total": "long"}
    stats = {k: v["value"] for k, v in node["stats"].items()}
    assert stats["consistent_stream_version"] == target.latest_version() and stats["num_rows"] == 3
    assert json.loads(stats["consistent_stream_cut"]) == {"shop.orders": DeltaTable(str(src)).version()}
    assert stats["consistent_stream_freshness"] >= 0

    # dbt source freshness with no loaded_at_field: the source's newest Delta commit
    r = dbt(tmp_path, "source", "freshness")
    assert r.success, messages(r)
    [result] = json.loads((tmp_path / "target" / "sources.json").read_text())["results"]
    assert result["status"] == "pass" and result["max_loaded_at_time_ago_in_s"] < 3600
    newest = DeltaTableRef(str(src)).latest_commit().timestamp_ms
    loaded = datetime.fromisoformat(result["max_loaded_at"].replace("Z", "+00:00"))
    assert abs(loaded.timestamp() * 1000 - newest) < 1000
    spark.sql(f"drop schema if exists {schema} cascade")
