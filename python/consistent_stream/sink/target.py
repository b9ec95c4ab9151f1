"""The target commit: exactly one Delta commit per micro-batch, idempotent by txn.

The batch's consolidated output changelog (size of the change) is collected once as Arrow.
With a unique key (configured, or inferred from the plan) it becomes, per key value, an
upsert (the key has a +1 row) or a delete (only a -1 row). A view without a unique key is a
bag: a row whose weight is +w gets w more copies, and a row with -w, whose multiplicity
before the batch was m, has its m copies deleted and m - w inserted again. Either way one
MERGE applies it, with txn ``(app id, batch id)``; a replayed batch whose txn the target
already holds is skipped by the caller. The first batch of a query (and every full refresh)
overwrites the target instead.

The changes are sorted by all columns before the commit, so the same input gives the same
commit whatever Spark's partitioning and shuffle order were.
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
    return _sorted(ops)


def _sorted(t: pa.Table) -> pa.Table:
    """``t`` in a total order of its columns (NULLs last): a deterministic file layout."""
    keys = [(c, "ascending") for c in t.column_names
            if not (pa.types.is_nested(t.schema.field(c).type) or pa.types.is_dictionary(t.schema.field(c).type))]
    return t.sort_by(keys) if keys and t.num_rows > 1 else t


def _row_keys(t: pa.Table, cols: list[str]) -> list[tuple]:
    return list(zip(*[t.column(c).to_pylist() for c in cols])) if t.num_rows else []


def bag_changes(delta: pa.Table, old_counts: pa.Table | None, model: str, *, first: bool) -> pa.Table:
    """Consolidated output changelog of a bag view -> the MERGE's source rows: target
    columns + ``__op`` ('delete': remove every copy of the row; 'insert': add one copy).

    ``old_counts``: for the rows with a negative weight, their multiplicity before the batch
    (data columns + ``__count`` int64); rows missing there have none. Raises CommitError when
    a retraction exceeds the row's multiplicity (the view and the target disagree).
    """
    cols = [c for c in delta.column_names if c != WEIGHT]
    w = delta.column(WEIGHT).to_pylist()
    old = dict(zip(_row_keys(old_counts, cols), old_counts.column("__count").to_pylist())) \
        if old_counts is not None and old_counts.num_rows else {}
    take, ops, delete_rows = [], [], []
    for i, (row, wi) in enumerate(zip(_row_keys(delta, cols), w)):
        if wi > 0:
            take += [i] * wi
            continue
        if first:
            raise CommitError(f"model {model}: the first batch produced retractions; this is a bug")
        m = old.get(row, 0)
        if m + wi < 0:
            raise CommitError(
                f"model {model}: the batch retracts {-wi} copies of a row the target holds {m} times "
                f"({dict(zip(cols, row))}); the target was changed outside consistent_stream. Run "
                f"dbt run --full-refresh. Nothing was committed for this batch")
        delete_rows.append(i)
        take += [i] * (m + wi)
    data = delta.select(cols)
    out = pa.concat_tables([
        data.take(pa.array(delete_rows, pa.int64())).append_column(OP, pa.array(["delete"] * len(delete_rows), pa.string())),
        data.take(pa.array(take, pa.int64())).append_column(OP, pa.array(["insert"] * len(take), pa.string())),
    ])
    return _sorted(out)


def commit_target(target: DeltaTableRef, changes: pa.Table, *, first: bool, unique_key: list[str] | None,
                  partition_by: list[str], txn: Txn, metadata: dict) -> tuple[int, int]:
    """Commit the batch to the target; returns ``(new version, rows written)``.

    ``changes``: from :func:`sink_changes` (``unique_key`` set) or :func:`bag_changes`
    (``unique_key`` None). ``first``: overwrite the target with the upserts/inserts (the
    first batch of a query).
    """
    if first:
        data = changes.filter(pc.is_in(changes.column(OP), pa.array(["upsert", "insert"]))).drop_columns([OP])
        version = target.write(data, mode="overwrite", txn=txn, metadata=metadata,
                               partition_by=partition_by,
                               configuration={"delta.enableChangeDataFeed": "true"})
        return version, data.num_rows
    if unique_key is None:
        return target.merge_bag(changes, txn=txn, metadata=metadata), changes.num_rows
    version = target.merge_by_key(changes, unique_key, txn=txn, metadata=metadata)
    return version, changes.num_rows
