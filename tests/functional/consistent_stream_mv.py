"""dbt's materialized-view suite (``dbt.tests.adapter.materialized_view``) adapted to
``materialized='consistent_stream'``: the pieces every adapted class shares.

dbt's suite reads a seed; a consistent_stream model reads only dbt sources with
``meta.consistent_stream`` (Delta tables with the Change Data Feed on) or other models over
them, and a seed is a compile error. So the seed ``my_seed`` becomes a source of the same
name and rows, a Delta table under the project directory written with ``deltalake``, declared
in the test's own schema; "insert a record" appends to that table, and "refresh" is
``dbt run`` of the model. The ``view`` model reads the source (the adapter publishes the
source's latest version in the catalog for it, as Spark cannot read Delta here); the
``table`` model reads that view, since Spark cannot read the source by itself.

A relation is a ``materialized_view`` when the catalog shows it as an external table whose
location is the snapshot directory of its Delta target's newest consistent_stream commit
(:func:`published_batch`): a ``table`` dbt built or a ``view`` of the same name is not one.

Subclass :class:`ConsistentStreamMaterializedView` before dbt's class
(``class TestX(ConsistentStreamMaterializedView, MaterializedViewBasic)``) so its fixtures
and hooks are the ones used.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import pyarrow as pa
import pytest
from dbt.adapters.base.relation import BaseRelation
from dbt.tests.util import get_model_file, run_dbt, set_model_file
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from consistent_stream.delta import DeltaTableRef
from consistent_stream.runtime import BatchMeta

SOURCE = "my_seed"  # dbt's seed, now a source of the same name in the test's schema
SOURCE_LOCATION = f"data/{SOURCE}"  # relative to the dbt project directory
SOURCE_ROWS = {"id": [1, 2, 3], "value": [100, 200, 300]}  # dbt's files.MY_SEED

SOURCES_YML = f"""
version: 2
sources:
  - name: cs
    schema: "{{{{ target.schema }}}}"
    tables:
      - name: {SOURCE}
        meta:
          consistent_stream: {{format: delta, location: {SOURCE_LOCATION}, primary_key: [id]}}
