"""The commits of a Delta table after a version a run already knows, read from the log without
opening the table: a source's change between two cuts at the cost of that change.

Opening a Delta table (delta-rs) reads its newest checkpoint and replays every commit since
(delta-rs reads each commit file twice: once for the protocol and metadata, once for the
files), and a source is opened by every run. A run that goes on from a cut needs only the
commits after it: one listing of the log after that version, one GET of each new commit file
(all at once), and the change files those commits name (one GET each, all at once).

The listing also says whether the table is still the one the cut read: it starts at the cut
version's own commit, whose write tag (size and ETag on an object store, size and mtime
locally: :func:`consistent_stream.storage.list_after`) the cut recorded from the listing of the
run before. The same tag is the same write of that file; another tag, or a cut that recorded
none, is checked by reading that commit's time (one GET more), which a table created again
under the path (dropped and created, as dbt seed does) does not share.

What the tail reads (the Delta protocol's Change Data Feed, "Change Data Files"): a commit
with ``cdc`` actions has its change rows in those files (with ``_change_type``); a commit
without them changes the rows of its ``add`` files (inserts) and ``remove`` files (deletes,
read from the removed file, which no vacuum has deleted yet) that have ``dataChange``; a
commit whose every action has ``dataChange: false`` (OPTIMIZE) changes nothing.

What it does not read, for which the caller opens the table instead (:meth:`LogTail.
unreadable` says why): a commit with a ``protocol`` or ``metaData`` action (a new reader
feature, a schema change, the Change Data Feed turned off), deletion vectors (rows removed
by a vector, not by a file), files of a column-mapped table (physical column names), and a
gap in the versions (a log cleaned up).

Out of :meth:`LogTail.changes`: the requested columns (named and typed as the caller's Arrow
schema) plus ``__weight``, consolidated (:mod:`.log_changes`, which the table's own reads of a
table without the Change Data Feed share).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from .. import storage


@dataclass(frozen=True)
class TailCommit:
    """One commit of the tail: its ``version``, commit time (``timestamp_ms``, ms since
    epoch) and its actions as the commit file holds them."""
    version: int
    timestamp_ms: int
    actions: tuple

    def _info(self) -> dict:
        return next((a["commitInfo"] for a in self.actions if "commitInfo" in a), {})

    @property
    def change_rows(self) -> int | None:
        """Change Data Feed rows of the commit: 0 for a commit that changes no data (every
        ``add`` and ``remove`` with ``dataChange: false``, no ``cdc``: OPTIMIZE), else from its
        ``operationMetrics`` (delta-rs' and Delta Spark's names; None: unknown)."""
        from .values import changed_rows
        changes = [a for a in self.actions if "cdc" in a
                   or any(k in a and a[k].get("dataChange", True) for k in ("add", "remove"))]
        return 0 if not changes else changed_rows(self._info().get("operationMetrics") or {})

    @property
    def net_rows(self) -> int | None:
        """How many rows the commit added to the table, less those it removed: 0 for a commit
        that changes no data; else from its ``operationMetrics`` (inserted less deleted rows;
        an UPDATE neither), None when they do not tell (a write that also removes files, as an
        overwrite does, counts only what it added)."""
        from .values import DELETED_METRICS, INSERTED_METRICS, UPDATED_METRICS
        data = [a for a in self.actions if "cdc" in a
                or any(k in a and a[k].get("dataChange", True) for k in ("add", "remove"))]
        if not data:
            return 0
        m = self._info().get("operationMetrics") or {}

        def first(names):
            return next((int(m[n]) for n in names if n in m), None)
        try:
            inserted, deleted, updated = first(INSERTED_METRICS), first(DELETED_METRICS), first(UPDATED_METRICS)
        except (TypeError, ValueError):
            return None
        removes = any("remove" in a and a["remove"].get("dataChange", True) for a in self.actions)
        if deleted is None and updated is None and removes:
            return None
        if inserted is None and deleted is None and updated is None:
            return None
        return (inserted or 0) - (deleted or 0)

    def unreadable(self) -> str | None:
        """Why the tail does not read this commit's change (None: it does)."""
        for a in self.actions:
            if "protocol" in a or "metaData" in a:
                return f"version {self.version} changes the table's {'protocol' if 'protocol' in a else 'metadata'}"
            for kind in ("add", "remove", "cdc"):
                if kind in a and a[kind].get("deletionVector"):
                    return f"version {self.version} has deletion vectors"
        return None


