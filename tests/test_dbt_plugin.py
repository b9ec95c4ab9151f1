"""The dbt adapter plugin ``consistent_spark``, driven through dbt in this process.

Real dbt (``dbtRunner``) and real Spark. The SparkSession is process-wide and may already
exist (other tests share one): then its static confs (warehouse, metastore) stay as they
are, so these tests assert only on runtime confs, use a schema of their own, drop it at the
end, restore the runtime confs the profile changed, and never stop the session.
"""

from __future__ import annotations

import re
import textwrap
import uuid
from pathlib import Path

import pytest
from dbt.cli.main import dbtRunner, dbtRunnerResult
from pyspark.sql import SparkSession

import consistent_stream.job

TEST_CONF = "spark.consistent_stream.test"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def profile(schema: str, spark_dir: Path, test_conf_value: str) -> str:
    # The static confs only take effect when this profile starts the session.
    metastore = f"jdbc:derby:;databaseName={spark_dir}/metastore_db;create=true"
    return f"""
        plugin_test:
          target: local
          outputs:
            local:
              type: consistent_spark
              method: session
              host: NA
              schema: {schema}
              threads: 1
              server_side_parameters:
                spark.master: "local[2]"
                spark.ui.enabled: "false"
                spark.sql.warehouse.dir: "{spark_dir}/warehouse"
                spark.hadoop.javax.jdo.option.ConnectionURL: "{metastore}"
                spark.driver.extraJavaOptions: "-Dderby.stream.error.file={spark_dir}/derby.log"
                spark.sql.shuffle.partitions: "3"
                {TEST_CONF}: "{test_conf_value}"
        """


PROJECT = """
    name: plugin_test
    version: "1.0"
    config-version: 2
    profile: plugin_test
    flags:
      send_anonymous_usage_stats: false
    """


def dbt(project: Path, *args: str) -> dbtRunnerResult:
    return dbtRunner().invoke(
        [*args, "--project-dir", str(project), "--profiles-dir", str(project)]
    )


def messages(result: dbtRunnerResult) -> str:
    parts = [str(result.exception or "")]
    if result.result is not None and hasattr(result.result, "results"):
        parts += [str(r.message) for r in result.result.results]
    return "\n".join(parts)


# registered as ``project``; the function named apart so that the ``project`` argument of a test in a
# module importing it (test_debezium_dbt.py) does not shadow the import
@pytest.fixture(name="project")
def project_fixture(tmp_path_factory, request):
    """A dbt project dir with this test's own schema; restores the session's runtime confs."""
    root = tmp_path_factory.mktemp("dbt_project")
    schema = f"plugin_{uuid.uuid4().hex[:8]}"
    test_conf_value = f"value-{uuid.uuid4().hex[:6]}"
    write(
        root,
        {
            "dbt_project.yml": PROJECT,
            "profiles.yml": profile(schema, tmp_path_factory.mktemp("spark"), test_conf_value),
        },
    )
    existing = SparkSession.getActiveSession()
    touched = ["spark.sql.shuffle.partitions", "spark.sql.ansi.enabled", TEST_CONF]
    before = {key: existing.conf.get(key, None) for key in touched} if existing else {}
    yield root, schema, test_conf_value
    spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
    spark.sql(f"drop schema if exists {schema} cascade")
    for key, value in before.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def spark_session() -> SparkSession:
    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()


def test_table_and_view_models_run_through_the_plugin_with_the_profiles_spark_confs(project):
    root, schema, test_conf_value = project
    write(
        root,
        {
            # Spark substitutes ${conf} in SQL: the model sees the profile's runtime conf.
            "models/numbers.sql": f"""
                {{{{ config(materialized='table') }}}}
                select id, '${{{TEST_CONF}}}' as conf_value from range(5)
                """,
            "models/doubled.sql": """
                {{ config(materialized='view') }}
                select id * 2 as doubled from {{ ref('numbers') }}
                """,
        },
    )

    result = dbt(root, "run")

    assert result.success, messages(result)
    spark = spark_session()
    assert spark.conf.get(TEST_CONF) == test_conf_value
    assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
    numbers = spark.table(f"{schema}.numbers").collect()
    assert sorted(row.id for row in numbers) == [0, 1, 2, 3, 4]
    assert {row.conf_value for row in numbers} == {test_conf_value}
    assert sorted(row.doubled for row in spark.table(f"{schema}.doubled").collect()) == [0, 2, 4, 6, 8]
    # the schema's relations: listTables also lists the session's temporary views, which
    # another test in this process may have registered (consistent_stream_cut's ``<model>__v<n>``)
    types = {t.name: t.tableType for t in spark.catalog.listTables(schema) if not t.isTemporary}
    assert types == {"numbers": "MANAGED", "doubled": "VIEW"}


