"""`dbt run`, `dbt test`, `dbt run --full-refresh`, `dbt docs generate` and `dbt source
freshness` on a consistent_stream model, for real:
dbt in this process, the real engine, real Delta tables, the target read back through the
Spark catalog as `<schema>.<model>`."""
from __future__ import annotations

import json
import re
import uuid
from datetime import datetime

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from consistent_stream import metrics
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
{{ config(materialized='consistent_stream', log_retention_hours=48, local_engine='spark') }}
select cid, amount from {{ source('shop', 'orders') }}
"""
SCHEMA_YML = """
version: 2
models:
  - name: totals
    description: "{description}"
    config:
      persist_docs: {{relation: true, columns: true}}
    columns:
      - name: cid
        description: "{cid}"
        data_tests: [unique, not_null]
      - name: n
        description: How many orders
        data_tests: [not_null]
      - name: no_such_column
        description: described in YAML, not in the SQL
"""


def test_dbt_run_test_and_full_refresh_on_a_consistent_stream_model(spark, tmp_path, capsys, monkeypatch):
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
        "models/schema.yml": SCHEMA_YML.format(description="Orders per customer", cid="The customer"),
    })

    def table():
        return {r["cid"]: (r["n"], r["total"]) for r in spark.table(f"{schema}.totals").collect()}

    def bag():
        return sorted(tuple(r) for r in spark.table(f"{schema}.amounts").collect())

    def docs():
        """The descriptions in the target's Delta metadata and in the catalog."""
        dt = DeltaTable(target.path)
        delta = (dt.metadata().description, {f.name: f.metadata.get("comment") for f in dt.schema().fields})
        table = spark.catalog.getTable(f"{schema}.totals")
        catalog = (table.description, {c.name: c.description for c in spark.catalog.listColumns(f"{schema}.totals")})
        return delta, catalog

    # a long batch reports its progress in dbt's output (here every batch is long: after 0 s)
    monkeypatch.setattr(metrics, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(metrics, "PROGRESS_EVERY_S", 0.05)  # often: a report needs a Spark job running
    capsys.readouterr()
    r = dbt(tmp_path, "run")
    assert r.success, messages(r)
    assert table() == {1: (2, 11), 2: (1, 7)}
    assert bag() == [(1, 5), (1, 6), (2, 7)]
    out = capsys.readouterr().out
    assert re.search(r"totals batch 0: running for \d+ s, \d+ Spark jobs? done; Spark job \d+ "
                     r"(stage \d+ \[[#-]{20}\] +\d+% \d+/\d+ tasks|starting)", out), out[-3000:]
    monkeypatch.undo()
    with open(index_path(str(tmp_path), "totals")) as f:
        target = DeltaTableRef(json.load(f)["target_path"])
    # the engine's config keys reach it through dbt: the retention is the target's property
    with open(index_path(str(tmp_path), "amounts")) as f:
        amounts = DeltaTable(json.load(f)["target_path"])
    assert amounts.metadata().configuration["delta.logRetentionDuration"] == f"interval {48 * 3600} seconds"
    # persist_docs: the descriptions in the Delta table's metadata and in the catalog
    written = ("Orders per customer", {"cid": "The customer", "n": "How many orders", "total": None})
    assert docs() == (written, written)

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

    # a changed description is no definition change: the target's Delta metadata, where the
    # catalog reads it, has it at the next rebuild (here the full refresh below)
    version = target.latest_version()
    write(tmp_path, {"models/schema.yml": SCHEMA_YML.format(description="Orders per customer, it's exact",
                                                          cid="The customer (the partition column)")})
    r = dbt(tmp_path, "run")
    assert r.success, messages(r)
    assert target.refresh().version == version
    changed = ("Orders per customer, it's exact", {**written[1], "cid": "The customer (the partition column)"})
    assert docs() == (written, written)

    app_before = target.commit_at(target.latest_version()).metadata["app_id"]
    r = dbt(tmp_path, "run", "--full-refresh")
    assert r.success, messages(r)
    assert table() == {1: (1, 6), 2: (1, 7), 3: (1, 1)}
    meta = target.commit_at(target.latest_version()).metadata
    assert meta["app_id"] != app_before and meta["batch_id"] == "0"
    assert docs() == (changed, changed)

    # dbt docs generate: the relation's type and its statistics from the Delta log
    r = dbt(tmp_path, "docs", "generate")
    assert r.success, messages(r)
    catalog = json.loads((tmp_path / "target" / "catalog.json").read_text())
    node = catalog["nodes"]["model.plugin_test.totals"]
    assert node["metadata"]["type"] == "consistent_stream"
    # the types as dbt-spark lists any Delta table's (DESCRIBE TABLE EXTENDED)
    assert ({c["name"]: c["type"] for c in node["columns"].values()}
            == {"cid": "bigint", "n": "bigint", "total": "bigint"})
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
