"""What a run checks before it reads or writes anything, and how it explains failures that
come from outside the engine (docs/troubleshooting.md).

Before a run (:func:`~consistent_stream.job.run_job`):

* :func:`check_checkpoint_owner`: the checkpoint belongs to this model (its ``job.json``
  names the model), so that two models configured with one
  ``checkpoint_location`` never replay each other's batches, and ``--full-refresh`` of one
  never deletes the other's checkpoint;
* :func:`check_checkpoint_files`: the files the run is about to read (the pending cut files,
  Spark's ``metadata`` and its newest ``offsets`` / ``commits`` / source log entries) are
  whole; a file cut short or emptied is named instead of failing deep inside Spark;
* :func:`check_target`: once the query has committed a batch, the target exists and its
  newest version is that query's (not deleted, not written by anyone else);
* :func:`source_schema_drift`: what changed in the names and types of the columns the model
  reads since the checkpoint was made (what a run does about it: :mod:`.config_change`).

Each raises an error naming the file, table or config key and saying what to do; none of them
writes. After a failure, :func:`explain_failure` turns a failure of the machine (a read-only
or full disk, the Spark session's JVM gone) into an error that says so.
"""
from __future__ import annotations

import errno
import json

from pyspark.sql.types import StructType

from . import checkpoint, storage
from .errors import (CommitError, CompileError, ConfigError, ConsistentStreamError, SessionLostError, StorageError,
                     UniqueKeyViolation)
from .spec import JobSpec

_FULL_REFRESH = "run dbt run --full-refresh -s {model}"


# ---- the checkpoint ---------------------------------------------------------------------------
def check_checkpoint_owner(job: JobSpec) -> None:
    """Raise ConfigError when the checkpoint at ``job.checkpoint_location`` was made for another
    model (its ``job.json`` names another model), whatever ``--full-refresh`` says. (Another
    target of this model is a change of its definition: :mod:`consistent_stream.config_change`.)"""
    from .config_change import saved_definition
    saved = saved_definition(job) or {}
    model, target = saved.get("model"), saved.get("target_path")
    if model and model != job.model:
        raise ConfigError(
            f"model {job.model}: config checkpoint_location {job.checkpoint_location} holds the checkpoint of "
            f"model {model} (target {target}); each model needs its own checkpoint_location. Nothing was read "
            f"or written, and model {model}'s checkpoint was left as it is: change checkpoint_location of "
            f"{job.model} (or unset it: the default is <target>__checkpoint)")


def _damaged(job: JobSpec, path: str, why: str) -> CommitError:
    return CommitError(
        f"model {job.model}: the checkpoint file {path} is damaged ({why}); it was changed or cut short "
        f"outside consistent_stream. The target {job.target_path} was not touched; "
        f"{_FULL_REFRESH.format(model=job.model)} to start the checkpoint over (the target is rebuilt from "
        f"the sources' snapshots)")


def check_checkpoint_files(job: JobSpec) -> None:
    """Raise CommitError naming the checkpoint's query record (:mod:`.checkpoint`) when it is
    damaged: the one checkpoint file a run reads before anything else."""
    checkpoint.read(job.query_path, job.model)


# ---- the target -------------------------------------------------------------------------------
def check_target(job: JobSpec, target, record) -> None:
    """Once the checkpoint's query (``record``, :class:`~consistent_stream.checkpoint.
    QueryRecord`) has committed a batch, the target must exist and its newest version must be
    one of that query's batches. Raises CommitError otherwise (the target was deleted or
    moved, or someone else wrote to it); a query that committed no batch yet rebuilds the
    target in its first batch."""
    if record is None or not record.committed:
        return
    query_id = record.id
    again = (f"Nothing was read or written; {_FULL_REFRESH.format(model=job.model)} to rebuild the target from "
             f"the sources")
    if not target.exists():
        raise CommitError(
            f"model {job.model}: the target {job.target_path} does not exist, but the checkpoint at "
            f"{job.checkpoint_location} has committed batches: the target was deleted or moved. {again}")
    commit = target.latest_commit()
    if commit.metadata.get("app_id") == query_id:
        return
    op = (target.table().history(1) or [{}])[0].get("operation", "?")
    who = (f"by query {commit.metadata['app_id']} of model {commit.metadata.get('model', '?')}"
           if commit.metadata.get("app_id") else f"by another writer (operation {op})")
    raise CommitError(
        f"model {job.model}: the target {job.target_path}'s newest version {commit.version} was not written by "
        f"this model's query {query_id} but {who}: its rows no longer follow from the sources. {again} "
        f"(earlier versions stay readable by time travel)")


