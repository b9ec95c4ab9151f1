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
from urllib.parse import unquote

from pyspark.sql import SparkSession

from ..delta import DeltaTableRef, Docs
from ..faults import fault_point
from .. import storage

SNAPSHOTS = "_consistent_stream/snapshots"
KEEP = 2


def _ddl(schema, comments: dict[str, str]) -> str:
    """Column definitions, with ``comments`` (lower-case column name -> comment)."""
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" +
                     (f" COMMENT {_literal(comments[f.name.lower()])}" if f.name.lower() in comments else "")
                     for f in schema.fields)


class CatalogTable:
    """``schema.identifier`` in Spark's catalog while one version is published: whether it
    exists, its fields (with their comments) and its comment, each looked up at most once.

    Every lookup is a catalog round trip through Py4J (``tableExists``, ``spark.table(..)
    .schema``, ``getTable``), a fixed cost of every run, and a run of a model with
    ``persist_docs`` used to ask up to seven of them for the same table. The statements
    :func:`publish` and :func:`apply_docs` run update or forget what it knows
    (:meth:`dropped`, :meth:`changed`)."""

    _UNKNOWN = object()

    def __init__(self, spark: SparkSession, schema: str, identifier: str):
        self.spark = spark
        self.schema = schema
        self.identifier = identifier
        self._exists: bool | None = None
        self._fields = None
        self._description = self._UNKNOWN

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.identifier}"

    @property
    def quoted(self) -> str:
        return f"`{self.schema}`.`{self.identifier}`"

    def exists(self) -> bool:
        if self._exists is None:
            self._exists = self.spark.catalog.tableExists(self.name)
        return self._exists

    def fields(self) -> list:
        """The table's fields (Spark ``StructField`` objects; the table must exist)."""
        if self._fields is None:
            self._fields = list(self.spark.table(self.quoted).schema.fields)
        return self._fields

    def comments(self) -> dict[str, tuple[str, str | None]]:
        """Lower-case column name -> (name, comment or None): the fields' ``comment``
        metadata. (``spark.catalog.listColumns`` gives the same through a far costlier catalog
        call.)"""
        return {f.name.lower(): (f.name, f.metadata.get("comment") or None) for f in self.fields()}

    def description(self) -> str | None:
        """The table's comment (the table must exist)."""
        if self._description is self._UNKNOWN:
            self._description = self.spark.catalog.getTable(self.name).description or None
        return self._description

    def dropped(self) -> None:
        self._exists, self._fields, self._description = False, None, self._UNKNOWN

    def changed(self) -> None:
        """A statement created or altered the table: what it knew of the table is stale."""
        self._exists, self._fields, self._description = True, None, self._UNKNOWN


def stale_partition_docs(table: CatalogTable, docs: Docs | None, partition_by: list[str]) -> bool:
    """Whether ``docs`` give a partition column of ``table`` a comment other than the
    catalog's: Spark cannot ALTER a partition column, so :func:`publish` re-registers the
    table."""
    parts = {c.lower() for c in partition_by}
    wanted = {k: v for k, v in (docs.columns if docs else ()) if k in parts}
    if not wanted or not table.exists():
        return False
    comments = table.comments()
    return any(comments[c][1] != v for c, v in wanted.items() if c in comments)


def snapshot_dir(home: str, version: int) -> str:
    return os.path.join(home, SNAPSHOTS, f"v{version:020d}")


def _marker(home: str) -> str:
    return os.path.join(home, "_consistent_stream", "published.json")


def _published(table: CatalogTable, home: str, version: int) -> bool:
    """Whether ``table`` already shows ``version`` (our last publish recorded it under
    ``home`` and the catalog has the table)."""
    m = storage.read_json(_marker(home))
    if m is None:
        return False
    return m.get("version") == version and m.get("table") == table.name and table.exists()


def publish(spark: SparkSession, schema: str, identifier: str, table_path: str, version: int,
            partition_by: list[str], home: str | None = None, docs: Docs | None = None,
            table: DeltaTableRef | None = None) -> bool:
    """Show ``version`` of the Delta table at ``table_path`` as ``schema.identifier``, with
    ``docs``' descriptions (dbt's ``persist_docs``), and return whether it was (re)registered:
    not when our last publish (recorded under ``home``, the table's directory by default)
    already showed that version and no partition column's comment changed. ``table``: the
    caller's handle of ``table_path``, if it has one.

    The catalog's table is looked up once (:class:`CatalogTable`) for all the steps:
    :func:`_register` and :func:`apply_docs`."""
    home = home or table_path
    entry = CatalogTable(spark, schema, identifier)
    stale_docs = stale_partition_docs(entry, docs, partition_by)
    fresh = stale_docs or not _published(entry, home, version)
    if fresh:
        _register(entry, table_path, version, partition_by, home, docs,
                  table if table is not None else DeltaTableRef(table_path), recreate=stale_docs)
    apply_docs(entry, docs, partition_by)
    return fresh


