"""Parquet data files for Delta commits, written either by the driver (a change-sized Arrow
table) or by Spark's executors (anything that grows with a table), and described as
:class:`DataFile` s with Delta statistics, ready for one :meth:`DeltaTableRef.commit_files`.

The rows of the files the driver wrote or read whole are held for the process's next read of
them (:data:`HELD`, :func:`read_whole`): a small batch's MERGE reads back the file the
previous batch's MERGE wrote.

Written files are invisible until a commit adds them; a crash before the commit leaves
unreferenced files, which no reader sees (``VACUUM`` removes them). Every write goes to a
fresh directory, so a replayed batch never overwrites a file a commit already references.

Statistics (``numRecords``, ``nullCount`` of every column, ``minValues``/``maxValues`` of
integer, date, decimal and short string columns) follow the Delta protocol; other readers use
them for data skipping and so do our keyed state reads. A decimal's bounds are JSON numbers,
which readers take as doubles: written as the nearest double at or below the minimum and at or
above the maximum, so every reader's skipping stays correct. Types whose bounds do not survive
JSON (floating point, timestamp, long strings) get no bounds: no bounds only means no skipping.
"""
from __future__ import annotations

import datetime
import json
import os
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from .. import duck, location, storage
from ..local_cache import DATA_FILES, DATA_KEYS
from .deletion_vectors import descriptor_of
from .deletion_vectors import live as live_rows
from .deletion_vectors import read_many as read_vectors
from .values import DataFile, as_uri, data_file_path, plain_arrow, plain_schema

MAX_STRING_STAT = 32
"""Strings longer than this get no min/max statistics (Delta truncates them; we skip)."""


