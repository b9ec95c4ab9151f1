"""A classic Delta checkpoint's rows (the Delta protocol, "Checkpoints", "Checkpoint Schema"):
the Arrow schema, the table :class:`~.log.OwnedLog` writes from its replay's actions and the
actions it reads back, and the key the protocol reconciles files by.

A checkpoint holds every live file and every tombstone not yet past the table's
``delta.deletedFileRetentionDuration``: a week by default, tens of thousands of removes for a
model that commits every second with deletion vectors, written every ``delta.checkpointInterval``
commits (4 on an object store). So the columns are built field by field, not row by row, and the
``remove`` column is built from the previous checkpoint's (:class:`RemoveColumn`): what a
checkpoint costs in Python is then the commits since the last one; the Parquet encoding of the
whole column remains.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _map(t: pa.DataType | None = None) -> pa.DataType:
    """A map from strings to ``t`` (default: strings)."""
    return pa.map_(pa.string(), pa.string() if t is None else t)


_STRINGS = pa.list_(pa.field("element", pa.string(), nullable=False))
_DV = pa.struct([pa.field("storageType", pa.string(), False), pa.field("pathOrInlineDv", pa.string(), False),
                 ("offset", pa.int32()), pa.field("sizeInBytes", pa.int32(), False),
                 pa.field("cardinality", pa.int64(), False)])
CHECKPOINT_SCHEMA = pa.schema([
    ("txn", pa.struct([pa.field("appId", pa.string(), False), pa.field("version", pa.int64(), False),
                       ("lastUpdated", pa.int64())])),
    ("add", pa.struct([pa.field("path", pa.string(), False), pa.field("partitionValues", _map(), False),
                       pa.field("size", pa.int64(), False), pa.field("modificationTime", pa.int64(), False),
                       pa.field("dataChange", pa.bool_(), False), ("stats", pa.string()), ("tags", _map()),
                       ("deletionVector", _DV)])),
    ("remove", pa.struct([pa.field("path", pa.string(), False), ("deletionTimestamp", pa.int64()),
                          pa.field("dataChange", pa.bool_(), False), ("extendedFileMetadata", pa.bool_()),
                          ("partitionValues", _map()), ("size", pa.int64()), ("deletionVector", _DV)])),
    ("metaData", pa.struct([pa.field("id", pa.string(), False), ("name", pa.string()), ("description", pa.string()),
                            pa.field("format", pa.struct([pa.field("provider", pa.string(), False),
                                                          pa.field("options", _map(), False)]), False),
                            pa.field("schemaString", pa.string(), False),
                            pa.field("partitionColumns", _STRINGS, False), ("createdTime", pa.int64()),
                            pa.field("configuration", _map(), False)])),
    ("protocol", pa.struct([pa.field("minReaderVersion", pa.int32(), False),
                            pa.field("minWriterVersion", pa.int32(), False),
                            ("readerFeatures", _STRINGS), ("writerFeatures", _STRINGS)])),
])
"""A classic checkpoint's columns (the Delta protocol, "Checkpoint Schema"): one action per
row, the others NULL. Maps are key/value lists in Parquet, as delta-rs and delta-spark write them."""
REMOVE = CHECKPOINT_SCHEMA.field("remove").type
"""The ``remove`` column's type."""


_MAP_FIELDS = {"add": ("partitionValues", "tags"), "remove": ("partitionValues",),
               "metaData": ("configuration",)}


def file_key(action: dict) -> tuple[str, str]:
    """The key the protocol reconciles an ``add`` or ``remove`` by: its path and its deletion
    vector's ``uniqueId`` ("" without one)."""
    dv = action.get("deletionVector")
    if not dv:
        return action["path"], ""
    offset = dv.get("offset")
    return action["path"], dv["storageType"] + dv["pathOrInlineDv"] + ("" if offset is None else f"@{offset}")


def _dicts(kind: str, action: dict) -> dict:
    """A checkpoint row's action with its maps as dicts (Arrow reads maps as pair lists)."""
    out = dict(action)
    for name in _MAP_FIELDS.get(kind, ()):
        if isinstance(out.get(name), list):
            out[name] = dict(out[name])
    if kind == "metaData" and isinstance((out.get("format") or {}).get("options"), list):
        out["format"] = {**out["format"], "options": dict(out["format"]["options"])}
    return out


def _pairs(value) -> list | None:
    """A map value as the key/value pairs Arrow builds a map column from."""
    return list(value.items()) if isinstance(value, dict) else value


def _action_array(kind: str, actions: list[dict], typ: pa.StructType) -> pa.StructArray:
    """The ``kind`` actions as one struct column of a checkpoint (:data:`CHECKPOINT_SCHEMA`),
    built field by field (a week of tombstones is tens of thousands of rows: building them
    row by row costs several times as much): maps as key/value pairs, fields the protocol
    requires given their empty values (an ``add``'s partition values, a ``metaData``'s
    configuration and format), fields the schema does not know left out."""
    children = []
    for f in typ:
        values = [a.get(f.name) for a in actions]
        if f.name in _MAP_FIELDS.get(kind, ()):
            required = (kind, f.name) in (("add", "partitionValues"), ("metaData", "configuration"))
            values = [[] if v is None and required else _pairs(v) for v in values]
        elif kind == "metaData" and f.name == "format":
            values = [{**(v or {"provider": "parquet"}), "options": _pairs((v or {}).get("options")) or []}
                      for v in values]
        children.append(pa.array(values, type=f.type))
    return pa.StructArray.from_arrays(children, fields=list(typ))


