"""A consistent_stream mart over the models a dbt project builds as Delta tables, for real:
an ``incremental`` (merge) model, a ``table`` model, a ``snapshot`` and a seed, and a view over
a source declared by its catalog name alone (``schema`` and ``table``, no
``meta.consistent_stream``; written by delta-spark with deletion vectors on and the Change Data
Feed off). ``dbt build --empty`` first (an empty, typed target and no checkpoint), then
``dbt build``; each upstream is then changed by its own command (``dbt run``, ``dbt snapshot``,
``dbt seed``) and the marts run after it, every version verified against batch evaluation at
its cut. Last, ``dbt run -s mart --defer --state``: the mart in a dev schema over prod's
upstreams."""
from __future__ import annotations

import json
import shutil
import uuid

from consistent_stream.sink.catalog import catalog_entry
from consistent_stream.verify import index_path, verify_target
from test_dbt_plugin import PROJECT, dbt, messages, profile, write

FILES = {
    "seeds/regions.csv": "rid,region\n1,north\n2,south\n3,east\n",
    "models/orders_inc.sql": """
        {{ config(materialized='incremental', incremental_strategy='merge', unique_key='oid', file_format='delta') }}
        select oid, cid, amount from {{ source('shop', 'orders') }}
        """,
    "models/big_orders.sql": """
        {{ config(materialized='table', file_format='delta') }}
        select oid from {{ ref('orders_inc') }} where amount >= 50
        """,
    "models/stg_orders.sql": """
        {{ config(materialized='view') }}
        select oid, cid, amount from {{ source('shop', 'orders') }}
        """,
    "models/mart.sql": """
        {{ config(materialized='consistent_stream', unique_key='region') }}
        select s.region, count(*) as n, sum(o.amount) as amount, count(b.oid) as big
        from {{ ref('orders_inc') }} o
        join {{ ref('customers_snap') }} c on c.cid = o.cid and c.dbt_valid_to is null
        join {{ ref('regions') }} s on s.rid = c.rid
        left join {{ ref('big_orders') }} b on b.oid = o.oid
        group by s.region
        """,
    "models/by_customer.sql": """
        {{ config(materialized='consistent_stream', unique_key='cid') }}
        select cid, count(*) as n, sum(amount) as amount from {{ ref('stg_orders') }} group by cid
        """,
}


def _yaml(source_schema: str) -> str:
    return f"""
        version: 2
        sources:
          - name: shop
            schema: {source_schema}
            tables:
              - name: orders
                freshness: {{warn_after: {{count: 1, period: day}}}}
                columns:
                  - name: oid
                    constraints: [{{type: primary_key}}]
              - name: customers
        snapshots:
          - name: customers_snap
            relation: source('shop', 'customers')
            config:
              unique_key: cid
              strategy: check
              check_cols: all
              file_format: delta
        models:
          - name: mart
            columns:
              - name: region
                data_tests: [unique, not_null]
        """


