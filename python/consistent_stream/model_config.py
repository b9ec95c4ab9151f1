"""The config of a ``consistent_stream`` model, defined once: every key the materialization
passes the engine, with its type, default, accepted values and what it does.

Who reads it:

* :meth:`consistent_stream.spec.JobSpec.from_dbt` validates the materialization's config
  against it (defaults, minimums, accepted values);
* the dbt adapter (``dbt.adapters.consistent_spark.impl``) generates its config class
  ``ConsistentSparkConfig`` from it, and gives the materialization the keys to read
  (``adapter.consistent_stream_config_keys()``), which builds ``stream_config`` from them;
* ``docs/gen/reference.py`` renders it as the docs' ``reference/model-config.md``.

``tests/test_references.py`` checks the four against each other. Adding a key is adding a
:class:`ConfigKey` here and reading it in ``JobSpec.from_dbt``.

Nothing is imported from the rest of the package: the adapter reads this module when dbt
loads it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

CONFIG = "config"
"""Origin of a key the model sets in ``config()`` (or ``dbt_project.yml``)."""
CONTRACT = "contract"
"""Origin of a key the materialization fills from the model's dbt contract (``columns``,
``constraints`` under ``contract: {enforced: true}``), not from its config."""
PERSIST_DOCS = "persist_docs"
"""Origin of a key the materialization fills from the model's descriptions under dbt's
``persist_docs``, not from its config."""

KINDS = ("columns", "location", "trigger", "number", "integer", "boolean", "choice", "autoscale",
         "contract", "constraints", "docs")


@dataclass(frozen=True)
class ConfigKey:
    """One key of a model's config.

    ``kind`` says how it is validated (:data:`KINDS`): ``number`` and ``integer`` are at least
    ``minimum``; ``choice`` is one of ``choices``, the first the default. ``type`` and
    ``accepted`` are how the reference states them; ``default_text``, when set, states a
    default that the value alone does not (a derived path, a default that depends on the
    storage). ``example`` is a valid value other than the default (the tests run it through
    :meth:`~consistent_stream.spec.JobSpec.from_dbt`)."""
    name: str
    kind: str
    type: str
    default: Any
    accepted: str
    description: str
    example: Any
    minimum: Union[int, float, None] = None
    choices: tuple = ()
    default_text: str = ""
    object_store_default: Any = None
    origin: str = CONFIG

    @property
    def from_config(self) -> bool:
        """Whether the model sets it in ``config()`` (else the materialization fills it)."""
        return self.origin == CONFIG

    def default_as_text(self) -> str:
        """The default as the reference states it."""
        if self.default_text:
            return self.default_text
        if self.default is None:
            return "none"
        if isinstance(self.default, bool):
            return "`true`" if self.default else "`false`"
        if isinstance(self.default, float) and self.default == int(self.default):
            return f"`{int(self.default)}`"
        if isinstance(self.default, (list, dict)) and not self.default:
            return "none"
        return f"`{self.default}`"

    def python_type(self) -> Any:
        """The annotation of the adapter config class's field (``Optional``: unset is None)."""
        return Optional[_PYTHON_TYPES[self.kind]]


_PYTHON_TYPES = {
    "columns": Union[str, List[str]], "location": str, "trigger": str, "number": float, "integer": int,
    "boolean": bool, "choice": str, "autoscale": Union[bool, Dict[str, Any]],
    "contract": List[Dict[str, Any]], "constraints": List[Dict[str, Any]], "docs": Dict[str, Any],
}

AUTOSCALE_KEYS = ("min_parallelism", "max_parallelism", "lag_threshold_s", "scale_down_ratio", "safety_factor",
                  "stable_s", "window", "state_rows_per_task")
"""The keys of an ``autoscale`` mapping: the fields of
:class:`consistent_stream.autoscale.AutoscaleConfig` (a test compares them)."""


