"""A Delta table's changelog between two versions derived from its log, with or without the
Change Data Feed: the change's cost, not the table's.

The Delta protocol's own rule for the Change Data Feed ("Change Data Files") is the delta
rule here: a commit with ``cdc`` actions has its change rows in those files (``_change_type``
insert / update_postimage at weight +1, delete / update_preimage at -1); a commit without them
changes the rows of the files it adds (+1) and removes (-1) with ``dataChange: true``. A file
with a deletion vector holds its rows less those the vector marks, so

* a copy-on-write UPDATE / DELETE / MERGE (a file removed, its rewrite added) gives the
  removed file's rows at -1 and the rewrite's at +1, and the rows it kept cancel;
* a merge-on-read one (``remove`` of the file with its old vector, ``add`` of the same file
  with the new vector) gives the rows the new vector marks and the old did not, at -1;
* an overwrite or ``CREATE OR REPLACE`` (every file removed, new ones added) gives the whole
  table's difference: the batch reads both versions' files (:attr:`LogChanges.whole_table`);
* OPTIMIZE, REORG and other ``dataChange: false`` commits change nothing and are not read.

Over a range of commits the add and remove actions are netted first, by file and deletion
vector: a file added and removed inside the range is never read, and a file whose vector
changed twice is read once, with the vector it had before the range (its rows at -1) and the
one it has at the end (+1): only the rows the two disagree on are kept. What is left is read
(one GET per file, all at once), its rows less the rows of its deletion vector, and
consolidated: rows that appear at +1 and -1
cancel, so the changelog is the change, whichever way the writer wrote it. Rows of a type Arrow
cannot group (lists, maps, structs) are left unconsolidated (a Z-set either way).

Deletion vectors are read by delta-rs (``DeltaTable.deletion_vectors``: each file's keep mask
at a version); the data files by pyarrow, by their physical column names under column mapping
(a column missing from an older file, added since, is NULL).

Out (:class:`LogChanges`): the requested columns (as the caller's Arrow schema) plus
``__weight`` (int64).
"""
from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import location, storage

WEIGHT = "__weight"
_SIGN = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}
_WHOLE_TABLE_OPERATIONS = ("CREATE OR REPLACE TABLE", "REPLACE TABLE", "CREATE OR REPLACE TABLE AS SELECT",
                           "REPLACE TABLE AS SELECT", "TRUNCATE")
"""Operations (``commitInfo.operation``) that rewrite a table whole; a ``WRITE`` does when its
``mode`` is ``Overwrite`` (delta-spark) or ``overwrite`` (delta-rs)."""


class CommitActions(Protocol):
    """One commit as its log file holds it: ``version``, ``timestamp_ms`` and ``actions``
    (the decoded JSON lines: ``add``, ``remove``, ``cdc``, ``metaData``, ``commitInfo``, ...)."""
    version: int
    timestamp_ms: int
    actions: tuple


class UnpairedUpdate(Exception):
    """A commit's Change Data Feed files hold a different number of update_preimage and
    update_postimage rows (a writer bug: the feed does not describe the update)."""

    def __init__(self, version: int, pre: int, post: int):
        super().__init__(f"version {version}: {pre} update_preimage rows, {post} update_postimage rows")
        self.version, self.pre, self.post = version, pre, post


@dataclass
class LogChanges:
    """The changelog of a range: ``data`` (the columns asked for plus ``__weight``), the files
    and rows read for it, the versions that rewrote the table whole (``whole_table``), whether
    any commit of the range had Change Data Feed files (``used_cdc``) and whether any file
    was read with a deletion vector (``used_deletion_vectors``); ``commit_ms``: the commit time
    (ms since epoch) of the newest commit of the range that changed rows, None when the
    changelog is empty."""
    data: pa.Table
    files_read: int = 0
    rows_read: int = 0
    whole_table: list = field(default_factory=list)
    used_cdc: bool = False
    used_deletion_vectors: bool = False
    commit_ms: int | None = None


@dataclass(frozen=True)
class _Part:
    """One file to read: relative ``path``; ``weight`` of its rows (+n / -n); ``mask_at``:
    the version whose deletion vector of the file applies (None: the file has none);
    ``cdc``: a Change Data Feed file (weights from its ``_change_type``); its partition values."""
    path: str
    weight: int
    mask_at: int | None
    cdc: bool
    partition_values: tuple
    version: int


def _dv_key(action: dict) -> str | None:
    dv = action.get("deletionVector")
    if not dv:
        return None
    return f"{dv.get('storageType')}:{dv.get('pathOrInlineDv')}:{dv.get('offset')}"


def whole_table_rewrite(commit: CommitActions) -> bool:
    """Whether ``commit`` rewrote its table whole (an overwrite, ``CREATE OR REPLACE``,
    ``TRUNCATE``), by its ``commitInfo``."""
    info = next((a["commitInfo"] for a in commit.actions if "commitInfo" in a), {})
    op = str(info.get("operation") or "").upper()
    mode = str((info.get("operationParameters") or {}).get("mode") or "").strip('"').lower()
    return op in _WHOLE_TABLE_OPERATIONS or (op == "WRITE" and mode == "overwrite")