CONSISTENT_STREAM_SOURCES = """
    version: 2
    sources:
      - name: shop
        schema: shop_raw
        tables:
          - name: orders
            meta:
              consistent_stream:
                format: delta
                location: "{{ env_var('PLUGIN_TEST_DATA', 'data') }}/orders"
                primary_key: [order_id]
          - name: customers
            meta:
              consistent_stream: {format: delta, location: data/customers, primary_key: [customer_id]}
          - name: notes
    """

CUSTOMER_TOTALS = """
    {{ config(materialized='consistent_stream', unique_key=['customer_id'],
              partition_by='region', checkpoint_location='/tmp/chk', trigger='availableNow',
              max_batch_rows=1000, local_engine='spark', log_retention_hours=48) }}
    select c.customer_id, c.region, count(*) as orders, sum(o.amount) as amount
    from {{ source('shop', 'customers') }} as c
    inner join {{ source('shop', 'orders') }} as o on o.customer_id = c.customer_id
    group by c.customer_id, c.region
    """


@pytest.fixture()
def recorded_runs(monkeypatch):
    """run_model replaced by a recorder (the engine itself is tested elsewhere)."""
    calls = []

    def record(spark, **kwargs):
        calls.append({"spark": spark, **kwargs})
        return {"model": kwargs["model_name"], "batches": 1, "changes_read": 7, "rows_written": 3,
                "seconds": 0.5, "target_version": 4, "target_path": "/somewhere"}

    monkeypatch.setattr(consistent_stream.job, "run_model", record)
    monkeypatch.setenv("PLUGIN_TEST_DATA", "data/shop")
    return calls


def test_consistent_stream_model_calls_the_engine_with_its_sql_sources_and_config(project, recorded_runs):
    root, schema, _ = project
    write(root, {"models/sources.yml": CONSISTENT_STREAM_SOURCES, "models/customer_totals.sql": CUSTOMER_TOTALS})

    result = dbt(root, "run")

    assert result.success, messages(result)
    (call,) = recorded_runs
    assert call["spark"] is spark_session()
    assert call["project_root"] == str(root.resolve())
    assert (call["schema"], call["identifier"], call["model_name"]) == (schema, "customer_totals", "customer_totals")
    assert "from shop_raw.customers as c" in call["sql"] and "join shop_raw.orders as o" in call["sql"]
    assert "{{" not in call["sql"]
    assert sorted(call["sources"], key=lambda s: s["name"]) == [
        {"source_name": "shop", "name": "customers", "relation": "shop_raw.customers",
         "meta": {"format": "delta", "location": "data/customers", "primary_key": ["customer_id"]}, "primary_key": []},
        {"source_name": "shop", "name": "orders", "relation": "shop_raw.orders",
         "meta": {"format": "delta", "location": "data/shop/orders", "primary_key": ["order_id"]},
         "primary_key": []},
    ]
    assert call["config"] == {"unique_key": ["customer_id"], "location_root": None, "checkpoint_location": "/tmp/chk",
                              "partition_by": "region", "trigger": "availableNow", "max_batch_rows": 1000,
                              "driver_rebuild_rows": None,
                              "recompute_threshold": None, "autoscale": None, "state_file_rows": None,
                              "local_engine": "spark", "incremental_only": None, "target_deletion_vectors": None,
                              "log_retention_hours": 48,
                              "deleted_file_retention_hours": None, "state_retention_versions": None,
                              "checkpoint_interval": None,
                              "on_configuration_change": "apply", "on_schema_change": "ignore",
                              "contract": [], "constraints": [], "docs": None}  # no persist_docs
    from consistent_stream.model_config import KEYS
    assert call["config"].keys() == KEYS.keys()   # every key of the definition, and no other
    assert call["full_refresh"] is False
    assert result.result.results[0].message == "OK version 4"

    assert dbt(root, "run", "--full-refresh").success
    assert recorded_runs[-1]["full_refresh"] is True


