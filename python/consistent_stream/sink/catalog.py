"""Show a target Delta table to Spark SQL as ``<schema>.<identifier>``, for ``dbt test``,
``ref()`` and any later session.

The target is registered once as ``CREATE TABLE <schema>.<identifier> USING delta LOCATION
'<target>'`` (delta-spark's catalog, :mod:`consistent_stream.session`). Registering writes
nothing to the table; its schema, descriptions (``persist_docs``: the sink keeps them in the
Delta metadata) and versions come from its log. Every later query reads the newest committed
version, and any session with delta-spark can ask for ``VERSION AS OF n``, ``DESCRIBE
HISTORY`` and ``table_changes(..)``. Each commit is atomic, so a reader always sees one whole
version: the snapshot directories of hard links that a Parquet table needed before delta-spark
was in the session are gone, and an entry made that way is replaced at the next run.

Sources are registered the same way (:func:`publish_source`) when a dbt ``view`` model reads
them, so that Spark can create and query the view: only the catalog entry is written, never
anything inside the source table.

The other way round, :class:`CatalogTables` finds where a source (or a model dbt builds as a
Delta table) named only by its table is: the location its catalog entry gives.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from urllib.parse import unquote

from pyspark.sql import SparkSession

from .. import storage
from ..delta import DeltaTableRef
from ..delta.deltars import as_uri
from ..faults import fault_point
from ..errors import ConfigError
from ..location import fs_path

log = logging.getLogger(__name__)

LEGACY_SNAPSHOTS = "_consistent_stream/snapshots"
"""Where the hard-link snapshot directories of a Parquet catalog entry were kept (removed)."""


def publish_record(home: str) -> str:
    """The file that records our last publish of the target whose directory is ``home``."""
    return os.path.join(home, "_consistent_stream", "published.json")


def is_target(location: str) -> bool:
    """Whether ``location`` (a path or ``file:`` URI, as the catalog shows it) is a target
    this module registered: a Delta table with our publish record in it."""
    path = fs_path(location)
    return storage.exists(publish_record(path)) and storage.is_dir(os.path.join(path, "_delta_log"))


UNREAD = object()
"""The ``entry`` of :func:`publish` when the caller has not read the catalog entry."""


def _registered(spark: SparkSession, name: str, location: str, entry=UNREAD) -> bool:
    """Whether the catalog has ``name`` as the external Delta table at ``location``, the entry
    :func:`publish` makes (as ``entry`` shows it, when the caller read it, else read here).
    Our publish record is not read for that (on an object store a GET every run): an entry at
    the location is what a publish would make, whoever made it. One made without the record
    (by hand, by an older version) is not :func:`is_target` for the dbt adapter, which drops
    it before the next ``dbt run``'s engine registers it again, record and all."""
    if entry is UNREAD:
        entry = catalog_entry(spark, *name.split(".", 1))
    return entry is not None and entry.is_at(location)


def publish(spark: SparkSession, schema: str, identifier: str, table_path: str, home: str | None = None, *,
            entry=UNREAD) -> bool:
    """Register the Delta table at ``table_path`` as ``schema.identifier`` (``USING delta
    LOCATION``) unless the catalog has it so already (:func:`_registered`); returns whether
    it (re)registered, and then records the publish under ``home`` (the table's directory by
    default; :func:`is_target`). An entry of the same name that is not this Delta table
    (a Parquet table over a snapshot directory, as published before delta-spark was in the
    session) is dropped first: only the entry, an external table's files stay. Creates the
    schema when missing. ``entry``: the name's :class:`CatalogEntry` (None: no entry) as the
    caller read it earlier in the same run, e.g. from dbt's relation cache; the catalog is
    then not asked again when it is this table."""
    home = home or table_path
    name = f"{schema}.{identifier}"
    location = as_uri(table_path)
    if _registered(spark, name, location, entry):
        return False
    fq = f"`{schema}`.`{identifier}`"
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS `{schema}`")
    fault_point("publishing")
    drop_entry(spark, schema, identifier)   # (any entry of the name: it reads it, and drops it when there)
    spark.sql(f"CREATE TABLE {fq} USING delta LOCATION '{_escaped(location)}'")
    storage.remove_tree(os.path.join(home, LEGACY_SNAPSHOTS), ignore_errors=True)
    storage.replace_text(publish_record(home), json.dumps({"table": name, "location": location, "provider": "delta"}))
    return True


