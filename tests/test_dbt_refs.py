"""`ref()` in dbt, for real: a consistent_stream model over an ephemeral model, one over a
view model, a mart over both consistent_stream models and one of their own sources, run with
`dbt build` (tests between the levels) and `dbt run` after source changes; every level
verified against batch evaluation of the whole chain. `ref()` of a `table` model that is not a
Delta table fails, naming the model, its provider and what to do (models dbt builds as Delta
tables: ``test_dbt_built_refs.py``)."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from consistent_stream.verify import index_path, verify_target
from test_dbt_end_to_end import SOURCES
from test_dbt_plugin import PROJECT, dbt, messages, profile, write

MODELS = {
    "models/stg_orders.sql": """
        {{ config(materialized='ephemeral') }}
        select oid, cid, amount * 2 as amount2 from {{ source('shop', 'orders') }}
        """,
    "models/v_orders.sql": """
        {{ config(materialized='view') }}
        select oid, cid, amount from {{ source('shop', 'orders') }} where amount > 0
        """,
    "models/doubled.sql": """
        {{ config(materialized='consistent_stream') }}
        select cid, sum(amount2) as s from {{ ref('stg_orders') }} group by cid
        """,
    "models/positive.sql": """
        {{ config(materialized='consistent_stream') }}
        select v.cid, count(*) as n from {{ ref('v_orders') }} as v group by v.cid
        """,
    "models/mart.sql": """
        {{ config(materialized='consistent_stream', unique_key='cid') }}
        select d.cid, d.s, p.n, o.orders
        from {{ ref('doubled') }} d
        left join {{ ref('positive') }} p on p.cid = d.cid
        join (select cid, count(*) as orders from {{ source('shop', 'orders') }} group by cid) o
          on o.cid = d.cid
        """,
    "models/schema.yml": """
        version: 2
        models:
          - name: doubled
            columns:
              - name: cid
                data_tests: [unique, not_null]
          - name: mart
            columns:
              - name: cid
                data_tests: [unique, not_null]
        """,
    "tests/cut_views_agree.sql": """
        -- at one cut, every customer with a positive order has a row in doubled
        {% set at = consistent_stream_cut(['doubled', 'positive']) %}
        select p.cid from {{ at['positive'] }} p left join {{ at['doubled'] }} d on d.cid = p.cid
        where d.cid is null
        """,
    "models/a_table.sql": """
        {{ config(materialized='table') }}
        select 1 as cid
        """,
    "models/over_table.sql": """
        {{ config(materialized='consistent_stream') }}
        select cid from {{ ref('a_table') }}
        """,
}


def test_ref_chains_through_ephemeral_view_and_consistent_stream_models(spark, tmp_path):
    schema = f"refs_{uuid.uuid4().hex[:8]}"
    src = tmp_path / "data" / "orders"
    write_deltalake(str(src), pa.table({"oid": [1, 2, 3, 4], "cid": [1, 1, 2, 3], "amount": [5, 6, 7, -1]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    write(tmp_path, {"dbt_project.yml": PROJECT, "profiles.yml": profile(schema, tmp_path / "spark", "refs"),
                     "models/sources.yml": SOURCES.format(loc=src), **MODELS})

    def rows(model):
        return sorted(tuple(r) for r in spark.table(f"{schema}.{model}").collect())

    def verify_all():
        for model in ("doubled", "positive", "mart"):
            with open(index_path(str(tmp_path), model)) as f:
                res = verify_target(spark, json.load(f)["target_path"])
            assert res.ok, res

    r = dbt(tmp_path, "build", "--exclude", "over_table", "a_table")
    assert r.success, messages(r)
    assert rows("doubled") == [(1, 22), (2, 14), (3, -2)]
    assert rows("positive") == [(1, 2), (2, 1)]
    assert rows("mart") == [(1, 22, 2, 2), (2, 14, 1, 1), (3, -2, None, 1)]
    verify_all()

    DeltaTable(str(src)).delete("oid = 1")
    write_deltalake(str(src), pa.table({"oid": [5], "cid": [3], "amount": [4]}), mode="append")
    r = dbt(tmp_path, "run", "--exclude", "over_table", "a_table")
    assert r.success, messages(r)
    assert rows("mart") == [(1, 12, 1, 1), (2, 14, 1, 1), (3, 6, 1, 2)]
    verify_all()
    meta = DeltaTable(json.load(open(index_path(str(tmp_path), "mart")))["target_path"]).history(1)[0]
    base = json.loads(meta["consistent_stream.base_cut"])
    assert base == {"shop.orders": DeltaTable(str(src)).version()}

    # a new customer reaches positive but not (yet) doubled: read together at one cut, they
    # are the versions before it, where they agree
    write_deltalake(str(src), pa.table({"oid": [6], "cid": [9], "amount": [3]}), mode="append")
    r = dbt(tmp_path, "run", "-s", "positive")
    assert r.success, messages(r)
    assert (9, 1) in rows("positive")
    cli = [sys.executable, "-m", "consistent_stream.cli", "cut", "doubled", "positive", "--project-dir", str(tmp_path)]
    out = json.loads(subprocess.run(cli, check=True, capture_output=True, text=True).stdout)
    versions = {m["model"]: m["version"] for m in out["models"]}
    assert out["base_cut"] == {"shop.orders": DeltaTable(str(src)).version() - 1}
    assert versions == {"doubled": 1, "positive": 1}
    r = dbt(tmp_path, "test", "-s", "cut_views_agree")
    assert r.success, messages(r)

    # a `table` model is read by its catalog name; this one is not a Delta table (no file_format)
    r = dbt(tmp_path, "run", "-s", "+over_table")
    assert not r.success
    msg = messages(r)
    assert f"ref('a_table'): {schema}.a_table is a" in msg and "not a Delta table" in msg, msg
    assert "file_format: delta" in msg, msg
    spark.sql(f"drop schema if exists {schema} cascade")
    spark.sql("drop schema if exists shop cascade")
