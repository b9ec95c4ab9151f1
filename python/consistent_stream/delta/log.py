"""The Delta log of a table only this package writes (a model's state table and its target,
both under the model's writer lock), replayed and committed here instead of by delta-rs: what
the table's one writer needs, at the fewest object-store requests.

Why. Opening a table with delta-rs 1.6 reads ``_last_checkpoint``, lists the log, reads the
checkpoint in several ranged GETs and each commit since it twice; each of its commits lists
the log before and after the PUT and reads the new commit back, and its checkpoint hook
replays the log once more. A run opens and commits its state table and its target once a
batch, so that is most of what a small batch costs on an object store. Here (the Delta
protocol, "Action Reconciliation", "Checkpoints"):

* **open** (:meth:`OwnedLog.load`): from this machine's copy of the replay when it is
  current (below: one LIST of the commits from the copy's version, one GET of each commit
  after it, at once), else ``_last_checkpoint`` (one GET), the checkpoint's parts (one GET
  each, whole, read at once), one LIST of the commits from it and one GET of each after it
  (at once). Reconciliation: the newest ``protocol`` and ``metaData``, the newest ``txn`` per
  app id, and the live files (an ``add`` not followed by a ``remove`` of its path).
* **commit** (:meth:`OwnedLog.commit`): the commit file of the next version written once, if
  absent (one conditional PUT: two writers of a version cannot both win), and the replay
  moved by the commit's own actions, nothing read back (the copy of the replay written
  again, locally).
* **version checksum** (``checksums=True``, the model's target): after each commit, its
  ``NNN.crc`` (one PUT, on a thread of its own: the commit returns without waiting for it, and
  the table's next commit, or :func:`settle`, waits), the state the replay holds (live files
  and their bytes, ``metaData``, ``protocol``), as the protocol's "Version Checksum File" says
  writers should. delta-spark reads a table's protocol and metadata from the newest version's
  checksum instead of running a Spark job over its log, so the first read of a target in a
  Spark session (``dbt test``, a view over it, ``verify``) starts that much sooner. A checksum
  that fails to be written is logged; the commit stands (readers do without one).
* **checkpoint**: after a commit whose version is a multiple of ``delta.checkpointInterval``
  (the table's property, Delta's default 10 when unset), a classic single-file checkpoint
  (Parquet, the action columns Delta readers look for) and ``_last_checkpoint``: two PUTs,
  made on the checksums' thread (the commit does not wait for them; the table's next commit
  and :func:`settle` do). A checkpoint that fails to be written is logged and left for
  maintenance; the commit stands.

**The local copy** (:mod:`consistent_stream.local_cache` kind ``delta-logs``): each load keeps
the replay on this machine (:meth:`OwnedLog.replay_state`) with the *write tag* of its
version's commit file (the size and ETag the PUT or the LIST gave on an object store, the size
and modification time locally: :func:`consistent_stream.storage.list_after`), and each commit
appends its actions and its file's write tag to that document's journal (on the checksums'
thread, which the next commit waits for), so that a commit's local write is the commit's size,
not the table's (a long-running model's target holds a week of tombstones). The document is
written whole again after :data:`JOURNAL_COMMITS` commits or a quarter of its actions, when the
replay moved by other commits than this process's own, and when the document on disk is no
longer the one this process wrote or read (another handle wrote it: its file's stamp); a
checkpoint is an entry too, with the floor below which it dropped tombstones. The next process
that opens the table replays the document and its journal (the entries of that document, in
consecutive versions) and lists the log from the version they reach; the copy is used only when
the listing shows that commit file with the same tag (the very commit the copy replayed) and at
most :data:`MAX_BEHIND` commits after it, which are then read and replayed as
:meth:`OwnedLog.refresh` does. Anything else (the table dropped and made again at the same
path, its log cleaned up, a copy torn or too old) replays from the checkpoint as without a
copy. On an object store that saves the round trips of ``_last_checkpoint``, the checkpoint and
each commit since; on local disk the reads of up to ``delta.checkpointInterval`` commit files
(100 by default there), which were most of opening a small model's target and state. Sound
because only the model's run commits data to these tables, under its writer lock; anything else
that commits (maintenance, a property) makes a new version, which the listing shows.

Deletion vectors are replayed as the protocol reconciles them: a file is keyed by its path
and its vector's ``uniqueId`` (a ``remove`` of the file with its old vector and an ``add`` of
the same path with a new one, in one commit, mark more of its rows deleted), and a
:attr:`~OwnedLog.plain` table may have the ``deletionVectors`` feature (reader 3, writer 7).

What it does not replay (:class:`UnsupportedLog`, the caller opens the table with delta-rs
instead): v2 checkpoints (sidecars), a gap in the versions. Tables written this way are
Delta tables delta-rs and delta-spark read, with their checkpoints.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from .. import local_cache, storage
from .checkpoint_rows import (RemoveColumn, checkpoint_actions, checkpoint_table, expire, file_key, has_sidecars,
                              next_removes)

log = logging.getLogger("consistent_stream")

DEFAULT_CHECKPOINT_INTERVAL = 10
"""Delta's ``delta.checkpointInterval`` when the table does not set it."""

