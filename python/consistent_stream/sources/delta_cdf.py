"""Delta Change Data Feed as a changelog.

Between two cut positions ``(start, end]`` of one source table:

* ``start == -1`` (first batch, or full refresh): the snapshot at ``end``, every row +1;
* ``start == end``: the empty changelog;
* otherwise: the Change Data Feed of versions ``start+1 .. end``, mapped to weights
  insert/update_postimage -> +1, delete/update_preimage -> -1 (not consolidated here:
  linear operators do not need it, and stateful operators consolidate their inputs, after
  projection, where an update of an unused column cancels out).

Out: the source's columns (or the requested subset) plus ``__weight`` bigint.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from ..changelog import WEIGHT, with_weight
from ..delta import DeltaTableRef
from .spec import INITIAL, SourceSpec

_SIGN = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}


def read_changelog(spark: SparkSession, source: SourceSpec, start: int, end: int,
                   columns: list[str] | None = None) -> tuple[DataFrame, int]:
    """The changes of ``source`` in ``(start, end]`` as a Z-set.

    Returns ``(changelog DataFrame, number of change rows read)``. Raises SourceError when
    the table is missing or its Change Data Feed is off or gone for those versions.
    """
    table = DeltaTableRef(source.location)
    if start == INITIAL:
        snap = table.read_snapshot(spark, end, columns)
        return with_weight(snap), -1  # row count unknown without a scan; reported as -1
    if start == end:
        schema = table.arrow_schema(end)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        empty = spark.createDataFrame([], from_arrow_schema(schema))
        return with_weight(empty), 0
    arrow = table.read_changes_arrow(start, end, columns)
    n = arrow.num_rows
    kinds = arrow.column("_change_type")
    weight = pc.if_else(pc.is_in(kinds, pa.array(["insert", "update_postimage"])), 1, -1).cast(pa.int64())
    unknown = pc.invert(pc.is_in(kinds, pa.array(list(_SIGN))))
    if n and pc.any(unknown).as_py():
        bad = pc.filter(kinds, unknown)[0].as_py()
        from ..errors import SourceError
        raise SourceError(f"{source.location}: unknown Change Data Feed _change_type {bad!r}")
    _check_update_pairs(source, arrow)
    keep = [c for c in arrow.column_names if not c.startswith("_change_type")
            and c not in ("_commit_version", "_commit_timestamp")]
    data = arrow.select(keep).append_column(WEIGHT, weight)
    schema = from_arrow_schema(data.schema)
    df = spark.createDataFrame(data, schema=schema) if n else spark.createDataFrame([], schema)
    return df, n


def _check_update_pairs(source: SourceSpec, arrow: pa.Table) -> None:
    """Every update_preimage row has its update_postimage in the same commit (Delta's Change
    Data Feed protocol). delta-rs 1.6.6 writes an UPDATE's postimages as a set difference, so
    a row updated to the same values as another row of the table (possible only without a
    primary key) loses its postimage; reading on would silently drop rows. Raises SourceError
    naming the table and version."""
    if not arrow.num_rows:
        return
    kinds = arrow.column("_change_type")
    is_pre = pc.equal(kinds, "update_preimage")
    is_post = pc.equal(kinds, "update_postimage")
    if not (pc.any(is_pre).as_py() or pc.any(is_post).as_py()):
        return
    counts = pa.table({"v": arrow.column("_commit_version"), "pre": pc.cast(is_pre, pa.int64()),
                       "post": pc.cast(is_post, pa.int64())}).group_by("v").aggregate([("pre", "sum"), ("post", "sum")])
    bad = counts.filter(pc.not_equal(counts.column("pre_sum"), counts.column("post_sum")))
    if bad.num_rows:
        from ..errors import SourceError
        v = bad.column("v")[0].as_py()
        raise SourceError(
            f"{source.location}: the Change Data Feed of version {v} has {bad.column('pre_sum')[0].as_py()} "
            f"update_preimage rows but {bad.column('post_sum')[0].as_py()} update_postimage rows, so it "
            f"does not describe the update (a writer bug; delta-rs 1.6.6 drops the postimages of rows "
            f"updated to equal another row). Nothing was read; rewrite the source table with a "
            f"primary key, then run with --full-refresh")