def test_engine_errors_fail_the_model_with_the_engines_message(project, monkeypatch):
    root, _, _ = project
    write(root, {"models/sources.yml": CONSISTENT_STREAM_SOURCES, "models/customer_totals.sql": CUSTOMER_TOTALS})

    def fail(spark, **kwargs):
        raise ValueError("unsupported SQL: window function ROW_NUMBER at line 2, column 8")

    monkeypatch.setattr(consistent_stream.job, "run_model", fail)
    result = dbt(root, "run")

    assert not result.success
    assert ("consistent_stream model customer_totals failed: ValueError: unsupported SQL: window function"
            in messages(result))


INVALID_MODELS = {
    "blank_string_unique_key": (
        "{{ config(materialized='consistent_stream', unique_key=' ') }} "
        "select customer_id from {{ source('shop', 'customers') }}",
        ["Invalid config `unique_key` for consistent_stream model blank_string_unique_key: \" \""],
    ),
    "blank_unique_key": (
        "{{ config(materialized='consistent_stream', unique_key=['a', ' ']) }} select 1 as a",
        ["Invalid config `unique_key` for consistent_stream model blank_unique_key"],
    ),
    "bad_partition_by": (
        "{{ config(materialized='consistent_stream', unique_key='a', partition_by={'field': 'a'}) }} select 1 as a",
        ["Invalid config `partition_by` for consistent_stream model bad_partition_by"],
    ),
    "parquet_file_format": (
        "{{ config(materialized='consistent_stream', unique_key='a', file_format='parquet') }} select 1 as a",
        ["Invalid config `file_format` for consistent_stream model parquet_file_format: \"parquet\""],
    ),
}


def test_invalid_consistent_stream_models_fail_with_the_config_key_before_the_engine_runs(project, recorded_runs):
    root, _, _ = project
    write(root, {"models/sources.yml": CONSISTENT_STREAM_SOURCES,
                 **{f"models/{name}.sql": sql for name, (sql, _) in INVALID_MODELS.items()}})

    result = dbt(root, "run")

    assert not result.success
    errors = {r.node.name: str(r.message) for r in result.result.results}
    assert errors.keys() == INVALID_MODELS.keys()
    for name, (_, expected) in INVALID_MODELS.items():
        for text in expected:
            assert text in errors[name], (name, errors[name])
    assert recorded_runs == []


def test_adapter_run_info_names_the_plugin_module():
    from dbt.adapters.consistent_spark import ConsistentSparkAdapter

    info = ConsistentSparkAdapter.get_adapter_run_info(None)
    assert (info.adapter_name, info.adapter_version) == ("consistent_spark", "0.1.0")


CONTRACTED = """
    version: 2
    sources:
      - name: shop
        tables:
          - name: orders
            meta:
              consistent_stream: {format: delta, location: data/orders, primary_key: [order_id]}
    models:
      - name: totals
        config:
          contract: {enforced: true}
          grants: {select: [analysts]}
        constraints:
          - type: check
            expression: "amount >= 0"
            name: no_refunds
          - type: unique
            columns: [customer_id]
        columns:
          - name: customer_id
            data_type: %s
            constraints: [{type: not_null}]
          - name: amount
            data_type: bigint
    """


