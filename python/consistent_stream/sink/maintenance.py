"""Table maintenance of a model: what a long run keeps on disk, and what it deletes.

Every micro-batch commits one version of the target and one of the state table and may leave
a scratch directory; left alone, the Delta logs, the superseded data files and the Change Data
Feed files grow with the run's history. A *maintenance pass* (:meth:`Maintenance.run`), run by the
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
  references (a crashed attempt's), are vacuumed (a full vacuum, without a commit), and the
  log below the newest checkpoint at or under the oldest kept version is deleted. Its
  tombstones expire from its checkpoints after ``STATE_TOMBSTONE_RETENTION`` (a table
  property set once), so its checkpoints stay the size of its live files;
* Delta checkpoints: the run's commits write one every ``delta.checkpointInterval`` commits
  (:mod:`consistent_stream.delta.log`; both tables are created with the model's
  ``checkpoint_interval``); a pass writes one when the newest is more than that many
  versions old (a table created without the property);
* scratch directories of batches before the running one (left by a crashed batch).

How. A pass reads the two tables through the run's own handles: the logs the run replayed
(:meth:`consistent_stream.delta.DeltaTableRef.replayed_log`) give the versions, live files,
tombstones and checkpoints without a request; what is on the store comes from one listing of
each table (and of its log and ``_change_data``), and what expired goes in one bulk delete
each (:func:`consistent_stream.storage.remove_many`). So every request of a pass is made, and
counted, by :mod:`consistent_stream.storage`. A table whose log delta-rs serves (a log this
package does not replay) is vacuumed from delta-rs' VACUUM listing instead.

The query's own checkpoint holds nothing that grows with its history: its record
(:mod:`consistent_stream.checkpoint`), the definition, the plan and the state table.

Tables on a local file system or an object store are cleaned; on another file system only
checkpoints are written (logged once).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import unquote

from .. import storage
from ..delta.deletion_vectors import FILE_PREFIX as DV_FILE_PREFIX
from ..delta.deletion_vectors import file_of as dv_file_of
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


def _last_checkpoint(table: str) -> int | None:
    """The version of the table's newest checkpoint (``_delta_log/_last_checkpoint``), or None."""
    last = storage.read_json(os.path.join(fs_path(table), "_delta_log", "_last_checkpoint"))
    if last is None:
        return None
    try:
        return int(last["version"])
    except (ValueError, KeyError):
        return None


def ensure_checkpoint(ref, interval: int) -> bool:
    """Write a checkpoint of the table of ``ref`` (a DeltaTableRef, at its latest version)
    when its newest is more than ``interval`` versions old. Returns whether one was written.
    A log replayed here (:meth:`DeltaTableRef.replayed_log` of a table whose protocol this
    package writes) knows its newest checkpoint and writes it (two PUTs); another table's
    is asked for its ``_last_checkpoint`` and written by delta-rs."""
    own = ref.replayed_log()
    if own is not None and own.plain:
        own.flush()   # (the checkpoint its last commit may be writing)
        if not _checkpoint_due(own.version, own.checkpoint_version if own.checkpoint_version >= 0 else None,
                               interval):
            return False
        own.write_checkpoint()
        return True
    dt = ref.table()
    if not _checkpoint_due(dt.version(), _last_checkpoint(dt.table_uri) if _reachable(dt.table_uri) else None,
                           interval):
        return False
    dt.create_checkpoint()
    return True


def _checkpoint_due(version: int, last: int | None, interval: int) -> bool:
    """Whether a table at ``version`` whose newest checkpoint is ``last`` (None: none) needs
    one: ``interval`` versions past it (or past the table's start)."""
    return version - (last if last is not None else 0) >= interval