def test_a_mart_over_models_dbt_builds_as_delta_tables_and_a_catalog_source(spark, tmp_path):
    schema, source_schema = f"built_{uuid.uuid4().hex[:8]}", f"raw_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE DATABASE {source_schema}")
    dv = "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    orders, customers = f"{source_schema}.orders", f"{source_schema}.customers"
    spark.sql(f"CREATE TABLE {orders} (oid BIGINT, cid BIGINT, amount BIGINT) USING delta {dv}")
    spark.sql(f"CREATE TABLE {customers} (cid BIGINT, rid BIGINT, name STRING) USING delta {dv}")
    spark.sql(f"INSERT INTO {customers} SELECT id, id % 3 + 1, concat('c', id) FROM range(1, 9)")
    spark.sql(f"INSERT INTO {orders} SELECT id, id % 8 + 1, id * 7 FROM range(1, 31)")
    project = PROJECT.rstrip() + "\n    seeds:\n      plugin_test:\n        +file_format: delta\n"
    write(tmp_path, {"dbt_project.yml": project, "profiles.yml": profile(schema, tmp_path / "spark", "built"),
                     "models/schema.yml": _yaml(source_schema), **FILES})

    def verify(*models):
        for model in models:
            with open(index_path(str(tmp_path), model)) as f:
                res = verify_target(spark, json.load(f)["target_path"])
            assert res.ok, (model, res)

    r = dbt(tmp_path, "build", "--empty")
    assert r.success, messages(r)
    empty = spark.table(f"{schema}.mart")
    assert empty.count() == 0 and empty.columns == ["region", "n", "amount", "big"]
    entry = catalog_entry(spark, schema, "mart")
    assert entry is not None and not entry.is_target()   # a plain table, which the build replaces

    r = dbt(tmp_path, "build")
    assert r.success, messages(r)
    verify("mart", "by_customer")
    assert spark.table(f"{schema}.mart").count() == 3
    r = dbt(tmp_path, "source", "freshness")   # from the Delta log of the table the catalog names
    assert r.success, messages(r)
    [result] = json.loads((tmp_path / "target" / "sources.json").read_text())["results"]
    assert result["status"] == "pass" and result["max_loaded_at_time_ago_in_s"] < 3600, result

    spark.sql(f"UPDATE {orders} SET amount = amount + 40 WHERE oid % 5 = 0")
    spark.sql(f"DELETE FROM {orders} WHERE oid IN (2, 3)")
    spark.sql(f"INSERT INTO {orders} VALUES (100, 1, 1000)")
    r = dbt(tmp_path, "run", "-s", "orders_inc", "big_orders")
    assert r.success, messages(r)
    r = dbt(tmp_path, "run", "-s", "mart", "by_customer")
    assert r.success, messages(r)
    verify("mart", "by_customer")

    spark.sql(f"UPDATE {customers} SET rid = 3 WHERE cid IN (1, 2)")
    r = dbt(tmp_path, "snapshot")
    assert r.success, messages(r)
    r = dbt(tmp_path, "run", "-s", "mart")
    assert r.success, messages(r)
    verify("mart")

    write(tmp_path, {"seeds/regions.csv": "rid,region\n1,north\n2,south\n3,west\n"})
    r = dbt(tmp_path, "seed")   # dbt-spark drops and creates a seed's table: the mart is rebuilt
    assert r.success, messages(r)
    r = dbt(tmp_path, "run", "-s", "mart")
    assert r.success, messages(r)
    verify("mart")
    assert "west" in {row[0] for row in spark.table(f"{schema}.mart").collect()}

    # --defer: the mart alone in a dev schema, over prod's upstreams (the state of the runs above)
    shutil.copytree(tmp_path / "target", tmp_path / "prod_state")
    dev = f"{schema}_dev"
    write(tmp_path, {"profiles.yml": profile(dev, tmp_path / "spark", "built")})
    r = dbt(tmp_path, "run", "-s", "mart", "--defer", "--state", str(tmp_path / "prod_state"))
    assert r.success, messages(r)
    verify("mart")
    assert sorted(spark.table(f"{dev}.mart").collect()) == sorted(spark.table(f"{schema}.mart").collect())

    # dbt clone: what dbt-spark gives a Delta `table` (a shallow clone of prod's target); a
    # later run in dev replaces the clone with a target of its own
    r = dbt(tmp_path, "clone", "-s", "by_customer", "--state", str(tmp_path / "prod_state"))
    assert r.success, messages(r)
    entry = catalog_entry(spark, dev, "by_customer")
    assert entry is not None and not entry.is_target()
    assert sorted(spark.table(f"{dev}.by_customer").collect()) == sorted(spark.table(f"{schema}.by_customer").collect())
    r = dbt(tmp_path, "run", "-s", "by_customer", "--defer", "--state", str(tmp_path / "prod_state"))
    assert r.success, messages(r)
    verify("by_customer")
    entry = catalog_entry(spark, dev, "by_customer")
    assert entry is not None and entry.is_target()
    spark.sql(f"DROP DATABASE IF EXISTS {dev} CASCADE")
    spark.sql(f"DROP DATABASE IF EXISTS {schema} CASCADE")
    spark.sql(f"DROP DATABASE IF EXISTS {source_schema} CASCADE")