def test_contract_constraints_grants_and_configuration_changes_through_dbt(project):
    """Real engine: an enforced contract checked before anything is written (dbt's table of
    mismatches), constraints enforced at each batch (not_null, check; unique warned about),
    grants warned about, and on_configuration_change continue / fail on a changed SQL."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    root, schema, _ = project
    write_deltalake(str(root / "data" / "orders"), pa.table({"order_id": [1, 2, 3], "customer_id": [7, 7, 8],
                                                             "amount": [5, 6, 7]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    model = ("{{ config(materialized='consistent_stream', on_configuration_change='%s') }}\n"
             "select customer_id, sum(amount) as amount from {{ source('shop', 'orders') }} group by customer_id")
    write(root, {"models/schema.yml": CONTRACTED % "string", "models/totals.sql": model % "fail"})
    result = dbt(root, "run")
    assert not result.success
    assert "| customer_id | bigint | string | data type mismatch |" in messages(result)

    write(root, {"models/schema.yml": CONTRACTED % "bigint"})
    logs: list[str] = []
    result = dbtRunner(callbacks=[lambda e: logs.append(e.info.msg)]).invoke(
        ["run", "--project-dir", str(root), "--profiles-dir", str(root)])
    assert result.success, messages(result)
    assert any("`grants`" in m and "not applied" in m for m in logs)
    assert any("unique constraint on customer_id is not enforced" in m for m in logs)
    assert spark_session().table(f"{schema}.totals").count() == 2

    write_deltalake(str(root / "data" / "orders"), pa.table({"order_id": [4], "customer_id": [None],
                                                             "amount": [1]}).cast(
        pa.schema([("order_id", pa.int64()), ("customer_id", pa.int64()), ("amount", pa.int64())])), mode="append")
    result = dbt(root, "run")
    assert not result.success and "not_null on ['customer_id']" in messages(result)

    import json
    target = DeltaTable(json.loads((root / ".consistent_stream" / "models" / "totals.json").read_text())["target_path"])
    version = target.version()
    write(root, {"models/totals.sql": (model % "continue").replace("sum(amount)", "max(amount)")})
    logs.clear()
    result = dbtRunner(callbacks=[lambda e: logs.append(e.info.msg)]).invoke(
        ["run", "--project-dir", str(root), "--profiles-dir", str(root)])
    assert result.success, messages(result)
    assert result.result.results[0].message == f"kept (configuration changed), version {version}"
    assert any("on_configuration_change` was set to `continue`" in m and "+select customer_id, max(amount)" in m
               for m in logs)
    write(root, {"models/totals.sql": (model % "fail").replace("sum(amount)", "max(amount)")})
    result = dbt(root, "run")
    assert not result.success and "on_configuration_change is 'fail'" in messages(result)
    assert DeltaTable(target.table_uri).version() == version


@pytest.mark.parametrize("key, value, message", [
    ("driver_rebuild_rows", -5, "config driver_rebuild_rows must be an integer >= 0, got -5"),
    ("driver_rebuild_rows", 2.5, "config driver_rebuild_rows must be an integer >= 0, got 2.5"),
    ("state_retention_versions", 0, "config state_retention_versions must be an integer >= 1, got 0"),
    ("local_engine", "polars", "config local_engine must be 'duckdb' or 'spark', got 'polars'"),
])
def test_a_bad_engine_config_value_names_the_model_and_the_key(tmp_path, key, value, message):
    from consistent_stream.errors import ConfigError
    from consistent_stream.spec import JobSpec
    source = {"source_name": "shop", "name": "orders", "relation": "shop_raw.orders",
              "meta": {"format": "delta", "location": "data/orders", "primary_key": ["order_id"]}}
    kw = dict(project_root=str(tmp_path), schema="s", identifier="m", model_name="m", sql="select 1",
              sources=[source], warehouse_dir=str(tmp_path / "warehouse"))
    assert JobSpec.from_dbt(**kw, config={"driver_rebuild_rows": 0}).driver_rebuild_rows == 0
    with pytest.raises(ConfigError, match=re.escape(f"model m: {message}")):
        JobSpec.from_dbt(**kw, config={key: value})


def test_a_deleted_target_whose_catalog_entry_remains_is_named_and_rebuilt_by_full_refresh(spark, project, capsys):
    from dbt_recovery import deleted_target_is_named_and_rebuilt
    root, schema, _ = project
    deleted_target_is_named_and_rebuilt(spark, capsys, root, schema, str(root / "data"))


def test_a_steady_run_takes_the_targets_catalog_entry_from_dbts_relation_cache(spark, project, monkeypatch):
    """dbt-spark fills its relation cache once per schema before the first model (``SHOW TABLE
    EXTENDED``, with each table's type, provider and location): once a consistent_stream
    target is registered, a run of its model takes the entry from there, and neither the
    adapter (before the engine runs) nor the engine's publish (after) asks the metastore
    again. A first run, with nothing in the cache, does ask."""
    import pyarrow as pa
    from deltalake import write_deltalake

    import consistent_stream.sink.catalog as catalog
    from dbt_recovery import BIG, TOTALS

    from test_dbt_end_to_end import SOURCES
    root, schema, _ = project
    src, targets = str(root / "data" / "src" / "orders"), str(root / "data" / "targets")
    write_deltalake(src, pa.table({"oid": [1, 2, 3], "cid": [1, 1, 2], "amount": [5, 6, 7]}),
                    configuration={"delta.enableChangeDataFeed": "true"})
    write(root, {"models/sources.yml": SOURCES.format(loc=src), "models/totals.sql": TOTALS.format(root=targets),
                 "models/big.sql": BIG.format(root=targets)})
    asked: list[str] = []
    read_entry = catalog.catalog_entry

    def counted(spark_, schema_, identifier):
        asked.append(identifier)
        return read_entry(spark_, schema_, identifier)
    monkeypatch.setattr(catalog, "catalog_entry", counted)
    res = dbt(root, "run")
    assert res.success, messages(res)
    assert "totals" in asked, asked
    asked.clear()
    write_deltalake(src, pa.table({"oid": [4], "cid": [2], "amount": [8]}), mode="append")
    res = dbt(root, "run")
    assert res.success, messages(res)
    assert asked == [], asked
    assert {r["cid"]: r["total"] for r in spark.table(f"{schema}.totals").collect()} == {1: 11, 2: 15}
    assert {r["cid"]: r["total"] for r in spark.table(f"{schema}.big").collect()} == {1: 11, 2: 15}


def test_a_catalog_entry_gives_each_kind_of_entry_its_type_provider_and_exact_location(spark, tmp_path):
    """``catalog_entry`` on a classic session reads the metastore entry alone: an external
    Delta table at a path whose URI escapes a space and a ``%`` (its location reads as that
    path, as over Spark Connect: the table is where a publish would put it, so a publish does
    not register it again, and a source named by it reads that path), a managed Parquet table
    whose comment holds lines that look like the entry's own, a view, and no entry (no table,
    no schema)."""
    from consistent_stream.sink.catalog import CatalogEntry, CatalogTables, catalog_entry, publish
    schema = f"entries_{uuid.uuid4().hex[:8]}"
    odd = tmp_path / "a dir%20x"
    spark.sql(f"CREATE SCHEMA `{schema}`")
    try:
        spark.sql(f"CREATE TABLE `{schema}`.`odd` (a INT) USING delta LOCATION '{odd}'")
        spark.sql(f"CREATE TABLE `{schema}`.`managed` (a INT) USING parquet "
                  f"COMMENT 'Type: VIEW\\nProvider: csv\\nLocation: file:/elsewhere'")
        spark.sql(f"CREATE VIEW `{schema}`.`v` AS SELECT 1 AS a")
        entry = catalog_entry(spark, schema, "odd")
        assert (entry.kind, entry.provider) == ("EXTERNAL", "delta")
        assert entry.location == f"file:{odd}", entry
        assert entry.is_at(str(odd))
        assert not publish(spark, schema, "odd", str(odd), home=str(tmp_path / "home"))
        assert CatalogTables(spark).location(("spark_catalog", schema, "odd"), "source shop.odd") == str(odd)
        managed = catalog_entry(spark, schema, "managed")
        assert (managed.kind, managed.provider) == ("MANAGED", "parquet")
        assert managed.location.endswith("/managed") and "elsewhere" not in managed.location
        assert catalog_entry(spark, schema, "v") == CatalogEntry("VIEW", None, None)
        assert catalog_entry(spark, schema, "none") is None
        assert catalog_entry(spark, f"{schema}_none", "odd") is None
    finally:
        spark.sql(f"DROP SCHEMA `{schema}` CASCADE")


def test_an_entrys_printed_lines_are_read_as_its_own_where_a_value_holds_lines_like_them():
    """``SHOW TABLE EXTENDED``'s information (as over Spark Connect) of a table whose comment and
    storage properties hold lines that look like the entry's: the entry's own ``Type`` and
    ``Provider`` come first, its ``Location`` after the comment."""
    from consistent_stream.sink.catalog import CatalogEntry
    information = "\n".join([
        "Catalog: spark_catalog", "Database: shop", "Table: orders", "Type: EXTERNAL", "Provider: delta",
        "Comment: orders", "Type: VIEW", "Provider: csv", "Location: file:/elsewhere",
        "Table Properties: [delta.enableChangeDataFeed=true]", "Location: file:/data/orders",
        "Serde Library: org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe", "Partition Provider: Catalog"])
    assert CatalogEntry.from_information(information) == CatalogEntry("EXTERNAL", "delta", "file:/data/orders")
