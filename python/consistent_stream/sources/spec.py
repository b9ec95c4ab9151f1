"""Source specifications (from dbt sources: their ``meta.consistent_stream``, or their table in Spark's
catalog) and cuts."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .. import location
from ..errors import ConfigError

SUPPORTED_FORMATS = ("delta", "debezium", "kafka")
KAFKA_KEYS = ("bootstrap_servers", "topic", "transaction_topic", "consistency", "columns", "driver_read_records")
CONSISTENCY = ("transaction", "per_topic")
REF_SOURCE_NAME = "ref"
"""The ``source_name`` of a model dbt builds as a Delta table (``table``, ``incremental``,
``snapshot``, ``seed``) that a model reads through ``ref()``: keyed ``ref.<model>``."""


def normalize_relation(relation: str) -> tuple[str, ...]:
    """``'`db`.`t`'``, ``'db.t'`` or ``'"db"."t"'`` -> ('db', 't'), lower-cased parts."""
    import sqlglot
    from sqlglot import exp

    tbl = sqlglot.parse_one(relation.strip(), read="spark", into=exp.Table)
    parts = [p.name.lower() for p in tbl.parts]
    return tuple(parts)


@dataclass(frozen=True)
class SourceSpec:
    """One changelog source of a model.

    ``name``: the dbt source's table name; ``relation``: how ``source()`` renders it in the
    compiled SQL; ``location``: absolute path of the Delta table, or for ``format: debezium``
    of the CDC landing directory, or for ``format: kafka`` ``kafka://<bootstrap servers>/<topic>``;
    ``table``: (debezium, kafka) the captured table, ``schema.table`` as in Debezium's
    ``source`` block; ``primary_key``: the source table's key columns (may be empty when
    unknown); ``options``: format-specific settings as sorted (key, JSON value) pairs (kafka:
    ``bootstrap_servers``, ``topic``, ``transaction_topic``, ``consistency``, ``columns``,
    ``driver_read_records``; see
    :mod:`consistent_stream.sources.kafka`); ``catalog_table``: the table
    (``catalog.schema.table``, lower case) whose catalog entry gave ``location``, empty when
    the YAML gave it.
    """
    name: str
    relation: str
    location: str
    format: str = "delta"
    primary_key: tuple[str, ...] = ()
    source_name: str = ""
    table: str = ""
    options: tuple = ()
    catalog_table: str = ""

    def option(self, key: str, default=None):
        """The format-specific setting ``key`` (decoded), or ``default``."""
        for k, v in self.options:
            if k == key:
                return json.loads(v)
        return default

    @property
    def relation_parts(self) -> tuple[str, ...]:
        return normalize_relation(self.relation)

    @property
    def key(self) -> str:
        """Stable name used in cuts and state: ``<source_name>.<name>``."""
        return f"{self.source_name}.{self.name}" if self.source_name else self.name

    @staticmethod
    def from_json(d: dict) -> "SourceSpec":
        """The spec whose fields are ``d`` (``dataclasses.asdict`` of one, as ``job.json`` holds
        them; ``primary_key`` a list there)."""
        return SourceSpec(**{**d, "primary_key": tuple(d.get("primary_key", ())),
                             "options": tuple(tuple(o) for o in d.get("options", ()))})

    @staticmethod
    def from_dbt(d: dict, project_root: str, catalog=None) -> "SourceSpec":
        """Build from the dict the materialization passes (source_name, name, relation, meta,
        primary_key: the key dbt's ``constraints`` declare on the table's columns, if any).

        A Delta source without ``meta.consistent_stream.location`` (or without
        ``meta.consistent_stream`` at all) is the table the relation names in Spark's catalog:
        ``catalog`` (a :class:`~consistent_stream.sink.catalog.CatalogTables`) gives its
        location. The primary key is ``meta.consistent_stream.primary_key``, else the
        constraints' key, else none (the source is a bag).

        Raises ConfigError naming the source and the YAML key when meta is incomplete, and
        when a source has no location and no catalog is at hand to look it up."""
        label = (f"ref('{d.get('name')}')" if d.get("source_name") == REF_SOURCE_NAME
                 else f"source('{d.get('source_name')}', '{d.get('name')}')")
        meta = d.get("meta") or {}
        if not isinstance(meta, dict):
            raise ConfigError(f"{label}: meta.consistent_stream must be a mapping (format, location, primary_key, ..)")
        fmt = str(meta.get("format", "delta")).lower()
        if fmt not in SUPPORTED_FORMATS:
            raise ConfigError(f"{label}: meta.consistent_stream.format is {fmt!r}; "
                              f"accepted values: {', '.join(SUPPORTED_FORMATS)}")
        if fmt == "kafka":
            return SourceSpec._kafka(d, meta, label)
        loc = meta.get("location")
        catalog_table = ""
        if not loc and fmt == "delta":
            if catalog is None:
                raise ConfigError(f"{label}: meta.consistent_stream.location is not set and there is no Spark "
                                  f"session to look {d.get('relation')} up in its catalog; give the Delta table's "
                                  f"path as meta.consistent_stream.location")
            parts = normalize_relation(d["relation"])
            loc = catalog.location(parts, label)
            catalog_table = ".".join(catalog.qualified(parts))
        if not loc:
            raise ConfigError(f"{label}: meta.consistent_stream.location is required for format: {fmt} (the landing "
                              f"directory of the captured tables)")
        table = ""
        if fmt == "debezium":
            table = str(meta.get("table") or "")
            if not table or "." not in table:
                raise ConfigError(f"{label}: meta.consistent_stream.table is required for format: debezium: the "
                                  f"captured table as schema.table, e.g. table: public.{d.get('name')}")
        loc = location.normalize(str(loc), project_root, key=f"{label}: meta.consistent_stream.location")
        pk = meta.get("primary_key") or d.get("primary_key") or []
        if isinstance(pk, str):
            pk = [pk]
        if not isinstance(pk, list) or not all(isinstance(c, str) for c in pk):
            raise ConfigError(f"{label}: meta.consistent_stream.primary_key must be a column name or a list of them")
        return SourceSpec(name=d["name"], relation=d["relation"], location=loc, format=fmt,
                          primary_key=tuple(c.lower() for c in pk), source_name=d.get("source_name", ""),
                          table=table, catalog_table=catalog_table)


    @staticmethod
    def _kafka(d: dict, meta: dict, label: str) -> "SourceSpec":
        """The spec of a ``format: kafka`` source (Debezium change events on a Kafka topic)."""
        unknown = sorted(set(meta) - set(KAFKA_KEYS) - {"format", "primary_key", "table"})
        if unknown:
            raise ConfigError(f"{label}: meta.consistent_stream has keys {unknown} that format: kafka does not know; "
                              f"known: {', '.join(KAFKA_KEYS + ('primary_key', 'table'))}")
        servers = str(meta.get("bootstrap_servers") or "").strip()
        topic = str(meta.get("topic") or "").strip()
        for key, value in (("bootstrap_servers", servers), ("topic", topic)):
            if not value:
                raise ConfigError(f"{label}: meta.consistent_stream.{key} is required for format: kafka "
                                  f"(e.g. bootstrap_servers: host:9092, topic: <topic.prefix>.public.{d.get('name')})")
        parts = topic.split(".")
        table = str(meta.get("table") or ("." .join(parts[-2:]) if len(parts) >= 3 else ""))
        if "." not in table:
            raise ConfigError(f"{label}: meta.consistent_stream.table is required when the topic {topic!r} is not "
                              f"named <topic.prefix>.<schema>.<table> (Debezium's default): table: schema.table")
        tx_topic = str(meta.get("transaction_topic") or f"{parts[0]}.transaction")
        consistency = str(meta.get("consistency") or "transaction").lower()
        if consistency not in CONSISTENCY:
            raise ConfigError(f"{label}: meta.consistent_stream.consistency is {consistency!r}; accepted values: "
                              f"{', '.join(CONSISTENCY)}")
        columns = meta.get("columns") or {}
        if not isinstance(columns, dict) or not all(isinstance(v, str) for v in columns.values()):
            raise ConfigError(f"{label}: meta.consistent_stream.columns must map column names to types, "
                              f"e.g. {{aid: int, abalance: int, filler: string}}")
        pk = meta.get("primary_key") or []
        pk = [pk] if isinstance(pk, str) else pk
        if not isinstance(pk, list) or not all(isinstance(c, str) for c in pk):
            raise ConfigError(f"{label}: meta.consistent_stream.primary_key must be a column name or a list of them")
        options = {"bootstrap_servers": servers, "topic": topic, "transaction_topic": tx_topic,
                   "consistency": consistency, "columns": {str(k).lower(): v for k, v in columns.items()}}
        if meta.get("driver_read_records") is not None:
            n = meta["driver_read_records"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ConfigError(f"{label}: meta.consistent_stream.driver_read_records is {n!r}; it takes a whole "
                                  f"number of Kafka records >= 0 (0: every read through Spark's Kafka source)")
            options["driver_read_records"] = n
        return SourceSpec(name=d["name"], relation=d["relation"], location=f"kafka://{servers}/{topic}",
                          format="kafka", primary_key=tuple(c.lower() for c in pk),
                          source_name=d.get("source_name", ""), table=table,
                          options=tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in options.items())))


INITIAL = -1
"""Cut position before a source's first version: the first batch reads its snapshot."""


@dataclass(frozen=True)
class Cut:
    """The source positions a micro-batch ends at: source key -> position (a Delta version,
    or for Debezium sources a transaction position: the LSN just past a commit, as an int, the
    same for every table of one landing directory).

    A position of -1 (INITIAL) means nothing read yet.
    """
    versions: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.versions, sort_keys=True)

    @staticmethod
    def from_json(s: str | dict) -> "Cut":
        d = json.loads(s) if isinstance(s, str) else s
        return Cut({k: int(v) for k, v in d.items()})

    def is_initial(self) -> bool:
        return all(v == INITIAL for v in self.versions.values())
