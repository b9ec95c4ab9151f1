"""The write side of a Delta table: its idempotent commits.

Owns :class:`TableCommitter`, the commits made to one table through its
:class:`~.reader.TableReader` (whose snapshot each commit moves on,
:meth:`~.reader.TableReader.after_commit`): files already written under the table root
committed as add and remove actions (:meth:`~TableCommitter.commit_files`, creating or
replacing the table when its schema, partitioning or descriptions change), Arrow rows written
and committed (:meth:`~TableCommitter.write`), a MERGE by key or of a bag's changes
(delta-rs), a copy-on-write rewrite done by the caller (:meth:`~TableCommitter.commit_rewrite`)
and a commit that changes no data (:meth:`~TableCommitter.commit_empty`). Each returns the
new version.

The commit protocol. Every commit of a batch carries an idempotent transaction, a
:class:`~.values.Txn`: a Delta ``txn`` action with the query's app id and a version that grows
with each batch (the batch id), and the batch's own metadata in its ``commitInfo`` under
``consistent_stream.*`` keys. Delta keeps the newest txn version per app id in the table's
state, so a batch that finds its txn version already there (:meth:`~.reader.TableReader.txn_version`)
was committed, and is not committed again: a batch retried after a crash commits at most once.
Each commit is one version, written only if that version is absent (delta-rs' commit, or
:meth:`.log.OwnedLog.commit`'s conditional PUT for a table only the model's run writes, whose
log is replayed by :mod:`.log`: its commits go through that replay, delta-rs serving only
what it does not, a MERGE :mod:`~consistent_stream.sink.rewrite` leaves to delta-rs and a
change of schema or descriptions); after it, the commit is read back from its own commit file
(one read, however long the log) and must record the txn as the version expected.

Raises :class:`~consistent_stream.errors.CommitError` when a commit did not record its txn as
the version expected, or another writer took the version.
"""
from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
from deltalake import PostCommitHookProperties, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from ..errors import CommitError
from ..faults import fault_point
from .log import ConflictingCommit, OwnedLog, log_path, with_deletion_vectors
from .reader import TableReader
from .values import (META_PREFIX, DataFile, Docs, Txn, _add_dict, _commented, _remove_dict, _same, dq, plain_arrow,
                     plain_schema)

HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
"""delta-rs' hooks after each of our commits: its checkpoint every ``delta.checkpointInterval``
commits, but no expired-log cleanup (a listing of the whole log after each commit; maintenance
cleans the logs, :mod:`consistent_stream.sink.maintenance`)."""


def _replaced_configuration(current: dict, wanted: dict | None) -> dict:
    """The table properties of a table replaced by delta-rs (CREATE OR REPLACE): the current
    ones with ``wanted`` set over them, less ``delta.enableDeletionVectors``: with it delta-rs
    1.6 gives the table reader and writer features this package does not write
    (``variantType``), without it the plain protocol; the new files have no deletion vector,
    and the next batch that marks rows upgrades the protocol itself
    (:meth:`TableCommitter.commit_rewrite`)."""
    conf = {**current, **(wanted or {})}
    conf.pop("delta.enableDeletionVectors", None)
    return conf