@dataclass(frozen=True)
class CatalogEntry:
    """What the metastore holds for a name, read without opening the table: ``kind``
    (``EXTERNAL``, ``MANAGED`` or ``VIEW``), ``provider`` (``delta``, ``parquet``, ...; None for a
    view) and ``location`` (a URI as ``SHOW TABLE EXTENDED`` prints it, escapes decoded: a
    ``file:`` URI's :func:`fs_path` is the path; None for a view)."""
    kind: str
    provider: str | None
    location: str | None

    def location_exists(self) -> bool:
        """Whether the entry's location still holds its table: a Delta log for a Delta table
        (what Spark opens; a prefix left with a directory marker of S3A holds none), anything
        for another provider. False for a location deleted after the entry was made (a bucket
        prefix cleaned up, a directory removed by hand, a restored metastore)."""
        if not self.location:
            return False
        path = fs_path(self.location)
        if self.provider == "delta":
            return storage.is_dir(os.path.join(path, "_delta_log"))
        return storage.exists(path)

    @classmethod
    def from_information(cls, information: str) -> "CatalogEntry":
        """The entry as ``SHOW TABLE EXTENDED``'s ``information`` column describes it (``Type``,
        ``Provider`` and ``Location`` lines; dbt-spark keeps it on its relations), or the text of
        Spark's ``CatalogTable``, which prints the same lines. Their order is fixed: ``Type`` and
        ``Provider`` come before any value that may hold a line break (a comment, the table's
        properties, a view's text), ``Location`` after the comment and the properties, so the
        first line of each of the two and the last ``Location`` line are the entry's own."""
        first: dict[str, str] = {}
        last: dict[str, str] = {}
        for line in information.splitlines():
            if ": " in line:
                name, value = line.split(": ", 1)
                first.setdefault(name, value)
                last[name] = value
        return cls(kind=first.get("Type", "").upper(),
                   provider=first["Provider"].lower() if first.get("Provider") else None,
                   location=last.get("Location"))

    @property
    def external_delta(self) -> bool:
        """Whether the entry is an external Delta table with a location."""
        return self.kind == "EXTERNAL" and self.provider == "delta" and bool(self.location)

    def is_at(self, location: str) -> bool:
        """Whether the entry is an external Delta table at ``location`` (a path or URI)."""
        return self.external_delta and fs_path(self.location).rstrip("/") == fs_path(location).rstrip("/")

    def is_target(self) -> bool:
        """Whether the entry is a target this module registered (:func:`is_target`)."""
        return self.external_delta and is_target(self.location)


def catalog_entry(spark: SparkSession, schema: str, identifier: str) -> CatalogEntry | None:
    """The metastore entry ``schema.identifier``, or None when there is none (nor its schema).
    Read from the metastore alone, never opening a Delta table's log (unlike
    ``spark.catalog.tableExists``, ``DESCRIBE`` or delta-spark's catalog), so it answers for an
    entry whose location is gone. A classic session asks its external catalog (Hive's, or the
    in-memory one) directly through the JVM: ``databaseExists``, ``tableExists`` and
    ``getTable``, a few py4j calls; over Spark Connect, where there is no JVM here, it reads
    ``SHOW TABLE EXTENDED``, which prints the entry's type, provider and location (the same
    fields: ``CatalogTable``'s), at the cost of a SQL statement's parse, plan and collect."""
    from ..connect import is_connect
    if not is_connect(spark):
        return _external_catalog_entry(spark, schema, identifier)
    try:
        rows = spark.sql(f"SHOW TABLE EXTENDED IN `{schema}` LIKE '{_escaped(identifier)}'").collect()
    except Exception as e:  # AnalysisException (classic or Connect): a schema that does not exist
        if "SCHEMA_NOT_FOUND" in str(e) or "NoSuchNamespace" in str(e) or "NoSuchDatabase" in str(e):
            return None
        raise
    for r in rows:
        if r["tableName"].lower() == identifier.lower() and not r["isTemporary"]:
            return CatalogEntry.from_information(r["information"])
    return None


