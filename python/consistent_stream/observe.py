"""What an operator sees of a project's consistent_stream models, read from their Delta logs
and checkpoints (no Spark job, no scan of data files): ``consistent-stream status``,
``plot`` and ``explain``.

* :func:`model_status`: one model's target version, cut, lag behind its sources, freshness,
  and its last batch (change rows read, seconds).
* :func:`model_history`: per retained target version, its batch's freshness and seconds
  (the data of ``plot``).
* :func:`explain_model`: the incremental plan the checkpoint holds: operators, the
  arrangements (state) each keeps, their keys and row counts.

Models are found through the index a ``dbt run`` writes in the project
(:func:`consistent_stream.verify.record_model`). Every time is in seconds; ``None`` where
a commit predates the metadata it needs.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

from . import storage
from .errors import ConsistentStreamError
from .spec import JobSpec
from .verify import INDEX_DIR, index_path


def project_models(project_root: str) -> list[str]:
    """The consistent_stream models a ``dbt run`` recorded in ``project_root``, sorted."""
    d = os.path.join(project_root, INDEX_DIR)
    try:
        return sorted(n[:-5] for n in storage.list_dir(d) if n.endswith(".json"))
    except OSError:
        return []


def load_model(project_root: str, model: str) -> JobSpec:
    """The job spec of ``model`` (its checkpoint's ``job.json``). Raises ConsistentStreamError
    naming the index file when the model has not been run in this project."""
    idx = index_path(project_root, model)
    entry = storage.read_json(idx)
    if not isinstance(entry, dict) or "checkpoint_location" not in entry:
        raise ConsistentStreamError(f"{idx} not found: model {model} has not been run by consistent_stream in "
                                    f"project {project_root}")
    checkpoint = entry["checkpoint_location"]
    try:
        return JobSpec.load(os.path.join(checkpoint, "_consistent_stream", "job.json"))
    except (OSError, ValueError) as e:
        raise ConsistentStreamError(f"model {model}: its checkpoint {checkpoint} has no readable job.json ({e}); "
                                    f"run it again") from None


@dataclass
class SourceLag:
    """How far a model's cut is behind one source: ``versions`` (positions: Delta versions,
    or transactions of a CDC landing directory) and ``seconds`` (the source's newest commit
    time minus the commit time of the position the cut reflects)."""
    cut: int
    latest: int
    versions: int
    seconds: float | None


@dataclass
class ModelStatus:
    """One model as an operator sees it. ``freshness_s``: the target commit's time minus the
    newest source commit in its cut (docs/guides/operating.md); ``age_s``: now minus the target's
    commit time; ``last_batch_*``: the batch that wrote ``target_version``; ``waiting``: per
    source, the upstream transactions seen in part that hold back its cut (a Kafka source's
    :meth:`~consistent_stream.sources.kafka.reader.KafkaReader.stalled`: id, age_s, end_seen,
    missing); ``last_batch_requests``: that batch's object-store requests before its commit
    (0 on local disk, None when its version did not record them); ``last_batch_recomputed``:
    the rows that batch evaluated again (window partitions it touched, recomputed blocks; None
    when its version did not record them)."""
    model: str
    target_path: str
    target_version: int | None
    batch_id: int | None
    strategy: str | None
    cut: dict
    lag: dict[str, SourceLag] = field(default_factory=dict)
    freshness_s: float | None = None
    age_s: float | None = None
    last_batch_changes: int | None = None
    last_batch_s: float | None = None
    last_batch_requests: int | None = None
    last_batch_recomputed: int | None = None
    error: str | None = None
    waiting: dict = field(default_factory=dict)

    @property
    def lag_versions(self) -> int:
        return sum(lag.versions for lag in self.lag.values())

    @property
    def lag_s(self) -> float | None:
        seconds = [lag.seconds for lag in self.lag.values() if lag.seconds is not None]
        return max(seconds) if seconds else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["lag_versions"], d["lag_s"] = self.lag_versions, self.lag_s
        return d


def _batch_seconds(commit_ms: int, meta) -> float | None:
    return round((commit_ms - meta.started_ms) / 1000.0, 3) if meta.started_ms else None


def missing_target(job: JobSpec) -> str | None:
    """When ``job``'s target does not exist although Spark's checkpoint records committed
    batches (the target was deleted or moved, its catalog entry may remain): what is missing
    and the command that rebuilds it. None when the model never committed a batch."""
    from .checkpoint import read
    record = read(job.query_path, job.model)
    if record is None or not record.committed:
        return None
    return (f"model {job.model}: its target {job.target_path} does not exist (deleted or moved), but the checkpoint "
            f"at {job.checkpoint_location} has committed batches; dbt run --full-refresh -s {job.model} rebuilds it "
            f"from the sources")


def model_status(job: JobSpec, now_ms: int | None = None) -> ModelStatus:
    """The status of ``job``'s model now (``now_ms``: ms since epoch). A target or source that
    cannot be read gives a status with ``error`` set instead of raising."""
    from .delta import DeltaTableRef
    from .runtime import BatchMeta
    from .sources.formats import open_source
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    status = ModelStatus(job.model, job.target_path, None, None, None, {})
    try:
        target = DeltaTableRef(job.target_path)
        if not target.exists():
            status.error = missing_target(job) or "no target yet (the model has not committed a batch)"
            return status
        commit = target.latest_commit()
        meta = BatchMeta.from_commit(commit)
        status.target_version, status.age_s = commit.version, round((now_ms - commit.timestamp_ms) / 1000.0, 3)
        if meta is None:
            status.error = f"version {commit.version} was not written by a consistent_stream batch"
            return status
        status.batch_id, status.strategy, status.cut = meta.batch_id, meta.strategy, meta.cut
        status.freshness_s = meta.freshness_s(commit.timestamp_ms)
        if meta.started_ms:   # else written by a version that did not record its batches
            status.last_batch_changes, status.last_batch_s = meta.changes_read, _batch_seconds(commit.timestamp_ms,
                                                                                                meta)
            if "requests_before_commit" in commit.metadata:
                status.last_batch_requests = meta.requests_before_commit
            if "rows_recomputed" in commit.metadata:
                status.last_batch_recomputed = meta.rows_recomputed
        for spec in job.sources:
            source = open_source(spec)
            latest, at = source.latest_position(), int(meta.cut.get(spec.key, -1))
            behind = None
            if latest > at:
                reflected = meta.source_commits.get(spec.key) or (source.commit_ms(at) if at >= 0 else None)
                behind = round((source.commit_ms(latest) - reflected) / 1000.0, 3) if reflected else None
            status.lag[spec.key] = SourceLag(at, latest, max(latest - at, 0), behind if latest > at else 0.0)
            waiting = source.stalled() if hasattr(source, "stalled") else []
            if waiting:
                status.waiting[spec.key] = waiting
    except ConsistentStreamError as e:
        status.error = str(e)
    return status


@dataclass
class VersionPoint:
    """One retained target version: its batch, commit time (ms since epoch), freshness and
    batch seconds (None when unknown), change rows read and strategy."""
    version: int
    batch_id: int
    commit_ms: int
    freshness_s: float | None
    batch_s: float | None
    changes_read: int
    strategy: str


def model_history(job: JobSpec, limit: int = 1000) -> list[VersionPoint]:
    """The newest ``limit`` retained versions of ``job``'s target written by its batches,
    oldest first (one read of the Delta log's commit files)."""
    from .delta import DeltaTableRef
    from .runtime import BatchMeta
    target = DeltaTableRef(job.target_path)
    if not target.exists():
        raise ConsistentStreamError(f"model {job.model}: no target at {job.target_path} yet; run the model first")
    points = []
    for commit in target.history(limit):
        meta = BatchMeta.from_commit(commit)
        if meta is not None:
            points.append(VersionPoint(commit.version, meta.batch_id, commit.timestamp_ms,
                                       meta.freshness_s(commit.timestamp_ms), _batch_seconds(commit.timestamp_ms, meta),
                                       meta.changes_read, meta.strategy))
    return sorted(points, key=lambda p: p.version)


def plot_history(job: JobSpec, out_png: str, limit: int = 1000) -> list[VersionPoint]:
    """Write a PNG of freshness and batch seconds over the target's versions (matplotlib,
    headless; the ``plot`` extra: ``pip install 'dbt-consistent-stream[plot]'``). Returns the
    points plotted. Raises ConsistentStreamError when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise ConsistentStreamError(
            "plot needs matplotlib, which is not installed: pip install 'dbt-consistent-stream[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = model_history(job, limit)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5))
    versions = [p.version for p in points]
    top.plot(versions, [p.freshness_s for p in points], marker=".", color="tab:blue")
    top.set_ylabel("freshness (s)")
    top.set_title(f"{job.model}: target {os.path.basename(job.target_path.rstrip('/'))}, "
                  f"{len(points)} versions")
    bottom.plot(versions, [p.batch_s for p in points], marker=".", color="tab:orange")
    bottom.set_ylabel("batch time (s)")
    bottom.set_xlabel("target version")
    from matplotlib.ticker import MaxNLocator
    for axis in (top, bottom):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.set_ylim(bottom=0)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return points


def explain_model(job: JobSpec) -> str:
    """The incremental plan of ``job`` as its checkpoint holds it: one operator a line (as
    :func:`consistent_stream.plan.logical.explain`), each ending with how it is maintained,
    ``incremental`` or ``recompute``, and what a batch reads
    (:func:`~consistent_stream.plan.logical.maintenance`); each stateful one followed by its
    arrangements: name, key, stored columns, and rows and files in the state version the
    target's last batch recorded. Raises ConsistentStreamError when the model has no
    checkpointed plan yet."""
    from .delta import DeltaTableRef
    from .plan import compile_model
    from .exec.evaluator import PlanTypes
    from .plan.logical import explain
    from .runtime import BatchMeta
    from .state.arrangement import ARRANGEMENT
    plan_path = job.plan_path
    plan = storage.read_json(plan_path)
    if plan is None:
        raise ConsistentStreamError(f"model {job.model}: no plan at {plan_path}; run the model first")
    columns = {k: [f["name"] for f in v["fields"]] for k, v in json.loads(plan["source_schemas"]).items()}
    root = compile_model(job.sql, job.sources, columns, incremental_only=job.incremental_only).root
    types = PlanTypes.from_json(plan["types"])
    rows: dict[str, tuple[int, int]] = {}
    target = DeltaTableRef(job.target_path)
    meta = BatchMeta.from_commit(target.latest_commit()) if target.exists() else None
    state = DeltaTableRef(job.state_root)
    if meta is not None and meta.state_version is not None and state.exists():
        for a in state.add_actions(meta.state_version).to_pylist():
            n, files = rows.get(a[f"partition.{ARRANGEMENT}"], (0, 0))
            rows[a[f"partition.{ARRANGEMENT}"]] = (n + int(a["num_records"] or 0), files + 1)
    key = plan.get("unique_key")
    lines = [f"model {job.model}: target {job.target_path}, "
             + (f"merged by unique_key {key}" if key else "kept as a bag (no unique key)"),
             f"state {job.state_root}" + (f" at version {meta.state_version}" if meta and meta.state_version is not None
                                          else ""), ""]
    by_op: dict[str, list] = {}   # arrangement "<operator id>_<role>", operator id "<nn>_<kind>"
    for name, a in sorted(types.arrangements.items()):
        by_op.setdefault("_".join(name.split("_", 2)[:2]), []).append(a)
    tree = explain(root, costs=True).split("\n")
    ops = [n.id for n in _preorder(root)]
    for line, op in zip(tree, ops):
        lines.append(line)
        pad = " " * (len(line) - len(line.lstrip()) + 4)
        for a in by_op.get(op, []):
            n, files = rows.get(a.name, (0, 0))
            data = [c for c in a.schema.fieldNames() if c not in a.key]
            lines.append(f"{pad}state {a.name}: key {list(a.key) or '(one group)'}, columns {data}, "
                         f"{n} rows in {files} files")
    return "\n".join(lines)


def _preorder(node):
    yield node
    for c in node.children:
        yield from _preorder(c)


def catalog_stats(target_path: str) -> dict[str, tuple[str, object, str]]:
    """The statistics ``dbt docs generate`` shows for a consistent_stream target, from its
    Delta log: stat id -> (label, value, description). Empty when the target has no
    consistent_stream commit."""
    from datetime import datetime, timezone

    from .delta import DeltaTableRef
    from .runtime import BatchMeta
    target = DeltaTableRef(target_path)
    if not target.exists():
        return {}
    commit = target.latest_commit()
    meta = BatchMeta.from_commit(commit)
    if meta is None:
        return {}
    rows = sum(int(n or 0) for n in target.add_actions(commit.version).column("num_records").to_pylist())
    committed = datetime.fromtimestamp(commit.timestamp_ms / 1000, tz=timezone.utc).isoformat(timespec="seconds")
    return {
        "consistent_stream_version": ("Target version", commit.version,
                                      "The Delta version of the target this catalog describes"),
        "consistent_stream_cut": ("Cut", json.dumps(meta.cut, sort_keys=True),
                                  "The source versions this version equals the model's SQL over"),
        "consistent_stream_freshness": ("Freshness (s)", meta.freshness_s(commit.timestamp_ms),
                                        "Commit time minus the newest source commit in the cut"),
        "consistent_stream_committed": ("Committed at", committed, "When this version was committed (UTC)"),
        "num_rows": ("# Rows", rows, "Rows in this version (Delta log statistics)"),
    }