def clean_log(table: str, keep_version: int, cutoff_s: float | None) -> int:
    """Delete the table's log entries (commit files, checkpoints, checksums: every
    ``_delta_log`` file named by a version) of the versions below ``c``, the newest
    checkpoint at or below ``keep_version`` whose commit files up to it are older than
    ``cutoff_s`` (seconds since epoch; None: any age). Every version from ``c`` on stays
    readable (Delta's ``logRetentionDuration`` cleanup). One listing of the log (one LIST per
    1,000 entries on an object store) and one bulk delete. Returns the files deleted."""
    log_dir = os.path.join(fs_path(table), "_delta_log")
    entries: dict[int, list[str]] = {}
    commit_mtime: dict[int, float] = {}
    checkpoints: set[int] = set()
    for path, st in storage.list_files(log_dir, skip_dirs=lambda name: True):
        name = path.rsplit("/", 1)[-1]
        if not (name[:20].isdigit() and name[20:21] == "."):
            continue   # _last_checkpoint, a temporary file
        v = int(name[:20])
        entries.setdefault(v, []).append(path)
        if name[21:] == "json":
            commit_mtime[v] = st.mtime_ns / 1e9
        elif name[21:].startswith("checkpoint.") and name.endswith(".parquet"):
            checkpoints.add(v)
    c = None
    for v in sorted(entries):
        if v > keep_version:
            break
        mtime = commit_mtime.get(v)
        if cutoff_s is not None and mtime is not None and mtime >= cutoff_s:
            break
        if v in checkpoints:
            c = v
    if c is None:
        return 0
    return storage.remove_many([p for v, paths in entries.items() if v < c for p in paths])


def _data_path(name: str) -> bool:
    """Whether a table's subdirectory ``name`` may hold data files: not the log, the Change
    Data Feed or another hidden one (``_``, ``.``), except a partition's (``k=v``)."""
    return not name.startswith(("_", ".")) or "=" in name


def _unreferenced(root: str, referenced: set[str], cutoff_ms: float | None,
                  removed_ms: dict[str, int] | None = None) -> list[str]:
    """The data files (``.parquet``) and deletion vector files (``deletion_vector_*.bin``) under
    table ``root`` (one listing) that no path in ``referenced`` (relative, decoded) names and
    that expired: a tombstone in ``removed_ms`` older than ``cutoff_ms``, or, without one, a
    modification time older than it (None: any). A vector file a crashed batch wrote and no
    commit names is one of them."""
    out = []
    removed_ms = removed_ms or {}
    for p, st in storage.list_files(root, skip_dirs=lambda name: not _data_path(name)):
        rel = p[len(root.rstrip("/")) + 1:]
        name = rel.rsplit("/", 1)[-1]
        ours = rel.endswith(".parquet") or (name.startswith(DV_FILE_PREFIX) and name.endswith(".bin"))
        if rel in referenced or not ours or name.startswith(("_", ".")):
            continue
        if cutoff_ms is not None:
            t = removed_ms.get(rel)
            if (t if t is not None else st.mtime_ns / 1e6) >= cutoff_ms:
                continue
        out.append(p)
    return out


def vacuum_target(ref, retention_hours: float, now_s: float) -> tuple[int, int]:
    """Delete the target's data files removed more than ``retention_hours`` ago and its Change
    Data Feed files written more than ``retention_hours`` ago, without a commit (``ref``: the
    target's DeltaTableRef at its latest version; files of that version are never deleted).
    As Delta's VACUUM, a data file that neither the latest version nor a tombstone lists (its
    tombstone expired from the checkpoints, or a crashed batch wrote it) is deleted once its
    modification time is older than the retention. Nothing before the table's first
    checkpoint (too few removed files to matter). With the log replayed here: its live files
    and tombstones, one listing of the table and of its ``_change_data``, one bulk delete;
    else delta-rs' VACUUM lists what to delete. Returns ``(data files, CDF files)`` deleted."""
    own = ref.replayed_log()
    root = fs_path(ref.path)
    cutoff_ms = (now_s - retention_hours * 3600.0) * 1000.0
    if own is not None:
        if own.checkpoint_version < 0:
            return 0, 0
        live = {unquote(p) for p in own.files} | {f for a in own.files.values() if (f := dv_file_of(a))}
        removed: dict[str, int] = {}
        for (p, _), r in own.tombstones.items():
            # a file whose vector was replaced is live still; the old vector's file is not
            for rel in (unquote(p), dv_file_of(r)):
                if rel and rel not in live:
                    removed[rel] = max(removed.get(rel, 0), int(r.get("deletionTimestamp") or 0))
        data = storage.remove_many(_unreferenced(root, live, cutoff_ms, removed))
    else:
        dt = ref.table()
        if _last_checkpoint(root) is None:
            return 0, 0
        data = storage.remove_many(_paths_under(root, dt.vacuum(
            retention_hours=retention_hours, dry_run=True, enforce_retention_duration=False)))
    expired = [p for p, st in storage.list_files(os.path.join(root, "_change_data"))
               if st.mtime_ns / 1e6 < cutoff_ms]
    return data, storage.remove_many(expired)