"""

MY_MATERIALIZED_VIEW = f"""
{{{{ config(
    materialized='consistent_stream',
) }}}}
select * from {{{{ source('cs', '{SOURCE}') }}}}
"""

MY_VIEW = f"""
{{{{ config(
    materialized='view',
) }}}}
select * from {{{{ source('cs', '{SOURCE}') }}}}
"""

MY_TABLE = """
{{ config(
    materialized='table',
) }}
select * from {{ ref('my_view') }}
"""


def spark_session() -> SparkSession:
    return SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()


def source_path(project) -> str:
    return str(Path(project.project_root) / SOURCE_LOCATION)


def write_source(project, rows: dict | None = None) -> None:
    """(Re)write the source table with ``rows`` (dbt's seed rows by default) as a new version."""
    table = pa.table({name: pa.array(values, pa.int64()) for name, values in (rows or SOURCE_ROWS).items()})
    write_deltalake(source_path(project), table, mode="overwrite",
                    configuration={"delta.enableChangeDataFeed": "true"})


def source_rows(project) -> list[tuple]:
    table = DeltaTable(source_path(project)).to_pyarrow_table()
    return sorted(zip(*(table.column(c).to_pylist() for c in ("id", "value"))))


def relation_rows(relation: BaseRelation) -> list[tuple]:
    return sorted(tuple(r) for r in spark_session().table(f"{relation.schema}.{relation.identifier}")
                  .select("id", "value").collect())


def published_batch(relation: BaseRelation) -> Optional[BatchMeta]:
    """The consistent_stream batch whose target version the catalog shows as ``relation``:
    an external Delta table whose location is a target the engine committed, at its newest
    version. None for anything else (a view, a table dbt built, no such relation)."""
    spark = spark_session()
    name = f"{relation.schema}.{relation.identifier}"
    if not spark.catalog.tableExists(name):
        return None
    details = {row.col_name: row.data_type for row in spark.sql(f"describe table extended {name}").collect()}
    target = details.get("Location", "").removeprefix("file:")
    if (details.get("Type") != "EXTERNAL" or details.get("Provider") != "delta"
            or not (Path(target) / "_delta_log").is_dir()):
        return None
    return BatchMeta.from_commit(DeltaTableRef(target).latest_commit())


def relation_type(relation: BaseRelation) -> Optional[str]:
    """``materialized_view`` (:func:`published_batch`), ``view``, ``table``, or None when the
    catalog has no such relation."""
    spark = spark_session()
    name = f"{relation.schema}.{relation.identifier}"
    if not spark.catalog.tableExists(name):
        return None
    if published_batch(relation) is not None:
        return "materialized_view"
    return "view" if spark.catalog.getTable(name).tableType == "VIEW" else "table"


def _swap(old: str, new: str) -> staticmethod:
    """dbt's ``swap_*`` hook: the model file's ``materialized='old'`` becomes ``'new'``."""

    def swap(project, relation: BaseRelation) -> None:
        model = get_model_file(project, relation)
        assert f"materialized='{old}'" in model, model
        set_model_file(project, relation, model.replace(f"materialized='{old}'", f"materialized='{new}'"))

    return staticmethod(swap)


class ConsistentStreamMaterializedView:
    """dbt's materialized-view hooks for consistent_stream models over a Delta source."""

    @pytest.fixture(scope="class", autouse=True)
    def seeds(self):
        return {}

    @pytest.fixture(scope="class", autouse=True)
    def models(self):
        yield {
            "sources.yml": SOURCES_YML,
            "my_table.sql": MY_TABLE,
            "my_view.sql": MY_VIEW,
            "my_materialized_view.sql": MY_MATERIALIZED_VIEW,
        }

    @pytest.fixture(scope="function", autouse=True)
    def setup(self, project, my_materialized_view, my_view, my_table):
        """dbt's setup with the source in place of the seed: the source at dbt's seed rows,
        ``my_view`` (which ``my_table`` reads) and the materialized view built from scratch.
        Afterwards every model file a test swapped is restored (dbt's restores only the
        materialized view's: here ``my_table`` reads ``my_view``) and the schema dropped."""
        write_source(project)
        run_dbt(["run", "--models", my_view.identifier, my_materialized_view.identifier, "--full-refresh"])
        models = [my_materialized_view, my_view, my_table]
        initial = {relation.identifier: get_model_file(project, relation) for relation in models}
        yield
        for relation in models:
            set_model_file(project, relation, initial[relation.identifier])
        project.run_sql(f"drop schema if exists {project.test_schema} cascade")

    @staticmethod
    def insert_record(project, table: BaseRelation, record: Tuple[int, int]):
        assert table.identifier == SOURCE, table
        write_deltalake(source_path(project), pa.table({"id": [record[0]], "value": [record[1]]}), mode="append")

    @staticmethod
    def refresh_materialized_view(project, materialized_view: BaseRelation):
        run_dbt(["run", "--models", materialized_view.identifier])

    @staticmethod
    def query_row_count(project, relation: BaseRelation) -> int:
        if relation.identifier == SOURCE:
            return len(source_rows(project))
        return spark_session().table(f"{relation.schema}.{relation.identifier}").count()

    @staticmethod
    def query_relation_type(project, relation: BaseRelation) -> Optional[str]:
        return relation_type(relation)

    # dbt's swaps, from and to materialized='consistent_stream'
    swap_table_to_materialized_view = _swap("table", "consistent_stream")
    swap_view_to_materialized_view = _swap("view", "consistent_stream")
    swap_materialized_view_to_table = _swap("consistent_stream", "table")
    swap_materialized_view_to_view = _swap("consistent_stream", "view")
