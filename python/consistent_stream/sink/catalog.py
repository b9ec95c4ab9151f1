"""Show a target Delta table to Spark SQL as ``<schema>.<identifier>``, for ``dbt test``,
``ref()`` and any later session.

A local SparkSession cannot read Delta (no Delta jars here), and a directory of Delta files
holds every version's files. So after each commit we publish the version: a directory of hard
links to exactly that version's data files, registered as an external Parquet table
(``ALTER TABLE .. SET LOCATION``). Readers always see one whole committed version; the two
newest snapshot directories are kept so a reader in flight is not cut off.

Sources are published the same way (:func:`publish_source`) when a dbt ``view`` model reads
them, so that Spark can create and query the view; their snapshot directories live under the
warehouse (``consistent_stream_sources/<schema>/<table>``), never inside the source table.
"""
from __future__ import annotations

import os
import shutil
from urllib.parse import unquote

from pyspark.sql import SparkSession

from ..delta import DeltaTableRef, Docs
from ..faults import fault_point
from ..spec import replace_text

SNAPSHOTS = "_consistent_stream/snapshots"
KEEP = 2


def _ddl(schema, comments: dict[str, str]) -> str:
    """Column definitions, with ``comments`` (lower-case column name -> comment)."""
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" +
                     (f" COMMENT {_literal(comments[f.name.lower()])}" if f.name.lower() in comments else "")
                     for f in schema.fields)


def stale_partition_docs(spark: SparkSession, schema: str, identifier: str, docs: Docs | None,
                         partition_by: list[str]) -> bool:
    """Whether ``docs`` give a partition column of ``schema.identifier`` a comment other than
    the catalog's: Spark cannot ALTER a partition column, so :func:`publish` re-registers the
    table."""
    parts = {c.lower() for c in partition_by}
    wanted = {k: v for k, v in (docs.columns if docs else ()) if k in parts}
    if not wanted or not spark.catalog.tableExists(f"{schema}.{identifier}"):
        return False
    comments = _column_comments(spark, schema, identifier)
    return any(comments[c][1] != v for c, v in wanted.items() if c in comments)


def _column_comments(spark: SparkSession, schema: str, identifier: str) -> dict[str, tuple[str, str | None]]:
    """The catalog's columns of ``schema.identifier``: lower-case name -> (name, comment or
    None), from the table's schema (the comments are its fields' ``comment`` metadata).
    ``spark.catalog.listColumns`` gives the same in 0.15-0.4 s a call on this machine, the
    schema in 10-20 ms, and both ran on every run of a model with ``persist_docs``."""
    return {f.name.lower(): (f.name, f.metadata.get("comment") or None)
            for f in spark.table(f"`{schema}`.`{identifier}`").schema.fields}


def snapshot_dir(home: str, version: int) -> str:
    return os.path.join(home, SNAPSHOTS, f"v{version:020d}")


def _marker(home: str) -> str:
    return os.path.join(home, "_consistent_stream", "published.json")


def published(spark: SparkSession, schema: str, identifier: str, table_path: str, version: int,
              home: str | None = None) -> bool:
    """Whether ``schema.identifier`` already shows ``version`` of the table (our last publish
    recorded it under ``home``, the table's directory by default, and the catalog has it)."""
    import json
    try:
        with open(_marker(home or table_path)) as f:
            m = json.load(f)
    except (OSError, ValueError):
        return False
    if m.get("version") != version or m.get("table") != f"{schema}.{identifier}":
        return False
    return spark.catalog.tableExists(f"{schema}.{identifier}")


def publish(spark: SparkSession, schema: str, identifier: str, table_path: str, version: int,
            partition_by: list[str], home: str | None = None, docs: Docs | None = None,
            table: DeltaTableRef | None = None) -> str:
    """Register ``table_path`` at ``version`` as ``schema.identifier``; returns the
    snapshot directory (under ``home``, the table's directory by default). Creates the schema
    when missing, re-creates the table when its columns (or a partition column's comment in
    ``docs``, see :func:`apply_docs`) changed; a table created here gets ``docs``'
    descriptions. ``table``: the caller's handle of ``table_path``, if it has one."""
    home = home or table_path
    table = table if table is not None else DeltaTableRef(table_path)
    snap = snapshot_dir(home, version)
    if not os.path.isdir(snap):
        tmp = snap + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        actions = table.add_actions(version)
        for i, a in enumerate(actions.to_pylist()):
            rel = unquote(a["path"])
            # Hive-style partition directories from the add action's partition values (the
            # file itself may live anywhere in the table), one level per partition column
            parts = [f"{c}={_hive_escape(a.get(f'partition.{c}'))}" for c in partition_by]
            dst = os.path.join(tmp, *parts, f"{i:06d}-{os.path.basename(rel)}")
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                os.link(os.path.join(table_path, rel), dst)
            except OSError:   # another file system (a source outside the warehouse's)
                shutil.copyfile(os.path.join(table_path, rel), dst)
        os.makedirs(tmp, exist_ok=True)
        fault_point("publishing")
        os.replace(tmp, snap)
    from pyspark.sql.pandas.types import from_arrow_schema
    from ..delta.deltars import plain_arrow
    spark_schema = from_arrow_schema(plain_arrow(table.arrow_schema(version).empty_table()).schema)
    fq = f"`{schema}`.`{identifier}`"
    exists = spark.catalog.tableExists(f"{schema}.{identifier}")
    if not exists:
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS `{schema}`")
    fault_point("publishing")
    if exists:
        current = spark.table(fq).schema
        same = [(f.name.lower(), f.dataType) for f in current.fields] == \
               [(f.name.lower(), f.dataType) for f in _reorder(spark_schema, partition_by).fields]
        if not same or stale_partition_docs(spark, schema, identifier, docs, partition_by):
            spark.sql(f"DROP TABLE {fq}")
            exists = False
    loc = "file://" + os.path.abspath(snap) if "://" not in snap else snap
    if not exists:
        parts = f" PARTITIONED BY ({', '.join(f'`{c}`' for c in partition_by)})" if partition_by else ""
        comment = f" COMMENT {_literal(docs.description)}" if docs and docs.description is not None else ""
        columns = _ddl(spark_schema, dict(docs.columns) if docs else {})
        spark.sql(f"CREATE TABLE {fq} ({columns}) USING parquet{parts}{comment} LOCATION '{loc}'")
    else:
        spark.sql(f"ALTER TABLE {fq} SET LOCATION '{loc}'")
    if partition_by:
        spark.sql(f"ALTER TABLE {fq} RECOVER PARTITIONS")
        spark.sql(f"REFRESH TABLE {fq}")
    # else SET LOCATION has refreshed the table itself (its cached files and data): a
    # separate REFRESH TABLE cost 30-35 ms of every run on a slow day
    _cleanup(home)
    import json
    replace_text(_marker(home), json.dumps({"version": version, "table": f"{schema}.{identifier}"}))
    return snap