MAX_BEHIND = 32
"""The most commits a local copy of the replay may be behind the table and still be used (a
checkpoint is nearer then)."""
COPY_FORMAT = 2
"""The local copies' format; a copy of another is not used."""
JOURNAL_COMMITS = 64
"""The most commits a local copy's journal holds before the copy is written whole again: what
a process that opens the table replays on top of the document."""
COPY_COMMITS = 16
"""The newest commits a local copy keeps whole (their ``commitInfo``, txns, removed paths):
what a run asks of its target's and state's recent commits; an older one is read from its
commit file when asked, as after a replay from a checkpoint."""


MAX_WRITER_VERSION = 4
"""The newest writer protocol version :attr:`OwnedLog.plain` tables may have without table
features."""

LEGACY_WRITER_FEATURES = {2: ("appendOnly", "invariants"), 3: ("appendOnly", "invariants", "checkConstraints"),
                          4: ("appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns")}
"""The writer features a legacy writer version (2 to 4) implies (the Delta protocol, "Table
Features": a table upgraded to writer version 7 lists them)."""

DELETION_VECTORS = "deletionVectors"
PLAIN_WRITER_FEATURES = frozenset(LEGACY_WRITER_FEATURES[4]) | {DELETION_VECTORS}
"""The table features a :attr:`OwnedLog.plain` table may list: writer version 4's and
deletion vectors (a reader feature too), nothing a commit must write beyond its actions."""


def with_deletion_vectors(protocol: dict) -> dict:
    """``protocol`` (a ``protocol`` action) upgraded to table features with
    ``deletionVectors``: reader version 3, writer version 7, the features the old versions
    implied kept (:data:`LEGACY_WRITER_FEATURES`)."""
    writer = int(protocol.get("minWriterVersion", 2))
    wf = list(protocol.get("writerFeatures") or LEGACY_WRITER_FEATURES.get(writer, LEGACY_WRITER_FEATURES[2]))
    rf = list(protocol.get("readerFeatures") or [])
    return {"minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": rf + [DELETION_VECTORS] * (DELETION_VECTORS not in rf),
            "writerFeatures": wf + [DELETION_VECTORS] * (DELETION_VECTORS not in wf)}


class UnsupportedLog(Exception):
    """The log holds what :class:`OwnedLog` does not replay (its message says what)."""


class ConflictingCommit(Exception):
    """Another writer committed the version this one was about to write, with data changes
    or a transaction of the committing app: the commit was not made."""


_SAFE_PATH = re.compile(r"[A-Za-z0-9_\-./=]+")


def log_path(rel: str) -> str:
    """A data file's path relative to the table root as the log holds it (a URI reference,
    percent-encoded as delta-rs writes it); a path already in that form is unchanged."""
    return rel if _SAFE_PATH.fullmatch(rel) or "%" in rel else quote(rel, safe="/=")


@dataclass
class CommitInfo:
    """One commit as its file says: ``version``, ``timestamp_ms``, the whole ``commitInfo``
    (``info``), the ``txns`` it records (app id -> version), whether it changes data
    (``data_change``: an add or remove with ``dataChange``), and the paths it removes (log
    form: what the version before it referenced and it does not)."""
    version: int
    timestamp_ms: int
    info: dict
    txns: dict = field(default_factory=dict)
    data_change: bool = False
    removed: tuple = ()