def _referenced(ref, keep_from: int) -> set[str]:
    """The data files (relative, decoded) some version from ``keep_from`` to the replayed
    log's latest references: the latest's live files and what each commit after
    ``keep_from`` removes (from the replay's commits, or, for one the replay did not read,
    its commit file: :meth:`DeltaTableRef.log_actions`)."""
    own = ref.replayed_log()
    paths = set(own.files) | {f for a in own.files.values() if (f := dv_file_of(a))}
    for v in range(max(0, keep_from) + 1, own.version + 1):
        c = own.commits.get(v)
        paths.update(c.removed if c is not None else
                     (a["remove"]["path"] for a in ref.log_actions(v) if "remove" in a))
    return {unquote(p) for p in paths}


def vacuum_state(ref, keep_from: int) -> int:
    """Delete every file of the state table (``ref``, its DeltaTableRef at its latest
    version) that no version from ``keep_from`` to the latest references: superseded files
    and a crashed attempt's files (a full vacuum, without a VACUUM commit). Only safe between
    batches, under the model's writer lock. With the log replayed here one listing of the
    table and one bulk delete; else delta-rs' full VACUUM lists what to delete. Returns the
    files deleted."""
    root = fs_path(ref.path)
    if ref.replayed_log() is not None:
        return storage.remove_many(_unreferenced(root, _referenced(ref, keep_from), None))
    dt = ref.table()
    return storage.remove_many(_paths_under(root, dt.vacuum(
        retention_hours=0, dry_run=True, enforce_retention_duration=False, full=True,
        keep_versions=list(range(max(0, keep_from), dt.version() + 1)))))


def _paths_under(root: str, files: list[str]) -> list[str]:
    """delta-rs' VACUUM listing (paths relative to the table, as the log encodes them, or
    absolute) as paths :mod:`consistent_stream.storage` takes."""
    return [fs_path(f if os.path.isabs(f) else os.path.join(root, unquote(f))) for f in files]


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
        self._target = target if target is not None else DeltaTableRef(job.target_path, own_log=True, checksums=True)
        self._state = state if state is not None else DeltaTableRef(job.state_root, own_log=True)
        self._warned = False

    def after_batch(self, batch_id: int, state_version: int | None) -> MaintenanceReport | None:
        self.batches += 1
        if batch_id % EVERY_BATCHES and self.batches < EVERY_BATCHES and time.time() - self.last_pass < EVERY_SECONDS:
            return None
        report = self.run(batch_id, state_version)
        self.batches, self.last_pass = 0, time.time()
        return report

    def run(self, batch_id: int, state_version: int | None) -> MaintenanceReport:
        """One pass after batch ``batch_id`` committed (its state at ``state_version``)."""
        t0 = time.time()
        r, job = MaintenanceReport(), self.job
        steps = [("target", lambda: self._target_pass(r, t0))]
        if state_version is not None and self._state.exists():
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
        job, ret, ref = self.job, self.retention, self._target
        version = ref.refresh().version   # the run's own handle: at its last commit, no request
        r.checkpoints += ensure_checkpoint(ref, ret.checkpoint_interval)
        if not _reachable(job.target_path):
            if not self._warned:
                log.warning("%s: the target %s is on a file system this package does not reach: only "
                            "checkpoints are written",
                            job.model, job.target_path)
                self._warned = True
            return
        r.target_log_files = clean_log(job.target_path, version, now - ret.log_retention_hours * 3600.0)
        r.target_data_files, r.target_cdc_files = vacuum_target(ref, ret.deleted_file_retention_hours, now)

    def _state_pass(self, r: MaintenanceReport, state_version: int) -> None:
        job, ret, ref = self.job, self.retention, self._state
        ref.refresh()
        own = ref.replayed_log()
        conf = own.configuration if own is not None else ref.table().metadata().configuration
        wanted = {k: v for k, v in state_properties(ret).items() if conf.get(k) != v}
        if wanted:   # a state table created before these properties, or a changed interval (delta-rs commits)
            ref.table().alter.set_table_properties(wanted)
            ref.refresh(force=True)
        r.checkpoints += ensure_checkpoint(ref, ret.checkpoint_interval)
        if not _reachable(job.state_root):
            return
        keep_from = state_version - ret.state_retention_versions + 1
        r.state_data_files = vacuum_state(ref, keep_from)
        r.state_log_files = clean_log(job.state_root, max(0, keep_from), None)


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
           "clean_log", "ensure_checkpoint", "table_properties", "state_properties", "vacuum_target", "vacuum_state",
           "clean_scratch", "retention_of"]