def _literal(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def apply_docs(spark: SparkSession, schema: str, identifier: str, docs: Docs | None,
               partition_by: list[str] | tuple[str, ...] = ()) -> list[str]:
    """dbt's ``persist_docs`` in the catalog: set ``schema.identifier``'s comment to
    ``docs.description`` and its columns' comments to ``docs.columns`` (lower-case name,
    description) where they differ (``COMMENT ON TABLE``, ``ALTER TABLE .. CHANGE COLUMN ..
    COMMENT``, as dbt-spark does). Columns the table does not have are skipped, and so are
    its ``partition_by`` columns, which Spark cannot alter (:func:`publish` re-creates the
    table for them: :func:`stale_partition_docs`). Returns the statements run; none without
    ``docs``."""
    if not docs:
        return []
    fq = f"`{schema}`.`{identifier}`"
    name = f"{schema}.{identifier}"
    statements = []
    description = docs.description
    if description is not None and (spark.catalog.getTable(name).description or None) != description:
        statements.append(f"COMMENT ON TABLE {fq} IS {_literal(description)}")
    wanted = dict(docs.columns)
    parts = {c.lower() for c in partition_by}
    for key, (column, current) in _column_comments(spark, schema, identifier).items():
        comment = wanted.get(key)
        if comment is not None and key not in parts and current != comment:
            statements.append(f"ALTER TABLE {fq} CHANGE COLUMN `{column}` COMMENT {_literal(comment)}")
    for statement in statements:
        spark.sql(statement)
    return statements


def publish_source(spark: SparkSession, source, warehouse_dir: str) -> int:
    """Register a ``format: delta`` source (a :class:`~consistent_stream.sources.SourceSpec`)
    at its latest version as its dbt relation (``schema.table``), for a dbt ``view`` model
    that reads it. Returns the version published. Raises ConfigError for other formats (a
    Debezium table is a changelog, not a table Spark can read)."""
    from ..errors import ConfigError
    if source.format != "delta":
        raise ConfigError(f"source {source.key} (format: {source.format}) cannot be read by a dbt view: Spark "
                          f"reads only Delta sources' snapshots; make the view model ephemeral, or a "
                          f"consistent_stream model")
    parts = source.relation_parts
    schema, identifier = parts[-2] if len(parts) > 1 else "default", parts[-1]
    table = DeltaTableRef(source.location)
    version = table.latest_version()
    home = os.path.join(warehouse_dir, "consistent_stream_sources", schema, identifier)
    if not published(spark, schema, identifier, source.location, version, home):
        publish(spark, schema, identifier, source.location, version, table.partition_columns(), home)
    return version


def _hive_escape(value) -> str:
    """A partition value as Spark names its directory (``ExternalCatalogUtils.escapePathName``)."""
    if value is None:
        return "__HIVE_DEFAULT_PARTITION__"
    import datetime
    if isinstance(value, datetime.datetime):
        text = value.isoformat(sep=" ")
    elif isinstance(value, datetime.date):
        text = value.isoformat()
    else:
        text = str(value)
    special = set('"#%\'*/:=?\\\x7f{[]^')
    return "".join(f"%{ord(ch):02X}" if ch in special or ord(ch) < 0x20 else ch for ch in text)


def _reorder(schema, partition_by):
    from pyspark.sql.types import StructType
    parts = [f for f in schema.fields if f.name in partition_by]
    return StructType([f for f in schema.fields if f.name not in partition_by] + parts)


def _cleanup(table_path: str) -> None:
    root = os.path.join(table_path, SNAPSHOTS)
    dirs = sorted(d for d in os.listdir(root) if d.startswith("v") and not d.endswith(".tmp"))
    for d in dirs[:-KEEP]:
        shutil.rmtree(os.path.join(root, d), ignore_errors=True)