@dataclass
class _KeptCopy:
    """The local copy a process wrote or read last: its ``id``, the ``version`` its document and
    journal reach, the document's ``size`` (files and tombstones, at least 1), its journal's
    ``entries`` and ``journal_actions``, and the document file's ``stamp``
    (:meth:`~consistent_stream.local_cache.Kept.stamp`; set once a write on the writer's thread
    is done, None when unknown)."""
    id: str
    version: int
    size: int
    entries: int = 0
    journal_actions: int = 0
    stamp: tuple | None = None

    def __post_init__(self):
        self.size = max(1, self.size)


class OwnedLog:
    """The replayed log of the Delta table at ``table_path`` (module docstring). ``version``
    is -1 until :meth:`load` finds the table. ``copy``: keep a local copy of the replay
    (module docstring); by default unless ``CONSISTENT_STREAM_LOCAL_CACHE=off``."""

    def __init__(self, table_path: str, *, checksums: bool = False, copy: bool | None = None):
        self.path = table_path.rstrip("/")
        self.log_dir = f"{self.path}/_delta_log"
        self.checksums = checksums
        if copy is None:
            copy = local_cache.enabled()
        self._copy = local_cache.Kept("delta-logs", self.path) if copy else None
        self.from_copy = False   # whether the last load replayed from the local copy
        self._peeked: tuple[dict, list[dict]] | None = None   # the copy kept_head read, for the next load
        self._kept: _KeptCopy | None = None   # the local copy this process wrote last
        self._reset()

    def _reset(self) -> None:
        """Nothing replayed yet."""
        self.version = -1
        self.checkpoint_version = -1   # the newest checkpoint's version (-1: none)
        self.protocol: dict = {}
        self.metadata: dict = {}
        self.txns: dict[str, dict] = {}          # app id -> its newest txn action
        self.files: dict[str, dict] = {}         # log path -> add action
        self.tombstones: dict[tuple[str, str], dict] = {}   # (log path, vector id) -> remove action
        self.commits: dict[int, CommitInfo] = {}  # commits replayed from their files (not those in a checkpoint)
        self._tag: str | None = None   # the write tag of this version's commit file (None: not known)
        self._expired_before: int | None = None   # the last checkpoint's tombstone floor (ms), for the journal
        self._removes: RemoveColumn | None = None   # the last checkpoint's remove column, kept for the next
        self._writing: list[Future] = []   # the last commit's checksum and checkpoint being written

    # ---- replay -------------------------------------------------------------------------------
    def load(self) -> bool:
        """Replay the log: from the local copy when it is current (module docstring), else from
        the newest checkpoint. Returns False when there is no table (no commit, no
        checkpoint). Raises UnsupportedLog, OSError when a file cannot be read."""
        self._reset()
        self.from_copy = self._copy is not None and self._load_copy()
        if self.from_copy:
            return True
        last = storage.read_text(f"{self.log_dir}/_last_checkpoint")
        if last:
            try:
                cp = json.loads(last)
            except ValueError:
                cp = None
            if cp and "version" in cp:
                if cp.get("v2Checkpoint") or cp.get("checkpointSchema", {}).get("sidecar"):
                    raise UnsupportedLog("a v2 checkpoint")
                self._read_checkpoint(int(cp["version"]), cp.get("parts"))
        listed = self._listed_from(self.version)
        found = self._read_commits(listed) or self.checkpoint_version >= 0
        self._tag = dict(listed).get(f"{self.version:020d}.json")
        self._keep()
        return found

    def refresh(self) -> int:
        """Read the commits written since (one LIST, a GET each); returns the newest version."""
        if self.version < 0:
            self.load()
        elif self._read_commits(self._listed_from(self.version)):
            self._keep()
        return self.version

    def _listed_from(self, version: int) -> list[tuple[str, str | None]]:
        """The log's files from ``version``'s commit file on (all of them for -1), with their
        write tags when a copy is kept (else None): one LIST."""
        start = f"{version:020d}.crc" if version >= 0 else ""
        if self._copy is None:
            return [(n, None) for n in storage.list_after(self.log_dir, start)]
        return storage.list_after(self.log_dir, start, tags=True)

    def kept_head(self) -> CommitInfo | None:
        """The newest commit this machine's copy of the replay holds (its version's), read
        without a request and not checked against the table: what the table most likely
        holds before :meth:`load` says so. None without a copy, or when the copy's version is
        a checkpoint's (its commit is not kept)."""
        if self._copy is None:
            return None
        kept = self._copy.read()
        self._peeked = None if kept is None else (kept, self._copy.read_journal())
        if kept is None or kept.get("format") != COPY_FORMAT:
            return None
        try:
            entries, _, _ = _journal_chain(kept, self._peeked[1])
            if entries:
                return commit_info(int(entries[-1]["version"]), entries[-1]["actions"])
            version = int(kept["log"]["version"])
            head = next((c for c in kept["log"]["commits"] if int(c["version"]) == version), None)
            return None if head is None else CommitInfo(**{**head, "removed": tuple(head["removed"])})
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def _load_copy(self) -> bool:
        """Replay from the local copy (its document and journal) when the log still holds the
        commit it reaches (the same write tag) and at most MAX_BEHIND commits after it; False
        otherwise (nothing replayed)."""
        # (read once when kept_head read it)
        kept, journal = self._peeked or (self._copy.read(), None)
        self._peeked = None
        if kept is None or kept.get("format") != COPY_FORMAT or not kept.get("tag") or not kept.get("id"):
            return False
        try:
            entries, version, tag = _journal_chain(kept, self._copy.read_journal() if journal is None else journal)
            listed = self._listed_from(version)
            if dict(listed).get(f"{version:020d}.json") != tag or len(_versions(listed, version)) > MAX_BEHIND:
                return False
            self._restore(kept["log"])
            floors = [int(e["checkpoint"]["expired_before_ms"]) if "checkpoint" in e else None for e in entries]
            for e, floor, due in zip(entries, floors, _expiring(floors)):
                self._replay(int(e["version"]), e["actions"])
                if floor is not None:
                    if due:
                        self._expire_tombstones(floor)
                    self.checkpoint_version = self.version
        except (KeyError, TypeError, ValueError, AttributeError):
            self._reset()
            return False
        self._tag = tag
        size = len(kept["log"]["files"]) + len(kept["log"]["tombstones"])
        self._kept = _KeptCopy(kept["id"], version, size, len(entries), sum(len(e["actions"]) for e in entries),
                               self._copy.read_stamp)
        if self._read_commits(listed):
            self._keep()
        return True

    def _keep(self, *, later: bool = False, checkpoint: bool = False) -> None:
        """Write the local copy of the replay (when kept; with ``later``, on the checksums'
        thread, of the replay as it is now; with ``checkpoint``, as of the checkpoint of this
        version being written there, which a failure leaves to the next interval's); a table
        not found, or a commit file whose write tag is not known (a store without ETags),
        drops it."""
        if self._copy is None:
            return
        if self.version < 0 or not self._tag:
            self._kept = None
            self._copy.drop()
            return
        doc = {"format": COPY_FORMAT, "id": uuid.uuid4().hex, "tag": self._tag, "log": self.replay_state()}
        kept = self._kept = _KeptCopy(doc["id"], self.version, len(self.files) + len(self.tombstones))
        if checkpoint:
            doc["log"]["checkpoint_version"] = self.version

        def write() -> None:
            kept.stamp = self._copy.write(doc)
        if later:
            self._writing.append(_in_background(write))
        else:
            write()

    def _keep_commit(self, lines: list[dict], *, checkpoint: bool) -> None:
        """After this process's commit of ``lines`` (its actions) at the replay's version: its
        entry appended to the local copy's journal, on the checksums' thread, when the copy
        this process wrote or read is still the document on disk (its stamp: no other process
        wrote it since), is at the version before, and its journal stays within
        :data:`JOURNAL_COMMITS` entries and a quarter of the document's number of actions (so
        a process opening the table replays little more than the document, and what is written
        over a run is a few times what it commits); else the copy written whole, as
        :meth:`_keep` does. With ``checkpoint`` (one of this version is being written), the
        entry also says so, with the floor below which the checkpoint dropped tombstones
        (:meth:`_expire_tombstones`), which a replay of the journal applies too."""
        if self._copy is None:
            return
        k = self._kept
        if (not self._tag or k is None or k.version != self.version - 1 or k.stamp is None
                or k.entries >= JOURNAL_COMMITS or 4 * (k.journal_actions + len(lines)) > k.size
                or self._copy.stamp() != k.stamp):
            self._keep(later=True, checkpoint=checkpoint)
            return
        entry = {"copy": k.id, "version": self.version, "tag": self._tag, "actions": lines}
        if checkpoint:
            entry["checkpoint"] = {"expired_before_ms": self._expired_before}
        self._writing.append(_in_background(self._copy.append, entry))
        self._kept = _KeptCopy(k.id, self.version, k.size, k.entries + 1, k.journal_actions + len(lines), k.stamp)

    def replay_state(self) -> dict:
        """What the replay holds, as JSON values (what the local copy keeps): ``version``,
        ``checkpoint_version``, ``protocol``, ``metadata``, ``txns`` (app id -> txn action),
        ``files`` and ``tombstones`` (add and remove actions), ``commits`` (:class:`CommitInfo`
        fields, the newest :data:`COPY_COMMITS`; an older one is read from its commit file when
        asked), each container a new one (what a later replay changes is not in it; the
        actions themselves are never changed, only replaced)."""
        newest = sorted(self.commits)[-COPY_COMMITS:]
        return {"version": self.version, "checkpoint_version": self.checkpoint_version,
                "protocol": dict(self.protocol), "metadata": dict(self.metadata), "txns": dict(self.txns),
                "files": list(self.files.values()), "tombstones": list(self.tombstones.values()),
                "commits": [{"version": c.version, "timestamp_ms": c.timestamp_ms, "info": c.info,
                             "txns": dict(c.txns), "data_change": c.data_change, "removed": list(c.removed)}
                            for c in (self.commits[v] for v in newest)]}

    def _restore(self, state: dict) -> None:
        """The replay made :meth:`replay_state` ``state``."""
        self.version = int(state["version"])
        self.checkpoint_version = int(state["checkpoint_version"])
        self.protocol = dict(state["protocol"])
        self.metadata = dict(state["metadata"])
        self.txns = dict(state["txns"])
        self.files = {a["path"]: a for a in state["files"]}
        self.tombstones = {file_key(r): r for r in state["tombstones"]}
        self._removes = None
        self.commits = {int(c["version"]): CommitInfo(**{**c, "removed": tuple(c["removed"])})
                        for c in state["commits"]}

    def _read_checkpoint(self, version: int, parts: int | None) -> None:
        names = ([f"{version:020d}.checkpoint.parquet"] if not parts else
                 [f"{version:020d}.checkpoint.{i:010d}.{int(parts):010d}.parquet" for i in range(1, int(parts) + 1)])
        blobs = storage.read_many([f"{self.log_dir}/{n}" for n in names], "delta-log")
        for blob in blobs:
            table = pq.read_table(pa.BufferReader(blob))
            if has_sidecars(table):
                raise UnsupportedLog("a v2 checkpoint with sidecars")
            for kind, action in checkpoint_actions(table):
                self._apply(kind, action)
        self.checkpoint_version = self.version = version

    def _read_commits(self, listed: list[tuple[str, str | None]]) -> bool:
        """Read and replay the commits after the replay's version among ``listed`` (log file
        names and write tags), at once; False when there are none."""
        versions = _versions(listed, self.version)
        if not versions:
            return False
        if versions != list(range(self.version + 1, versions[-1] + 1)):
            raise UnsupportedLog(f"a gap in the versions after {self.version} ({versions[:5]}...)")
        texts = storage.read_many([f"{self.log_dir}/{v:020d}.json" for v in versions], "delta-log")
        for v, text in zip(versions, texts):
            self._replay(v, [json.loads(line) for line in text.splitlines() if line.strip()])
        self._tag = dict(listed).get(f"{self.version:020d}.json")
        return True

    def _replay(self, version: int, actions: list[dict]) -> None:
        for a in actions:
            for kind, action in a.items():
                if kind != "commitInfo":
                    self._apply(kind, action)
        self.commits[version] = commit_info(version, actions)
        for v in sorted(self.commits)[:-64]:
            del self.commits[v]
        self.version = version

    def _expire_tombstones(self, floor_ms: int) -> None:
        """Drop the tombstones removed before ``floor_ms`` (epoch ms), as a checkpoint of this
        version leaves them out; the journal's entry of the commit records the floor."""
        expire(self.tombstones, floor_ms)
        self._expired_before = floor_ms

    def _apply(self, kind: str, action: dict) -> None:
        if kind == "add":
            self.files[action["path"]] = action
            key = file_key(action)
            if self.tombstones.pop(key, None) is not None and self._removes is not None:
                self._removes.touched.add(key)
        elif kind == "remove":
            key = file_key(action)
            live = self.files.get(action["path"])
            if live is not None and file_key(live) == key:
                del self.files[action["path"]]
            self.tombstones[key] = action
            if self._removes is not None:
                self._removes.touched.add(key)
        elif kind == "txn":
            self.txns[action["appId"]] = action
        elif kind == "metaData":
            self.metadata = action
        elif kind == "protocol":
            self.protocol = action
        elif kind not in ("cdc", "domainMetadata", "checkpointMetadata", "sidecar"):
            raise UnsupportedLog(f"a {kind} action")

    # ---- what the table holds -----------------------------------------------------------------
    @property
    def configuration(self) -> dict:
        return dict(self.metadata.get("configuration") or {})

    @property
    def partition_columns(self) -> list[str]:
        return list(self.metadata.get("partitionColumns") or [])

    @property
    def plain(self) -> bool:
        """Whether this package may write the table's commits and checkpoints: a protocol
        without table features, reader version 1 (no column mapping) and writer version 4
        at most (invariants, CHECK constraints, Change Data Feed, generated columns: nothing
        a commit must add to the rows or the log beyond their actions); or reader 3 / writer 7
        with those features and deletion vectors only (:data:`PLAIN_WRITER_FEATURES`)."""
        p = self.protocol
        reader, writer = int(p.get("minReaderVersion", 1)), int(p.get("minWriterVersion", 2))
        if reader <= 1 and writer <= MAX_WRITER_VERSION:
            return not p.get("readerFeatures") and not p.get("writerFeatures")
        return (reader == 3 and writer == 7 and set(p.get("readerFeatures") or ()) <= {DELETION_VECTORS}
                and set(p.get("writerFeatures") or ()) <= PLAIN_WRITER_FEATURES)

    @property
    def deletion_vectors(self) -> bool:
        """Whether the table's protocol has the ``deletionVectors`` feature (its commits may
        mark rows deleted in a file's deletion vector)."""
        return DELETION_VECTORS in (self.protocol.get("writerFeatures") or ())

    def txn_version(self, app_id: str) -> int | None:
        t = self.txns.get(app_id)
        return None if t is None else int(t["version"])

    # ---- commits ------------------------------------------------------------------------------
    def commit(self, adds: list[dict], removes: list[dict], *, txn: tuple[str, int] | None,
               info: dict, cdc: list[dict] = (), table: list[dict] = (), retries: int = 3) -> int:
        """ONE commit of ``adds`` and ``removes`` (add / remove actions, paths in log form),
        and ``cdc`` (Change Data Feed files: ``cdc`` actions), recording ``txn`` (app id,
        version) and ``info`` (the ``commitInfo``), at the version after the replay's;
        ``table``: ``protocol`` / ``metaData`` actions (``{"protocol": {...}}``) the commit
        also makes (a protocol upgrade with the table property that goes with it). When
        another writer took that version with a commit that changes no data and records no
        transaction of ``txn``'s app (table maintenance: a property, a checkpoint's commit),
        the replay reads it and the commit goes to the next version; any other commit there
        raises ConflictingCommit. Returns the new version."""
        now = int(time.time() * 1000)
        lines = [{"commitInfo": {"timestamp": now, **info}}]
        if txn is not None:
            lines.append({"txn": {"appId": txn[0], "version": int(txn[1]), "lastUpdated": now}})
        lines += list(table)
        lines += [{"remove": r} for r in removes] + [{"add": a} for a in adds] + [{"cdc": c} for c in cdc]
        body = "\n".join(json.dumps(a, separators=(",", ":")) for a in lines).encode() + b"\n"
        self.flush()
        for _ in range(retries + 1):
            version = self.version + 1
            try:
                tag = storage.create_bytes(f"{self.log_dir}/{version:020d}.json", body)
            except FileExistsError:
                self._accept_concurrent(txn)
                continue
            self._replay(version, lines)
            self._tag = tag
            if self.checksums:
                self._writing.append(_in_background(self._write_checksum, self.version, self.checksum()))
            self._keep_commit(lines, checkpoint=self._maybe_checkpoint())
            return version
        raise ConflictingCommit(f"{self.path}: the versions after {self.version} keep being taken by other writers")

    def flush(self) -> None:
        """Wait for the last commit's version checksum and checkpoint being written (each logs
        its own failure)."""
        writing, self._writing = self._writing, []
        for f in writing:
            f.result()

    def _accept_concurrent(self, txn: tuple[str, int] | None) -> None:
        before = self.version
        self.refresh()
        for v in range(before + 1, self.version + 1):
            c = self.commits.get(v)
            if c is None or c.data_change or (txn is not None and txn[0] in c.txns):
                raise ConflictingCommit(
                    f"{self.path}: version {v} was committed by another writer"
                    + (f" ({'a data change' if c.data_change else f'transactions {c.txns}'})" if c else ""))

    def checksum(self) -> dict:
        """The replay's version checksum (the protocol's "Version Checksum File": live files
        and their total size in bytes, the one ``metaData`` and ``protocol``). The optional
        parts are left out: ``setTransactions`` (delta-spark compares them after expiring
        transactions older than ``delta.setTransactionRetentionDuration``, which this replay
        does not), ``allFiles`` (grows with the table), the file size histogram."""
        return {"tableSizeBytes": sum(int(a.get("size") or 0) for a in self.files.values()),
                "numFiles": len(self.files), "numMetadata": 1, "numProtocol": 1,
                "metadata": self.metadata, "protocol": self.protocol}

    def _write_checksum(self, version: int, checksum: dict) -> None:
        try:
            storage.create_bytes(f"{self.log_dir}/{version:020d}.crc",
                                 json.dumps(checksum, separators=(",", ":")).encode())
        except Exception as e:  # noqa: BLE001 (optional: readers without it reconstruct the state)
            log.warning("version checksum of %s at version %d not written: %s", self.path, version, e)

    def _maybe_checkpoint(self) -> bool:
        """Write a checkpoint of this version (on the checksums' thread) when the interval says
        so; whether one is being written."""
        try:
            interval = int(self.configuration.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL))
        except ValueError:
            interval = DEFAULT_CHECKPOINT_INTERVAL
        if interval <= 0 or self.version % interval or not self.plain:
            return False
        try:
            self.write_checkpoint(later=True)
            return True
        except Exception as e:  # noqa: BLE001 (the commit stands; maintenance writes the checkpoint)
            log.warning("checkpoint of %s at version %d not written (maintenance writes it): %s",
                        self.path, self.version, e)
            return False

    def write_checkpoint(self, *, later: bool = False) -> None:
        """A classic checkpoint of the replay's version and ``_last_checkpoint`` pointing at
        it (two PUTs; with ``later``, made on the thread that writes the version checksums,
        which the table's next commit and :func:`settle` wait for, and a failure logged).
        Tombstones older than ``delta.deletedFileRetentionDuration`` (Delta's default: one
        week) are left out, as Delta's own checkpoints do, and dropped from the replay too: it
        then holds what a replay from this checkpoint holds, and a process that commits for
        weeks (a continuous model: a remove or two each batch) does not carry, and write to
        its local copy at every commit, every file it ever removed."""
        keep_ms = _interval_ms(self.configuration.get("delta.deletedFileRetentionDuration"), 7 * 24 * 3600 * 1000)
        floor_ms = int(time.time() * 1000) - keep_ms
        self._removes = next_removes(self.tombstones, floor_ms, self._removes)
        self._expired_before = floor_ms
        table = checkpoint_table(self.protocol, self.metadata, list(self.txns.values()), list(self.files.values()),
                                 self._removes.rows)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="snappy")
        buf = sink.getvalue()
        version, pointer = self.version, json.dumps({"version": self.version, "size": table.num_rows,
                                                     "sizeInBytes": buf.size, "numOfAddFiles": len(self.files)})

        def put() -> None:
            storage.write_bytes(f"{self.log_dir}/{version:020d}.checkpoint.parquet", buf)
            storage.replace_bytes(f"{self.log_dir}/_last_checkpoint", pointer.encode())
            self.checkpoint_version = max(self.checkpoint_version, version)

        def put_logged() -> None:
            try:
                put()
            except Exception as e:  # noqa: BLE001 (the commit stands; maintenance writes the checkpoint)
                log.warning("checkpoint of %s at version %d not written (maintenance writes it): %s",
                            self.path, version, e)
        if later:
            self._writing.append(_in_background(put_logged))
        else:
            put()