def _external_catalog_entry(spark: SparkSession, schema: str, identifier: str) -> CatalogEntry | None:
    """:func:`catalog_entry` through a classic session's ``ExternalCatalog`` (Spark's
    ``sharedState.externalCatalog``: the metastore behind ``spark_catalog``, with Spark's
    listener events, as ``SHOW TABLE EXTENDED`` reads it). Names are lower-cased as Spark's
    session catalog does for a case-insensitive analysis (the default; Hive keeps them so).

    Every run of a model asks this once (:func:`publish`), and each py4j call is a round trip
    to the JVM: the type and provider are read from the ``CatalogTable``'s text (the lines
    ``SHOW TABLE EXTENDED`` prints), and only the location is asked for, as a ``URI``, whose
    escapes are decoded as Spark's ``CatalogUtils.URIToString`` decodes them for that
    printout (a directory ``a dir%20x`` is ``a%20dir%2520x`` in the URI): the location then
    reads the same as over Spark Connect, and :func:`fs_path` of it is the table's path. Its
    printed line is not used, since a value printed before it (a comment) may hold such a
    line."""
    case_sensitive = spark.conf.get("spark.sql.caseSensitive", "false").lower() == "true"
    db, name = (schema, identifier) if case_sensitive else (schema.lower(), identifier.lower())
    external = spark._jsparkSession.sharedState().externalCatalog()
    try:
        table = external.getTable(db, name)
        text = table.toString()
    except Exception as e:  # py4j's Java error, or PySpark's AnalysisException converted from it
        if any(s in str(e) for s in ("NoSuchTableException", "NoSuchDatabaseException", "TABLE_OR_VIEW_NOT_FOUND",
                                     "SCHEMA_NOT_FOUND")):
            return None
        raise
    printed = CatalogEntry.from_information(text)
    location = None
    if printed.kind != "VIEW" and printed.location:
        try:
            location = unquote(table.location().toString())
        except Exception as e:  # noqa: BLE001  (a "Location" line of a value, on an entry without one)
            log.debug("catalog entry %s.%s has no location: %s", db, name, e)
    return CatalogEntry(kind=printed.kind, provider=printed.provider, location=location)


def drop_entry(spark: SparkSession, schema: str, identifier: str) -> None:
    """Drop the metastore entry ``schema.identifier`` (an external table's files stay; a
    managed table's are deleted where they still exist). ``DROP TABLE`` (``DROP VIEW`` for a
    view) drops an entry whose location is gone without opening its table."""
    entry = catalog_entry(spark, schema, identifier)
    if entry is not None:
        spark.sql(f"DROP {'VIEW' if entry.kind == 'VIEW' else 'TABLE'} IF EXISTS `{schema}`.`{identifier}`")


