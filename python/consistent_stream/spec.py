"""The job spec: everything needed to run, replay or verify one model, saved beside its
checkpoint as ``_consistent_stream/job.json``."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from . import location
from .errors import ConfigError
from .model_config import KEYS
from .settings import STATE_FILE_ROWS
from .storage import read_text, replace_text
from .sources import SourceSpec


RECOMPUTE_THRESHOLD = KEYS["recompute_threshold"].default
"""Default ``recompute_threshold``: a batch whose source change rows exceed this fraction of
the sources' rows is recomputed from snapshots instead of maintained incrementally."""
MAX_BATCH_ROWS = KEYS["max_batch_rows"].default
"""Default ``max_batch_rows``: source change rows above which a backlog is split."""
DRIVER_REBUILD_ROWS = KEYS["driver_rebuild_rows"].default
"""Default ``driver_rebuild_rows``: source rows (summed over the model's sources at the batch's
cut) up to which a rebuild runs on the driver (:mod:`consistent_stream.runtime`); the bound of
``MAX_DRIVER_ROWS`` on a change held there. Above it, the executors rebuild, and the driver
never holds a table-sized relation. Why: a rebuild on the driver runs no Spark job, where the
executors' rebuild runs many, each with its fixed scheduling cost, so up to this size the driver
is faster; but the driver holds the rebuild's relations, which grow with the sources, and the
bound keeps them within what it may hold. Time and peak memory of both are measured by
``benchmarks/driver_rebuild.py`` (the example models in a warm session at Spark's defaults)."""
LOG_RETENTION_HOURS = KEYS["log_retention_hours"].default
"""Default ``log_retention_hours``: the target's log entries are kept this long (Delta's
``delta.logRetentionDuration``, 30 days); see :mod:`consistent_stream.sink.maintenance`."""
DELETED_FILE_RETENTION_HOURS = KEYS["deleted_file_retention_hours"].default
"""Default ``deleted_file_retention_hours``: the target's superseded data files and Change
Data Feed files are kept this long (Delta's ``delta.deletedFileRetentionDuration``, 7 days)."""
STATE_RETENTION_VERSIONS = KEYS["state_retention_versions"].default
"""Default ``state_retention_versions``: state table versions kept (the newest ones)."""
ON_CONFIGURATION_CHANGE = KEYS["on_configuration_change"].choices
"""Values of dbt's ``on_configuration_change`` (the first is dbt's default); see
:mod:`consistent_stream.config_change`."""
ON_SCHEMA_CHANGE = KEYS["on_schema_change"].choices
"""Values of dbt's ``on_schema_change`` (the first is dbt's default)."""
CHECKPOINT_INTERVAL = KEYS["checkpoint_interval"].default
"""Default ``checkpoint_interval``: commits between Delta checkpoints (delta-rs' default
``delta.checkpointInterval``)."""
CHECKPOINT_INTERVAL_OBJECT_STORE = KEYS["checkpoint_interval"].object_store_default
"""The default when the target or the checkpoint is on an object store: every run opens the
target and the state table, replaying each log from its newest checkpoint
(:mod:`consistent_stream.delta.log`): ``_last_checkpoint``, the checkpoint (one GET each), a
LIST and a GET per commit since; writing a checkpoint costs two PUTs. Per run and table that
is 3 requests plus about ``(interval - 1) / 2`` commits plus ``2 / interval`` for the writing:
from 2 to 4 the same within half a request, and 4 keeps the checkpoints (which rewrite every
live file's entry) four times rarer than 1 would; 10, Delta Spark's own
``checkpointInterval``, costs ~3 more GETs a run, never checkpointing a GET per commit per
run, without end."""


def _as_list(value, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"config {key} must be a column name or a list of column names, got {value!r}")


def _boolean(config: dict, key: str, model_name: str) -> bool:
    """Boolean config ``key`` (``true``/``false``, also as strings), its default when unset.
    Raises ConfigError naming the model and key for another value."""
    value = config.get(key)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if value is None:
        return KEYS[key].default
    if not isinstance(value, bool):
        raise ConfigError(f"model {model_name}: config {key} must be true or false, got {value!r}")
    return value


def _number(config: dict, key: str, model: str, default=None):
    """Config ``key`` (a ``number`` or ``integer`` of :data:`~.model_config.KEYS`) as a float or
    an int, at least the key's minimum (ConfigError naming it); ``default``, else the key's own,
    when unset."""
    definition = KEYS[key]
    typ, low = {"number": float, "integer": int}[definition.kind], definition.minimum
    default = definition.default if default is None else default
    value = config.get(key)
    if value is None:
        return default
    try:
        n = typ(value)
        if isinstance(value, bool) or n < low or (typ is int and float(value) != n):
            raise ValueError
    except (TypeError, ValueError):
        kind = "an integer" if typ is int else "a number"
        raise ConfigError(f"model {model}: config {key} must be {kind} >= {low}, got {value!r}") from None
    return n