_BACKGROUND: ThreadPoolExecutor | None = None
_PENDING: set[Future] = set()
_PENDING_LOCK = threading.Lock()


def _in_background(fn, *args) -> Future:
    """``fn(*args)`` on the module's writer thread (what :func:`settle` waits for)."""
    global _BACKGROUND
    with _PENDING_LOCK:
        if _BACKGROUND is None:
            _BACKGROUND = ThreadPoolExecutor(max_workers=2, thread_name_prefix="delta-log-write")
        future = _BACKGROUND.submit(fn, *args)
        _PENDING.add(future)
    future.add_done_callback(lambda f: _PENDING.discard(f))
    return future


def settle() -> None:
    """Wait for the version checksums and checkpoints this process's commits are still
    writing (a run waits before it reports, so that what it counts and what readers find is
    whole)."""
    with _PENDING_LOCK:
        pending = list(_PENDING)
    for f in pending:
        f.result()   # (its function logs its own failures)


def commit_info(version: int, actions: list[dict]) -> CommitInfo:
    """What the commit of ``actions`` (its file's lines, each ``{kind: action}``) at
    ``version`` says (:class:`CommitInfo`)."""
    info, txns, changed, removed = {}, {}, False, []
    for a in actions:
        for kind, action in a.items():
            if kind == "commitInfo":
                info = action
            elif kind == "txn":
                txns[action["appId"]] = int(action["version"])
            elif kind in ("add", "remove"):
                changed = changed or action.get("dataChange", True)
                if kind == "remove":
                    removed.append(action["path"])
    ts = int(info.get("inCommitTimestamp") or info.get("timestamp") or 0)
    return CommitInfo(version, ts, info, txns, bool(changed), tuple(removed))