def _escaped(text: str) -> str:
    """``text`` inside a Spark SQL string literal."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def publish_source(spark: SparkSession, source, warehouse_dir: str) -> int:
    """Register a ``format: delta`` source (a :class:`~consistent_stream.sources.SourceSpec`)
    as its dbt relation (``schema.table``, ``USING delta LOCATION``), for a dbt ``view``
    model that reads it; Spark then reads its newest version. Returns that version. Raises
    ConfigError for other formats (a Debezium table is a changelog, not a table Spark can
    read)."""
    from ..errors import ConfigError
    if source.format != "delta":
        raise ConfigError(f"source {source.key} (format: {source.format}) cannot be read by a dbt view: Spark "
                          f"reads only Delta sources; make the view model ephemeral, or a consistent_stream model")
    parts = source.relation_parts
    schema, identifier = parts[-2] if len(parts) > 1 else "default", parts[-1]
    version = DeltaTableRef(source.location).latest_version()
    home = os.path.join(warehouse_dir, "consistent_stream_sources", schema, identifier)
    publish(spark, schema, identifier, source.location, home)
    return version


# ---- sources and models named only by their table ----------------------------------------------
# A dbt project's sources.yml names a schema and a table (source('shop', 'orders') renders
# shop.orders), and a table, incremental, snapshot or seed model with file_format: delta is a
# table in the catalog too; the path of its Delta log is what the catalog knows.

SESSION_CATALOG = "spark_catalog"


class CatalogTables:
    """Resolves table names to Delta table locations through ``spark``'s catalogs, each name
    once per instance (one dbt invocation's model): for ``schema.table`` and
    ``spark_catalog.schema.table`` the session catalog's metastore entry (:func:`catalog_entry`:
    a few py4j calls, the table's log never opened), for a table of another catalog configured
    in the session (``spark.sql.catalog.<name>``) ``DESCRIBE TABLE EXTENDED``, whose ``Provider``
    and ``Location`` rows every v2 catalog fills. Anything that is not a Delta table with a
    location is refused, naming it, what it is and what is read. Passed to
    :meth:`consistent_stream.sources.SourceSpec.from_dbt` as its ``catalog``."""

    def __init__(self, spark):
        self.spark = spark
        self._found: dict[tuple, str] = {}

    def location(self, parts: tuple, label: str) -> str:
        """The location (a path, or an object store URI) of the Delta table named ``parts``
        (``(table,)``, ``(schema, table)`` or ``(catalog, schema, table)``, lower case: a dbt
        relation's parts, :func:`consistent_stream.sources.spec.normalize_relation`). ``label``
        names the dbt node in errors. Raises ConfigError when the catalog has no such table, or
        it is a view or not a Delta table."""
        parts = self.qualified(parts)
        if parts not in self._found:
            self._found[parts] = self._lookup(parts, label)
        return self._found[parts]

    def qualified(self, parts: tuple) -> tuple:
        """``parts`` as ``(catalog, schema, table)`` (a name without a catalog is the session
        catalog's, ``spark_catalog``; without a schema, the current one's)."""
        parts = tuple(parts)
        if len(parts) == 1:
            parts = (self.spark.catalog.currentDatabase().lower(), *parts)
        return (SESSION_CATALOG, *parts) if len(parts) == 2 else parts

    def _lookup(self, parts: tuple, label: str) -> str:
        if parts[0] == SESSION_CATALOG:
            kind, provider, where = _described(catalog_entry(self.spark, parts[-2], parts[-1]))
        else:
            kind, provider, where = self._describe(parts)
        name = ".".join(parts[1:] if parts[0] == SESSION_CATALOG else parts)
        if kind is None:
            raise ConfigError(f"{label}: Spark's catalog has no table {name}. Create "
                              f"the table, check the source's schema and identifier (or the model's), or give its "
                              f"path as meta.consistent_stream.location")
        if kind == "VIEW":
            raise ConfigError(f"{label}: {name} is a view in Spark's catalog; consistent_stream reads Delta tables "
                              f"as changelogs. Read the tables under the view (a dbt view model over sources is "
                              f"expanded), or give a Delta table's path as meta.consistent_stream.location")
        if provider != "delta" or not where:
            raise ConfigError(f"{label}: {name} is a {provider or 'non-Delta'} table in Spark's catalog, not a "
                              f"Delta table; consistent_stream reads Delta tables (with or without the Change Data "
                              f"Feed), Debezium change events (format: debezium) and Kafka topics (format: kafka). "
                              f"Write it with file_format: delta (USING delta), or point "
                              f"meta.consistent_stream at one of those")
        return fs_path(where) if where.startswith("file:") else where

    def _describe(self, parts: tuple) -> tuple[str | None, str | None, str | None]:
        """(type, provider, location) of a table of a catalog other than the session's, from
        ``DESCRIBE TABLE EXTENDED``; (None, None, None) when there is no such table."""
        quoted = ".".join(f"`{p}`" for p in parts)
        try:
            rows = self.spark.sql(f"DESCRIBE TABLE EXTENDED {quoted}").collect()
        except Exception as e:  # AnalysisException (classic or Connect)
            if any(s in str(e) for s in ("TABLE_OR_VIEW_NOT_FOUND", "NoSuchTable", "SCHEMA_NOT_FOUND",
                                         "NoSuchNamespace", "CATALOG_NOT_FOUND", "not found")):
                return None, None, None
            raise
        info = {str(r[0]).strip(): str(r[1] or "").strip() for r in rows if r[0]}
        kind = info.get("Type", "").upper() or "TABLE"
        return kind, (info.get("Provider") or "").lower() or None, info.get("Location") or None


def _described(entry) -> tuple[str | None, str | None, str | None]:
    if entry is None:
        return None, None, None
    return entry.kind, entry.provider, entry.location