def _register(entry: CatalogTable, table_path: str, version: int, partition_by: list[str], home: str,
              docs: Docs | None, table: DeltaTableRef, recreate: bool) -> str:
    """Register ``table_path`` at ``version`` as ``entry``; returns the snapshot directory
    (under ``home``). Creates the schema when missing, re-creates the table when its columns
    changed or ``recreate`` (a partition column's comment in ``docs`` changed:
    :func:`stale_partition_docs`); a table created here gets ``docs``' descriptions."""
    spark = entry.spark
    snap = snapshot_dir(home, version)
    if not storage.is_dir(snap):
        tmp = snap + ".tmp"
        storage.remove_tree(tmp, ignore_errors=True)
        actions = table.add_actions(version)
        for i, a in enumerate(actions.to_pylist()):
            rel = unquote(a["path"])
            # Hive-style partition directories from the add action's partition values (the
            # file itself may live anywhere in the table), one level per partition column
            parts = [f"{c}={_hive_escape(a.get(f'partition.{c}'))}" for c in partition_by]
            dst = os.path.join(tmp, *parts, f"{i:06d}-{os.path.basename(rel)}")
            storage.make_dirs(os.path.dirname(dst))
            storage.link_or_copy(os.path.join(table_path, rel), dst)   # copied: a source on another file system
        storage.make_dirs(tmp)
        fault_point("publishing")
        storage.rename(tmp, snap)
    from pyspark.sql.pandas.types import from_arrow_schema
    spark_schema = from_arrow_schema(table.plain_arrow_schema(version))
    fq = entry.quoted
    if not entry.exists():
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS `{entry.schema}`")
    fault_point("publishing")
    if entry.exists():
        same = [(f.name.lower(), f.dataType) for f in entry.fields()] == \
               [(f.name.lower(), f.dataType) for f in _reorder(spark_schema, partition_by).fields]
        if not same or recreate:
            spark.sql(f"DROP TABLE {fq}")
            entry.dropped()
    loc = "file://" + os.path.abspath(snap) if "://" not in snap else snap
    if not entry.exists():
        parts = f" PARTITIONED BY ({', '.join(f'`{c}`' for c in partition_by)})" if partition_by else ""
        comment = f" COMMENT {_literal(docs.description)}" if docs and docs.description is not None else ""
        columns = _ddl(spark_schema, dict(docs.columns) if docs else {})
        spark.sql(f"CREATE TABLE {fq} ({columns}) USING parquet{parts}{comment} LOCATION '{loc}'")
        entry.changed()
    else:
        spark.sql(f"ALTER TABLE {fq} SET LOCATION '{loc}'")   # same columns and comments
    if partition_by:
        spark.sql(f"ALTER TABLE {fq} RECOVER PARTITIONS")
        spark.sql(f"REFRESH TABLE {fq}")
    # else SET LOCATION has refreshed the table itself (its cached files and data): a
    # separate REFRESH TABLE would be one more catalog statement in every run, for nothing
    _cleanup(home)
    import json
    storage.replace_text(_marker(home), json.dumps({"version": version, "table": entry.name}))
    return snap


def _literal(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def apply_docs(table: CatalogTable, docs: Docs | None, partition_by: list[str] | tuple[str, ...] = ()) -> list[str]:
    """dbt's ``persist_docs`` in the catalog: set ``table``'s comment to ``docs.description``
    and its columns' comments to ``docs.columns`` (lower-case name, description) where they
    differ (``COMMENT ON TABLE``, ``ALTER TABLE .. CHANGE COLUMN .. COMMENT``, as dbt-spark
    does). Columns the table does not have are skipped, and so are its ``partition_by``
    columns, which Spark cannot alter (:func:`publish` re-creates the table for them:
    :func:`stale_partition_docs`). Returns the statements run; none without ``docs``."""
    if not docs:
        return []
    fq = table.quoted
    statements = []
    description = docs.description
    if description is not None and table.description() != description:
        statements.append(f"COMMENT ON TABLE {fq} IS {_literal(description)}")
    wanted = dict(docs.columns)
    parts = {c.lower() for c in partition_by}
    for key, (column, current) in table.comments().items():
        comment = wanted.get(key)
        if comment is not None and key not in parts and current != comment:
            statements.append(f"ALTER TABLE {fq} CHANGE COLUMN `{column}` COMMENT {_literal(comment)}")
    for statement in statements:
        table.spark.sql(statement)
    if statements:
        table.changed()
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
    publish(spark, schema, identifier, source.location, version, table.partition_columns(), home, table=table)
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
    dirs = sorted(d for d in storage.list_dir(root) if d.startswith("v") and not d.endswith(".tmp"))
    for d in dirs[:-KEEP]:
        storage.remove_tree(os.path.join(root, d), ignore_errors=True)