def _expiring(floors: list[int | None]) -> list[bool]:
    """Which of a journal's checkpoint entries (their tombstone floors, None for the other
    entries) a replay of it must expire tombstones at: when the floors never fall (the
    retention was not raised in between), the last one's alone: each expiry's survivors are
    then a superset of the last's, and a tombstone made after an entry is subject to the
    floors after it only, so the last expiry drops what all of them would (each one is a pass
    over every tombstone)."""
    given = [f for f in floors if f is not None]
    if given != sorted(given):
        return [f is not None for f in floors]
    last = max((i for i, f in enumerate(floors) if f is not None), default=-1)
    return [i == last for i in range(len(floors))]


def _journal_chain(kept: dict, journal: list[dict]) -> tuple[list[dict], int, str]:
    """The entries of local copy ``kept``'s ``journal`` that replay on top of it (its own, in
    consecutive versions from the one after its replay's; an entry of another copy, which a
    process still holding that copy appended after this one replaced it, is passed over), and
    the version and write tag they reach."""
    version, tag, entries = int(kept["log"]["version"]), kept["tag"], []
    for e in journal:
        if e.get("copy") != kept["id"]:
            continue
        if int(e["version"]) != version + 1:
            break
        entries.append(e)
        version, tag = version + 1, e["tag"]
    return entries, version, tag


def _versions(listed: list[tuple[str, str | None]], after: int) -> list[int]:
    """The commit versions after ``after`` among log file names ``listed`` (name, tag), in order."""
    return sorted(v for v in (int(n[:20]) for n, _ in listed if len(n) == 25 and n.endswith(".json")
                              and n[:20].isdigit()) if v > after)


_UNITS_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
             "week": 604_800_000}


def _interval_ms(text: str | None, default: int) -> int:
    """Delta's ``interval N unit`` table property in ms (``default`` when unset or unread)."""
    m = re.fullmatch(r"\s*interval\s+(\d+)\s+(\w+?)s?\s*", text or "")
    if not m or m.group(2) not in _UNITS_MS:
        return default
    return int(m.group(1)) * _UNITS_MS[m.group(2)]
