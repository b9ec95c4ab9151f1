"""Parquet copies of a transaction log's chunks on the driver's local disk: where a
:class:`~.kafka.reader.KafkaReader` keeps the changes it no longer holds in memory, and what Spark
computes the table as of a position from when its executors share the driver's disk (a local
session), instead of reading the topics again (:mod:`.kafka.table`).

A reader's chunks (:class:`~.debezium.source.TransactionLog`: per table an Arrow table of its columns
+ ``__pos`` + ``__weight``, positions growing from chunk to chunk) are written here in their
order, each at most once: when the reader drops their rows from memory past its budget, or
when Spark first needs them. So the files of a table hold, in position order, every change
from the start up to the newest chunk written, and the table as of position ``p`` is their
rows with ``__pos <= p`` consolidated, whatever was dropped.

One file per table per write; small files are merged as a binary counter does (the newest two
while the newer is at least half the older, both under :data:`FROZEN_BYTES`), so a
long-running reader that drops a small chunk at every refresh keeps O(log n) small files and
rewrites each row O(log n) times, and files past :data:`FROZEN_BYTES` are never rewritten.
Rows keep their positions: no merge consolidates, so every position stays readable. A lazy
query reads hard links of the files it was made with (:meth:`ChunkFiles.pin`), which a merge
does not remove.

The directory (``consistent-stream-changes-*`` in ``TMPDIR``) is removed when the
:class:`ChunkFiles` is garbage collected or the process exits. Raises OSError naming the
directory when it cannot be written.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .debezium.events import POS, WEIGHT

FROZEN_BYTES = 32 << 20
"""A file at least this large (bytes on disk) is never merged again."""


@dataclass
class _File:
    path: str
    lo: int      # smallest __pos in it
    hi: int      # largest
    size: int    # bytes on disk


class ChunkFiles:
    """The Parquet copies of one reader's chunks (module docstring): :meth:`write` appends a
    chunk's tables, :meth:`paths` and :meth:`read` give a table's files or rows up to a
    position; ``frozen_bytes``: :data:`FROZEN_BYTES`. Thread-safe."""

    def __init__(self, frozen_bytes: int = FROZEN_BYTES):
        self.frozen_bytes = frozen_bytes
        self._dir: str | None = None
        self._files: dict[str, list[_File]] = {}
        self._seq = 0
        self._lock = threading.Lock()
        self._cleanup = None

    @property
    def directory(self) -> str | None:
        """Where the files are; None before the first write."""
        return self._dir

    def _open(self) -> str:
        if self._dir is None:
            try:
                self._dir = tempfile.mkdtemp(prefix="consistent-stream-changes-")
            except OSError as e:
                raise OSError(e.errno, f"a Kafka reader's changes could not be kept in {tempfile.gettempdir()} "
                                       f"({e.strerror}); set TMPDIR to a local directory with space") from e
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
        return self._dir

    def write(self, tables: dict[str, pa.Table]) -> None:
        """Append one chunk's (or several consecutive chunks') rows: table -> Arrow table of its
        columns + ``__pos`` + ``__weight``, positions above every position written before."""
        with self._lock:
            root = self._open()
            for table, t in tables.items():
                if not t.num_rows:
                    continue
                self._seq += 1
                path = os.path.join(root, f"{self._seq:08d}.parquet")
                m = pc.min_max(t.column(POS))
                try:
                    pq.write_table(t, path, compression="snappy")
                except OSError as e:
                    raise OSError(e.errno, f"a Kafka reader's changes could not be written to {path} ({e}); "
                                           f"set TMPDIR to a local directory with space") from e
                files = self._files.setdefault(table, [])
                files.append(_File(path, m["min"].as_py(), m["max"].as_py(), os.path.getsize(path)))
                self._merge(files)

    def _merge(self, files: list[_File]) -> None:
        """Merge the newest two files while the newer holds at least half the older's bytes
        and the older is under :attr:`frozen_bytes` (module docstring), streaming record batches."""
        while len(files) >= 2 and files[-2].size < self.frozen_bytes and 2 * files[-1].size >= files[-2].size:
            a, b = files[-2], files[-1]
            self._seq += 1
            path = os.path.join(self._dir, f"{self._seq:08d}.parquet")
            schema = pq.read_schema(a.path)
            with pq.ParquetWriter(path, schema, compression="snappy") as w:
                for f in (a, b):
                    for batch in pq.ParquetFile(f.path).iter_batches():
                        w.write_batch(batch)
            os.remove(a.path)
            os.remove(b.path)
            files[-2:] = [_File(path, a.lo, b.hi, os.path.getsize(path))]

    def paths(self, table: str, upto: int) -> list[str]:
        """The files of ``table`` holding a row at a position ``<= upto``, in position order."""
        with self._lock:
            return self._paths(table, upto)

    def _paths(self, table: str, upto: int) -> list[str]:
        return [f.path for f in self._files.get(table, ()) if f.lo <= upto]

    def pin(self, table: str, upto: int) -> list[str]:
        """:meth:`paths`, as hard links of their own (in a directory beside them) that a later
        merge does not remove: what a lazy Spark query, run at any later time, reads. The
        links go with the directory."""
        with self._lock:
            files = self._paths(table, upto)
            if not files:
                return []
            self._seq += 1
            pinned = os.path.join(self._dir, f"pin-{self._seq:08d}")
            os.mkdir(pinned)
            out = []
            for f in files:
                link = os.path.join(pinned, os.path.basename(f))
                os.link(f, link)
                out.append(link)
            return out

    def read(self, table: str, after: int, upto: int, columns: list[str]) -> list[pa.Table]:
        """The rows of ``table`` with ``after < __pos <= upto``: ``columns`` + ``__weight``, in
        position order (one Arrow table per file that has any)."""
        with self._lock:
            files = [f for f in self._files.get(table, ()) if f.lo <= upto and f.hi > after]
            out = []
            for f in files:
                t = pq.read_table(f.path, columns=list(columns) + [POS, WEIGHT])
                if f.lo <= after or f.hi > upto:
                    pos = t.column(POS)
                    t = t.filter(pc.and_(pc.greater(pos, after), pc.less_equal(pos, upto)))
                out.append(t.select(list(columns) + [WEIGHT]))
            return out

    def close(self) -> None:
        """Remove the files now."""
        with self._lock:
            if self._cleanup is not None:
                self._cleanup()
            self._files.clear()
