"""The landing index: each event file of a landing directory parsed once, kept as Arrow IPC.

Parsing Debezium JSON is most of the cost of reading a landing directory (a Python call per
line, and a 410,000-event pgbench backlog is 920,000 JSON lines), and every process that
reads the directory parsed all of it again, so a ``dbt run``'s cost grew with the capture's
history instead of with its change (``benchmarks/pgbench_catchup.py`` measures a catch-up
cold and warm). The index keeps what the parser makes of each event file::

    <landing>/_index/<event file>.<size>.<mtime_ns>.<schemas digest>.v<FORMAT>.arrow

An entry (:class:`ParsedFile`) is the event file read *in isolation*, by a parser with no
open transaction, no snapshot position and no earlier position: per table an Arrow table of
the table's columns + ``__pos`` + ``__weight`` (the transactions whose END is in the file),
the transactions (:class:`TxInfo`), and what the file needs of the state it is read in:
``first_pos`` (the position of its first BEGIN), ``snapshot_reads``, the ``snapshot_pos`` it
completes, whether it ``began`` transactions.

Contract (why an entry is exact). Reading a file in context gives what reading it in
isolation gives when, at the file's start:

1. no transaction is open (a capture may cut a file inside a long transaction: the file after
   such a cut is always parsed, and a file that ends inside one gets no entry);
2. if the file holds snapshot reads, no snapshot position and no transaction came before;
3. the last position and the snapshot position are both below ``first_pos``, so nothing in the
   file is skipped as already in the snapshot, and positions grow;
4. or, inside a snapshot that earlier files began (a large snapshot spans files): the file
   starts with snapshot reads at that snapshot's position (``leading_snapshot``). Isolation
   started a new snapshot there; :meth:`ParsedFile.apply` carries the earlier files' counts,
   the first read's time and place into it. Snapshot rows go to the file that holds them as
   they are read (at position P0, past ``latest_position()`` until the snapshot completes).

:meth:`ParsedFile.fits` checks exactly this; where it does not hold, the reader parses the
JSON in context, as without an index.

The key is in the entry's name: the event file's name, size and mtime (event files are
immutable), a digest of the schema files, and ``FORMAT`` (bump it when the parser's output
changes). Entries are written by rename (no fsync: a lost entry is made again); a torn or
unreadable entry is a miss. A landing directory the reader cannot write is read without an
index.

Cold start. When many files have no entry (the first run over a backlog), :func:`build`
parses them in isolation in worker processes, one per core (``python -m
consistent_stream.sources.landing_index``), and the reader then loads their entries. Parsing
is independent per file in isolation, which is what makes it parallel; a worker's failure
(an error in a file, a file cut inside a transaction) only leaves that file to the reader.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow as pa

from .. import storage
from ..location import is_remote
from .packed import PackedInts
from .tx_ids import TxIds

log = logging.getLogger(__name__)

FORMAT = 1
INDEX_DIR = "_index"
# below this many bytes of event files without an entry, the reader parses them itself:
# starting worker processes (Python + pyarrow imports) is a fixed cost that parsing a
# small backlog in parallel does not repay
PARALLEL_MIN_BYTES = 32 * 1024 * 1024
_TXS = "__txs"


class TxInfo(NamedTuple):
    """One complete transaction (or the snapshot): ``position`` (commit LSN, int), ``id``,
    ``ts_ms`` (commit time, ms since epoch), ``counts`` (table -> change events), and where its
    END is (``file``, ``line``, 1-based). A named tuple: a backlog has hundreds of thousands."""
    position: int
    id: str
    ts_ms: int
    counts: dict
    file: str
    line: int
    snapshot: bool = False


class TxLog:
    """Complete transactions in position order (:class:`TxInfo`), held as columns: positions,
    commit times and END places as :class:`~.packed.PackedInts`, ids as :class:`~.tx_ids.TxIds`
    (decimal ids as int64), each distinct ``counts`` dict and ``file`` once, indexed. A
    catch-up holds millions of transactions: a few bytes each, not a tuple of boxed ints and a
    dict per transaction (the Kafka catch-up benchmark page measures what that saves).

    Indexing gives TxInfo (a slice: a list of them); :meth:`bisect` finds a position. The
    ``counts`` of the TxInfo given out are shared between transactions: read-only."""

    _MAX_SHARED = 4096   # distinct counts dicts shared; past that each transaction keeps its own

    def __init__(self, txs=()):
        self._pos, self._ts, self._line = PackedInts(), PackedInts(), PackedInts()
        self._snapshot = bytearray()
        self._ids = TxIds()
        self._counts, self._files = PackedInts(), PackedInts()   # indices into the two lists below
        self._distinct_counts: list[dict] = []
        self._distinct_files: list[str] = []
        self._shared_counts: dict[tuple, int] = {}
        self._shared_files: dict[str, int] = {}
        self.extend(txs)

    def append(self, tx: TxInfo) -> None:
        self._pos.append(tx.position)
        self._ts.append(tx.ts_ms)
        self._line.append(tx.line)
        self._snapshot.append(bool(tx.snapshot))
        self._ids.append(tx.id)
        key = tuple(sorted(tx.counts.items()))
        counts = self._shared_counts.get(key)
        if counts is None:
            counts = len(self._distinct_counts)
            self._distinct_counts.append(dict(tx.counts))
            if len(self._shared_counts) < self._MAX_SHARED:
                self._shared_counts[key] = counts
        self._counts.append(counts)
        f = self._shared_files.get(tx.file)
        if f is None:
            f = self._shared_files[tx.file] = len(self._distinct_files)
            self._distinct_files.append(tx.file)
        self._files.append(f)
        if len(self._snapshot) % 1024 == 0:
            for c in (self._pos, self._ts, self._line, self._ids, self._counts, self._files):
                c.settle()

    def extend(self, txs) -> None:
        for tx in txs:
            self.append(tx)

    def __len__(self) -> int:
        return len(self._pos)

    def _at(self, i: int) -> TxInfo:
        return TxInfo(self._pos[i], self._ids[i], self._ts[i], self._distinct_counts[self._counts[i]],
                      self._distinct_files[self._files[i]], self._line[i], bool(self._snapshot[i]))

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self._at(j) for j in range(start, stop, step)]
            counts, files = self._distinct_counts, self._distinct_files
            cols = (self._pos.numpy(start, stop).tolist(), self._ids.range(start, stop),
                    self._ts.numpy(start, stop).tolist(), self._counts.numpy(start, stop).tolist(),
                    self._files.numpy(start, stop).tolist(), self._line.numpy(start, stop).tolist(),
                    self._snapshot[start:stop])
            return [TxInfo(p, tx_id, ts, counts[c], files[f], line, bool(snap))
                    for p, tx_id, ts, c, f, line, snap in zip(*cols)]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("transaction index out of range")
        return self._at(i)

    def __iter__(self):
        for start in range(0, len(self), PackedInts.BLOCK):
            yield from self[start:start + PackedInts.BLOCK]

    def bisect(self, position: int) -> int:
        """The number of transactions at or before ``position`` (positions grow)."""
        return self._pos.searchsorted(position)


@dataclass
class OpenTransaction:
    """A transaction (or the snapshot) the parser has seen BEGIN of and not yet END: its id,
    position, commit time, where it began, whether it is skipped (already in the snapshot),
    its rows per table so far and its event counts."""
    id: str
    position: int
    ts_ms: int
    where: tuple   # (file, line, byte offset) of its BEGIN
    skip: bool
    rows: dict = field(default_factory=dict)   # table -> list of (position, weight, row dict, Where)
    counts: dict = field(default_factory=dict)
    snapshot: bool = False


class ParserState(NamedTuple):
    """What a file's parse depends on at its start: whether a transaction is open, the
    position of a snapshot being read (None: none open), the complete snapshot's position
    (None: none yet), the last position, whether transactions began."""
    open_tx: bool
    snap_position: int | None
    snapshot_pos: int | None
    last_pos: int
    started_tx: bool


@dataclass
class ParsedFile:
    """One event file parsed: ``tables`` (table -> Arrow table of its columns + __pos int64 +
    __weight int64), ``txs`` (the complete transactions whose END is in the file, in order),
    and the file's needs of the parser state (module docstring)."""
    name: str
    size: int
    mtime_ns: int
    tables: dict = field(default_factory=dict)
    txs: list = field(default_factory=list)
    first_pos: int | None = None
    snapshot_pos: int | None = None
    began: bool = False
    snapshot_reads: bool = False
    leading_snapshot: int | None = None   # the file starts with snapshot reads at this position
    snap_end: dict | None = None          # the snapshot still open at the file's end: position, ts_ms, counts, where

    def fits(self, state: ParserState) -> bool:
        """Whether reading this file in parser state ``state`` gives what reading it in
        isolation gave (the contract in the module docstring)."""
        if state.open_tx:
            return False
        if state.snap_position is not None:
            # inside the snapshot: the file must go on with its reads (isolation started a new
            # snapshot there; :meth:`apply` adds the counts read before)
            return self.leading_snapshot == state.snap_position
        if self.snapshot_reads and (state.snapshot_pos is not None or state.started_tx):
            return False
        if self.first_pos is not None:
            if state.last_pos >= self.first_pos:
                return False
            if state.snapshot_pos is not None and state.snapshot_pos >= self.first_pos:
                return False
        return True

    def apply(self, parser) -> None:
        """Move ``parser`` (a :class:`~.debezium.events.EventParser`) past this file, as parsing it in context
        would have; inside the snapshot, the snapshot's counts so far, its first read's time
        and place are carried into this file's snapshot (its END, or the one still open)."""
        held = parser.snap   # the snapshot open before this file (fits: this file goes on with it)
        if held is not None:
            for i, tx in enumerate(self.txs):
                if tx.snapshot:
                    counts = {t: held.counts.get(t, 0) + tx.counts.get(t, 0) for t in {*held.counts, *tx.counts}}
                    self.txs[i] = tx._replace(id=held.id, ts_ms=held.ts_ms, counts=counts)
        if self.snap_end is not None:
            e = self.snap_end
            counts = dict(e["counts"])
            if held is not None:
                for t, n in held.counts.items():
                    counts[t] = counts.get(t, 0) + n
                parser.snap = OpenTransaction(held.id, held.position, held.ts_ms, held.where, False,
                                              counts=counts, snapshot=True)
            else:
                parser.snap = OpenTransaction(f"snapshot:{e['position']}", e["position"], e["ts_ms"],
                                              tuple(e["where"]), False, counts=counts, snapshot=True)
        else:
            parser.snap = None
        if self.snapshot_pos is not None:
            parser.snapshot_pos = self.snapshot_pos
        if self.txs:
            parser.last_pos = self.txs[-1].position
        parser.started_tx = parser.started_tx or self.began


