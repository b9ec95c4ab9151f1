"""A query's record in its checkpoint: ``<checkpoint_location>/_consistent_stream/query.json``.

What a query's checkpoint holds, beside the model's definition (``job.json``, the plan) and
its operator state, is only what no commit records:

* ``id``: the query's id, the app id of the Delta transaction (``txn``) of every commit it
  makes, state and target; a full refresh starts a new query, so a replayed batch id of the
  old one can never be taken for one of the new;
* ``committed``: whether the query's target commit of a batch happened (written once, after
  its first): a target that does not exist while its query has committed batches was deleted
  or moved, which a run names instead of silently rebuilding.

Everything else a run needs to go on is in the commits themselves: the batch a target version
is, its cut and its state version (the target's commit metadata,
:class:`~consistent_stream.runtime.BatchMeta`), and the cut a batch whose state was committed
but whose target was not must be replayed at (the state commit's metadata). Written whole
(an atomic replace), one PUT on an object store, when a query starts and after its first
batch; read once per run (one GET; a missing record is the answer "no query yet").
"""
from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass

from . import storage
from .errors import CommitError


@dataclass(frozen=True)
class QueryRecord:
    """A query's ``id`` and whether it has ``committed`` a batch to its target."""
    id: str
    committed: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def read(path: str, model: str) -> QueryRecord | None:
    """The record at ``path`` of ``model``'s checkpoint, None when there is none (no query
    started yet). Raises CommitError naming the file and ``dbt run --full-refresh`` when it is
    not a whole record (cut short, changed by hand) or cannot be read."""
    try:
        text = storage.read_bytes(path).decode()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise _damaged(path, model, str(e)) from None
    try:
        d = json.loads(text)
        if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not d["id"]:
            raise ValueError
        return QueryRecord(d["id"], bool(d.get("committed", False)))
    except ValueError:
        raise _damaged(path, model, "not a whole query record: JSON with the query's id") from None


def migrate(path: str, spark_checkpoint: str, model: str) -> QueryRecord | None:
    """The record of a checkpoint made with Spark's streaming checkpoint at
    ``spark_checkpoint`` (its query id, whether its ``commits`` log has an entry), written at
    ``path``; None when there is no such checkpoint. Spark's files are left as they are."""
    try:
        d = json.loads(storage.read_bytes(f"{spark_checkpoint}/metadata").decode())
    except (FileNotFoundError, ValueError, OSError):
        return None
    if not isinstance(d, dict) or not isinstance(d.get("id"), str):
        return None
    try:
        committed = any(n.isdigit() for n in storage.list_dir(f"{spark_checkpoint}/commits"))
    except OSError:
        committed = False
    record = QueryRecord(d["id"], committed)
    storage.replace_text(path, record.to_json())
    return record


def _damaged(path: str, model: str, why: str) -> CommitError:
    return CommitError(
        f"model {model}: the checkpoint file {path} is damaged ({why}); it was changed or cut short outside "
        f"consistent_stream. The target was not touched; run dbt run --full-refresh -s {model} to start the "
        f"checkpoint over (the target is rebuilt from the sources' snapshots)")


def start(path: str) -> QueryRecord:
    """Start a new query: a fresh id, nothing committed yet, written at ``path``."""
    record = QueryRecord(str(uuid.uuid4()))
    storage.replace_text(path, record.to_json())
    return record


def mark_committed(path: str, record: QueryRecord) -> QueryRecord:
    """Record that ``record``'s query committed a batch (once; the same record again is
    written nothing)."""
    if record.committed:
        return record
    done = QueryRecord(record.id, True)
    storage.replace_text(path, done.to_json())
    return done
