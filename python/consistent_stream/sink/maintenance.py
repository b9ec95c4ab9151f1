"""Table maintenance of a model: what a long run keeps on disk, and what it deletes.

Every micro-batch commits one version of the target and one of the state table and may leave
a scratch directory; left alone, the Delta logs, the superseded data files and the Change Data
Feed files grow with the run's history. A *maintenance pass* (:func:`maintain`), run by the
model's one writer after a committed batch (every ``EVERY_BATCHES``-th batch of the query, or
after ``EVERY_BATCHES`` batches or ``EVERY_SECONDS`` seconds of one run, see
:class:`Maintenance`), keeps:

* the target (read by ``ref()`` downstream through its Change Data Feed, by time travel, by
  the catalog's snapshot of a version): everything Delta's own retention keeps. Log entries
  (commit files, old checkpoints) are deleted once older than ``log_retention_hours`` (Delta's
  ``delta.logRetentionDuration``, 30 days), and only below a checkpoint, so every version from
  that checkpoint on stays readable; data files removed from the table, and Change Data Feed
  files, are deleted once removed (written) longer than ``deleted_file_retention_hours`` ago
  (``delta.deletedFileRetentionDuration``, 7 days). A downstream model must consume a version
  within those windows, as with any Delta table. The target gets no commit from maintenance:
  the files are deleted directly (delta-rs' VACUUM would commit "VACUUM START/END" versions,
  and the target's newest commit must be a batch's, which the protocol reads);
* the state table (internal: only the model's writer reads it, at the version the target's
  last commit records): the versions from the ``state_retention_versions``-th newest up to
  that one. A crashed batch's replay reads the state at the version the target's last commit
  recorded, and finds the target's txn there; both are kept, and nothing newer than the
  target's last commit is touched (a pass runs after the target commit, before the next batch
  starts, under the model's writer lock). Files of older versions, and files no version
  references (a crashed attempt's), are vacuumed (delta-rs, ``full``), and the log below the
  newest checkpoint at or under the oldest kept version is deleted. Its tombstones expire
  from its checkpoints after ``STATE_TOMBSTONE_RETENTION`` (a table property set once), so
  its checkpoints stay the size of its live files;
* Delta checkpoints: delta-rs writes one every ``delta.checkpointInterval`` commits (100, its
  default, which we keep: our handles follow a table by reading only the newer commits, so a
  full log replay from the last checkpoint happens only when a run opens a table, and a
  checkpoint rewrites every live file's entry); a pass writes one when the newest is more
  than ``checkpoint_interval`` versions old (a table written by a writer without that hook);
* scratch directories of batches before the running one (left by a crashed batch).

The query's own checkpoint holds nothing that grows with its history: its record
(:mod:`consistent_stream.checkpoint`), the definition, the plan and the state table.

Only local file systems are cleaned (URIs get checkpoints only, logged once).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import unquote

from .. import location, storage
from ..location import fs_path

log = logging.getLogger(__name__)

EVERY_BATCHES = 10
"""A model's maintenance pass runs after the batches whose id is a multiple of this (batch ids
go on across runs: a model run once a batch, as ``dbt run`` runs it, passes every this many
runs, not at every run: on an object store a pass is tens of requests), and in a long run
after every this many committed batches ..."""
EVERY_SECONDS = 60.0
"""... or once this many seconds passed since the previous pass (or the run's start),
whichever comes first."""
STATE_TOMBSTONE_RETENTION = "interval 10 minutes"
"""The state table's ``delta.deletedFileRetentionDuration``: how long its removed files stay
listed (as tombstones) in its checkpoints. Maintenance vacuums them long before."""


@dataclass(frozen=True)
class Retention:
    """What a model keeps (see the module docstring). Hours may be fractions."""
    log_retention_hours: float = 720.0
    deleted_file_retention_hours: float = 168.0
    state_retention_versions: int = 2
    checkpoint_interval: int = 100


@dataclass
class MaintenanceReport:
    """What one pass did: files deleted per kind, checkpoints written, seconds taken."""
    seconds: float = 0.0
    checkpoints: int = 0
    target_log_files: int = 0
    target_data_files: int = 0
    target_cdc_files: int = 0
    state_log_files: int = 0
    state_data_files: int = 0
    scratch_dirs: int = 0
    errors: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _reachable(path: str) -> bool:
    """Whether :mod:`consistent_stream.storage` reaches ``path``: a local path, a ``file://``
    URI or an object store's (``s3://``, ``s3a://``)."""
    return "://" not in path or path.startswith(("file://", "s3://", "s3a://"))


def _log_name(version: int, suffix: str) -> str:
    return f"{version:020d}.{suffix}"


def _last_checkpoint(table: str) -> int | None:
    """The version of the table's newest checkpoint (``_delta_log/_last_checkpoint``), or None."""
    last = storage.read_json(os.path.join(fs_path(table), "_delta_log", "_last_checkpoint"))
    if last is None:
        return None
    try:
        return int(last["version"])
    except (ValueError, KeyError):
        return None


def ensure_checkpoint(dt, interval: int) -> bool:
    """Write a checkpoint of ``dt`` (a deltalake DeltaTable, at its latest version) when its
    newest is more than ``interval`` versions old. Returns whether one was written."""
    last = _last_checkpoint(dt.table_uri) if _reachable(dt.table_uri) else None
    if last is not None and dt.version() - last < interval:
        return False
    if last is None and dt.version() < interval:
        return False
    dt.create_checkpoint()
    return True


class LogCleaner:
    """Deletes a table's log entries below a checkpoint, oldest first; remembers how far it
    got, so a pass stats only the entries it may delete (never lists a long log twice)."""

    def __init__(self, table: str):
        self.log_dir = os.path.join(fs_path(table), "_delta_log")
        self.floor: int | None = None   # the lowest version whose entries may still exist

    def _lowest(self) -> int:
        versions = [int(n[:20]) for n in storage.list_dir(self.log_dir) if n[:20].isdigit() and n.endswith(".json")]
        return min(versions) if versions else 0

    def clean(self, keep_version: int, cutoff_s: float | None) -> int:
        """Delete the entries (commit files, checkpoints, checksums) of the versions below
        ``c``, the newest checkpoint at or below ``keep_version`` whose commit file is older
        than ``cutoff_s`` (seconds since epoch; None: any age). Every version from ``c`` on stays
        readable. Returns the number of files deleted."""
        if self.floor is None:
            self.floor = self._lowest()
        c, v = None, self.floor
        while v <= keep_version:
            try:
                mtime = storage.stat(os.path.join(self.log_dir, _log_name(v, "json"))).mtime_ns / 1e9
            except FileNotFoundError:
                mtime = None
            if cutoff_s is not None and mtime is not None and mtime >= cutoff_s:
                break
            if storage.exists(os.path.join(self.log_dir, _log_name(v, "checkpoint.parquet"))):
                c = v
            v += 1
        if c is None or c <= self.floor:
            return 0
        deleted = 0
        for old in range(self.floor, c):
            for suffix in ("json", "crc", "checkpoint.parquet"):
                if storage.remove(os.path.join(self.log_dir, _log_name(old, suffix))):
                    deleted += 1
        self.floor = c
        return deleted


class Tombstones:
    """A table's removed files still listed in its log: relative path (decoded) -> removal time
    (ms since epoch). Read from its newest checkpoint (again only when a newer one is written)
    and the commit files after it (each read once). Only a single-file checkpoint is read
    (ValueError for another kind)."""

    def __init__(self, table: str):
        self.log_dir = os.path.join(fs_path(table), "_delta_log")
        self.checkpoint: int | None = None
        self.next_version = 0
        self.removed: dict[str, int] = {}

    def refresh(self) -> dict[str, int]:
        import pyarrow.parquet as pq
        last = storage.load_json(os.path.join(self.log_dir, "_last_checkpoint"))
        version = int(last["version"])
        if last.get("parts"):
            raise ValueError(f"multi-part checkpoint {version} in {self.log_dir}")
        if version != self.checkpoint:
            fs, cp_path = location.pyarrow_filesystem(
                os.path.join(self.log_dir, _log_name(version, "checkpoint.parquet")))
            cp = pq.read_table(cp_path, columns=["remove"], filesystem=fs)
            # merged: a checkpoint leaves out tombstones older than the table's
            # deletedFileRetentionDuration, which this process may not have vacuumed yet
            self.removed.update({unquote(r["path"]): int(r.get("deletionTimestamp") or 0)
                                 for r in cp.column("remove").to_pylist() if r is not None})
            self.checkpoint, self.next_version = version, max(self.next_version, version + 1)
        while True:
            path = os.path.join(self.log_dir, _log_name(self.next_version, "json"))
            try:
                lines = storage.read_bytes(path).splitlines()
            except FileNotFoundError:
                break
            for line in lines:
                a = json.loads(line)
                if "remove" in a:
                    self.removed[unquote(a["remove"]["path"])] = int(a["remove"].get("deletionTimestamp") or 0)
                elif "add" in a:
                    self.removed.pop(unquote(a["add"]["path"]), None)
            self.next_version += 1
        return self.removed


def vacuum_target(dt, retention_hours: float, now_s: float, tombstones: Tombstones | None = None) -> tuple[int, int]:
    """Delete the target's data files removed more than ``retention_hours`` ago and its Change
    Data Feed files written more than ``retention_hours`` ago, without a commit (``dt``: a
    deltalake DeltaTable at its latest version; files of that version are never deleted;
    ``tombstones``: a :class:`Tombstones` kept across passes). As Delta's VACUUM, a data file
    that neither the latest version nor a tombstone lists (its tombstone expired from the
    checkpoints, or a crashed batch wrote it) is deleted once its modification time is older
    than the retention. Returns ``(data files, CDF files)`` deleted."""
    root = fs_path(dt.table_uri)
    if _last_checkpoint(root) is None:
        return 0, 0   # fewer than checkpoint_interval commits: too few removed files to matter
    tombstones = tombstones or Tombstones(root)
    cutoff_ms = (now_s - retention_hours * 3600.0) * 1000.0
    live = {unquote(p) for p in dt.get_add_actions(flatten=True).column("path").to_pylist()}
    data = 0
    removed = tombstones.refresh()
    for path, removed_ms in list(removed.items()):
        if removed_ms < cutoff_ms and path not in live:
            if storage.remove(os.path.join(root, path)):
                data += 1
            del removed[path]   # gone: not tried again (a newer checkpoint may list it until it expires)

    def skip(name: str) -> bool:   # not the log, the Change Data Feed or the catalog's marker; partitions
        return name.startswith(("_", ".")) and "=" not in name

    for p, st in storage.list_files(root, skip_dirs=skip):
        path = p[len(root.rstrip("/")) + 1:]
        if not path.endswith(".parquet") or path in live or path in removed:
            continue
        if st.mtime_ns / 1e6 < cutoff_ms and storage.remove(p):
            data += 1
    cdc = 0
    for p, st in storage.list_files(os.path.join(root, "_change_data")):
        if st.mtime_ns / 1e6 < cutoff_ms and storage.remove(p):
            cdc += 1
    return data, cdc


def vacuum_state(dt, keep_from: int, keep_to: int) -> int:
    """Delete every file of the state table (``dt``, a deltalake DeltaTable) that no version in
    ``[keep_from, keep_to]`` references: superseded files and a crashed attempt's files (a full
    vacuum, listed by delta-rs and deleted here, so the state gets no VACUUM commit). Only
    safe between batches, under the model's writer lock. Returns the files deleted."""
    root = fs_path(dt.table_uri)
    files = dt.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False, full=True,
                      keep_versions=list(range(max(0, keep_from), keep_to + 1)))
    deleted = 0
    for f in files:
        p = f if os.path.isabs(f) else os.path.join(root, unquote(f))
        if storage.remove(fs_path(p)):
            deleted += 1
    return deleted