def plan_parts(commits: Iterable[CommitActions], start: int, end: int, *,
               use_cdc: bool = True) -> tuple[list[_Part], list[int], bool]:
    """The files the changelog of ``commits`` (the range ``(start, end]``) reads: each commit's
    ``cdc`` files, else its ``add`` / ``remove`` files with ``dataChange`` netted by (path,
    deletion vector) over the range; a netted ``add`` takes the file's deletion vector at the
    version of its last add, a netted ``remove`` at the version before its last remove (a
    later ``dataChange: false`` commit, as OPTIMIZE, may have removed the file since, its rows
    moved to another without a change). Returns the parts, the whole-table versions and
    whether any commit had ``cdc`` files. ``use_cdc=False`` derives every commit's change from
    its ``add`` and ``remove`` files, its ``cdc`` files ignored (what the Change Data Feed is
    checked against)."""
    cdc_parts: list[_Part] = []
    net: Counter = Counter()
    info: dict = {}
    whole, used_cdc = [], False
    for c in commits:
        if whole_table_rewrite(c):
            whole.append(c.version)
        cdc = [a["cdc"] for a in c.actions if "cdc" in a] if use_cdc else []
        if cdc:
            used_cdc = True
            cdc_parts += [_Part(f["path"], 1, None, True, tuple(sorted((f.get("partitionValues") or {}).items())),
                                c.version) for f in cdc]
            continue
        for a in c.actions:
            for kind, sign in (("add", 1), ("remove", -1)):
                f = a.get(kind)
                if f is None or not f.get("dataChange", True):
                    continue
                key = (unquote(f["path"]), _dv_key(f))
                net[key] += sign
                values, seen = info.get(key, (None, {}))
                info[key] = (f.get("partitionValues") or {}, {**seen, kind: c.version})
    parts = []
    for (path, dv), n in sorted(net.items(), key=lambda kv: kv[0][0] + "\0" + (kv[0][1] or "")):
        if n == 0:
            continue
        values, seen = info[(path, dv)]
        # the file had this deletion vector right after its add, and right before its remove
        at = seen["add"] if n > 0 else seen["remove"] - 1
        parts.append(_Part(path, n, at if dv else None, False, tuple(sorted(values.items())),
                           seen["add" if n > 0 else "remove"]))
    return cdc_parts + parts, whole, used_cdc


