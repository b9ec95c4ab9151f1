"""The values the Delta interface takes and gives (see ``consistent_stream.delta``), and the
conversions between Spark's, Arrow's and Delta's forms of a table's rows.

Owns: :class:`Txn` (an idempotent transaction), :class:`Commit` (one commit's version, time
and our metadata), :class:`DataFile` (a data file as its add or remove action describes it,
and those actions as delta-rs and the log's JSON take them), :class:`Docs` (dbt's
``persist_docs`` as Delta keeps it), the Arrow forms of a table's schema and rows
(:func:`arrow_schema`, :func:`plain_schema`, :func:`plain_arrow`), a commit's changed rows
from its operation metrics (:func:`changed_rows`), and the quoting of paths (:func:`as_uri`;
identifiers: :func:`consistent_stream.duck.dq`). Values only: nothing here reads or writes a
table, and nothing raises beyond pyarrow's own errors for a cast that cannot be done.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import unquote

import pyarrow as pa
from deltalake.transaction import AddAction, RemoveAction

from ..duck import dq
from .log import log_path

META_PREFIX = "consistent_stream."
"""The prefix of our keys in a commit's metadata (``commitInfo``)."""


def our_metadata(info: Mapping[str, Any]) -> dict[str, Any]:
    """The ``consistent_stream.*`` entries of a commit's info, without the prefix."""
    return {k[len(META_PREFIX):]: v for k, v in info.items() if k.startswith(META_PREFIX)}

@dataclass(frozen=True)
class Txn:
    """An idempotent Delta transaction: ``app_id`` and a monotonically growing ``version``
    (we use the micro-batch id). Delta keeps the latest version per app id in the log."""
    app_id: str
    version: int


@dataclass(frozen=True)
class Commit:
    """One commit of a table: its version, commit time (ms since epoch) and our metadata."""
    version: int
    timestamp_ms: int
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DataFile:
    """One Parquet data file of a Delta table, as its add (or remove) action describes it.

    ``path``: relative to the table root, not URL-encoded; ``size``: bytes; ``num_records``:
    rows; ``partition_values``: partition column -> Delta's string form of the value (None for
    NULL); ``stats``: Delta's JSON statistics (``numRecords``, ``minValues``, ``maxValues``,
    ``nullCount``), "" when unknown; ``deletion_vector``: the action's ``deletionVector``
    descriptor (:mod:`.deletion_vectors`), None when no row of the file is deleted.
    ``num_records`` counts the file's rows, those its deletion vector marks included (Delta's
    ``numRecords``); :attr:`live_records` leaves them out.
    """
    path: str
    size: int
    num_records: int
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    stats: str = ""
    deletion_vector: Mapping[str, Any] | None = None

    @property
    def live_records(self) -> int:
        """Rows of the file its deletion vector does not mark."""
        return self.num_records - int((self.deletion_vector or {}).get("cardinality") or 0)

    def add_action(self) -> AddAction:
        return AddAction(self.path, self.size, dict(self.partition_values), int(time.time() * 1000), True,
                         self.stats or json.dumps({"numRecords": self.num_records}))

    def remove_action(self) -> RemoveAction:
        return RemoveAction(self.path, True, int(time.time() * 1000), self.size, dict(self.partition_values))


def arrow_schema(schema) -> pa.Schema:
    """A Spark schema (``StructType``) in Arrow as Delta stores it: a TIMESTAMP is
    UTC-adjusted microseconds (``timestamp[us, tz=UTC]``), every other type as pyspark maps it."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types :func:`plain_arrow` casts to (plain string/binary)."""
    return plain_arrow(schema.empty_table()).schema


def plain_arrow(table: pa.Table) -> pa.Table:
    """Cast Arrow view and large string/binary types (delta-rs emits views, and rejects
    some of what Spark emits) to plain string/binary."""
    fields = []
    changed = False
    for f in table.schema:
        t = f.type
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            t, changed = pa.string(), True
        elif pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            t, changed = pa.binary(), True
        fields.append(pa.field(f.name, t, f.nullable))
    return table.cast(pa.schema(fields)) if changed else table