def schemas_digest(schemas: dict) -> str:
    """A digest of a landing directory's schema files (table -> ``TableSchema``): 16 hex."""
    h = hashlib.sha256()
    for table in sorted(schemas):
        h.update(schemas[table].to_json().encode())
    return h.hexdigest()[:16]


def entry_path(location: str, name: str, size: int, mtime_ns: int, digest: str) -> str:
    return os.path.join(location, INDEX_DIR, f"{name}.{size}.{mtime_ns}.{digest}.v{FORMAT}.arrow")


def writable(location: str) -> bool:
    """Whether entries can be written under ``location`` (its ``_index`` made if missing)."""
    d = os.path.join(location, INDEX_DIR)
    try:
        storage.make_dirs(d)
    except OSError:
        return False
    return storage.is_writable(d)


def store(location: str, digest: str, parsed: ParsedFile) -> None:
    """Write ``parsed``'s entry (temp file + rename). An OSError is logged, not raised: the
    index is a cache."""
    txs = parsed.txs
    tables = sorted({t for tx in txs for t in tx.counts})
    txs_table = pa.table({
        "position": pa.array([tx.position for tx in txs], pa.int64()),
        "id": pa.array([tx.id for tx in txs], pa.string()),
        "ts_ms": pa.array([tx.ts_ms for tx in txs], pa.int64()),
        "line": pa.array([tx.line for tx in txs], pa.int64()),
        "snapshot": pa.array([tx.snapshot for tx in txs], pa.bool_()),
        **{f"count:{t}": pa.array([tx.counts.get(t, 0) for tx in txs], pa.int64()) for t in tables},
    })
    names, blobs = [], []
    for name, t in [(_TXS, txs_table)] + sorted(parsed.tables.items()):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, t.schema) as w:
            w.write_table(t)
        names.append(name)
        blobs.append(sink.getvalue().to_pybytes())
    meta = {"first_pos": parsed.first_pos, "snapshot_pos": parsed.snapshot_pos, "began": parsed.began,
            "snapshot_reads": parsed.snapshot_reads, "leading_snapshot": parsed.leading_snapshot,
            "snap_end": parsed.snap_end}
    container = pa.table({"name": pa.array(names, pa.string()), "data": pa.array(blobs, pa.large_binary())})
    container = container.replace_schema_metadata({"entry": json.dumps(meta)})
    out = pa.BufferOutputStream()
    with pa.ipc.new_file(out, container.schema) as w:
        w.write_table(container)
    path = entry_path(location, parsed.name, parsed.size, parsed.mtime_ns, digest)
    try:
        storage.replace_bytes(path, out.getvalue())
    except OSError as e:
        log.warning("%s: could not write the landing index entry (%s); the file will be parsed again next time",
                    path, e)