def changelog(table_path: str, commits: list[CommitActions], start: int, end: int, schema: pa.Schema,
              partition_columns: list[str], *, physical: dict[str, str] | None = None,
              deletion_vectors: Callable[[int], dict[str, np.ndarray]] | None = None,
              use_cdc: bool = True) -> LogChanges:
    """The changelog of the table at ``table_path`` over ``commits`` (every commit of ``(start,
    end]``, in order; the module docstring): ``schema``'s columns (``physical``: logical name
    -> the name in the files, under column mapping) plus ``__weight``, consolidated.

    ``deletion_vectors(version)``: the keep masks of the table's files with a deletion vector
    at ``version``, by path relative to the table (called once for each version a file to
    read had its vector at: for one commit, at most the versions before and after it). Raises
    FileNotFoundError (or the object store's error) naming a file that is gone (vacuumed),
    ValueError when a file with a deletion vector has none at its version, and
    :class:`UnpairedUpdate`. ``use_cdc``: as
    :func:`plan_parts`'s."""
    parts, whole, used_cdc = plan_parts(commits, start, end, use_cdc=use_cdc)
    out_schema = pa.schema(list(schema) + [pa.field(WEIGHT, pa.int64())])
    result = LogChanges(out_schema.empty_table(), whole_table=whole, used_cdc=used_cdc)
    if not parts:
        return result
    masks: dict[int, dict[str, np.ndarray]] = {}
    for at in sorted({p.mask_at for p in parts if p.mask_at is not None}):
        masks[at] = deletion_vectors(at) if deletion_vectors is not None else {}
        result.used_deletion_vectors = True
    physical = physical or {}
    names = [f.name for f in schema]
    file_cols = {n: physical.get(n, n) for n in names if n not in partition_columns}

    def weights(group: list[_Part], n: int) -> np.ndarray:
        """Each row's weight in a file of ``n`` rows: the sum over the group's parts of the
        part's weight where its deletion vector keeps the row."""
        weight = np.zeros(n, dtype=np.int64)
        for part in group:
            if part.mask_at is None:
                weight += part.weight
                continue
            mask = masks[part.mask_at].get(part.path)
            if mask is None:
                raise ValueError(f"{table_path}: {part.path} has a deletion vector in the log but none at version "
                                 f"{part.mask_at}")
            keep = np.ones(n, dtype=np.int64)
            keep[:min(n, len(mask))] = np.asarray(mask[:n], dtype=bool)
            weight += part.weight * keep
        return weight

    def read(group: list[_Part]) -> tuple[pa.Table, int, Counter]:
        """The weighted rows of one file, read once for all its parts (:func:`weights`). When
        the file's own rows cancel (a file whose deletion vector changed: -1 with the old
        vector, +1 with the new), only the row groups holding rows the vectors disagree on
        are decoded."""
        first = group[0]
        pf = pq.ParquetFile(pa.BufferReader(storage.read_bytes(_file(table_path, first.path))))
        present = set(pf.schema_arrow.names)
        wanted = [c for c in file_cols.values() if c in present] + (["_change_type"] if first.cdc else [])
        n = pf.metadata.num_rows
        weight = None if first.cdc else weights(group, n)
        if weight is not None and sum(p.weight for p in group) == 0 and pf.metadata.num_row_groups > 1:
            starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)])
            changed = np.flatnonzero(weight)
            groups_read = sorted(set(np.searchsorted(starts, changed, side="right") - 1))
            raw = pf.read_row_groups(groups_read, columns=wanted) if groups_read else \
                pf.schema_arrow.empty_table().select(wanted)
            weight = np.concatenate([weight[starts[g]:starts[g + 1]] for g in groups_read]) if groups_read \
                else np.zeros(0, dtype=np.int64)
        else:
            raw = pf.read(columns=wanted)
        rows = raw.num_rows
        values = dict(first.partition_values)
        cols = {}
        for f in schema:
            if f.name in partition_columns:
                v = values.get(physical.get(f.name, f.name), values.get(f.name))
                cols[f.name] = pc.cast(pa.array([v] * rows, pa.string()), f.type)
            elif file_cols[f.name] in present:
                cols[f.name] = raw.column(file_cols[f.name]).cast(f.type)
            else:   # a column added after the file was written
                cols[f.name] = pa.nulls(rows, f.type)
        pairs: Counter = Counter()
        if first.cdc:
            kinds = raw.column("_change_type")
            unknown = pc.invert(pc.is_in(kinds, pa.array(list(_SIGN))))
            if rows and pc.any(unknown).as_py():
                raise ValueError(f"{table_path}: unknown Change Data Feed _change_type "
                                 f"{pc.filter(kinds, unknown)[0].as_py()!r} in {first.path}")
            pairs = Counter({k: pc.sum(pc.cast(pc.equal(kinds, k), pa.int64())).as_py() or 0
                             for k in ("update_preimage", "update_postimage")})
            cols[WEIGHT] = pc.if_else(pc.is_in(kinds, pa.array(["insert", "update_postimage"])), 1, -1).cast(pa.int64())
            return pa.table(cols, schema=out_schema), rows, pairs
        cols[WEIGHT] = pa.array(weight, pa.int64())
        data = pa.table(cols, schema=out_schema)
        return data.filter(pa.array(weight != 0)), rows, pairs

    groups: dict[tuple, list[_Part]] = {}
    for part in parts:
        groups.setdefault((part.path, part.cdc, part.version if part.cdc else None), []).append(part)
    with ThreadPoolExecutor(max_workers=min(16, len(groups)), thread_name_prefix="delta-log-changes") as pool:
        read_groups = list(pool.map(read, groups.values()))
    per_version: dict[int, Counter] = {}
    for group, (_, _, pairs) in zip(groups.values(), read_groups):
        if group[0].cdc:
            per_version.setdefault(group[0].version, Counter()).update(pairs)
    for version, pairs in sorted(per_version.items()):
        if pairs["update_preimage"] != pairs["update_postimage"]:
            raise UnpairedUpdate(version, pairs["update_preimage"], pairs["update_postimage"])
    result.files_read = len(groups)
    result.rows_read = sum(n for _, n, _ in read_groups)
    result.data = consolidate(pa.concat_tables([t for t, _, _ in read_groups]))
    if result.data.num_rows:
        newest = max(p.version for p in parts)
        result.commit_ms = next(c.timestamp_ms for c in commits if c.version == newest)
    return result


def consolidate(zset: pa.Table) -> pa.Table:
    """``zset`` (columns plus ``__weight``) with equal rows summed and rows of weight 0
    dropped; unchanged when a column's type cannot be a grouping key (list, map, struct)."""
    cols = [c for c in zset.column_names if c != WEIGHT]
    if not zset.num_rows or not cols:
        return zset
    if any(pa.types.is_nested(zset.schema.field(c).type) for c in cols):
        return zset
    summed = zset.group_by(cols, use_threads=False).aggregate([(WEIGHT, "sum")])
    summed = summed.rename_columns(cols + [WEIGHT]).select(zset.column_names)
    summed = summed.filter(pc.not_equal(summed.column(WEIGHT), 0))
    return summed.cast(zset.schema)


def _file(table_path: str, rel: str) -> str:
    rel = unquote(rel)
    if location.is_remote(table_path):
        return f"{table_path.rstrip('/')}/{rel}"
    return os.path.join(table_path, rel)