def _autoscale(value, trigger: str, model: str) -> dict | None:
    """Config ``autoscale``: ``true`` (the defaults) or a dict of
    :class:`~consistent_stream.autoscale.AutoscaleConfig` fields, only with a continuous
    trigger. ConfigError naming the key otherwise."""
    if value is None or value is False:
        return None
    from dataclasses import fields
    from .autoscale import AutoscaleConfig
    d = {} if value is True else value
    if not isinstance(d, dict):
        raise ConfigError(f"model {model}: config autoscale must be true or a mapping of "
                          f"{', '.join(f.name for f in fields(AutoscaleConfig))}; got {value!r}")
    known = {f.name for f in fields(AutoscaleConfig)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"model {model}: config autoscale has unknown keys {unknown}; known: {sorted(known)}")
    if not trigger.startswith("processing_time:"):
        raise ConfigError(f"model {model}: config autoscale needs a continuous trigger "
                          f"(trigger='processing_time:<seconds>'); an available_now run plans its batches up front")
    try:
        # validated now with a stand-in maximum: the real default is the session's parallelism
        AutoscaleConfig(**{"max_parallelism": max(int(d.get("min_parallelism", 1)), 1), **d})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model {model}: config {e}") from None
    return dict(d)


def _constraint(c: dict, model: str) -> dict:
    """One dbt constraint as the engine keeps it: ``{type, columns, expression, name}``."""
    out = {"type": str(c.get("type") or "").lower(), "columns": [str(x) for x in c.get("columns") or []],
           "expression": c.get("expression"), "name": c.get("name")}
    if out["type"] == "check" and not (out["expression"] or "").strip():
        raise ConfigError(f"model {model}: a check constraint{' ' + out['name'] if out['name'] else ''} has no "
                          f"expression; give it `expression: <Spark SQL over the model's columns>`")
    if out["type"] == "not_null" and not out["columns"]:
        raise ConfigError(f"model {model}: a model-level not_null constraint names no columns; give it "
                          f"`columns: [...]` or put it under the column")
    return out


def warehouse_path(project_root: str, warehouse_dir: str) -> str:
    """``spark.sql.warehouse.dir`` as a location (:func:`location.normalize`: a ``file:``
    URI's path, a relative directory relative to the project, an S3 URI as ``s3://``)."""
    from urllib.parse import urlparse
    base = urlparse(warehouse_dir).path if warehouse_dir.startswith("file:") else warehouse_dir
    return location.normalize(base, project_root, key="spark.sql.warehouse.dir")


def target_location(project_root: str, schema: str, identifier: str, config: dict, warehouse_dir: str) -> str:
    """Where a consistent_stream model's target lives: ``<location_root>/<identifier>`` when
    the model configures ``location_root`` (relative to the project), else
    ``<warehouse>/consistent_stream/<schema>/<identifier>``."""
    root = config.get("location_root")
    if root:
        root = location.normalize(str(root), project_root, key="config location_root")
    else:
        root = location.join(warehouse_path(project_root, warehouse_dir), "consistent_stream", schema)
    return location.normalize(location.join(root, identifier))


def _source_spec(d: dict, project_root: str, warehouse_dir: str, catalog=None) -> SourceSpec:
    """One input of a model as the materialization describes it: a dbt source
    (``{source_name, name, relation, meta, primary_key}``; a model dbt builds as a Delta table,
    ``table``, ``incremental``, ``snapshot``, ``seed``, comes the same way with
    ``source_name: ref``) or, with ``kind: model``, an upstream consistent_stream model
    (``{name, relation, schema, identifier, config}``). ``catalog``: a
    :class:`~consistent_stream.sink.catalog.CatalogTables` for inputs named only by table."""
    if d.get("kind") == "model":
        from .sources.model import model_spec
        target = target_location(project_root, d["schema"], d["identifier"], d.get("config") or {}, warehouse_dir)
        return model_spec(d["name"], d["relation"], target)
    return SourceSpec.from_dbt(d, project_root, catalog)