class LogTail:
    """The commits of the Delta table at ``table_path`` after version ``after`` (the module
    docstring), read on demand: :meth:`refresh` lists the log and reads the new commits."""

    def __init__(self, table_path: str, after: int, after_ms: int | None = None, after_tag: str | None = None):
        self.path, self.after, self.after_ms, self.after_tag = table_path, after, after_ms, after_tag
        self.log_dir = f"{table_path.rstrip('/')}/_delta_log"
        self.commits: dict[int, TailCommit] = {}
        self.tags: dict[int, str | None] = {}   # the listed commit files' write tags, by version
        self.listed = False     # the log was listed once
        self.anchored = False   # that listing held the commit of version ``after`` (the table is there)

    def refresh(self) -> int:
        """List the log after the newest version known and read the new commit files (one
        LIST, one GET each, all at once). Returns the newest version (``after`` when there is
        none). Raises OSError when the log cannot be listed or a commit file read."""
        known = max(self.commits, default=self.after)
        # the first listing starts at the known version's own commit: its presence says the
        # table is still there with its log (a table moved away or a log cleaned up is not)
        first = not self.commits and not self.listed
        start = (f"{known - 1:020d}.json" if known > 0 else "") if first else f"{known:020d}.json"
        listed = {int(n[:20]): tag for n, tag in storage.list_after(self.log_dir, start, tags=True)
                  if len(n) == 25 and n.endswith(".json") and n[:20].isdigit()}
        self.tags.update(listed)
        versions = sorted(listed)
        if first:
            self.listed = True
            self.anchored = known in versions
        new = [v for v in versions if v > known]
        # the first time, version ``after``'s own commit too when its time is known and its
        # write tag is not the one the cut recorded: another table created under the path
        # (dropped and created again, as dbt seed does) has other commits under the same versions
        same_write = self.after_tag is not None and listed.get(known) == self.after_tag
        check = first and self.anchored and self.after_ms is not None and not same_write
        texts = storage.read_many([f"{self.log_dir}/{v:020d}.json" for v in ([known] if check else []) + new],
                                  "delta-tail")
        if check:
            self.anchored = _timestamp(texts[0]) == self.after_ms
            texts = texts[1:]
        for v, text in zip(new, texts):
            actions = tuple(json.loads(line) for line in text.splitlines() if line.strip())
            self.commits[v] = TailCommit(v, commit_ms(actions), actions)
        return max(self.commits, default=self.after)

    def tag(self, version: int) -> str | None:
        """The write tag of ``version``'s commit file as the tail listed it (None: not listed,
        or the store gives none)."""
        return self.tags.get(version)

    def latest(self) -> int:
        return max(self.commits, default=self.after)

    def range(self, start: int, end: int) -> list[TailCommit]:
        """The commits in ``(start, end]`` (``start`` at least the tail's ``after``)."""
        return [self.commits[v] for v in range(start + 1, end + 1) if v in self.commits]

    def unreadable(self, start: int, end: int) -> str | None:
        """Why the tail does not read the change in ``(start, end]`` (None: it does)."""
        if start < self.after:
            return f"the range starts at {start + 1}, before the tail's first version {self.after + 1}"
        if not self.anchored:
            return (f"version {self.after}'s commit is not in the log, or is another commit than the one the cut read "
                    f"(the table moved, was created again, or its log was cleaned up)")
        missing = [v for v in range(start + 1, end + 1) if v not in self.commits]
        if missing:
            return f"versions {missing[0]}.. are not in the log listing (a gap)"
        return next((r for c in self.range(start, end) if (r := c.unreadable())), None)

    def changes(self, start: int, end: int, schema: pa.Schema, partition_columns: list[str]):
        """The changelog of ``(start, end]`` (:func:`.log_changes.changelog`, the module
        docstring): ``schema``'s columns plus ``__weight``, consolidated, as a
        :class:`~.log_changes.LogChanges`. Call only when :meth:`unreadable` is None."""
        from .log_changes import changelog
        return changelog(self.path, self.range(start, end), start, end, schema, partition_columns)


def commit_ms(actions) -> int:
    """A commit's time (ms since epoch): its in-commit timestamp, else its commitInfo's."""
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    return int(info.get("inCommitTimestamp") or info.get("timestamp") or 0)


def _timestamp(text) -> int:
    """:func:`_commit_ms` of a commit file's text."""
    text = text.decode() if isinstance(text, bytes) else text
    return commit_ms([json.loads(line) for line in text.splitlines() if line.strip()])
