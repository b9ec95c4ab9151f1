"""The Change Data Feed of a Delta table, read by the engine its protocol needs, and the schema
changes a range of its commits holds.

Owns the reads of :meth:`~.reader.TableReader.read_changes_arrow`: delta-rs' ``load_cdf`` on
the driver, or, under column mapping (:class:`~.snapshot.ReadPlan`), delta-spark's
``readChangeFeed`` collected to the driver, split at the range's schema changes when
delta-spark refuses to read it with one schema; and :class:`SchemaChange` (a commit that
changed a table's columns, matched by physical name). Takes a
:class:`~.reader.TableReader` (``table``) for the table's handle, snapshots and commit files;
gives Arrow tables of the table's columns plus :data:`CDF_COLUMNS`. Raises SourceError, saying
what to do, for a range that cannot be read (the feed off, versions vacuumed, a schema change
the feed cannot be read across).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from ..errors import SourceError
from .snapshot import DELTA_SPARK
from .values import as_uri, plain_arrow

log = logging.getLogger("consistent_stream")

CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
"""The columns the Change Data Feed adds to a table's own."""

_SCHEMA_REFUSALS = ("DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA",
                    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE")
"""delta-spark's error conditions for a batch Change Data Feed read it refuses to read with one
schema (``CDCReader.changesToDF``): a commit of the range, or its first version, has a schema
delta-spark cannot read as the end version's (a column renamed or dropped under column
mapping, a type or nullability change)."""


def physical_name(field: dict) -> str:
    """A column's identity across a table's versions: its physical name (field metadata
    ``delta.columnMapping.physicalName``, with its column mapping id, under column mapping;
    without column mapping, the name itself). ``field``: a column as Delta's schema JSON
    holds it."""
    return (field.get("metadata") or {}).get("delta.columnMapping.physicalName") or field["name"]


def _columns_of(fields) -> list[tuple]:
    """What a schema says of its columns: (physical name, name, type, nullability) each;
    descriptions and other field metadata left out."""
    return [(physical_name(f), f["name"], json.dumps(f["type"], sort_keys=True), bool(f.get("nullable", True)))
            for f in fields]


def _type_name(field: dict) -> str:
    from pyspark.sql.types import StructField
    return StructField.fromJson(field).dataType.simpleString()


@dataclass(frozen=True)
class SchemaChange:
    """A commit whose ``metaData`` action changed a table's columns: its ``version`` and the
    columns ``before`` and ``after`` it (Delta's schema JSON fields)."""
    version: int
    before: tuple
    after: tuple

    def describe(self) -> str:
        """What changed, column by column, matched by physical name: e.g. ``version 6 renamed
        column name to full_name, dropped column v (bigint)``."""
        old = {physical_name(f): f for f in self.before}
        new = {physical_name(f): f for f in self.after}
        said = []
        for key, f in old.items():
            g = new.get(key)
            if g is None:
                said.append(f"dropped column {f['name']} ({_type_name(f)})")
                continue
            if g["name"] != f["name"]:
                said.append(f"renamed column {f['name']} to {g['name']}")
            if g["type"] != f["type"]:
                said.append(f"changed the type of column {g['name']} from {_type_name(f)} to {_type_name(g)}")
            if bool(g.get("nullable", True)) != bool(f.get("nullable", True)):
                said.append(f"made column {g['name']} {'nullable' if g.get('nullable', True) else 'NOT NULL'}")
        said += [f"added column {g['name']} ({_type_name(g)})" for key, g in new.items() if key not in old]
        if not said and [physical_name(f) for f in self.before] != [physical_name(f) for f in self.after]:
            said.append("reordered the columns")
        return f"version {self.version} {', '.join(said) or 'replaced the schema'}"


def _describe_changes(changes: list[SchemaChange]) -> str:
    return "; ".join(c.describe() for c in changes)


def _check_same_columns(what: str, wanted: list[str], start: list[dict], end_by_name: dict[str, dict],
                        changes: list[SchemaChange]) -> None:
    """Raise SourceError when a column of ``wanted`` (named as at the range's end) was, under
    that name, another column at the range's start (another physical name: the column was
    dropped, or renamed away, and its name given to another one), or is gone at the end.
    Then every row older than the range reads differently now without a row in the Change
    Data Feed saying so, and a model that read the column cannot follow incrementally. Names
    the column, the commit that took the name away from it, and --full-refresh; ``what``
    says which read failed (the table and the versions)."""
    at_start = {f["name"]: physical_name(f) for f in start}
    for name in wanted:
        key = at_start.get(name)
        if key is None or (name in end_by_name and physical_name(end_by_name[name]) == key):
            continue
        where = next((c for c in changes if {physical_name(f) for f in c.after if f["name"] == name} != {key}),
                     changes[-1])
        raise SourceError(
            f"{what}: the model reads column "
            f"{name}, and {where.describe()}, so column {name} is no longer the column it was (its physical name "
            f"{key}): its rows from before that version changed without a row in the Change Data Feed "
            f"({_describe_changes(changes)}). Run with --full-refresh (the model is rebuilt from the table at the "
            f"cut)")


def schema_changes(table, start_exclusive: int, end_inclusive: int) -> list[SchemaChange]:
    """The commits in ``(start_exclusive, end_inclusive]`` whose ``metaData`` action changes
    the table's columns (:func:`_columns_of`: a column added, dropped, renamed, retyped, or
    its nullability changed; a new table property or comment is no change), oldest first,
    each with the columns before and after it. Reads the range's commit files (one read
    each, in parallel) and the schema at ``start_exclusive`` (a handle at that version):
    for a range known to hold a schema change, never on the common path. Raises
    SourceError when a version or a commit file is gone."""
    from ..threads import at_once
    versions = list(range(start_exclusive + 1, end_inclusive + 1))
    try:
        commits = at_once(table.log_actions, versions, "delta-log", limit=16)
    except Exception as e:
        raise SourceError(f"cannot read the commits {start_exclusive + 1}..{end_inclusive} of the Delta table "
                          f"{table.path}: {e}. If its log was cleaned up, run with --full-refresh") from e
    changes: list[SchemaChange] = []
    before = None
    for version, actions in zip(versions, commits):
        for meta in (a["metaData"] for a in actions if "metaData" in a):
            if before is None:
                before = table.schema_fields(start_exclusive)
            after = json.loads(meta["schemaString"])["fields"]
            if _columns_of(after) != _columns_of(before):
                changes.append(SchemaChange(version, tuple(before), tuple(after)))
            before = after
    return changes


def read_changes_arrow(table, start_exclusive: int, end_inclusive: int,
                       columns: list[str] | None = None, spark: SparkSession | None = None) -> pa.Table:
    """Change Data Feed rows of versions ``(start_exclusive, end_inclusive]`` as Arrow: the
    table's columns at ``end_inclusive`` (or ``columns``, named as there), with
    ``_change_type`` (insert, delete, update_preimage, update_postimage),
    ``_commit_version`` and ``_commit_timestamp``; plain string/binary types. Read by
    delta-rs (``load_cdf``), or, for a table with column mapping (:class:`~.snapshot.ReadPlan`), by
    delta-spark's ``readChangeFeed`` in ``spark`` and collected to the driver (the rows
    of one change).

    A range delta-spark refuses to read with one schema (a column renamed or dropped
    inside it, under column mapping) is read across its schema changes
    (:func:`_spark_changes_across`), each part with its own schema, its columns matched
    to those at ``end_inclusive`` by physical name.

    Raises SourceError naming the table and the table property to set when the Change
    Data Feed is off; naming the versions, and the commits that changed the schema and
    how when there are any, when the range cannot be read (versions vacuumed, log
    cleaned up, a schema change the feed cannot be read across); and what to do.
    """
    if not table.change_data_feed_enabled():
        raise SourceError(
            f"Delta table {table.path} does not have the Change Data Feed on: set table "
            f"property delta.enableChangeDataFeed = true, then run with --full-refresh")
    cols = None if columns is None else list(columns) + list(CDF_COLUMNS)
    first = start_exclusive + 1
    try:
        if table.read_plan().change_feed == DELTA_SPARK:
            if spark is None:
                raise ValueError("a Change Data Feed read by delta-spark needs the Spark session")
            try:
                df = _spark_change_feed(table, spark, first, end_inclusive)
                return plain_arrow(df.select(*[f"`{c}`" for c in (cols or df.columns)]).toArrow())
            except Exception as e:
                if not any(c in str(e) for c in _SCHEMA_REFUSALS):
                    raise
            return _spark_changes_across(table, spark, start_exclusive, end_inclusive, columns)
        reader = table.table().load_cdf(starting_version=first, ending_version=end_inclusive, columns=cols)
        return plain_arrow(pa.table(reader.read_all()))
    except SourceError:
        raise
    except Exception as e:
        raise _unreadable_changes(table, start_exclusive, end_inclusive, e) from e


def _spark_change_feed(table, spark: SparkSession, first: int, last: int) -> DataFrame:
    """delta-spark's Change Data Feed of versions ``first..last`` (a lazy DataFrame), read
    with the schema at ``last`` (delta-spark's default batch schema mode for column mapping
    tables, ``spark.databricks.delta.changeDataFeed.defaultSchemaModeForColumnMappingTable
    = endVersion``)."""
    return (table.spark_reader(spark, last).option("readChangeFeed", "true")
            .option("startingVersion", first).option("endingVersion", last).load(as_uri(table.path)))


def _spark_changes_across(table, spark: SparkSession, start_exclusive: int, end_inclusive: int,
                          columns: list[str] | None) -> pa.Table:
    """:func:`read_changes_arrow` by delta-spark for a range holding schema changes
    (:func:`schema_changes`): the range split at each of them, each part read with its
    own schema (no schema change inside a part, so delta-spark reads it), its columns
    matched to ``columns`` as named at ``end_inclusive`` by physical name (Delta never
    changes a column's physical name: a rename keeps it, a dropped column's goes away, an
    added column gets a new one). A column a part does not have (added later) is NULL in
    its rows, as Delta reads older rows. The parts are one Spark query (a union), read
    once.

    Raises SourceError naming the versions and the schema changes when a column in
    ``columns`` is not the same column at the start and at the end (dropped and added
    again, or a renamed column's old name taken by another: its older rows changed
    without a row in the Change Data Feed), or when a part still cannot be read."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField
    what = f"cannot read the Change Data Feed of {table.path} for versions {start_exclusive + 1}..{end_inclusive}"
    changes = schema_changes(table, start_exclusive, end_inclusive)
    if not changes:
        raise SourceError(
            f"{what}: delta-spark refuses it for a schema change, but no commit in the range changes the schema "
            f"(spark.databricks.delta.changeDataFeed.defaultSchemaModeForColumnMappingTable must be endVersion, "
            f"delta-spark's default). Run with --full-refresh")
    start = list(changes[0].before)
    end_by_name = {f["name"]: f for f in changes[-1].after}
    # as named at the end; a column added after the range (none of the parts has it) as the handle has it
    targets = {**{f["name"]: f for f in table.schema_fields()}, **end_by_name}
    wanted = list(columns) if columns is not None else list(end_by_name)
    _check_same_columns(what, wanted, start, end_by_name, changes)
    bounds = [start_exclusive + 1] + [c.version for c in changes] + [end_inclusive + 1]
    schemas = [start] + [list(c.after) for c in changes]
    parts = [(lo, hi - 1, fields) for lo, hi, fields in zip(bounds, bounds[1:], schemas)
             if lo < hi]   # empty before a schema change in the range's first commit
    log.info("Change Data Feed of %s, versions %d..%d: read in parts %s across its schema changes (%s)",
             table.path, start_exclusive + 1, end_inclusive, ", ".join(f"{lo}..{hi}" for lo, hi, _ in parts),
             _describe_changes(changes))
    frames = []
    for lo, hi, fields in parts:
        by_key = {physical_name(f): f for f in fields}
        exprs = []
        for name in wanted:
            mine = by_key.get(physical_name(targets[name]))
            if mine is None:   # added after these versions: NULL in their rows, as Delta reads them
                exprs.append(F.lit(None).cast(StructField.fromJson(targets[name]).dataType).alias(name))
            elif mine["type"] != targets[name]["type"]:
                raise SourceError(f"{what}: column {name} has another type in versions {lo}..{hi} "
                                  f"({_describe_changes(changes)}). Run with --full-refresh")
            else:
                exprs.append(F.col(f"`{mine['name']}`").alias(name))
        frames.append(_spark_change_feed(table, spark, lo, hi).select(*exprs, *CDF_COLUMNS))
    df = frames[0]
    for frame in frames[1:]:
        df = df.union(frame)
    try:
        return plain_arrow(df.toArrow())
    except Exception as e:
        raise SourceError(
            f"{what} across its schema changes ({_describe_changes(changes)}), read in parts "
            f"{', '.join(f'{lo}..{hi}' for lo, hi, _ in parts)}: {e}. Run with --full-refresh (the model is "
            f"rebuilt from the table at the cut)") from e


def _unreadable_changes(table, start_exclusive: int, end_inclusive: int, error: Exception) -> SourceError:
    """The SourceError for a Change Data Feed range that cannot be read (``error``): naming
    the commits in the range that changed the schema and how, when there are any (read
    from the range's commit files, only now that the read failed); else the versions
    vacuumed or the log cleaned up."""
    what = f"cannot read the Change Data Feed of {table.path} for versions {start_exclusive + 1}..{end_inclusive}"
    try:
        changes = schema_changes(table, start_exclusive, end_inclusive)
    except Exception:
        changes = []
    if changes:
        return SourceError(
            f"{what}: {error}. The schema changed inside these versions ({_describe_changes(changes)}) and the "
            f"feed cannot be read across the change. Run with --full-refresh (the model is rebuilt from the "
            f"table at the cut)")
    return SourceError(f"{what}: {error}. If those versions were vacuumed, run with --full-refresh")