def new_dir(prefix: str) -> str:
    """A fresh relative directory name: ``<prefix>-<uuid>``."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def _bound(value, typ: pa.DataType, upper: bool = False):
    """A min (``upper``: max) value in Delta's JSON form, or None when the type gets no
    bounds; a decimal as the nearest double on the outer side of it."""
    if value is None:
        return None
    if pa.types.is_integer(typ):
        return int(value)
    if pa.types.is_decimal(typ):
        import decimal
        import math
        d = decimal.Decimal(value)
        f = float(d)
        if (decimal.Decimal(f) < d) if upper else (decimal.Decimal(f) > d):
            f = math.nextafter(f, math.inf if upper else -math.inf)
        return f
    if pa.types.is_date(typ):
        return value.isoformat() if isinstance(value, datetime.date) else None
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return value if isinstance(value, str) and len(value) <= MAX_STRING_STAT else None
    return None


def stats_json(num_records: int, schema: pa.Schema, mins: dict, maxs: dict, nulls: dict) -> str:
    """Delta statistics JSON for a file of ``schema`` (top-level columns only)."""
    lo, hi = {}, {}
    for f in schema:
        a, b = _bound(mins.get(f.name), f.type), _bound(maxs.get(f.name), f.type, upper=True)
        if a is not None and b is not None:
            lo[f.name], hi[f.name] = a, b
    return json.dumps({"numRecords": int(num_records), "minValues": lo, "maxValues": hi,
                       "nullCount": {k: int(v) for k, v in nulls.items() if v is not None}})


def arrow_stats(data: pa.Table) -> str:
    """Statistics of an Arrow table about to be written as one file."""
    mins, maxs, nulls = {}, {}, {}
    for f in data.schema:
        col = data.column(f.name)
        nulls[f.name] = col.null_count
        if data.num_rows and (pa.types.is_integer(f.type) or pa.types.is_date(f.type) or pa.types.is_string(f.type)
                              or pa.types.is_decimal(f.type)):
            mm = pc.min_max(col)
            mins[f.name], maxs[f.name] = mm["min"].as_py(), mm["max"].as_py()
    return stats_json(data.num_rows, data.schema, mins, maxs, nulls)


DICTIONARY_SAMPLE_ROWS = 10_000


def dictionary_columns(data: pa.Table) -> list[str]:
    """The columns of ``data`` worth Parquet's dictionary encoding: those whose first
    ``DICTIONARY_SAMPLE_ROWS`` rows hold at most half as many distinct values as rows. A key or
    a price is mostly distinct: pyarrow would hash every value into a dictionary, find it too
    large and fall back to plain encoding, at several times the cost of writing it plain and
    into a larger file (parquet-mr, which Spark writes with, falls back the same way)."""
    sample = data.slice(0, DICTIONARY_SAMPLE_ROWS)
    return [f.name for f in data.schema
            if not (pa.types.is_nested(f.type) or pa.types.is_null(f.type))
            and pc.count_distinct(sample.column(f.name), mode="all").as_py() <= sample.num_rows // 2]


def write_arrow(table_path: str, rel_dir: str, data: pa.Table,
                partition_values: dict[str, str | None] | None = None, *, hold: bool = False) -> DataFile:
    """Write ``data`` (no partition columns in it) as one Parquet file under
    ``table_path/rel_dir`` from the driver. For change-sized data only: the file is encoded in
    memory and written whole, locally or in one PUT on an object store (no directory markers,
    no multipart upload, no HEAD for its size). ``hold``: keep its rows in :data:`HELD` for
    a later :func:`read_whole` of the file in this process and, on an object store, its bytes
    on this machine (:data:`~consistent_stream.local_cache.DATA_FILES`) for a later process."""
    data = plain_arrow(data)
    rel = f"{rel_dir}/part-{uuid.uuid4().hex}.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, compression="snappy", use_dictionary=dictionary_columns(data))
    buf = sink.getvalue()
    full = f"{table_path.rstrip('/')}/{rel}"
    storage.make_dirs(os.path.dirname(full))
    storage.write_bytes(full, buf)
    if hold:
        HELD.put(full, buf.size, data)
        if location.is_remote(full):
            DATA_FILES.put(full, buf)   # for the next process's read of it
    return DataFile(rel, buf.size, data.num_rows, dict(partition_values or {}), arrow_stats(data))


HELD_BYTES = 256 << 20
"""Bytes of Arrow data :data:`HELD` keeps at most (read at call time: a test may lower it)."""
HELD_CHUNKS = 16
"""Rows held in more chunks than this are made contiguous first."""


class HeldFiles:
    """The rows of data files this process wrote or read whole, by the file's full path and
    size, so that the next read of the same file is not a read: a small batch's MERGE reads
    the files it rewrites (:mod:`consistent_stream.sink.rewrite`), and in a process that runs
    one model batch after batch (a continuous model, the benchmarks) those are the files its
    previous batch wrote; a keyed read of state reads the files earlier batches wrote, and
    on local disk reads small arrangements whole once and filters them in memory after
    (:func:`consistent_stream.state.arrangement.fetched_scan`). A
    ``dbt run`` in a fresh process holds nothing yet (a warm session keeps the JVM, not
    this).

    A Delta data file never changes once written (the protocol removes and adds files, it
    never rewrites one, and every name here carries a fresh UUID), so an entry is never stale,
    only unused; the size, from the log's add action, is checked too. Bounded by
    :data:`HELD_BYTES` of Arrow buffers, least recently used out first; a table larger than
    the bound is not kept. Thread-safe (the threads of a ``dbt run`` share it).

    ``share``: the part of :data:`HELD_BYTES` this one keeps (:data:`HELD_KEYS`, a
    quarter)."""

    def __init__(self, share: float = 1.0):
        self.share = share
        self._rows: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str, size: int) -> pa.Table | None:
        """The rows of file ``path`` of ``size`` bytes (plain Arrow types, as written), or None."""
        with self._lock:
            rows = self._rows.get((path, size))
            if rows is not None:
                self._rows.move_to_end((path, size))
            return rows

    def holds(self, path: str, size: int) -> bool:
        """Whether the rows of file ``path`` of ``size`` bytes are held (not counted as a use)."""
        with self._lock:
            return (path, size) in self._rows

    def put(self, path: str, size: int, rows: pa.Table) -> None:
        """Keep ``rows`` as the rows of file ``path`` of ``size`` bytes."""
        if rows.num_columns and rows.column(0).num_chunks > HELD_CHUNKS:
            rows = rows.combine_chunks()   # a file rewritten batch after batch: one chunk more each time
        n = rows.nbytes
        budget = HELD_BYTES * self.share
        with self._lock:
            old = self._rows.pop((path, size), None)
            self._bytes -= old.nbytes if old is not None else 0
            if n > budget:
                return
            self._rows[(path, size)] = rows
            self._bytes += n
            while self._bytes > budget:
                _, dropped = self._rows.popitem(last=False)
                self._bytes -= dropped.nbytes

    def clear(self) -> None:
        """Forget every file: what a new process holds (the benchmarks measure a fresh
        ``dbt run`` process's reads so)."""
        with self._lock:
            self._rows.clear()
            self._bytes = 0

    def drop(self, paths: list[str]) -> None:
        """Forget the files ``paths`` (whatever their size): a commit removed them."""
        gone = set(paths)
        with self._lock:
            for k in [k for k in self._rows if k[0] in gone]:
                self._bytes -= self._rows.pop(k).nbytes


HELD = HeldFiles()
"""The process's :class:`HeldFiles`."""

HELD_KEYS = HeldFiles(share=0.25)
"""The key columns of large target files whose other columns are not held: what a MERGE
reads of a file it may mark rows of (:func:`consistent_stream.sink.rewrite._probe`), kept so
that the next batch's MERGE into the same file reads nothing of it. A file's rows at its
path never change (its deletion vector does, and is read apart), so entries are the whole
file's key columns, before any vector."""


def kept_keys(path: str, size: int, schema: pa.Schema) -> pa.Table | None:
    """The key columns ``schema`` of data file ``path`` (full path; ``size`` bytes, from its
    ``add`` action) as this machine keeps them (:data:`~consistent_stream.local_cache.DATA_KEYS`,
    written by :func:`keep_keys`), or None: none kept, or not of that schema."""
    data = DATA_KEYS.get(_keys_uri(path, schema), size)
    if data is None:
        return None
    try:
        keys = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    except DAMAGED:
        DATA_KEYS.drop(_keys_uri(path, schema), size)
        return None
    return keys if keys.schema.equals(schema) else None


def keep_keys(path: str, size: int, keys: pa.Table) -> None:
    """Keep the key columns ``keys`` of data file ``path`` of ``size`` bytes on this machine
    (an Arrow IPC file, uncompressed: read back without decoding) for :func:`kept_keys`."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, keys.schema) as writer:
        writer.write_table(keys)
    DATA_KEYS.put(_keys_uri(path, keys.schema), sink.getvalue(), size)


def _keys_uri(path: str, schema: pa.Schema) -> str:
    return f"{path}#{json.dumps(schema.names)}"


def read_whole(paths: list[str], sizes: list[int], columns: list[str], *, hold: bool = True,
               name: str = "read") -> list[pa.Table]:
    """The rows of each Parquet data file ``paths[i]`` (full paths; ``sizes[i]`` bytes, from
    the log), only ``columns``, with plain Arrow types (:func:`plain_arrow`): from
    :data:`HELD` where it holds the file, the others read whole (one GET each on an object
    store, all at once). ``hold``: the files read are read with all their columns and held;
    otherwise only ``columns`` are read. Raises OSError when a file cannot be read,
    pyarrow's ArrowInvalid (naming the file) when it lacks one of ``columns``."""
    out: list[pa.Table | None] = [HELD.get(p, s) for p, s in zip(paths, sizes)]
    missing = [i for i, t in enumerate(out) if t is None]

    def decode(path: str, blob: bytes) -> pa.Table:
        try:
            return plain_arrow(pq.read_table(pa.BufferReader(blob), columns=None if hold else columns))
        except pa.ArrowInvalid as e:
            raise pa.ArrowInvalid(f"data file {path}: {e}") from e

    for i, t in zip(missing, read_data_files([paths[i] for i in missing], [sizes[i] for i in missing], name,
                                             decode)):
        out[i] = t
        if hold:
            HELD.put(paths[i], sizes[i], out[i])
    tables = []
    for p, t in zip(paths, out):
        absent = [c for c in columns if c not in t.column_names]
        if absent:
            raise pa.ArrowInvalid(f"data file {p} has no column {', '.join(absent)} (its columns: "
                                  f"{', '.join(t.column_names)})")
        tables.append(t.select(columns))
    return tables


DAMAGED = (pa.ArrowInvalid, OSError)
"""What pyarrow raises on bytes that are not the file they stand for."""


def read_data_files(paths: list[str], sizes: list[int], name: str = "read",
                    decode: Callable[[str, bytes], Any] | None = None) -> list:
    """The bytes of each Parquet data file ``paths[i]`` (full paths; ``sizes[i]`` bytes, from
    the log's ``add`` action), in order, or ``decode(path, bytes)`` of them. On an object store
    a file this machine keeps (:data:`~consistent_stream.local_cache.DATA_FILES`: it wrote or
    read it before, in this process or another) is read from there, the others with one GET
    each, all at once, and kept once decoded. Kept bytes that ``decode`` fails on (:data:`DAMAGED`)
    are dropped and the file is read from the store. Raises as
    :func:`consistent_stream.storage.read_many` and ``decode`` do."""
    out: list = [_from_kept(p, n, decode) for p, n in zip(paths, sizes)]
    missing = [i for i, b in enumerate(out) if b is None]
    for i, blob in zip(missing, storage.read_many([paths[i] for i in missing], name)):
        out[i] = decode(paths[i], blob) if decode else blob
        if location.is_remote(paths[i]) and len(blob) == sizes[i]:
            DATA_FILES.put(paths[i], blob)
    return out


def _from_kept(path: str, size: int, decode: Callable[[str, bytes], Any] | None):
    """``decode(path, bytes)`` (or the bytes) of the copy of data file ``path`` of ``size``
    bytes this machine keeps; None when none is kept (a file on local disk: never) or the copy
    does not decode (:data:`DAMAGED`: then it is dropped)."""
    blob = DATA_FILES.get(path, size) if location.is_remote(path) else None
    if blob is None:
        return None
    try:
        return decode(path, blob) if decode else blob
    except DAMAGED:
        DATA_FILES.drop(path, size)
        return None


def read_live(table_path: str, files: list[DataFile], columns: list[str], *, hold: bool = True,
              name: str = "read") -> list[tuple[pa.Table, np.ndarray]]:
    """For each of a table's data ``files`` (at ``table_path``), its rows less those its
    deletion vector marks, only ``columns``, and each row's position in the file's Parquet
    (int64): the files as :func:`read_whole` reads them, their vectors as
    :func:`.deletion_vectors.read_many` does (each vector file once, the process's own from
    memory). Raises as those do."""
    tables = read_whole([data_file_path(table_path, f.path) for f in files], [f.size for f in files], columns,
                        hold=hold, name=name)
    marked = read_vectors(table_path, [descriptor_of(f.deletion_vector) for f in files])
    out = []
    for t, gone in zip(tables, marked):
        positions = np.arange(t.num_rows, dtype=np.int64)
        if len(gone):
            live = live_rows(t.num_rows, gone)
            t, positions = t.filter(pa.array(live)), positions[live]
        out.append((t, positions))
    return out


@dataclass
class ParquetRows:
    """A Parquet data file opened for reading parts of it (columns, rows by position, column
    chunks' bytes): ``pf``; ``local``: its path on local disk, None on an object store, whose
    bytes (one GET) are ``buffer``; ``kept``: the file's full path and size when ``buffer`` is
    this machine's copy of it, which a read that fails on it (:data:`DAMAGED`) drops, reading
    the file from the store instead. Opened by :func:`open_rows`."""
    pf: pq.ParquetFile
    local: str | None = None
    buffer: bytes | None = None
    kept: tuple[str, int] | None = None

    def _decoded(self, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except DAMAGED:
            if self.kept is None:
                raise
            path, size = self.kept
            DATA_FILES.drop(path, size)
            self.kept = None
            self.buffer = read_data_files([path], [size])[0]
            self.pf = pq.ParquetFile(pa.BufferReader(self.buffer))
            return read()

    def read(self, columns: list[str]) -> pa.Table:
        """All rows of ``columns`` (physical names), as stored."""
        return self._decoded(lambda: self.pf.read(columns=columns))

    def present(self, columns: Iterable[str]) -> list[str]:
        """``columns`` (physical names) the file has, in the order given."""
        have = set(self.pf.schema_arrow.names)
        return [c for c in columns if c in have]

    def chunk(self, row_group: int, leaf: int) -> bytes:
        """The bytes of one column chunk (its dictionary page and data pages)."""
        meta = self.pf.metadata.row_group(row_group).column(leaf)
        start = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
        if self.buffer is not None:
            return self.buffer[start:start + meta.total_compressed_size]
        with open(self.local, "rb") as f:
            f.seek(start)
            return f.read(meta.total_compressed_size)

    def take(self, columns: list[str], at: np.ndarray, types: dict[str, pa.DataType]) -> pa.Table:
        """``columns`` at rows ``at`` (ascending positions), cast to ``types`` (by column): by
        position through DuckDB (:func:`consistent_stream.duck.rows_at`) for a local file whose
        types it reads exactly, else decoded by pyarrow (only the row groups that hold the
        rows) and taken."""
        stored = pa.schema([self.pf.schema_arrow.field(c) for c in columns])
        schema = pa.schema([pa.field(c, types[c]) for c in columns])
        if self.local is not None and len(at) and all(duck.exact_by_position(f.type) for f in stored):
            found = duck.rows_at(self.local, schema, at)
            if found is not duck.UNSUPPORTED:
                return found
        if not len(at):
            return schema.empty_table()
        meta = self.pf.metadata
        starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        group_of = np.searchsorted(starts, at, side="right") - 1
        groups = sorted(set(group_of.tolist()))    # only the row groups that hold the rows
        base = dict(zip(groups, np.cumsum([0] + [starts[g + 1] - starts[g] for g in groups[:-1]])))
        within = at - starts[group_of] + np.array([base[g] for g in group_of], dtype=np.int64)
        return self._decoded(lambda: self.pf.read_row_groups(groups, columns=columns)).cast(schema).take(
            pa.array(within))


def open_rows(table_path: str, rel: str, size: int | None = None) -> ParquetRows:
    """A data file of the table, opened for reading: on local disk by its path (a read then
    touches only the footer and the column chunks it decodes), on an object store with one GET
    of the whole file (counted as every request of :mod:`consistent_stream.storage` is), or,
    given its ``size`` (bytes, from its ``add`` action), from the data files this machine keeps
    (:func:`read_data_files`; a later read that finds the copy damaged reads the file from the
    store, :class:`ParquetRows`)."""
    path = data_file_path(table_path, rel)
    if location.is_remote(table_path):
        if not size:
            data = storage.read_bytes(path)
            return ParquetRows(pq.ParquetFile(pa.BufferReader(data)), buffer=data)
        kept = _from_kept(path, size, lambda p, blob: ParquetRows(pq.ParquetFile(pa.BufferReader(blob)),
                                                                  buffer=blob, kept=(p, size)))
        if kept is not None:
            return kept
        data = read_data_files([path], [size])[0]
        return ParquetRows(pq.ParquetFile(pa.BufferReader(data)), buffer=data)
    local = location.fs_path(path)
    return ParquetRows(pq.ParquetFile(local), local=local)


def footer_stats(fs: pafs.FileSystem, full_path: str, schema: pa.Schema) -> tuple[int, str]:
    """Rows and Delta statistics of a Parquet file, from its footer (no data read). A column
    gets bounds only when every row group with a non-NULL value has them."""
    md = pq.read_metadata(full_path, filesystem=fs)
    names = {md.schema.column(i).name: i for i in range(md.num_columns)}
    mins: dict = {}
    maxs: dict = {}
    nulls: dict = {}
    for name, i in names.items():
        lo = hi = None
        nc: int | None = 0
        bounded = True
        for rg in range(md.num_row_groups):
            group = md.row_group(rg)
            st = group.column(i).statistics
            if st is None or not st.has_null_count:
                nc = None
            elif nc is not None:
                nc += st.null_count
            all_null = st is not None and st.has_null_count and st.null_count == group.num_rows
            if st is not None and st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
            elif not all_null:
                bounded = False
        nulls[name] = nc
        if bounded:
            mins[name], maxs[name] = lo, hi
    present = pa.schema([f for f in schema if f.name in names])
    return md.num_rows, stats_json(md.num_rows, present, mins, maxs, nulls)


def _partition_values(rel: str, partition_by: list[str]) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for seg in rel.split("/")[:-1]:
        if "=" in seg:
            k, v = seg.split("=", 1)
            if k in partition_by:
                v = unquote(v)
                values[k] = None if v == "__HIVE_DEFAULT_PARTITION__" else v
    return {k: values.get(k) for k in partition_by}


def write_spark(df: DataFrame, table_path: str, rel_dir: str, *, partition_by: list[str] | None = None,
                partition_values: dict[str, str | None] | None = None, delta_encoded: bool = False) -> list[DataFile]:
    """Write ``df`` as Parquet files under ``table_path/rel_dir`` from Spark's executors (the
    driver only lists the files and reads their footers). ``partition_by``: Hive-style
    partition directories of those columns (the table's partition columns);
    ``partition_values``: fixed partition values of every file (a partition the caller chose).
    ``delta_encoded``: Parquet's version 2 pages (parquet-mr's ``parquet.writer.version`` v2),
    whose columns a dictionary does not fit fall back to the delta encodings
    (``DELTA_BINARY_PACKED`` integers, ``DELTA_BYTE_ARRAY`` strings) instead of plain values:
    a column sorted by its values (a key) takes a few bits a row, not eight bytes. For files
    only this project reads (the state's): Spark, DuckDB and pyarrow read them, some other
    Parquet readers do not.

    Timestamps are written as INT64 microseconds (Delta's encoding, not Spark's INT96)."""
    spark = df.sparkSession
    out = as_uri(os.path.join(table_path, rel_dir))
    old = spark.conf.get("spark.sql.parquet.outputTimestampType", None)
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    try:
        w = df.write.mode("error").option("compression", "snappy")
        if delta_encoded:
            w = w.option("parquet.writer.version", "v2")
        if partition_by:
            w = w.partitionBy(*partition_by)
        w.parquet(out)
    finally:
        if old is None:
            spark.conf.unset("spark.sql.parquet.outputTimestampType")
        else:
            spark.conf.set("spark.sql.parquet.outputTimestampType", old)
    schema = plain_schema(_arrow_schema(df))
    fs, base = location.pyarrow_filesystem(out)
    files = []
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
        name = info.path.rsplit("/", 1)[-1]
        if info.type != pafs.FileType.File or not name.endswith(".parquet") or name.startswith((".", "_")):
            continue
        rel = rel_dir + "/" + info.path[len(base.rstrip("/")) + 1:]
        n, stats = footer_stats(fs, info.path, schema)
        if n == 0:
            continue
        pv = dict(partition_values or {})
        if partition_by:
            pv.update(_partition_values(rel, partition_by))
        files.append(DataFile(rel, info.size, n, pv, stats))
    return sorted(files, key=lambda f: f.path)


def _arrow_schema(df: DataFrame) -> pa.Schema:
    """``df``'s schema in Arrow; a TIMESTAMP is UTC-adjusted microseconds, as Delta stores it."""
    from .values import arrow_schema
    return arrow_schema(df.schema)


def stats_bounds(stats: str, schema: pa.Schema) -> tuple[dict, dict, dict]:
    """``(min, max, nullCount)`` of a file's Delta statistics JSON, each column -> value, the
    bounds as Python values of the column's type in ``schema`` (a date's ISO string as a
    ``datetime.date``, a timestamp's as a UTC ``datetime``, a decimal's as the double
    written, which lies outside the bound: :func:`_bound`); bounds of floating point and other
    types, and strings Delta may have truncated, are left out (no bound: no skipping)."""
    try:
        st = json.loads(stats) if stats else {}
    except ValueError:
        st = {}
    lo, hi = {}, {}
    for values, out in ((st.get("minValues") or {}, lo), (st.get("maxValues") or {}, hi)):
        for c, v in values.items():
            i = schema.get_field_index(c)
            if i < 0 or v is None:
                continue
            t = schema.field(i).type
            try:
                if pa.types.is_integer(t) and isinstance(v, int):
                    out[c] = v
                elif pa.types.is_decimal(t) and isinstance(v, (int, float)):
                    out[c] = v   # (a double on the outer side of the decimal: compares with Decimals exactly)
                elif pa.types.is_date(t):
                    out[c] = datetime.date.fromisoformat(v)
                elif pa.types.is_timestamp(t) and t.tz is not None:
                    out[c] = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
                elif (pa.types.is_string(t) or pa.types.is_large_string(t)) and len(v) < MAX_STRING_STAT:
                    out[c] = v
            except (TypeError, ValueError):
                pass
    return lo, hi, dict(st.get("nullCount") or {})


def may_hold(bounds: tuple[dict, dict, dict], rows: int, wanted: dict[str, tuple[list, bool]]) -> bool:
    """Whether a file with ``bounds`` (:func:`stats_bounds`) of ``rows`` rows may hold a row
    whose every column ``c`` of ``wanted`` has one of the values ``wanted[c][0]`` (sorted, no
    NULL), or NULL when ``wanted[c][1]``. A column without bounds may hold anything."""
    import bisect
    lo, hi, nulls = bounds
    for c, (values, want_null) in wanted.items():
        if want_null and nulls.get(c, 1) != 0:
            continue   # may hold a NULL looked for
        a, b = lo.get(c), hi.get(c)
        if a is None or b is None:
            if nulls.get(c) == rows and not want_null:
                return False   # every value NULL, none looked for
            continue
        try:
            i = bisect.bisect_left(values, a)
            if not (i < len(values) and values[i] <= b):
                return False
        except TypeError:
            continue
    return True


def wanted_values(keys: pa.Table, cols: list[str], null_safe: bool = True) -> dict[str, tuple[list, bool]] | None:
    """For :func:`may_hold`: each column's distinct non-NULL values of ``keys``, sorted, and
    whether it has a NULL looked for; None when the values do not sort (any file may hold them)."""
    out = {}
    for c in cols:
        col = keys.column(c)
        values = pc.unique(col.drop_null()).to_pylist()
        try:
            values.sort()
        except TypeError:
            return None
        out[c] = (values, null_safe and col.null_count > 0)
    return out
