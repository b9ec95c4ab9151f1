"""The target's unique key across batches.

Within one batch, :func:`~consistent_stream.sink.target.sink_changes` refuses a changelog
with two rows for one key, and a rebuild is checked whole. What neither sees is a key that
already has a row in the target: in a consolidated changelog of a keyed view, a row added for
a key the view already holds always comes with the retraction of the old row (an update is
``-old, +new``). A *new* key (a ``+1`` row whose key has no ``-1`` row in the batch) must
therefore be absent from the target, or the view now has two rows for it, and the MERGE by
key would silently replace one with the other.
"""
from __future__ import annotations

import bisect

import pyarrow as pa
import pyarrow.compute as pc

from .. import location
from ..changelog import WEIGHT
from ..delta import DeltaTableRef
from ..errors import CommitError, UniqueKeyViolation


def row_keys(t: pa.Table, cols: list[str]) -> list[tuple]:
    """The values of columns ``cols`` of each row of ``t``, as Python tuples (NULL: None)."""
    return list(zip(*[t.column(c).to_pylist() for c in cols])) if t.num_rows else []


def key_in(t: pa.Table, other: pa.Table, cols: list[str]) -> pa.Array:
    """For each row of ``t``, whether its key (columns ``cols``) is the key of a row of
    ``other``, NULLs comparing equal (as the MERGE's IS NOT DISTINCT FROM): a boolean array of
    ``t.num_rows``. One key column is looked up with Arrow's hash set (``is_in``: vectorized,
    where building a Python tuple per row of a target-sized key column is not); several key
    columns, or a column whose type the other side cannot be cast to, compare Python tuples
    (Arrow's joins never match NULLs)."""
    if not t.num_rows or not other.num_rows:
        return pa.array([False] * t.num_rows, pa.bool_())
    if len(cols) == 1:
        c = cols[0]
        try:
            values = other.column(c).cast(t.schema.field(c).type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values = None
        if values is not None:
            return pc.is_in(t.column(c), value_set=values.combine_chunks(), skip_nulls=False)
    known = set(row_keys(other, cols))
    return pa.array([k in known for k in row_keys(t, cols)], pa.bool_())


def check_new_keys(target: DeltaTableRef, version: int, delta: pa.Table, unique_key: list[str], model: str) -> None:
    """Before an incremental MERGE of the consolidated changelog ``delta`` (target columns +
    ``__weight``, on the driver): raise UniqueKeyViolation naming the key when one of its new
    keys has a row in the target at ``version`` (the handle's own version); nothing is
    committed then. Reads only the key columns of the target's files whose statistics say they
    may hold a new key (the files the MERGE reads anyway). NULL key values compare as values,
    as in the MERGE.

    Example, key ``g``, the target holds ``('a', 'x')``: a changelog ``+('a', 'z')`` alone is a
    violation; ``-('a', 'x') +('a', 'z')`` is an update of key ``'a'`` and passes.
    """
    w = delta.column(WEIGHT)
    plus = delta.filter(pc.greater(w, 0))
    if not plus.num_rows or not target.exists():
        return
    new = plus.filter(pc.invert(key_in(plus, delta.filter(pc.less(w, 0)), unique_key)))
    if not new.num_rows:
        return
    dt = target.table()
    if dt.version() != version:
        raise CommitError(f"model {model}: the target {target.path} moved from version {version} to "
                          f"{dt.version()} during the batch; another writer is at work. Nothing was committed "
                          f"for this batch")
    found = _target_keys(target, version, new, unique_key)
    clash = row_keys(new.filter(key_in(new, found, unique_key)), unique_key)
    if clash:
        row = dict(zip(unique_key, sorted(clash, key=repr)[0]))
        raise UniqueKeyViolation(
            f"model {model}: unique_key {unique_key} is not unique: key {row} has a row in the target "
            f"(version {version}) and the batch adds another one without retracting it. Fix the model SQL or "
            f"the unique_key config, then run again (the batch is replayed); nothing was committed for this "
            f"batch")


def _may_hold(actions: pa.Table, new: pa.Table, unique_key: list[str], parts: list[str]) -> list[int]:
    """Indexes of the files (rows of ``actions``, the version's add actions with their
    statistics) whose min/max range of every key column holds one of the new keys' values (or
    that have NULLs where a new key has one); files without statistics may hold anything."""
    keep = list(range(actions.num_rows))
    for c in unique_key:
        col = f"min.{c}"
        if c in parts or col not in actions.column_names:
            continue
        values = sorted(v for v in new.column(c).to_pylist() if v is not None)
        has_null = new.column(c).null_count > 0
        lo, hi = actions.column(col).to_pylist(), actions.column(f"max.{c}").to_pylist()
        nulls = actions.column(f"null_count.{c}").to_pylist() if f"null_count.{c}" in actions.column_names \
            else [None] * actions.num_rows

        def holds(i: int) -> bool:
            if lo[i] is None or hi[i] is None or isinstance(hi[i], str) and len(hi[i]) >= 32:
                return True  # no statistics, or a string maximum Delta may have truncated
            if has_null and (nulls[i] is None or nulls[i] > 0):
                return True
            try:
                j = bisect.bisect_left(values, lo[i])
                return j < len(values) and values[j] <= hi[i]
            except TypeError:  # statistics of another Python type than the values
                return True
        keep = [i for i in keep if holds(i)]
    return keep


def _target_keys(target: DeltaTableRef, version: int, new: pa.Table, unique_key: list[str]) -> pa.Table:
    """The key columns of the target's rows at ``version`` in the files that may hold one of
    ``new``'s keys (:func:`_may_hold`), read from those files' Parquet directly."""
    import pyarrow.parquet as pq

    from ..delta.deltars import plain_arrow
    actions = target.add_actions(version)
    parts = [c[len("partition."):] for c in actions.column_names if c.startswith("partition.")]
    stored = [c for c in unique_key if c not in parts]
    tables = []
    for i in _may_hold(actions, new, unique_key, parts):
        fs, path = location.pyarrow_filesystem(target.file_path(actions.column("path")[i].as_py()))
        t = plain_arrow(pq.read_table(path, columns=stored, filesystem=fs))
        for c in unique_key:
            if c in parts:  # a partition column: its value is in the log, not in the file
                value = actions.column(f"partition.{c}")[i].as_py()   # typed by delta-rs, or a string
                t = t.append_column(c, pa.array([value] * t.num_rows).cast(new.schema.field(c).type))
        tables.append(t.select(unique_key))
    return pa.concat_tables(tables) if tables else new.select(unique_key).slice(0, 0)
