"""The target commit: exactly one Delta commit per micro-batch, idempotent by txn.

The batch's consolidated output changelog becomes, per ``unique_key`` value, an upsert (the
key has a +1 row) or a delete (only a -1 row), applied by one MERGE whose txn is
``(app id, batch id)``; a replayed batch whose txn the target already holds is skipped by the
caller. The first batch of a query (and every full refresh) overwrites the target instead.
"""
from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..changelog import WEIGHT
from ..delta import DeltaTableRef, Txn
from ..errors import UniqueKeyViolation

OP = "__op"


def _check_unique(plus: DataFrame, delta: DataFrame, unique_key: list[str], model: str) -> None:
    bad = delta.where(F.abs(F.col(WEIGHT)) > 1).limit(1).collect()
    if bad:
        row = {k: bad[0][k] for k in unique_key}
        raise UniqueKeyViolation(
            f"model {model}: unique_key {unique_key} is not unique: the output has "
            f"{abs(bad[0][WEIGHT])} identical rows with key {row}. Fix the model SQL or the "
            f"unique_key config; nothing was committed for this batch")
    dup = plus.groupBy(*unique_key).count().where(F.col("count") > 1).limit(1).collect()
    if dup:
        row = {k: dup[0][k] for k in unique_key}
        raise UniqueKeyViolation(
            f"model {model}: unique_key {unique_key} is not unique: key {row} has "
            f"{dup[0]['count']} rows in the output. Fix the model SQL or the unique_key config; "
            f"nothing was committed for this batch")


def sink_changes(delta: DataFrame, unique_key: list[str], model: str) -> DataFrame:
    """Consolidated output changelog -> target changes: the target's columns + ``__op``
    ('upsert' | 'delete'), one row per key. Raises UniqueKeyViolation."""
    plus = delta.where(F.col(WEIGHT) > 0).drop(WEIGHT)
    _check_unique(plus, delta, unique_key, model)
    minus = delta.where(F.col(WEIGHT) < 0).drop(WEIGHT)
    cond = None
    for k in unique_key:
        e = minus[k].eqNullSafe(plus[k])
        cond = e if cond is None else cond & e
    deletes = minus.join(plus, cond, "left_anti").dropDuplicates(unique_key)
    return (plus.withColumn(OP, F.lit("upsert"))
            .unionByName(deletes.withColumn(OP, F.lit("delete"))))


def commit_target(target: DeltaTableRef, changes: DataFrame, *, first: bool, unique_key: list[str],
                  partition_by: list[str], txn: Txn, metadata: dict) -> tuple[int, int]:
    """Commit the batch to the target; returns ``(new version, rows written)``.

    ``first``: overwrite the target with the upserts (the first batch of a query).
    """
    arrow = changes.toArrow()
    if first:
        data = arrow.filter(pa.compute.equal(arrow.column(OP), "upsert")).drop_columns([OP])
        version = target.write(data, mode="overwrite", txn=txn, metadata=metadata,
                               partition_by=partition_by,
                               configuration={"delta.enableChangeDataFeed": "true"})
        return version, data.num_rows
    version = target.merge_by_key(arrow, unique_key, txn=txn, metadata=metadata)
    return version, arrow.num_rows