def clean_scratch(scratch_dir: str, before_batch: int) -> int:
    """Remove ``<scratch_dir>/<batch>`` directories (``JobSpec.scratch_dir``) of batches
    before ``before_batch`` (left by a batch that crashed). Returns how many."""
    n = 0
    for name in storage.list_dir(scratch_dir):
        if name.isdigit() and int(name) < before_batch:
            storage.remove_tree(os.path.join(scratch_dir, name), ignore_errors=True)
            n += 1
    return n


class Maintenance:
    """The maintenance of one model for one run: decides when a pass is due and runs it with
    handles (and log positions) kept across passes: the run's own handles of the target and
    the state (``target``, ``state``: DeltaTableRef) when given, so a run opens each table
    once.

    ``after_batch(batch_id, state_version)`` is called once a batch is committed (the target
    holds it); it returns the pass's :class:`MaintenanceReport`, or None when no pass was due.
    A pass never raises: a failure is logged and reported, the committed batch stands."""

    def __init__(self, job, retention: Retention | None = None, *, target=None, state=None):
        self.job = job
        self.retention = retention or retention_of(job)
        self.batches = 0                # committed batches since the last pass
        self.last_pass = time.time()    # the run's start until its first pass
        from ..delta import DeltaTableRef
        self._target = target if target is not None else DeltaTableRef(job.target_path)
        self._state = state if state is not None else DeltaTableRef(job.state_root)
        self._target_log = LogCleaner(job.target_path)
        self._tombstones = Tombstones(job.target_path)
        self._state_log = LogCleaner(job.state_root)
        self._warned = False

    def after_batch(self, batch_id: int, state_version: int | None) -> MaintenanceReport | None:
        self.batches += 1
        if batch_id % EVERY_BATCHES and self.batches < EVERY_BATCHES and time.time() - self.last_pass < EVERY_SECONDS:
            return None
        report = self.run(batch_id, state_version)
        self.batches, self.last_pass = 0, time.time()
        return report

    @staticmethod
    def _latest(ref):
        """``ref``'s delta-rs handle at the table's latest version (opened on first use, then
        refreshed by reading only the newer commits)."""
        ref.refresh()
        return ref.table()

    def run(self, batch_id: int, state_version: int | None) -> MaintenanceReport:
        """One pass after batch ``batch_id`` committed (its state at ``state_version``)."""
        t0 = time.time()
        r, job = MaintenanceReport(), self.job
        steps = [("target", lambda: self._target_pass(r, t0))]
        if state_version is not None and storage.is_dir(os.path.join(job.state_root, "_delta_log")):
            steps.append(("state", lambda: self._state_pass(r, state_version)))
        steps.append(("scratch", lambda: setattr(r, "scratch_dirs", clean_scratch(job.scratch_dir, batch_id))))
        for name, step in steps:
            try:
                step()
            except Exception as e:  # noqa: BLE001 (maintenance never fails a committed batch)
                r.errors.append(f"{name}: {type(e).__name__}: {e}")
                log.warning("%s: maintenance of the %s failed (retried at the next pass): %s", job.model, name, e)
        r.seconds = round(time.time() - t0, 3)
        log.info("%s: maintenance after batch %d in %.3fs: %s", job.model, batch_id, r.seconds,
                 {k: v for k, v in r.to_dict().items() if v and k != "seconds"})
        return r

    def _target_pass(self, r: MaintenanceReport, now: float) -> None:
        job, ret = self.job, self.retention
        dt = self._latest(self._target)
        r.checkpoints += ensure_checkpoint(dt, ret.checkpoint_interval)
        if not _reachable(job.target_path):
            if not self._warned:
                log.warning("%s: the target %s is on a file system this package does not reach: only "
                            "checkpoints are written",
                            job.model, job.target_path)
                self._warned = True
            return
        r.target_log_files = self._target_log.clean(dt.version(), now - ret.log_retention_hours * 3600.0)
        r.target_data_files, r.target_cdc_files = vacuum_target(dt, ret.deleted_file_retention_hours, now, self._tombstones)

    def _state_pass(self, r: MaintenanceReport, state_version: int) -> None:
        job, ret = self.job, self.retention
        dt = self._latest(self._state)
        conf = dt.metadata().configuration
        wanted = {k: v for k, v in state_properties(ret).items() if conf.get(k) != v}
        if wanted:   # a state table created before these properties, or a changed interval
            dt.alter.set_table_properties(wanted)
            dt.update_incremental()
        r.checkpoints += ensure_checkpoint(dt, ret.checkpoint_interval)
        if not _reachable(job.state_root):
            return
        keep_from = state_version - ret.state_retention_versions + 1
        r.state_data_files = vacuum_state(dt, keep_from, dt.version())
        r.state_log_files = self._state_log.clean(max(0, keep_from), None)


