"""A source or upstream model named only by its table in Spark's catalog: where its Delta
table is.

A dbt project's ``sources.yml`` names a schema and a table (``source('shop', 'orders')``
renders ``shop.orders``), and a ``table``, ``incremental``, ``snapshot`` or ``seed`` model
with ``file_format: delta`` is a table in the catalog too; the path of its Delta log is what
the catalog knows. :class:`CatalogTables` asks it: for ``schema.table`` and
``spark_catalog.schema.table`` the session catalog's metastore entry
(:func:`consistent_stream.sink.catalog.catalog_entry`: a few py4j calls, the table's log never
opened), for a table of another catalog configured in the session
(``spark.sql.catalog.<name>``) ``DESCRIBE TABLE EXTENDED``, whose ``Provider`` and ``Location``
rows every v2 catalog fills. Anything that is not a Delta table with a location is refused,
naming it, what it is and what is read.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..location import fs_path
from .spec import normalize_relation

SESSION_CATALOG = "spark_catalog"


class CatalogTables:
    """Resolves table names to Delta table locations through ``spark``'s catalogs, each name
    once per instance (one dbt invocation's model)."""

    def __init__(self, spark):
        self.spark = spark
        self._found: dict[tuple, str] = {}

    def location(self, relation: str, label: str) -> str:
        """The location (a path, or an object store URI) of the Delta table ``relation``
        (``table``, ``schema.table`` or ``catalog.schema.table``, as dbt renders it).
        ``label`` names the dbt node in errors. Raises ConfigError when the catalog has no
        such table, or it is a view or not a Delta table."""
        parts = normalize_relation(relation)
        if parts not in self._found:
            self._found[parts] = self._lookup(parts, relation, label)
        return self._found[parts]

    def qualified(self, relation: str) -> str:
        """``relation`` as ``catalog.schema.table`` (lower case; a name without a catalog is
        the session catalog's, ``spark_catalog``; without a schema, the current one's)."""
        parts = normalize_relation(relation)
        if len(parts) == 1:
            parts = (self.spark.catalog.currentDatabase().lower(), *parts)
        return ".".join((SESSION_CATALOG, *parts) if len(parts) == 2 else parts)

    def _lookup(self, parts: tuple, relation: str, label: str) -> str:
        parts = tuple(self.qualified(relation).split("."))
        if parts[0] == SESSION_CATALOG:
            from ..sink.catalog import catalog_entry
            kind, provider, where = _described(catalog_entry(self.spark, parts[-2], parts[-1]))
        else:
            kind, provider, where = self._describe(parts)
        name = ".".join(parts[1:] if parts[0] == SESSION_CATALOG else parts)
        if kind is None:
            raise ConfigError(f"{label}: Spark's catalog has no table {name} ({relation} as dbt renders it). Create "
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