# ---- the sources' schemas ---------------------------------------------------------------------
def _columns(schema: StructType) -> dict[str, tuple[str, str | None]]:
    """Column name (lower case) -> (its type, its physical name under column mapping, else
    None): a column dropped and added again under its name has another physical name."""
    return {f.name.lower(): (f.dataType.simpleString(), (f.metadata or {}).get("delta.columnMapping.physicalName"))
            for f in schema.fields}


def source_schema_drift(job: JobSpec, fingerprint: str, schemas: dict[str, StructType]) -> dict[str, list[str]]:
    """Compare each source's schema now (``schemas``: source key -> StructType) with the one
    recorded in the checkpoint's plan (``job.plan_path``) for this ``fingerprint``. Returns, per
    source key, what changed in the columns the model reads: one dropped, renamed or retyped,
    or a new column the model reads (``select *``); a change to columns the model does not
    read is no drift. Empty when nothing the model reads changed, or when the plan was made
    for another fingerprint (then the definition changed anyway:
    :mod:`consistent_stream.config_change`)."""
    saved = storage.read_json(job.plan_path)
    try:
        if saved is None or saved.get("fingerprint") != fingerprint:
            return {}
        before = {k: _columns(StructType.fromJson(v)) for k, v in json.loads(saved["source_schemas"]).items()}
    except (ValueError, KeyError, TypeError):
        return {}
    now = {k: _columns(s) for k, s in schemas.items()}
    changed = [k for k in now if k in before and before[k] != now[k]]
    if not changed:
        return {}
    from .plan import compile_model
    from .runtime import scan_columns

    def read(columns: dict[str, dict[str, str]]) -> dict[str, set[str]] | None:
        try:
            compiled = compile_model(job.sql, job.sources, {k: list(v) for k, v in columns.items()})
        except CompileError:
            return None
        return {k: {c.lower() for c in cols} for k, cols in scan_columns(compiled).items()}
    read_before = read({**now, **before}) or {}
    read_now = read(now)
    drift: dict[str, list[str]] = {}
    for key in changed:
        old, new = before[key], now[key]
        added = [c for c in new if c not in old]
        problems = []
        for c in old:
            if c not in read_before.get(key, ()):
                continue
            if c not in new:
                hint = f"; its new columns: {', '.join(added)}" if added else ""
                problems.append(f"column {c} ({old[c][0]}) is gone (dropped or renamed{hint})")
            elif new[c][0] != old[c][0]:
                problems.append(f"column {c} changed type from {old[c][0]} to {new[c][0]}")
            elif None not in (old[c][1], new[c][1]) and old[c][1] != new[c][1]:
                problems.append(f"column {c} ({old[c][0]}) was dropped and added again (column mapping's physical "
                                f"name {old[c][1]} -> {new[c][1]}): its older rows changed without a row in the "
                                f"Change Data Feed")
        for c in added:
            if read_now is not None and c in read_now.get(key, ()):
                problems.append(f"column {c} ({new[c][0]}) was added and the model reads it")
        if problems:
            drift[key] = problems
    return drift


# ---- failures from outside --------------------------------------------------------------------
_STORAGE = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded",
            errno.EFBIG: "File too large", errno.EROFS: "Read-only file system",
            errno.EACCES: "Permission denied", errno.EPERM: "Operation not permitted"}