@dataclass
class JobSpec:
    """One consistent_stream model: its SQL, sources, target and checkpoint.

    ``unique_key``: the configured key (lower case), or empty: then the key inferred from
    the plan is used, and a view without one is a bag (duplicates keep their multiplicity).
    ``recompute_threshold``: a batch whose source change rows exceed this fraction of the
    sources' rows is recomputed from snapshots; ``state_file_rows``: rows per state (and
    rebuilt target) file; ``max_batch_rows``: source change rows above which a backlog is
    split into several micro-batches; ``driver_rebuild_rows``: source rows up to which a
    rebuild runs on the driver, not on the executors (0: never); ``local_engine``: where
    change-sized delta queries over driver-side relations run, ``duckdb`` (in-process, exact
    or not at all, see :mod:`consistent_stream.exec.local`) or ``spark`` (always as Spark
    jobs); ``incremental_only``: a query block without a delta rule is a compile error
    instead of being recomputed (:mod:`consistent_stream.plan.recompute`);
    ``target_deletion_vectors``: a batch may mark retracted target rows in deletion vectors
    instead of rewriting their files (:mod:`.sink.rewrite`).
    ``log_retention_hours``, ``deleted_file_retention_hours``, ``state_retention_versions``,
    ``checkpoint_interval``: what table maintenance keeps (:mod:`.sink.maintenance`).
    ``on_configuration_change``, ``on_schema_change``: what a run does when the definition
    or the sources' schemas changed since the checkpoint (:mod:`.config_change`).
    ``contract``: the enforced dbt contract, ``[{name, data_type}]`` (empty when not
    enforced); ``constraints``: ``[{type, columns, expression, name}]``, dbt's column and
    model constraints (:mod:`.sink.constraints`). ``docs``: with dbt's ``persist_docs``,
    ``{description, columns: {name: description}}`` (``description`` None unless
    ``relation: true``, ``columns`` empty unless ``columns: true``), written into the
    target's Delta metadata when it is created or rebuilt and into the catalog at every run
    (:mod:`.sink.catalog`); None without ``persist_docs``. Not part of the definition: a
    changed description never rebuilds the view. ``autoscale``: with a continuous trigger,
    the parallelism of each batch is chosen from the lag (:mod:`.autoscale`; the dict holds
    :class:`~.autoscale.AutoscaleConfig` fields, ``{}`` for the defaults); None: fixed."""
    model: str
    schema: str
    identifier: str
    sql: str
    sources: list[SourceSpec]
    unique_key: list[str]
    target_path: str
    checkpoint_location: str
    partition_by: list[str] = field(default_factory=list)
    trigger: str = KEYS["trigger"].default
    recompute_threshold: float = RECOMPUTE_THRESHOLD
    state_file_rows: int = STATE_FILE_ROWS
    max_batch_rows: int = MAX_BATCH_ROWS
    driver_rebuild_rows: int = DRIVER_REBUILD_ROWS
    local_engine: str = KEYS["local_engine"].default
    incremental_only: bool = KEYS["incremental_only"].default
    target_deletion_vectors: bool = KEYS["target_deletion_vectors"].default
    log_retention_hours: float = LOG_RETENTION_HOURS
    deleted_file_retention_hours: float = DELETED_FILE_RETENTION_HOURS
    state_retention_versions: int = STATE_RETENTION_VERSIONS
    checkpoint_interval: int = CHECKPOINT_INTERVAL
    on_configuration_change: str = ON_CONFIGURATION_CHANGE[0]
    on_schema_change: str = ON_SCHEMA_CHANGE[0]
    contract: list[dict] = field(default_factory=list)
    constraints: list[dict] = field(default_factory=list)
    docs: dict | None = None
    autoscale: dict | None = None

    @property
    def spec_path(self) -> str:
        return os.path.join(self.checkpoint_location, "_consistent_stream", "job.json")

    @property
    def fingerprint_path(self) -> str:
        """The definition's fingerprint the checkpoint was made for (:func:`.plan.fingerprint`)."""
        return os.path.join(self.checkpoint_location, "_consistent_stream", "fingerprint")

    @property
    def plan_path(self) -> str:
        """The compiled incremental plan and the sources' schemas it was compiled for."""
        return os.path.join(self.checkpoint_location, "_consistent_stream", "plan.json")

    @property
    def local_sql_path(self) -> str:
        """The local engine's translations of the plan's delta queries (:class:`.exec.local.Translations`)."""
        return os.path.join(self.checkpoint_location, "_consistent_stream", "local_sql.json")

    @property
    def query_path(self) -> str:
        """The checkpoint's record of its query: id, whether it committed (:mod:`.checkpoint`)."""
        return os.path.join(self.checkpoint_location, "_consistent_stream", "query.json")

    @property
    def scratch_dir(self) -> str:
        """Per-batch scratch files (removed by maintenance)."""
        return os.path.join(self.checkpoint_location, "scratch")

    @property
    def state_root(self) -> str:
        return os.path.join(self.checkpoint_location, "state")


    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps(d, indent=2, sort_keys=True)

    def save(self) -> None:
        replace_text(self.spec_path, self.to_json())

    @staticmethod
    def load(path: str) -> "JobSpec":
        """The job spec saved at ``path`` (:meth:`save`). Raises FileNotFoundError when there is
        none, ValueError when it is not JSON."""
        text = read_text(path)
        if text is None:
            raise FileNotFoundError(path)
        d = json.loads(text)
        d["sources"] = [SourceSpec.from_json(s) for s in d["sources"]]
        return JobSpec(**d)

    @staticmethod
    def from_dbt(*, project_root: str, schema: str, identifier: str, model_name: str, sql: str,
                 sources: list[dict], config: dict, warehouse_dir: str, catalog=None) -> "JobSpec":
        """Validate the materialization's config (keys named as in dbt / dbt-spark) against
        their definition, :data:`consistent_stream.model_config.MODEL_CONFIG` (defaults,
        minimums, accepted values). ``catalog``: a
        :class:`~consistent_stream.sink.catalog.CatalogTables` that finds the sources named
        only by their table (no ``meta.consistent_stream.location``)."""
        unique_key = [c.lower() for c in _as_list(config.get("unique_key"), "unique_key")]
        partition_by = [c.lower() for c in _as_list(config.get("partition_by"), "partition_by")]
        target = target_location(project_root, schema, identifier, config, warehouse_dir)
        ckpt = config.get("checkpoint_location")
        if ckpt:
            ckpt = location.normalize(str(ckpt), project_root, key=f"model {model_name}: config checkpoint_location")
        else:
            ckpt = target + "__checkpoint"
        trigger = str(config.get("trigger") or KEYS["trigger"].default)
        if trigger != "available_now" and not trigger.startswith("processing_time:"):
            raise ConfigError(f"model {model_name}: config trigger must be 'available_now' or "
                              f"'processing_time:<seconds>', got {trigger!r}")
        threshold = _number(config, "recompute_threshold", model_name)
        file_rows = _number(config, "state_file_rows", model_name)
        batch_rows = _number(config, "max_batch_rows", model_name)
        driver_rows = _number(config, "driver_rebuild_rows", model_name)
        local_engines = KEYS["local_engine"].choices
        local_engine = str(config.get("local_engine") or local_engines[0]).lower()
        incremental_only = _boolean(config, "incremental_only", model_name)
        deletion_vectors = _boolean(config, "target_deletion_vectors", model_name)
        retention = dict(
            log_retention_hours=_number(config, "log_retention_hours", model_name),
            deleted_file_retention_hours=_number(config, "deleted_file_retention_hours", model_name),
            state_retention_versions=_number(config, "state_retention_versions", model_name),
            checkpoint_interval=_number(config, "checkpoint_interval", model_name,
                                        default=CHECKPOINT_INTERVAL_OBJECT_STORE if location.is_remote(ckpt)
                                        or location.is_remote(target) else CHECKPOINT_INTERVAL))
        if local_engine not in local_engines:
            raise ConfigError(f"model {model_name}: config local_engine must be "
                              f"{' or '.join(repr(e) for e in local_engines)}, got {config.get('local_engine')!r}")
        policies = {}
        for key, allowed in (("on_configuration_change", ON_CONFIGURATION_CHANGE),
                             ("on_schema_change", ON_SCHEMA_CHANGE)):
            policies[key] = str(config.get(key) or allowed[0]).lower()
            if policies[key] not in allowed:
                raise ConfigError(f"model {model_name}: config {key} must be one of {', '.join(allowed)}; "
                                  f"got {config.get(key)!r}")
        contract = [{"name": str(c["name"]), "data_type": c.get("data_type")} for c in config.get("contract") or []]
        constraints = [_constraint(c, model_name) for c in config.get("constraints") or []]
        docs = config.get("docs")
        if docs is not None:
            docs = {"description": docs.get("description") or None,
                    "columns": {str(k).lower(): str(v) for k, v in (docs.get("columns") or {}).items() if v}}
        autoscale = _autoscale(config.get("autoscale"), trigger, model_name)
        srcs = [_source_spec(s, project_root, warehouse_dir, catalog) for s in sources]
        if not srcs:
            raise ConfigError(f"model {model_name}: a consistent_stream model reads at least one source() "
                              f"or ref() of a consistent_stream model")
        return JobSpec(model=model_name, schema=schema, identifier=identifier, sql=sql, sources=srcs,
                       unique_key=unique_key, target_path=target, checkpoint_location=ckpt,
                       partition_by=partition_by, trigger=trigger, recompute_threshold=threshold,
                       state_file_rows=file_rows, max_batch_rows=batch_rows, driver_rebuild_rows=driver_rows,
                       local_engine=local_engine, incremental_only=incremental_only,
                       target_deletion_vectors=deletion_vectors, contract=contract,
                       constraints=constraints, docs=docs,
                       autoscale=autoscale, **retention, **policies)