def load(location: str, digest: str, name: str, size: int, mtime_ns: int) -> ParsedFile | None:
    """The entry of event file ``name`` (of this size, mtime and schemas), or None when there
    is none or it cannot be read (a miss: the caller parses the file)."""
    path = entry_path(location, name, size, mtime_ns, digest)
    try:   # a local file is mapped, not read: the tables point into the file, not into a copy of it
        if is_remote(path):
            container = pa.ipc.open_file(pa.BufferReader(storage.read_bytes(path))).read_all()
        else:
            with pa.memory_map(path) as src:
                container = pa.ipc.open_file(src).read_all()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowInvalid) as e:
        log.warning("%s: unreadable landing index entry (%s); parsing the event file instead", path, e)
        return None
    try:
        meta = json.loads((container.schema.metadata or {})[b"entry"])
    except (KeyError, ValueError) as e:
        log.warning("%s: unreadable landing index entry (%s); parsing the event file instead", path, e)
        return None
    parts = {}
    for n, blob in zip(container.column("name").to_pylist(), container.column("data").chunk(0) if
                       container.num_rows else []):
        parts[n] = pa.ipc.open_stream(blob.as_buffer()).read_all()
    txs_table = parts.pop(_TXS)
    cols = {c: txs_table.column(c).to_pylist() for c in ("position", "id", "ts_ms", "line", "snapshot")}
    counts = [(c[len("count:"):], txs_table.column(c).to_pylist())
              for c in txs_table.column_names if c.startswith("count:")]
    txs = [TxInfo(p, i, ms, {t: n[k] for t, n in counts if n[k]}, name, ln, sn)
           for k, (p, i, ms, ln, sn) in enumerate(zip(cols["position"], cols["id"], cols["ts_ms"], cols["line"],
                                                      cols["snapshot"]))]
    return ParsedFile(name, size, mtime_ns, parts, txs, meta["first_pos"], meta["snapshot_pos"], meta["began"],
                      meta["snapshot_reads"], meta["leading_snapshot"], meta["snap_end"])