MODEL_CONFIG: tuple[ConfigKey, ...] = (
    ConfigKey(
        "unique_key", "columns", "column or list of columns", None,
        "a column name or a list of column names of the model's result",
        "The target's primary key; each batch's changes are merged into the target by it, and every "
        "batch checks it is unique. Optional: when unset it is inferred from the SQL (a GROUP BY's "
        "keys, the sources' primary keys through joins), and a view without any key is kept as a bag, "
        "duplicates keeping their multiplicity (see Supported SQL).",
        ["c_custkey"], default_text="inferred from the SQL"),
    ConfigKey(
        "location_root", "location", "string", None,
        "a directory: a path (relative to the dbt project) or an `s3://` URI",
        "Where the target lives: at `{location_root}/{alias}`. A changed location is a new relation: "
        "the model is built at the new location and the old target is left as it is.",
        "data/targets", default_text="`{spark.sql.warehouse.dir}/consistent_stream/{schema}`"),
    ConfigKey(
        "checkpoint_location", "location", "string", None,
        "a directory: a path (relative to the dbt project) or an `s3://` URI",
        "The model's checkpoint: the Spark checkpoint, the operator state, the compiled plan and the "
        "job spec, and beside it the writer lock (`<checkpoint_location>.lock`) that lets one run at a "
        "time write the model.",
        "data/checkpoints/m", default_text="`{target}__checkpoint`"),
    ConfigKey(
        "partition_by", "columns", "column or list of columns", [],
        "a column name or a list of column names of the model's result",
        "Partition columns of the target Delta table. Part of the model's definition: a new "
        "`partition_by` is a configuration change (`on_configuration_change`), applied to the table "
        "in the rebuild's commit.",
        ["region"]),
    ConfigKey(
        "trigger", "trigger", "string", "available_now",
        "`available_now`, or `processing_time:<seconds>`",
        "`available_now`: process every change up to the cut taken at start, then stop (one `dbt run`). "
        "`processing_time:<seconds>`: a continuous query that starts a batch every this many seconds "
        "with the changes committed since the last one.",
        "processing_time:10"),
    ConfigKey(
        "recompute_threshold", "number", "number", 0.25, "a number >= 0",
        "A batch whose source change rows exceed this fraction of its sources' rows (and 1,000) is "
        "recomputed from the snapshots on the executors instead of incrementally, still as one commit "
        "with the batch's txn; the run log says which strategy it chose and why.",
        0.5, minimum=0.0),
    ConfigKey(
        "max_batch_rows", "integer", "integer", 500_000, "an integer >= 1",
        "A backlog (e.g. a day of changes) is split into micro-batches of at most this many source "
        "change rows, each ending at a transaction-consistent cut, the last at the cut taken at start; "
        "a single larger transaction is a batch of its own. Not split, one version to the cut: a first "
        "build (a rebuild from the snapshots), a model over `ref()`, and a backlog larger than "
        "`recompute_threshold` x its sources' rows, which is recomputed from the snapshots (the run log "
        "warns, naming the threshold that would split it; set `recompute_threshold` above it to keep "
        "versions of at most `max_batch_rows`).",
        1000, minimum=1),
    ConfigKey(
        "driver_rebuild_rows", "integer", "integer", 1_000_000, "an integer >= 0",
        "A rebuild (the first batch, `--full-refresh`, a recomputed batch) whose sources hold at most "
        "this many rows together runs on the driver (the snapshots go through the delta rules over "
        "empty state, with no Spark job per arrangement); a larger one runs on the executors. `0`: "
        "every rebuild on the executors, for a driver with little memory (rebuilds of 600,000-766,000 "
        "TPC-H source rows peaked at 560-740 MB of the driver's Python).",
        0, minimum=0),
    ConfigKey(
        "autoscale", "autoscale", "boolean or mapping", None,
        "`true`, or a mapping of " + ", ".join(f"`{k}`" for k in AUTOSCALE_KEYS) + "; only with "
        "`trigger='processing_time:<seconds>'`",
        "The parallelism of each batch of a continuous query is chosen from the lag behind the last "
        "one (see \"Scaling from lag\"). `true` takes the defaults: `min_parallelism` 1, "
        "`max_parallelism` the session's default parallelism (its cores), `lag_threshold_s` 10, "
        "`scale_down_ratio` 6, `safety_factor` 3, `stable_s` 60, `window` 3 batches, "
        "`state_rows_per_task` 10,000,000; a mapping overrides some of them. Unset: a fixed parallelism.",
        True, default_text="none (a fixed parallelism)"),
    ConfigKey(
        "state_file_rows", "integer", "integer", 1_000_000, "an integer >= 1",
        "Rows per file of operator state (and of a rebuilt target); smaller files make keyed state "
        "reads read less.",
        100_000, minimum=1),
    ConfigKey(
        "local_engine", "choice", "string", "duckdb", "`duckdb` or `spark`",
        "Where an incremental batch's delta queries run when every relation they read is already on "
        "the driver (the batch's changes, keyed state reads). `duckdb` runs them in-process, but only "
        "those whose every construct gives Spark's exact result (integers, DECIMAL including Spark's "
        "decimal division and rounding, strings, dates; no floating point, no implicit casts between "
        "types, no function outside a short list); every other query, and any query DuckDB fails on, "
        "runs on Spark. `spark` runs them all as Spark jobs.",
        "spark", choices=("duckdb", "spark")),
    ConfigKey(
        "incremental_only", "boolean", "boolean", False, "`true` or `false`",
        "`true`: a query block without a delta rule of its own (see Supported SQL: `PIVOT`, "
        "`kurtosis`, ...) is a compile error, named with its line, instead of being maintained by "
        "recomputing it each batch.",
        True),
    ConfigKey(
        "target_deletion_vectors", "boolean", "boolean", True, "`true` or `false`",
        "An incremental batch retracts the rows of a large target file by marking them in the file's "
        "Delta deletion vector (merge-on-read: the table gets the `deletionVectors` feature, reader "
        "version 3, writer version 7, and `delta.enableDeletionVectors`) instead of rewriting the file; "
        "a file with a quarter of its rows marked is rewritten (purged). `false`: every touched file is "
        "rewritten (copy-on-write), for readers without the feature. A target that already has the "
        "feature keeps it; rebuild it under a new name, or drop it, to give such readers a table "
        "without it.",
        False),
    ConfigKey(
        "log_retention_hours", "number", "number of hours", 720.0, "a number >= 0 (fractions allowed)",
        "Delta's `delta.logRetentionDuration` (default 30 days): the target's log entries older than "
        "this are deleted, only below a Delta checkpoint, so every later version stays readable (time "
        "travel, a downstream `ref()` reading the Change Data Feed from the version it consumed). Also "
        "set as the target's table property when it is created.",
        48, minimum=0.0),
    ConfigKey(
        "deleted_file_retention_hours", "number", "number of hours", 168.0, "a number >= 0 (fractions allowed)",
        "Delta's `delta.deletedFileRetentionDuration` (default 7 days): the target's data files removed "
        "from the table, and its Change Data Feed files, are deleted this long after their removal. A "
        "downstream model must consume a version within this window. Also set as the target's table "
        "property when it is created, so its checkpoints drop the tombstones of files removed longer ago.",
        24, minimum=0.0),
    ConfigKey(
        "state_retention_versions", "integer", "integer", 2, "an integer >= 1",
        "Operator-state versions kept (the newest ones, always including the one the target's last "
        "commit records, which a crashed batch's replay reads); older state files and log entries are "
        "deleted.",
        3, minimum=1),
    ConfigKey(
        "checkpoint_interval", "integer", "integer", 100, "an integer >= 1",
        "A Delta checkpoint of the target and of the state is written every this many commits (set as "
        "the tables' `delta.checkpointInterval` when they are created; the run's own commits write it "
        "as they reach it; maintenance catches up on a table created without it). The default is "
        "delta-rs' `delta.checkpointInterval`, 100, and 4 when the target or the checkpoint is on an "
        "object store, where a run's open of the target and the state reads the newest checkpoint and "
        "each commit since it, a GET each, and a checkpoint costs two PUTs: 4 is near the least "
        "requests per run.",
        10, minimum=1, default_text="`100`; `4` on an object store", object_store_default=4),
    ConfigKey(
        "on_configuration_change", "choice", "string", "apply", "`apply`, `continue` or `fail`",
        "What a run does when the model's definition (its SQL, sources, `unique_key`, `partition_by`, "
        "target location) changed since its checkpoint was made, as for dbt's materialized views. "
        "`apply` rebuilds the view (a full refresh, one new version) and logs what changed; `continue` "
        "keeps the view as it is, not refreshed, and dbt warns with the changes; `fail` fails before "
        "reading or writing anything, naming every change.",
        "fail", choices=("apply", "continue", "fail")),
    ConfigKey(
        "on_schema_change", "choice", "string", "ignore",
        "`ignore`, `fail`, `append_new_columns` or `sync_all_columns`",
        "What a run does when a source's schema drifted in a column the model reads (a column dropped, "
        "renamed or retyped, or a new column that `select *` reads): `fail` fails naming the columns, "
        "`sync_all_columns` and `append_new_columns` rebuild, and `ignore` (dbt's default, which cannot "
        "be honoured for a column the plan reads) leaves it to `on_configuration_change`.",
        "fail", choices=("ignore", "fail", "append_new_columns", "sync_all_columns")),
    ConfigKey(
        "contract", "contract", "list of `{name, data_type}`", [],
        "filled by the materialization from the model's `columns` when `contract: {enforced: true}`",
        "The enforced dbt contract: the model's columns and their Spark DDL types, checked against the "
        "SQL's output as Spark's analysis types it before anything is read or written; a mismatch fails "
        "the model with dbt's table. Empty when the contract is not enforced.",
        [{"name": "c_custkey", "data_type": "bigint"}], default_text="none (no enforced contract)",
        origin=CONTRACT),
    ConfigKey(
        "constraints", "constraints", "list of `{type, columns, expression, name}`", [],
        "filled by the materialization from the model's column and model constraints under an enforced "
        "contract",
        "dbt's constraints. `not_null` and `check` (Spark SQL over the output's columns, passing when "
        "TRUE or NULL) are enforced at every batch on the rows it inserts or updates (a rebuild: on "
        "every row), before the target's commit: a violation fails the batch naming the constraint and "
        "up to five rows. `unique`, `primary_key`, `foreign_key` and `custom` are warned about, not "
        "enforced.",
        [{"type": "not_null", "columns": ["c_custkey"]}], default_text="none", origin=CONTRACT),
    ConfigKey(
        "docs", "docs", "mapping `{description, columns}`", None,
        "filled by the materialization from the model's descriptions under dbt's `persist_docs`",
        "With dbt's `persist_docs`, the model's description (with `relation: true`) and its columns' "
        "(with `columns: true`), written into the target's Delta metadata when it is created or "
        "rebuilt and into the catalog at every run. Not part of the definition: a changed description "
        "never rebuilds the view.",
        {"description": "totals per customer", "columns": {}}, default_text="none (no `persist_docs`)",
        origin=PERSIST_DOCS),
)
"""Every key of a model's config, in the order the reference lists them."""

KEYS: dict[str, ConfigKey] = {k.name: k for k in MODEL_CONFIG}
""":data:`MODEL_CONFIG` by name."""


def config_keys() -> list[str]:
    """The keys the materialization reads from the model's config (``config.get``), in order;
    the others (:data:`CONTRACT`, :data:`PERSIST_DOCS`) it fills from dbt's contract and docs."""
    return [k.name for k in MODEL_CONFIG if k.from_config]


def default(name: str) -> Any:
    """The default of key ``name`` (a fresh copy of a list or mapping)."""
    value = KEYS[name].default
    return type(value)(value) if isinstance(value, (list, dict)) else value
