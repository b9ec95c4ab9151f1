"""The landing directory of a CDC capture: layout, per-table schemas, LSNs, atomic writes.

A landing directory holds Debezium JSON change events (see :mod:`.debezium.events`) for a set of
tables of one database, in commit order::

    <landing>/
      _schemas/<schema>.<table>.json   one per captured table (TableSchema.to_json)
      cdc-000000000001.json            event files, JSON lines, numbered 1, 2, 3, ... with no gap
      cdc-000000000002.json
      ...
      _index/                          what readers parsed, per event file (.landing_index)

Event files are immutable once they appear: writers create them under a hidden temporary name,
fsync, then rename (``atomic_write``). Names starting with ``.`` or ``_`` and names ending in
``.tmp`` are not event files.

Column types (``ColumnSchema.type``) and their Debezium JSON encoding (Debezium's defaults,
except ``decimal.handling.mode=string``):

========================  ===================  =============================================
type                      Arrow type           JSON value
========================  ===================  =============================================
int16 / int32 / int64     int16/int32/int64    number
float32 / float64         float32/float64      number
decimal(p,s)              decimal128(p, s)     string ("12.50"; a number is accepted too)
bool                      bool                 true / false
string                    string               string
date                      date32               days since 1970-01-01 (io.debezium.time.Date);
                                               "YYYY-MM-DD" accepted
timestamp                 timestamp[us]        microseconds since epoch (MicroTimestamp);
                                               ISO-8601 accepted
timestamptz               timestamp[us, UTC]   ISO-8601 with offset (ZonedTimestamp)
========================  ===================  =============================================
"""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass

import pyarrow as pa

from .. import storage
from ..errors import SourceError

SCHEMA_DIR = "_schemas"
EVENT_FILE = re.compile(r"^(?P<prefix>.*?)(?P<seq>\d+)\.jsonl?$")
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
SIMPLE_TYPES = {
    "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "float32": pa.float32(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
    "date": pa.date32(), "timestamp": pa.timestamp("us"), "timestamptz": pa.timestamp("us", tz="UTC"),
}


def arrow_type(type_name: str) -> pa.DataType:
    """``'decimal(12,2)'`` -> ``pa.decimal128(12, 2)``, ``'int32'`` -> ``pa.int32()``, ...

    Raises SourceError for a name not in the table of the module docstring."""
    if type_name in SIMPLE_TYPES:
        return SIMPLE_TYPES[type_name]
    m = _DECIMAL.match(type_name)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        if not 1 <= p <= 38 or not 0 <= s <= p:
            raise SourceError(f"column type {type_name!r}: precision must be 1..38 and scale 0..precision")
        return pa.decimal128(p, s)
    raise SourceError(f"unknown column type {type_name!r}; known: {', '.join(SIMPLE_TYPES)}, decimal(p,s)")


def parse_lsn(text: str | int) -> int:
    """PostgreSQL's ``'16/B374D848'`` (or an integer) -> the 64-bit LSN as an int."""
    if isinstance(text, int):
        return text
    hi, _, lo = str(text).partition("/")
    if not _:
        return int(text)
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(lsn: int) -> str:
    """The 64-bit LSN ``lsn`` in PostgreSQL's ``'X/Y'`` notation."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


@dataclass(frozen=True)
class ColumnSchema:
    """One column: ``name``, ``type`` (see the module docstring), the source database's type
    ``source_type`` (e.g. PostgreSQL's ``numeric(12,2)``) and ``nullable``."""
    name: str
    type: str
    source_type: str = ""
    nullable: bool = True


@dataclass(frozen=True)
class TableSchema:
    """The schema of one captured table, ``table`` = ``'<schema>.<table>'`` as in Debezium's
    ``source.schema`` + ``source.table``; ``primary_key`` may be empty (no key)."""
    table: str
    columns: tuple[ColumnSchema, ...]
    primary_key: tuple[str, ...] = ()

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @functools.cached_property
    def has_decimal(self) -> bool:
        """Whether a column is a DECIMAL (its JSON numbers must be parsed exactly)."""
        return any(c.type.startswith("decimal") for c in self.columns)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, arrow_type(c.type), nullable=True) for c in self.columns])

    def to_json(self) -> str:
        return json.dumps({"table": self.table, "primary_key": list(self.primary_key),
                           "columns": [{"name": c.name, "type": c.type, "source_type": c.source_type,
                                        "nullable": c.nullable} for c in self.columns]}, indent=2)

    @staticmethod
    def from_dict(d: dict) -> "TableSchema":
        """The schema ``json.loads(to_json())`` gives back. KeyError, TypeError or SourceError
        (an unknown type name) when ``d`` is not one."""
        cols = tuple(ColumnSchema(c["name"], c["type"], c.get("source_type", ""), bool(c.get("nullable", True)))
                     for c in d["columns"])
        ts = TableSchema(d["table"], cols, tuple(d.get("primary_key") or ()))
        ts.arrow_schema()  # validates the type names
        return ts

    @staticmethod
    def load(path: str) -> "TableSchema":
        """Read a schema file; SourceError naming the file when it is not a valid schema."""
        try:
            return TableSchema.from_dict(storage.load_json(path))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SourceError(f"{path}: not a valid table schema file ({e}); it is written by "
                              f"`consistent-stream capture`, see consistent_stream.sources.landing") from e


def schema_path(landing: str, table: str) -> str:
    return os.path.join(landing, SCHEMA_DIR, f"{table}.json")


def write_schema(landing: str, schema: TableSchema) -> None:
    atomic_write(schema_path(landing, schema.table), schema.to_json().encode())


def load_schemas(landing: str) -> dict[str, TableSchema]:
    """Every ``_schemas/*.json`` of ``landing``: table name -> TableSchema."""
    d = os.path.join(landing, SCHEMA_DIR)
    out = {}
    if storage.is_dir(d):
        for name in sorted(storage.list_dir(d)):
            if name.endswith(".json") and not name.startswith("."):
                ts = TableSchema.load(os.path.join(d, name))
                out[ts.table] = ts
    return out


def event_file_name(seq: int) -> str:
    return f"cdc-{seq:012d}.json"


def list_event_files(landing: str) -> list[tuple[int, str]]:
    """``[(sequence number, file name)]`` of the event files in ``landing``, by sequence (none
    when it does not exist).

    Raises SourceError when two files have the same number."""
    out = {}
    for name in storage.list_dir(landing):
        if name.startswith((".", "_")) or name.endswith(".tmp"):
            continue
        m = EVENT_FILE.match(name)
        if not m:
            continue
        seq = int(m.group("seq"))
        if seq in out:
            raise SourceError(f"{landing}: files {out[seq]} and {name} have the same sequence number {seq}")
        out[seq] = name
    return sorted(out.items())


def atomic_write(path: str, data: bytes) -> None:
    """Write ``path`` so that readers see nothing or all of it, creating its directory: hidden
    temp file, fsync, rename, fsync of the directory (the rename itself is durable when this
    returns; :func:`consistent_stream.storage.replace_bytes`)."""
    storage.make_dirs(os.path.dirname(path))
    storage.replace_bytes(path, data, fsync=True)
