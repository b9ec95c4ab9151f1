"""What changed since a model's checkpoint was made, and what a run does about it.

A checkpoint (its state, its cut log, its Spark query) holds the view of one definition: the
model's SQL, its sources (key, location, primary key), ``unique_key``, ``partition_by``, its
enforced constraints and target, saved as ``_consistent_stream/job.json`` when a run starts,
and the columns the plan reads from each source, with their types
(``_consistent_stream/plan.json``). When the next run's definition differs, the state no longer
follows from the sources by the new definition, and the run does what the model's config says,
as dbt's materialized views do:

``on_configuration_change`` (dbt's config; default ``apply``)
    ``apply`` rebuilds the view: a full refresh (logged with what changed); ``continue``
    keeps the view as it is (the target is not refreshed; dbt warns, naming the changes);
    ``fail`` fails with the diff of what changed. Nothing is read or written then.
``on_schema_change`` (dbt's config, for drift of the sources' schemas)
    Only a column the plan reads counts (dropped, renamed, retyped, or a new one that
    ``select *`` reads); a column the model does not read changes nothing. ``fail`` fails
    naming the columns; ``sync_all_columns`` and ``append_new_columns`` rebuild; ``ignore``
    (dbt's default) cannot be honoured for a column the plan reads, so the drift is handled
    as a configuration change, by ``on_configuration_change``.

A checkpoint made by another version of consistent_stream goes on from its state, unless
that version planned the same SQL with other operators (a construct it recomputed and this
one maintains by a delta rule: :func:`plan_changes`): that is a ``state_format`` change,
handled by ``on_configuration_change`` as well.

A definition whose target does not exist yet is built, whatever these say (as dbt creates a
missing materialized view). ``--full-refresh`` rebuilds whatever changed.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass

from . import location, storage
from .errors import ConfigError
from .spec import JobSpec

_SQL_DIFF_LINES = 40


@dataclass(frozen=True)
class Change:
    """One difference between the checkpoint's definition and the run's: ``what`` is
    ``sql``, ``sources``, ``unique_key``, ``partition_by``, ``constraints``, ``target``,
    ``state_format``, ``source_schema`` or ``source_replaced`` (a source table created again under
    its path); ``detail`` says how, for a person (the SQL as a unified diff)."""
    what: str
    detail: str

    def __str__(self) -> str:
        return f"{self.what}: {self.detail}"


def saved_definition(job: JobSpec) -> dict | None:
    """The checkpoint's ``job.json`` (None when the checkpoint has none yet)."""
    return storage.read_json(job.spec_path)


def _saved_fingerprint(job: JobSpec) -> str | None:
    return (storage.read_text(job.fingerprint_path) or "").strip() or None


def _source_text(s: dict) -> str:
    pk = list(s.get("primary_key") or ())
    return f"{s.get('format', 'delta')} {s.get('location')}" + (f" {s.get('table')}" if s.get("table") else "") + \
        (f" primary_key {pk}" if pk else "")


def definition_changes(job: JobSpec, fingerprint: str) -> list[Change]:
    """How ``job`` differs from the definition its checkpoint was made for (``fingerprint``:
    :func:`consistent_stream.plan.fingerprint` of ``job``). Empty when the checkpoint is new
    or the same."""
    saved = saved_definition(job)
    if saved is None:
        return []
    changes: list[Change] = []
    old_sql, new_sql = str(saved.get("sql", "")).strip(), job.sql.strip()
    if old_sql != new_sql:
        diff = list(difflib.unified_diff(old_sql.splitlines(), new_sql.splitlines(), "checkpoint", "model",
                                         lineterm="", n=1))
        if len(diff) > _SQL_DIFF_LINES:
            diff = diff[:_SQL_DIFF_LINES] + [f"... ({len(diff) - _SQL_DIFF_LINES} more lines)"]
        changes.append(Change("sql", "\n" + "\n".join(diff)))
    old_sources = {f"{s['source_name']}.{s['name']}" if s.get("source_name") else s.get("name"): s
                   for s in saved.get("sources", [])}
    new_sources = {s.key: {**s.__dict__, "primary_key": list(s.primary_key)} for s in job.sources}
    parts = [f"{k} added ({_source_text(new_sources[k])})" for k in sorted(set(new_sources) - set(old_sources))]
    parts += [f"{k} removed" for k in sorted(set(old_sources) - set(new_sources))]
    parts += [f"{k} {_source_text(old_sources[k])} -> {_source_text(new_sources[k])}"
              for k in sorted(set(old_sources) & set(new_sources))
              if _source_text(old_sources[k]) != _source_text(new_sources[k])]
    if parts:
        changes.append(Change("sources", "; ".join(parts)))
    for key in ("unique_key", "partition_by"):
        old, new = list(saved.get(key) or []), list(getattr(job, key))
        if old != new:
            changes.append(Change(key, f"{old or 'none'} -> {new or 'none'}"))
    from .sink.constraints import describe as constraint_text
    old_c = sorted(constraint_text(c) for c in saved.get("constraints") or [] if c["type"] in ("not_null", "check"))
    new_c = sorted(constraint_text(c) for c in job.constraints if c["type"] in ("not_null", "check"))
    if old_c != new_c:   # rows committed before were not checked against a new constraint
        changes.append(Change("constraints", f"{old_c or 'none'} -> {new_c or 'none'}"))
    old_target = saved.get("target_path")
    if old_target and location.normalize(old_target) != location.normalize(job.target_path):
        changes.append(Change("target", f"{old_target} -> {job.target_path} (location_root or the alias changed; "
                                         f"the old target is left as it is)"))
    old_fp = _saved_fingerprint(job)
    if not changes and old_fp is not None and old_fp != fingerprint:
        changes.append(Change("state_format", "the checkpoint was made by another version of consistent_stream, "
                                              "whose state format this version does not read"))
    if not changes and plain_float_accumulators(storage.read_json(job.plan_path)):
        changes.append(Change("state_format", "its SUM or AVG over FLOAT or DOUBLE keeps a plain floating-point "
                                              "accumulator, made by an earlier version of consistent_stream; this "
                                              "one keeps compensated accumulators (bounded under retractions)"))
    return changes