_SESSION_LOST = ("Answer from Java side is empty", "Error while sending or receiving",
                 "An error occurred while trying to connect to the Java server", "SparkContext was shut down",
                 "Cannot call methods on a stopped SparkContext", "Connection refused")
_CONNECT_LOST = ("StatusCode.UNAVAILABLE", "failed to connect to all addresses", "Connection refused",
                 "RETRIES_EXCEEDED", "Socket closed")
"""What a Spark Connect client's error says when its server went away (gRPC's UNAVAILABLE)."""


def _session_alive() -> bool:
    """Whether the active Spark session's JVM still answers (py4j reports a call on a lost
    connection only as "An error occurred while calling o26.setJobGroup"). False where there is
    no JVM beside Python (pyspark-client: Spark Connect only)."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    sc = SparkContext._active_spark_context
    if sc is None:
        return False
    try:
        sc._jvm.java.lang.System.currentTimeMillis()
        return True
    except Exception:
        return False


def _session_lost(e: BaseException, text: str) -> bool:
    """Whether ``e`` says the session itself is gone: py4j's lost JVM (classic), gRPC's
    unavailable server (Spark Connect)."""
    if isinstance(e, ConnectionRefusedError):
        return True
    if (type(e).__module__.startswith(("pyspark.errors.exceptions.connect", "grpc"))
            and any(s in text for s in _CONNECT_LOST)):
        return True
    try:
        from py4j.protocol import Py4JError
    except ImportError:   # pyspark-client: no py4j, no JVM to lose
        return False
    return isinstance(e, (Py4JError, ConnectionError)) and (any(s in text for s in _SESSION_LOST)
                                                           or not _session_alive())


def explain_failure(job: JobSpec, e: BaseException) -> BaseException | None:
    """The error to raise instead of ``e``, a failure of a run of ``job``, when ``e`` comes
    from the machine rather than from the model: a file that cannot be written (read-only or
    full file system: :class:`StorageError`), the Spark session lost
    (:class:`SessionLostError`); and a unique key violation of a key inferred from the
    sources' primary keys, which names them. None when ``e`` needs no explaining."""
    if isinstance(e, UniqueKeyViolation) and not job.unique_key:
        keyed = [f"{s.key} {list(s.primary_key)}" for s in job.sources if s.primary_key]
        if keyed and "primary_key" not in str(e):
            return UniqueKeyViolation(
                f"{e} The model configures no unique_key: its key is inferred from the declared primary keys "
                f"of {', '.join(keyed)} (meta.consistent_stream.primary_key). If a source has two rows with one "
                f"primary key, fix its data or its primary_key, then {_FULL_REFRESH.format(model=job.model)} "
                f"(the failed batch would be replayed as planned)")
        return None
    if isinstance(e, ConsistentStreamError):
        return None
    text = str(e)
    reason = _STORAGE.get(getattr(e, "errno", None)) if isinstance(e, OSError) else None
    reason = reason or next((r for r in _STORAGE.values() if r in text and r not in ("Permission denied",
                                                                                     "Operation not permitted")), None)
    if reason:
        where = getattr(e, "filename", None) or f"{job.target_path} or {job.checkpoint_location}"
        return StorageError(
            f"model {job.model}: cannot write {where}: {reason}. Nothing after the target's last commit was "
            f"made visible (a batch commits whole or not at all). Make the target's location (config "
            f"location_root) and checkpoint_location writable, with free space, then run again: an "
            f"unfinished batch is replayed")
    if _session_lost(e, text):
        return SessionLostError(
            f"model {job.model}: the Spark session was lost while the run was under way (its JVM stopped or "
            f"died, or its Spark Connect server went away: "
            f"{text.strip().splitlines()[0] if text.strip() else type(e).__name__}). Nothing after the "
            f"target's last commit was made visible (a batch commits whole or not at all); start a new "
            f"session and run again: an unfinished batch is replayed")
    return None