@dataclass(frozen=True)
class Docs:
    """dbt's ``persist_docs`` as Delta keeps it: the table's ``description`` (the metaData
    action's) and the columns' comments (``comment`` in each field's metadata, as Spark and
    Delta Lake write ``COMMENT``). ``None`` / missing columns: not managed (kept as they are)."""
    description: str | None = None
    columns: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(description: str | None, fields: list[dict]) -> "Docs":
        """What a table holds: its ``description`` and its columns' comments (``fields``:
        its columns as Delta's schema JSON holds them)."""
        return Docs(description,
                    tuple(sorted((f["name"].lower(), f["metadata"]["comment"]) for f in fields
                                 if (f.get("metadata") or {}).get("comment") is not None)))

    @staticmethod
    def from_dbt(docs: dict | None) -> "Docs | None":
        """From the job spec's ``docs`` (``{description, columns: {name: description}}``)."""
        if not docs:
            return None
        return Docs(docs.get("description") or None,
                    tuple(sorted((str(k).lower(), str(v)) for k, v in (docs.get("columns") or {}).items() if v)))

    def updated(self, wanted: "Docs | None", schema: pa.Schema) -> "Docs":
        """These descriptions with ``wanted``'s set over them, for the columns of ``schema``."""
        names = {f.name.lower() for f in schema}
        columns = {**dict(self.columns), **dict(wanted.columns if wanted else ())}
        return Docs(wanted.description if wanted and wanted.description is not None else self.description,
                    tuple(sorted((k, v) for k, v in columns.items() if k in names)))


def _commented(schema: pa.Schema, docs: Docs | None) -> pa.Schema:
    """``schema`` with each column's comment from ``docs`` in its field metadata."""
    comments = {k.lower(): v for k, v in (docs.columns if docs else ())}
    return pa.schema([f.with_metadata({"comment": comments[f.name.lower()]}) if f.name.lower() in comments else f
                      for f in schema])


def _num_records(stats: str | None) -> int:
    """``numRecords`` of a Delta statistics JSON (0 when absent)."""
    try:
        return int(json.loads(stats).get("numRecords") or 0) if stats else 0
    except (ValueError, AttributeError):
        return 0


def _add_dict(f: DataFile, now_ms: int) -> dict:
    """The log's ``add`` action of data file ``f`` (path in log form, its deletion vector if
    it has one)."""
    out = {"path": log_path(f.path), "partitionValues": dict(f.partition_values), "size": int(f.size),
           "modificationTime": now_ms, "dataChange": True,
           "stats": f.stats or json.dumps({"numRecords": f.num_records})}
    if f.deletion_vector:
        out["deletionVector"] = dict(f.deletion_vector)
    return out


def _remove_dict(f: DataFile, now_ms: int) -> dict:
    """The log's ``remove`` action of data file ``f`` (path in log form, its deletion vector if
    it has one: a remove names the file *and* vector it removes)."""
    out = {"path": log_path(f.path), "deletionTimestamp": now_ms, "dataChange": True,
           "extendedFileMetadata": True, "partitionValues": dict(f.partition_values), "size": int(f.size)}
    if f.deletion_vector:
        out["deletionVector"] = dict(f.deletion_vector)
    return out


INSERTED_METRICS = ("num_added_rows", "num_target_rows_inserted", "numOutputRows", "numTargetRowsInserted")
DELETED_METRICS = ("num_deleted_rows", "num_target_rows_deleted", "numDeletedRows", "numTargetRowsDeleted")
UPDATED_METRICS = ("num_updated_rows", "num_target_rows_updated", "numUpdatedRows", "numTargetRowsUpdated")
"""A commit's operation metrics, by delta-rs' and Delta Spark's names: rows inserted, deleted
and updated."""


def changed_rows(metrics: dict) -> int | None:
    """Change Data Feed rows a commit produced, from its operation metrics (None: unknown)."""
    known = False
    rows = 0
    for names, factor in ((INSERTED_METRICS, 1), (DELETED_METRICS, 1), (UPDATED_METRICS, 2)):
        for n in names:
            if n in metrics:
                known = True
                try:
                    rows += factor * int(metrics[n])
                except (TypeError, ValueError):
                    return None
                break
    return rows if known else None


def _same(cols: list[str]) -> str:
    """Target row ``t`` and source row ``s`` agree on ``cols`` (NULLs equal)."""
    return " AND ".join(f"(t.{dq(c)} IS NOT DISTINCT FROM s.{dq(c)})" for c in cols)


def data_file_path(table_path: str, rel: str) -> str:
    """Where data file ``rel`` (relative to the table root, as the log holds it) of the table
    at ``table_path`` is read from: a local path for a table on the local file system, else
    its URI."""
    if "://" not in table_path:
        return os.path.join(table_path, unquote(rel))
    return as_uri(os.path.join(table_path, "")) + unquote(rel)


def as_uri(path: str) -> str:
    """A local path as a ``file://`` URI (URIs unchanged)."""
    if "://" in path:
        return path
    tail = "/" if path.endswith(os.sep) else ""
    return "file://" + os.path.abspath(path) + tail