def table_properties(retention: Retention) -> dict[str, str]:
    """The Delta table properties a target is created with so that Delta's own retention
    agrees with the model's: ``delta.logRetentionDuration`` and
    ``delta.deletedFileRetentionDuration`` (whole seconds), and ``delta.checkpointInterval``.
    The second also decides how long the target's checkpoints keep the tombstones of removed
    files: without it a checkpoint would list every file removed in the last 7 days, growing
    with the run's history. The third makes delta-rs' post-commit hook write the checkpoints
    the model asks for as it commits (every reader of the table then replays at most
    ``checkpoint_interval - 1`` commits), not only maintenance's pass."""
    def interval(hours: float) -> str:
        return f"interval {max(1, round(hours * 3600))} seconds"
    return {"delta.logRetentionDuration": interval(retention.log_retention_hours),
            "delta.deletedFileRetentionDuration": interval(retention.deleted_file_retention_hours),
            "delta.checkpointInterval": str(retention.checkpoint_interval)}


def state_properties(retention: Retention) -> dict[str, str]:
    """The Delta table properties of a model's state table: its tombstones kept
    ``STATE_TOMBSTONE_RETENTION`` (maintenance vacuums long before) and a checkpoint every
    ``checkpoint_interval`` commits (see :func:`table_properties`)."""
    return {"delta.deletedFileRetentionDuration": STATE_TOMBSTONE_RETENTION,
            "delta.checkpointInterval": str(retention.checkpoint_interval)}


def retention_of(job) -> Retention:
    """The model's :class:`Retention`, from its config (``JobSpec`` fields of the same names;
    Delta's defaults when the spec has none)."""
    d = Retention()
    return Retention(**{k: getattr(job, k, getattr(d, k)) for k in asdict(d)})


__all__ = ["Maintenance", "MaintenanceReport", "Retention", "EVERY_BATCHES", "EVERY_SECONDS",
           "Tombstones", "ensure_checkpoint", "table_properties", "state_properties", "vacuum_target", "vacuum_state", "clean_scratch", "retention_of"]
