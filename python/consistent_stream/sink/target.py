"""The target commit: exactly one Delta commit per micro-batch, idempotent by txn.

The batch's consolidated output changelog (size of the change) is collected once as Arrow
and becomes, per ``unique_key`` value, an upsert (the key has a +1 row) or a delete (only a
-1 row), applied by one MERGE whose txn is ``(app id, batch id)``; a replayed batch whose txn
the target already holds is skipped by the caller. The first batch of a query (and every full
refresh) overwrites the target instead.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..changelog import WEIGHT
from ..delta import DeltaTableRef, Txn
from ..errors import CommitError, UniqueKeyViolation

OP = "__op"


def sink_changes(delta: pa.Table, unique_key: list[str], model: str, *, first: bool) -> pa.Table:
    """Consolidated output changelog (target columns + ``__weight``) -> target changes: the
    target's columns + ``__op`` ('upsert' | 'delete'), one row per key.

    Raises UniqueKeyViolation when a key has two output rows (also when one row appears
    twice), CommitError when the first batch holds a retraction.
    """
    w = delta.column(WEIGHT)
    if delta.num_rows and pc.max(pc.abs(w)).as_py() > 1:
        i = pc.index(pc.greater(pc.abs(w), 1), True).as_py()
        row = {k: delta.column(k)[i].as_py() for k in unique_key}
        raise UniqueKeyViolation(
            f"model {model}: unique_key {unique_key} is not unique: the output has "
            f"{abs(w[i].as_py())} identical rows with key {row}. Fix the model SQL or the "
            f"unique_key config; nothing was committed for this batch")
    plus = delta.filter(pc.greater(w, 0)).drop_columns([WEIGHT])
    minus = delta.filter(pc.less(w, 0)).drop_columns([WEIGHT])
    if first and minus.num_rows:
        raise CommitError(f"model {model}: the first batch produced retractions; this is a bug")
    if plus.num_rows:
        counts = plus.group_by(unique_key, use_threads=False).aggregate([([], "count_all")])
        dup = counts.filter(pc.greater(counts.column("count_all"), 1))
        if dup.num_rows:
            row = {k: dup.column(k)[0].as_py() for k in unique_key}
            raise UniqueKeyViolation(
                f"model {model}: unique_key {unique_key} is not unique: key {row} has "
                f"{dup.column('count_all')[0].as_py()} rows in the output. Fix the model SQL or the "
                f"unique_key config; nothing was committed for this batch")
    # a key with a -1 row and no +1 row is deleted. NULL keys compare equal, as in the MERGE
    # (IS NOT DISTINCT FROM); Arrow's joins never match NULLs, so compare key tuples here
    # (both sides are the size of the change).
    upserted = set(zip(*[plus.column(k).to_pylist() for k in unique_key])) if plus.num_rows else set()
    minus_keys = zip(*[minus.column(k).to_pylist() for k in unique_key])
    deletes = minus.filter(pa.array([k not in upserted for k in minus_keys], pa.bool_())) \
        if minus.num_rows else minus
    deletes = deletes.select(plus.column_names).cast(plus.schema)
    ops = pa.concat_tables([
        plus.append_column(OP, pa.array(["upsert"] * plus.num_rows, pa.string())),
        deletes.append_column(OP, pa.array(["delete"] * deletes.num_rows, pa.string())),
    ])
    return ops


def commit_target(target: DeltaTableRef, changes: pa.Table, *, first: bool, unique_key: list[str],
                  partition_by: list[str], txn: Txn, metadata: dict) -> tuple[int, int]:
    """Commit the batch to the target; returns ``(new version, rows written)``.

    ``first``: overwrite the target with the upserts (the first batch of a query).
    """
    if first:
        data = changes.filter(pc.equal(changes.column(OP), "upsert")).drop_columns([OP])
        version = target.write(data, mode="overwrite", txn=txn, metadata=metadata,
                               partition_by=partition_by,
                               configuration={"delta.enableChangeDataFeed": "true"})
        return version, data.num_rows
    version = target.merge_by_key(changes, unique_key, txn=txn, metadata=metadata)
    return version, changes.num_rows