def plan_changes(saved, root) -> list[Change]:
    """A ``state_format`` change when the checkpoint's saved plan ``saved`` (``plan.json``'s
    content, or None) has other operators than ``root``, the plan this version compiles the
    same SQL to (an operator's id is its position and kind,
    :func:`consistent_stream.plan.logical.assign_ids`): a construct the checkpoint's version
    recomputed that this one maintains by a delta rule, whose state the checkpoint does not
    hold. Empty when there is no saved plan or it has the same operators."""
    from .plan.logical import Join, walk
    try:
        types = json.loads(saved["types"])
        old = {k for k in types["nodes"] if "/" not in k}
        arrangements = types["arrangements"]
    except (KeyError, TypeError, ValueError):
        return []
    new = {n.id for n in walk(root)}
    if old != new:
        return [Change("state_format", "this version of consistent_stream maintains the model's SQL with other "
                                       f"operators ({', '.join(sorted(new - old)[:6])}) than the checkpoint's "
                                       f"({', '.join(sorted(old - new)[:6])}), whose state it does not hold")]
    for n in walk(root):   # a join now arranged by another key (a range join's band column)
        for role in ("left", "right") if isinstance(n, Join) else ():
            a = arrangements.get(f"{n.id}_{role}")
            if isinstance(a, dict) and list(a.get("key", [])) != n.arrangement_key(role):
                return [Change("state_format", f"this version of consistent_stream arranges the {role} side of "
                                               f"join {n.id} by {n.arrangement_key(role)}, the checkpoint's state "
                                               f"by {a.get('key')}")]
    return []


def plain_float_accumulators(saved) -> bool:
    """Whether a checkpoint's saved plan (``plan.json``'s content, or None) has an aggregate's
    accumulator arrangement with an additive DOUBLE or FLOAT column that is not a compensated
    pair (:mod:`consistent_stream.fsum`): made before SUM and AVG over floating point were
    compensated. Such a plan is neither reused nor its state read on: the model is rebuilt;
    every other checkpoint of an earlier version goes on incrementally."""
    if not isinstance(saved, dict):
        return False
    try:
        arrangements = json.loads(saved["types"])["arrangements"].values()
    except (KeyError, TypeError, ValueError):
        return False
    for a in arrangements:
        paired = {c for pair in a.get("compensated", ()) for c in pair}
        types = {f["name"]: f["type"] for f in a["schema"]["fields"]}
        if any(types.get(c) in ("double", "float") and c not in paired for c in a.get("additive", ())):
            return True
    return False


def schema_changes(problems: dict[str, list[str]], job: JobSpec) -> list[Change]:
    """``problems`` (source key -> what changed in the columns the plan reads, from
    :func:`consistent_stream.preflight.source_schema_drift`) as changes."""
    location = {s.key: s.location for s in job.sources}
    return [Change("source_schema", f"{key} ({location.get(key, '?')}): {'; '.join(p)}")
            for key, p in problems.items() if p]


def action(job: JobSpec, changes: list[Change]) -> str:
    """What the run does about ``changes``: ``none`` (there are none), ``apply`` (rebuild),
    ``continue`` (keep the view as it is) or ``fail``, by ``job.on_schema_change`` for drift of
    the sources' schemas and ``job.on_configuration_change`` for everything else."""
    if not changes:
        return "none"
    drift_only = all(c.what == "source_schema" for c in changes)
    if drift_only and job.on_schema_change == "fail":
        return "fail"
    if drift_only and job.on_schema_change in ("append_new_columns", "sync_all_columns"):
        return "apply"
    return job.on_configuration_change


def describe(changes: list[Change]) -> str:
    """One line per change, for a log line or an error."""
    return "\n".join(f"  - {c}" for c in changes)


def failure(job: JobSpec, changes: list[Change]) -> ConfigError:
    """The error of ``fail``: what changed, which config said to fail, what to do."""
    drift_only = all(c.what == "source_schema" for c in changes)
    key = ("on_schema_change", job.on_schema_change) if drift_only and job.on_schema_change == "fail" else \
        ("on_configuration_change", job.on_configuration_change)
    # dbt's words for a materialized view, when on_configuration_change decided
    dbt = (f"Configuration changes were identified and `on_configuration_change` was set to `fail` for "
           f"`{job.schema}.{job.identifier}`. " if key[0] == "on_configuration_change" else "")
    return ConfigError(
        f"{dbt}model {job.model}: its definition changed since the checkpoint at {job.checkpoint_location} was "
        f"made, and config {key[0]} is '{key[1]}':\n{describe(changes)}\nNothing was read or written. Update the "
        f"model if a column it names is gone, then run dbt run --full-refresh -s {job.model} (or set "
        f"{key[0]}='{'sync_all_columns' if key[0] == 'on_schema_change' else 'apply'}') to rebuild the view")