class TableCommitter:
    """The commits to the table ``reader`` reads (module docstring)."""

    def __init__(self, reader: TableReader):
        self.reader = reader
        self.path = reader.path

    @staticmethod
    def _props(txn: Txn | None, metadata: dict[str, Any] | None) -> CommitProperties:
        """delta-rs' form of a commit's ``txn`` and our ``metadata`` (``consistent_stream.*``
        keys, values JSON unless strings)."""
        meta = {META_PREFIX + k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True))
                for k, v in (metadata or {}).items()}
        return CommitProperties(custom_metadata=meta or None,
                                app_transactions=[Transaction(txn.app_id, txn.version)] if txn else None)

    def _recorded(self, version: int, txn: Txn) -> bool:
        """Whether commit ``version`` (this committer's own, just made) records ``txn``: read
        from that one commit file (one read, however long the log; kept for
        :meth:`.reader.TableReader.commit_at`). Remembers it for
        :meth:`.reader.TableReader.txn_version`."""
        recorded = self.reader.commit_txns(version)[1].get(txn.app_id)
        if recorded is None or recorded != txn.version:
            return False
        self.reader.remember_txn(version, txn)
        return True

    def write(self, data: pa.Table, *, mode: str, txn: Txn | None = None,
              metadata: dict[str, Any] | None = None, partition_by: list[str] | None = None,
              configuration: dict[str, str] | None = None) -> int:
        """Append or overwrite (``mode``) ``data`` as ONE commit; returns the new version."""
        data = plain_arrow(data)
        exists = self.reader.exists()
        before = self.reader.version() if exists else -1
        write_deltalake(self.path, data, mode=mode, partition_by=partition_by or None,
                        storage_options=self.reader.storage_options,
                        schema_mode="overwrite" if (mode == "overwrite" and exists) else None,
                        configuration=None if exists else configuration,
                        commit_properties=self._props(txn, metadata), post_commithook_properties=HOOKS)
        if not exists:
            return self.reader.created()
        return self.reader.after_commit(before + 1, same_metadata=mode != "overwrite")

    def commit_files(self, adds: list[DataFile], removes: list[DataFile], *, schema: pa.Schema,
                     txn: Txn | None, metadata: dict[str, Any] | None,
                     partition_by: list[str] | None = None,
                     configuration: dict[str, str] | None = None, docs: Docs | None = None) -> int:
        """ONE commit that adds ``adds`` (files already written under the table root) and
        removes ``removes``, recording ``txn`` and ``metadata``; creates the table (with
        ``schema``, ``partition_by``, table properties ``configuration`` and descriptions
        ``docs``) when missing, and replaces its schema, partitioning and descriptions (every
        file removed: a rebuild) when they differ. Give ``docs`` only with a commit whose
        ``removes`` are every current file. Returns the new version."""
        schema = plain_schema(schema)
        fault_point("files_written")
        from deltalake import Schema
        from deltalake.transaction import create_table_with_add_actions
        if not self.reader.exists():
            create_table_with_add_actions(self.path, Schema.from_arrow(_commented(schema, docs)),
                                          [a.add_action() for a in adds], partition_by=partition_by or None,
                                          storage_options=self.reader.storage_options,
                                          description=docs.description if docs else None,
                                          configuration=configuration, commit_properties=self._props(txn, metadata),
                                          post_commithook_properties=HOOKS)
            return self.reader.created()
        own = self.reader.own()
        if own is not None and own.plain and self._same_table(own, schema, partition_by, docs):
            return self._commit_own(adds, removes, txn, metadata)
        dt = self.reader.table()
        current = pa.schema(dt.schema().to_arrow())
        same = [(f.name, f.type) for f in plain_schema(current)] == \
               [(f.name, f.type) for f in schema] and \
               list(dt.metadata().partition_columns) == list(partition_by or [])
        before = dt.version()
        kept = Docs.of(dt.metadata().description, json.loads(dt.schema().to_json())["fields"])
        wanted = kept.updated(docs, schema)
        replaced = not same or wanted != kept
        if replaced:
            # a new schema, partitioning or descriptions (a rebuild that changed the output,
            # partition_by or the model's docs): CREATE OR REPLACE in one commit, every file
            # removed. (An "overwrite" write transaction keeps the old partition columns in
            # the metadata while the new files carry partition values: they would read as
            # NULL; and it cannot change the description.)
            create_table_with_add_actions(self.path, Schema.from_arrow(_commented(schema, wanted)),
                                          [a.add_action() for a in adds], mode="overwrite",
                                          storage_options=self.reader.storage_options,
                                          partition_by=partition_by or None, description=wanted.description,
                                          configuration=_replaced_configuration(dt.metadata().configuration,
                                                                                configuration),
                                          commit_properties=self._props(txn, metadata),
                                          post_commithook_properties=HOOKS)
        else:
            dt.create_write_transaction([a.add_action() for a in adds] + [r.remove_action() for r in removes],
                                        "append", current, partition_by=partition_by or None,
                                        commit_properties=self._props(txn, metadata),
                                        post_commithook_properties=HOOKS)
        version = self.reader.after_commit(before + 1, same_metadata=not replaced)
        if version != before + 1 or (txn is not None and not self._recorded(version, txn)):
            raise CommitError(f"commit to {self.path} did not record txn {txn} as version {before + 1}")
        return version

    @staticmethod
    def _same_table(own: OwnedLog, schema: pa.Schema, partition_by: list[str] | None, docs: Docs | None) -> bool:
        """Whether a commit of files of ``schema`` (plain types), ``partition_by`` and ``docs``
        leaves the replayed table's metadata as it is (else delta-rs replaces it)."""
        from deltalake import Schema
        if not own.metadata or own.partition_columns != list(partition_by or []):
            return False
        fields = json.loads(own.metadata.get("schemaString") or "{}").get("fields", [])
        wanted = json.loads(Schema.from_arrow(schema).to_json())["fields"]
        if [(f["name"], f["type"]) for f in fields] != [(f["name"], f["type"]) for f in wanted]:
            return False
        kept = Docs.of(own.metadata.get("description"), fields)
        return kept.updated(docs, schema) == kept

    def _commit_own(self, adds: list[DataFile], removes: list[DataFile], txn: Txn | None,
                    metadata: dict[str, Any] | None, *, operation: str = "WRITE", metrics: dict | None = None,
                    cdc: list[DataFile] = (), table: list[dict] = ()) -> int:
        """ONE commit through the replayed log (:meth:`.log.OwnedLog.commit`): ``adds``,
        ``removes``, the Change Data Feed files ``cdc``, the ``protocol`` / ``metaData``
        actions ``table``, recording ``txn``, ``metadata`` and the operation's ``metrics``
        (delta-rs' names). Raises CommitError when another writer took the version."""
        meta = self._props(txn, metadata).custom_metadata or {}
        if metrics is None:
            metrics = {"num_added_files": len(adds), "num_removed_files": len(removes),
                       "num_added_rows": sum(a.num_records for a in adds)}
        info = {"operation": operation, "engineInfo": "consistent_stream", "operationMetrics": metrics, **meta}
        cdc_actions = [{"path": log_path(f.path), "partitionValues": dict(f.partition_values), "size": int(f.size),
                        "dataChange": False} for f in cdc]
        now = int(time.time() * 1000)
        try:
            return self.reader.own().commit([_add_dict(a, now) for a in adds],
                                            [_remove_dict(r, now) for r in removes],
                                            txn=(txn.app_id, txn.version) if txn else None, info=info,
                                            cdc=cdc_actions, table=table)
        except ConflictingCommit as e:
            raise CommitError(f"commit to {self.path} refused: {e}") from e
        except OSError as e:
            raise CommitError(f"commit to {self.path} failed: {e}") from e

    def rewritable(self) -> str | None:
        """Why a copy-on-write rewrite through the replayed log (:meth:`commit_rewrite`) may
        not replace a delta-rs MERGE on this table (None: it may): not an ``own_log`` table,
        partitioned, a protocol this package does not write (:attr:`.log.OwnedLog.plain`), CHECK constraints,
        column invariants, generated or identity columns (delta-rs' MERGE enforces them), or
        append-only."""
        own = self.reader.own()
        if own is None or own.version < 0:
            return "its log is not replayed here"
        conf = own.configuration
        if own.partition_columns:
            return "it is partitioned"
        if not own.plain:
            return f"its protocol ({own.protocol})"
        if any(k.startswith("delta.constraints.") for k in conf) or conf.get("delta.appendOnly") == "true":
            return "it has CHECK constraints or is append-only"
        fields = json.loads(own.metadata.get("schemaString") or "{}").get("fields", [])
        if any(k.startswith(("delta.invariants", "delta.generationExpression", "delta.identity"))
               for f in fields for k in (f.get("metadata") or {})):
            return "it has column invariants, generated or identity columns"
        return None

    def change_feed_on(self) -> bool:
        """Whether the table records its Change Data Feed (``delta.enableChangeDataFeed``)."""
        own = self.reader.own()
        conf = own.configuration if own is not None else self.reader.table().metadata().configuration
        return str(conf.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    def commit_rewrite(self, adds: list[DataFile], removes: list[DataFile], cdc: list[DataFile], *, txn: Txn,
                       metadata: dict[str, Any], metrics: dict[str, int], deletion_vectors: bool = False) -> int:
        """ONE commit of a MERGE done by the caller (a :meth:`rewritable` table): ``removes``
        the files it rewrote or whose deletion vectors it replaced (each with its old
        vector), ``adds`` their new files and the same files with their new vectors, ``cdc``
        its Change Data Feed files (under ``_change_data/``), recording ``txn``, ``metadata``
        and ``metrics`` (delta-rs' MERGE metric names). ``deletion_vectors``: some add has a
        vector; a table without the ``deletionVectors`` feature gets it in this commit
        (:func:`.log.with_deletion_vectors`, and ``delta.enableDeletionVectors``). Returns the
        new version. Raises CommitError when another writer took the version."""
        own = self.reader.own()
        table = []
        if deletion_vectors and not own.deletion_vectors:
            conf = {**own.configuration, "delta.enableDeletionVectors": "true"}
            table = [{"protocol": with_deletion_vectors(own.protocol)},
                     {"metaData": {**own.metadata, "configuration": conf}}]
        return self._commit_own(adds, removes, txn, metadata, operation="MERGE", metrics=metrics, cdc=cdc,
                                table=table)

    def commit_empty(self, *, txn: Txn, metadata: dict[str, Any]) -> int:
        """A commit with no data change that records ``txn`` and ``metadata``."""
        own = self.reader.own()
        if own is not None and own.version >= 0 and own.plain:
            return self._commit_own([], [], txn, metadata)
        dt = self.reader.table()
        before = dt.version()
        dt.create_write_transaction([], "append", dt.schema(), commit_properties=self._props(txn, metadata),
                                    post_commithook_properties=HOOKS)
        return self.reader.after_commit(before + 1)

    def merge_by_key(self, changes: pa.Table, key: list[str], *, txn: Txn,
                     metadata: dict[str, Any]) -> tuple[int, dict]:
        """Apply upserts and deletes by ``key`` in ONE commit; returns the new version and
        delta-rs' merge metrics (``num_target_rows_copied``: rows rewritten unchanged, ...).

        ``changes``: the target's columns plus ``__op`` ('upsert' | 'delete'), at most one
        row per key. Keys compare with IS NOT DISTINCT FROM (a NULL key is a value).
        """
        return self._merge(
            changes, lambda cols: _same(key),
            lambda m, cols: (m.when_matched_update({dq(c): f"s.{dq(c)}" for c in cols}, predicate="s.__op = 'upsert'")
                             .when_matched_delete(predicate="s.__op = 'delete'")
                             .when_not_matched_insert({dq(c): f"s.{dq(c)}" for c in cols},
                                                      predicate="s.__op = 'upsert'")),
            txn=txn, metadata=metadata)

    def merge_bag(self, changes: pa.Table, *, txn: Txn, metadata: dict[str, Any]) -> tuple[int, dict]:
        """Apply a bag's changes in ONE commit: rows with ``__op`` 'delete' remove every copy
        of that row (all columns equal, NULLs as values); rows with ``__op`` 'insert' are
        appended, one copy each. Returns the new version and the merge metrics.

        ``changes``: the target's columns plus ``__op``; the delete rows are distinct.
        """
        return self._merge(
            changes, lambda cols: "s.__op = 'delete' AND " + _same(cols),
            lambda m, cols: (m.when_matched_delete()
                             .when_not_matched_insert({dq(c): f"s.{dq(c)}" for c in cols},
                                                      predicate="s.__op = 'insert'")),
            txn=txn, metadata=metadata)

    def _merge(self, changes: pa.Table, predicate, clauses, *, txn: Txn,
               metadata: dict[str, Any]) -> tuple[int, dict]:
        """One MERGE of ``changes`` (target columns + ``__op``) as ONE commit recording
        ``txn``: ``predicate(cols)`` is its ON condition (target ``t``, source ``s``) and
        ``clauses(merger, cols)`` adds its WHEN clauses. Raises CommitError when the commit
        did not record ``txn``."""
        if changes.num_rows == 0:
            return self.commit_empty(txn=txn, metadata=metadata), {}
        changes = plain_arrow(changes)
        cols = [c for c in changes.column_names if c != "__op"]
        dt = self.reader.table()
        before = dt.version()
        merger = dt.merge(changes, predicate(cols), source_alias="s", target_alias="t",
                          commit_properties=self._props(txn, metadata), post_commithook_properties=HOOKS)
        metrics = clauses(merger, cols).execute()
        v = self.reader.after_commit(before + 1)
        if not self._recorded(v, txn):
            raise CommitError(f"merge into {self.path} did not record txn {txn}")
        return v, dict(metrics or {})
