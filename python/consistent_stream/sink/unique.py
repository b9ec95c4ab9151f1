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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import location
from ..changelog import WEIGHT
from ..delta import DeltaTableRef
from ..delta.deltars import plain_arrow
from ..delta.files import MAX_STRING_STAT, may_hold, read_live, stats_bounds, wanted_values
from ..errors import CommitError, UniqueKeyViolation
from ..operators.keyed import key_in, row_keys


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
    if target.version() != version:
        raise CommitError(f"model {model}: the target {target.path} moved from version {version} to "
                          f"{target.version()} during the batch; another writer is at work. Nothing was committed "
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
    statistics, flattened by delta-rs) whose min/max range of every key column holds one of
    the new keys' values (or that have NULLs where a new key has one): :func:`~consistent_stream.
    delta.files.may_hold`; files without statistics may hold anything, and so may a string
    maximum Delta may have truncated."""
    stored = [c for c in unique_key if c not in parts and f"min.{c}" in actions.column_names]
    wanted = wanted_values(new, stored)
    if wanted is None:
        return list(range(actions.num_rows))
    columns = {k: actions.column(k).to_pylist() for k in actions.column_names
               if k.split(".", 1)[-1] in stored and k.split(".", 1)[0] in ("min", "max", "null_count")}

    def bounds(i: int) -> tuple[dict, dict, dict]:
        lo, hi, nulls = {}, {}, {}
        for c in stored:
            a, b = columns[f"min.{c}"][i], columns[f"max.{c}"][i]
            if a is not None and b is not None and not (isinstance(b, str) and len(b) >= MAX_STRING_STAT):
                lo[c], hi[c] = a, b
            n = columns.get(f"null_count.{c}", [None] * actions.num_rows)[i]
            if n is not None:
                nulls[c] = n
        return lo, hi, nulls
    rows = actions.column("num_records").to_pylist() if "num_records" in actions.column_names \
        else [None] * actions.num_rows
    return [i for i in range(actions.num_rows) if may_hold(bounds(i), rows[i], wanted)]


def _target_keys(target: DeltaTableRef, version: int, new: pa.Table, unique_key: list[str]) -> pa.Table:
    """The key columns of the target's rows at ``version`` in the files that may hold one of
    ``new``'s keys (:func:`_may_hold`), read from those files' Parquet directly."""
    files = target.data_files(version)
    if files is not None and not target.partition_columns():   # the replayed log's files and statistics
        schema = target.plain_arrow_schema()
        wanted = wanted_values(new, unique_key)
        picked = [f for f in files if wanted is None or may_hold(stats_bounds(f.stats, schema), f.num_records, wanted)]
        tables = [t for t, _ in read_live(target.path, picked, unique_key, hold=False, name="key-read")]
        return pa.concat_tables(tables) if tables else new.select(unique_key).slice(0, 0)
    if "deletionVectors" in target.reader_features(version):   # delta-rs' scan applies them
        return target.read_snapshot_arrow(version, unique_key)
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
