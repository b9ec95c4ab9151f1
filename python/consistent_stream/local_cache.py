"""What this machine keeps between runs of what it learned from an object store, so that the
next process (each ``dbt run`` is a new one) asks the store less: small JSON documents, one
per kind and key (:class:`Kept`). Their users: the replayed Delta logs of a model's target and
state table (:mod:`consistent_stream.delta.log`), the checkpoint's small files
(:func:`consistent_stream.storage.read_once_under`), the ETag of a released writer lock
(:mod:`consistent_stream.sink.lock`) and compiled plans (:mod:`consistent_stream.plan_cache`,
the one kind keyed by everything its document is a function of, so used as it is).

Nothing kept of a store is trusted: each user checks it against the store with a request it makes anyway
(a log copy by its commit file's ETag in the LIST that reads the newer commits, a file's copy
by its ETag in a LIST of its directory, a lock's ETag by the conditional write that takes the
lock), and a document that is missing, torn, of another
key or cannot be written is no document: the user asks the store as without it.

A document may have a *journal*: JSON lines appended after it (:meth:`Kept.append`), which
its user reads back on top of it (:meth:`Kept.read_journal`), so that what changes a little at a
time (a replayed log, one commit after another) is not written whole each time; writing the
document again starts an empty journal. A torn last line (a process killed while appending) ends
the journal there.

**Data files** (:data:`DATA_FILES`, kind ``data-files``) are the one exception to checking
against the store: the bytes of Parquet data files of tables on an object store that this
machine wrote (a batch's state delta files and target files, :func:`consistent_stream.delta.
files.write_arrow`) or read whole (a keyed read of the state, the target files a MERGE probes),
so that a fresh process's keyed reads GET only the files it has never seen (a process that runs
batch after batch holds them in memory already, :data:`consistent_stream.delta.files.HELD`).
A Delta data file never changes once written (the protocol adds and removes files, never
rewrites one, and the names this package and Spark write carry a fresh UUID), so the check is
the one the log makes: a file is used only for the path and size a live ``add`` action of the
table's current log names, and only when its bytes are that size and framed as Parquet
(``PAR1`` at both ends). Beside them (:data:`DATA_KEYS`, kind ``data-keys``, on local disk
too): the key columns of the large target files a MERGE probes, as Arrow IPC files, which a
new process reads instead of decoding the column from the Parquet file. Bounded by
``CONSISTENT_STREAM_DATA_CACHE_MB`` (default :data:`DATA_CACHE_MB`, of which the keys take at
most a quarter; ``0``: none kept), least recently used out first; a file larger than a quarter
of its kind's bound is not kept.

Where: ``$CONSISTENT_STREAM_CACHE_DIR`` (default ``~/.cache/consistent-stream``), under
``<kind>/``, one file per key named by a hash of it (``.json``, its journal ``.jsonl``); the
directories are this account's only (mode 0700). ``CONSISTENT_STREAM_LOCAL_CACHE=off`` keeps
nothing. Documents not written for :data:`KEEP_DAYS` are removed when a key's first document of
that kind is written.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

import orjson

log = logging.getLogger("consistent_stream")

ENV_DIR = "CONSISTENT_STREAM_CACHE_DIR"
ENV_SWITCH = "CONSISTENT_STREAM_LOCAL_CACHE"
KEEP_DAYS = 30
"""Documents not written for this many days are removed."""


def _loads(data: bytes):
    """The JSON value of ``data`` (UTF-8): parsed by orjson, faster than the standard parser
    on the documents every run opens (a model's target's replayed log keeps the tombstones of
    its retention: hundreds of KB), and by the standard parser where orjson refuses what it
    accepts (NaN, integers past 64 bits), so a document reads as it did. Raises ValueError
    for what neither parses."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def enabled() -> bool:
    """Whether documents are kept (``CONSISTENT_STREAM_LOCAL_CACHE`` is not ``off``)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in ("off", "0", "false", "no")


def directory(kind: str) -> Path:
    """Where the documents of ``kind`` are: ``$CONSISTENT_STREAM_CACHE_DIR/<kind>``."""
    base = os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "consistent-stream")
    return Path(base) / kind


class Kept:
    """The document of ``kind`` kept for ``key`` (a table's or an object's URI): a JSON object,
    read back only when it was written for that very key."""

    def __init__(self, kind: str, key: str):
        self.key = key
        self.file = directory(kind) / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")
        self.journal = self.file.with_suffix(".jsonl")
        self.read_stamp: tuple | None = None   # the stamp of the document the last read returned

    def stamp(self) -> tuple | None:
        """The document file's identity: its inode, modification time (ns) and size (None
        without one). A document written again (a new file renamed over the old one) has
        another, so its writer can tell that another process replaced it."""
        try:
            st = self.file.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def read(self) -> dict | None:
        """The document (without its key), or None when there is none this key can use.
        Sets :attr:`read_stamp` to the document's stamp taken just before the read (a document
        replaced in between then has a stamp other than the one read, never the reverse)."""
        self.read_stamp = self.stamp()
        try:
            doc = _loads(self.file.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.debug("%s (kept for %s) is not read: %s", self.file, self.key, e)
            return None
        if not isinstance(doc, dict) or doc.pop("key", None) != self.key:
            return None
        return doc

    def write(self, doc: dict) -> tuple | None:
        """Keep ``doc`` (JSON values), atomically: a temporary file renamed over the old one;
        the old document's journal is removed. Returns the new document's :meth:`stamp`
        (None when it could not be written)."""
        try:
            first = not self.file.exists()
            self.file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": self.key, **doc}, separators=(",", ":")))
            os.replace(tmp, self.file)
            stamp = self.stamp()
            self.journal.unlink(missing_ok=True)
            if first:
                _remove_old(self.file.parent)
            return stamp
        except OSError as e:
            log.debug("%s (kept for %s) is not written: %s", self.file, self.key, e)
            return None

    def append(self, entry: dict) -> None:
        """Append ``entry`` (JSON values) to the document's journal: one line, not synced (a
        line lost or torn by a crash is one the reader does without)."""
        try:
            with open(self.journal, "a") as f:
                f.write(json.dumps(entry, separators=(",", ":")) + "\n")
        except OSError as e:
            log.debug("%s (kept for %s) is not appended to: %s", self.journal, self.key, e)

    def read_journal(self) -> list[dict]:
        """The journal's entries in the order appended, up to the first line that is not a
        whole JSON object (none without a journal)."""
        try:
            text = self.journal.read_bytes()
        except OSError:
            return []
        entries = []
        for line in text.split(b"\n"):
            try:
                entry = _loads(line)
            except ValueError:
                break
            if not isinstance(entry, dict):
                break
            entries.append(entry)
        return entries

    def drop(self) -> None:
        """Remove the document (if any) and its journal."""
        for f in (self.file, self.journal):
            try:
                f.unlink()
            except OSError:
                pass


def _remove_old(where: Path) -> None:
    """Remove the documents under ``where`` not written for :data:`KEEP_DAYS`."""
    floor = time.time() - KEEP_DAYS * 86400
    for f in [*where.glob("*.json"), *where.glob("*.jsonl")]:
        try:
            if f.stat().st_mtime < floor:
                f.unlink()
        except OSError:
            continue


DATA_ENV = "CONSISTENT_STREAM_DATA_CACHE_MB"
DATA_CACHE_MB = 2048
"""Default bound of the kept data files, in MiB (``CONSISTENT_STREAM_DATA_CACHE_MB``)."""
_PARQUET_MAGIC = b"PAR1"


def data_cache_bytes() -> int:
    """The bound of the kept data files in bytes: ``CONSISTENT_STREAM_DATA_CACHE_MB`` (a whole
    number of MiB >= 0; 0 keeps none), default :data:`DATA_CACHE_MB`; 0 when
    ``CONSISTENT_STREAM_LOCAL_CACHE`` is off. Raises ConfigError naming the variable for any
    other value."""
    if not enabled():
        return 0
    raw = os.environ.get(DATA_ENV)
    if raw is None or not raw.strip():
        return DATA_CACHE_MB << 20
    try:
        mb = int(raw.strip())
    except ValueError:
        mb = -1
    if mb < 0:
        from .errors import ConfigError
        raise ConfigError(f"{DATA_ENV}={raw!r}: the bound of the data files kept on this machine must be a whole "
                          f"number of MiB >= 0 (0 keeps none; default {DATA_CACHE_MB})")
    return mb << 20


class KeptDataFiles:
    """Whole files kept on this machine by the URI and size of the immutable data file they
    come from (the module docstring, "Data files"): one file each under ``<kind>/``, named by a
    hash of the URI and the size, written whole to a temporary file and renamed (a reader never
    sees part of one), and read back only when framed by ``magic`` at both ends and, for the
    file's own bytes (``exact``), of that very size. ``share``: the part of
    ``CONSISTENT_STREAM_DATA_CACHE_MB`` this kind may take. Thread-safe; processes share the
    directory (a file removed by another's eviction while asked for is a miss). Nothing here
    raises: a file that cannot be read, written or removed is a miss, logged at debug level;
    a user that finds a kept file damaged (it does not decode) drops it (:meth:`drop`) and
    reads the file from the store."""

    def __init__(self, kind: str = "data-files", magic: bytes = _PARQUET_MAGIC, *, exact: bool = True,
                 share: float = 1.0):
        self.kind, self.magic, self.exact, self.share = kind, magic, exact, share
        self._lock = threading.Lock()
        self._total: int | None = None   # bytes under the directory, as this process last counted them

    def _bound(self) -> int:
        return int(data_cache_bytes() * self.share)

    def _file(self, uri: str, size: int) -> Path:
        return directory(self.kind) / f"{hashlib.sha256(uri.encode()).hexdigest()[:32]}-{size}"

    def get(self, uri: str, size: int) -> bytes | None:
        """What is kept for data file ``uri`` of ``size`` bytes (the size its ``add`` action
        gives), or None when nothing is."""
        if size <= 0 or not self._bound():
            return None
        f = self._file(uri, size)
        try:
            data = f.read_bytes()
        except OSError:
            return None
        n = len(self.magic)
        if (self.exact and len(data) != size) or len(data) < 2 * n or data[:n] != self.magic \
                or data[-n:] != self.magic:
            log.debug("%s (kept for %s of %d bytes) is not whole: dropped", f, uri, size)
            self._unlink(f)
            return None
        try:
            os.utime(f)   # its last use, which eviction goes by
        except OSError:
            pass
        return data

    def drop(self, uri: str, size: int) -> None:
        """Forget what is kept for data file ``uri`` of ``size`` bytes: its user found it
        damaged (framed whole, yet it does not decode: a disk's fault, an edit by hand)."""
        f = self._file(uri, size)
        if f.exists():
            log.warning("%s (kept for %s of %d bytes) does not decode: removed; the file is read from the "
                        "store", f, uri, size)
            self._unlink(f)
        with self._lock:
            self._total = None   # counted again at the next put

    def put(self, uri: str, data, size: int | None = None) -> None:
        """Keep ``data`` (bytes or a buffer: a whole file) for data file ``uri`` of ``size``
        bytes (default: ``data``'s own size, the file's bytes themselves), removing the least
        recently used files when the kept ones exceed the bound."""
        bound = self._bound()
        n = len(memoryview(data))
        size = n if size is None else size
        if not bound or not n or n > bound // 4 or (self.exact and n != size):
            return
        f = self._file(uri, size)
        if f.exists():
            return
        try:
            f.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = f.with_name(f".{f.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(tmp, "wb") as out:
                out.write(data)
            os.replace(tmp, f)
        except OSError as e:
            log.debug("%s (kept for %s) is not written: %s", f, uri, e)
            return
        with self._lock:
            total = (self._count(f.parent) if self._total is None else self._total + n)
            if total > bound:
                total = self._evict(f.parent, bound * 3 // 4)
            self._total = total

    @staticmethod
    def _files(where: Path) -> list[tuple[float, int, Path]]:
        out = []
        for f in where.iterdir():
            try:
                st = f.stat()
            except OSError:
                continue
            out.append((st.st_mtime, st.st_size, f))
        return out

    def _count(self, where: Path) -> int:
        try:
            return sum(n for _, n, _ in self._files(where))
        except OSError:
            return 0

    def _evict(self, where: Path, keep: int) -> int:
        """Remove the least recently used files under ``where`` (and temporary files an hour
        old: a writer killed before its rename) until at most ``keep`` bytes remain; returns
        the bytes left."""
        try:
            files = sorted(self._files(where), key=lambda t: t[0], reverse=True)
        except OSError:
            return 0
        total, stale = 0, time.time() - 3600
        for mtime, n, f in files:
            if f.name.endswith(".tmp") and mtime < stale or total + n > keep:
                self._unlink(f)
            else:
                total += n
        return total

    @staticmethod
    def _unlink(f: Path) -> None:
        try:
            f.unlink()
        except OSError as e:
            log.debug("%s is not removed: %s", f, e)


DATA_FILES = KeptDataFiles()
"""The process's handle on the kept data files (their Parquet bytes)."""

DATA_KEYS = KeptDataFiles("data-keys", b"ARROW1", exact=False, share=0.25)
"""The key columns of large target files, as Arrow IPC files, by the data file's URI (with
the columns' names) and size: what a MERGE probes of a file it may mark rows of
(:func:`consistent_stream.sink.rewrite._probe`), kept so that a new process does not decode
them from the file again (on local disk too); a quarter of the bound."""