def checkpoint_table(protocol: dict, metadata: dict, txns: list[dict], files: list[dict],
                     tombstones: list[dict] | pa.StructArray | None) -> pa.Table:
    """A classic checkpoint's rows (:data:`CHECKPOINT_SCHEMA`, one action a row, the others
    NULL): the ``protocol``, the ``metadata``, then the ``txn``, ``add`` (``files``) and
    ``remove`` (``tombstones``, or their column built already) actions, as the log holds them
    (maps as dicts). (A NULL action has its required fields filled with empty values, as Arrow
    builds it from None: Parquet's writer refuses NULLs in a required field, even under a NULL
    struct.)"""
    parts = []
    for kind, actions in (("protocol", [protocol]), ("metaData", [metadata]), ("txn", txns), ("add", files),
                          ("remove", tombstones)):
        if actions is not None and len(actions):
            n = len(actions)
            column = actions if isinstance(actions, pa.Array) else None
            parts.append(pa.Table.from_arrays(
                [(column if column is not None else _action_array(kind, actions, f.type)) if f.name == kind
                 else pa.array([None] * n, type=f.type) for f in CHECKPOINT_SCHEMA], schema=CHECKPOINT_SCHEMA))
    return pa.concat_tables(parts).combine_chunks()


def has_sidecars(table: pa.Table) -> bool:
    """Whether the checkpoint part read as ``table`` is a v2 checkpoint's with sidecars (its
    file actions are in other files, which :func:`checkpoint_actions` does not read)."""
    return "sidecar" in table.column_names and table.column("sidecar").null_count < table.num_rows


def checkpoint_actions(table: pa.Table) -> Iterator[tuple[str, dict]]:
    """The actions of a checkpoint part read as ``table`` (kind, action; maps as dicts), in
    its rows' order (a part with sidecars: see :func:`has_sidecars`)."""
    cols = [c for c in ("protocol", "metaData", "txn", "add", "remove") if c in table.column_names]
    for row in table.select(cols).to_pylist():
        for kind, action in row.items():
            if action is not None:
                yield kind, _dicts(kind, action)


def _expired(remove: dict, floor_ms: int) -> bool:
    """Whether the ``remove`` action was made before ``floor_ms`` (epoch ms; one without a
    ``deletionTimestamp`` counts as 0)."""
    return int(remove.get("deletionTimestamp") or 0) < floor_ms


def expire(tombstones: dict, floor_ms: int) -> None:
    """Drop from ``tombstones`` (:func:`file_key` -> remove action) those removed before
    ``floor_ms`` (:func:`_expired`)."""
    for key in [k for k, r in tombstones.items() if _expired(r, floor_ms)]:
        del tombstones[key]


class RemoveColumn:
    """The ``remove`` column a checkpoint wrote (``rows``, of :data:`REMOVE`), and the keys of
    the tombstones assigned or dropped since (``touched``, which the replay adds to as it
    applies actions): what the next checkpoint's column is built from (:func:`next_removes`)."""

    def __init__(self, rows: pa.StructArray):
        self.rows = rows
        self.touched: set[tuple[str, str]] = set()


def next_removes(tombstones: dict, floor_ms: int, last: RemoveColumn | None) -> RemoveColumn:
    """The ``remove`` column of a checkpoint of the replay whose tombstones are ``tombstones``
    (:func:`file_key` -> remove action), the ones removed before ``floor_ms`` dropped from it
    and from ``tombstones`` (in place, as :func:`expire`). From ``last``, the previous
    checkpoint's column (None: built from every tombstone): its rows expired or touched since
    dropped with Arrow's kernels, the touched tombstones still present appended; the same rows
    as built from every tombstone, in another order."""
    if last is None:
        expire(tombstones, floor_ms)
        return RemoveColumn(_action_array("remove", list(tombstones.values()), REMOVE))
    rows, touched = last.rows, last.touched
    live = pc.greater_equal(pc.fill_null(rows.field("deletionTimestamp"), 0), floor_ms)
    if touched:   # rows whose key was assigned or dropped since: the replay holds their news
        paths = pa.array(sorted({k[0] for k in touched}), pa.string())
        stale = [i for i in pc.indices_nonzero(pc.is_in(rows.field("path"), value_set=paths)).to_pylist()
                 if file_key(rows[i].as_py()) in touched]
        if stale:
            keep = np.ones(len(rows), dtype=bool)
            keep[stale] = False
            live = pc.and_(live, pa.array(keep))
    for i in pc.indices_nonzero(pc.invert(live)).to_pylist():
        key = file_key(rows[i].as_py())
        if key not in touched:   # (expired: its action in the replay is this row's)
            tombstones.pop(key, None)
    since = []
    for key in touched:
        action = tombstones.get(key)
        if action is not None and _expired(action, floor_ms):
            del tombstones[key]
        elif action is not None:
            since.append(action)
    parts = [rows.filter(live)] + ([_action_array("remove", since, REMOVE)] if since else [])
    return RemoveColumn(pa.concat_arrays(parts))
