"""A local copy of an owned table's replayed log (:class:`.log.OwnedLog`), so that the next
process that opens the table reads only what was committed since the copy.

Why. A run opens its state table and its target anew (a ``dbt run`` is a new process): from
the Delta log alone that is ``_last_checkpoint``, then the checkpoint's parts, then a LIST of
the commits after it, then each of them: three to four round trips and three or more
requests a table before the batch's first read. With a copy it is one LIST from the copy's
version (and a GET of each commit the copy has not seen: none when the last writer was this
machine).

Contract. A copy is used only when that LIST shows the commit file of the copy's version with
the *write tag* the copy recorded (:func:`consistent_stream.storage.list_after`: the size and
ETag on an object store, the size and modification time locally), that is, the very commit
the copy replayed. Then the commits after it are read and replayed, as
:meth:`.log.OwnedLog.refresh` does. Anything else is a miss and the log is replayed from its
checkpoint as without a copy, which is then written anew: no copy, one unreadable or of
another format, the commit file gone or written again (the table dropped and made again at
the same path, its log cleaned up), or more than :data:`MAX_BEHIND` commits since (the
checkpoint is nearer). Sound because only the model's run commits data to these tables, under
the writer lock; anything else that commits (maintenance, a property change) makes a new
version, which the LIST shows.

A copy is written after each load and each commit, atomically (a temporary file renamed over
the old one); a copy that cannot be written or read is logged at debug level and otherwise
ignored: it only saves requests. Copies are JSON: ``{"format", "table", "tag", "log"}``, the
last being :meth:`.log.OwnedLog.replay_state`.

Where: ``$CONSISTENT_STREAM_CACHE_DIR`` (default ``~/.cache/consistent-stream``), under
``delta-logs/``, one file per table named by a hash of its path (the directory is this
account's only, mode 0700). ``CONSISTENT_STREAM_LOG_CACHE=off`` turns copies off. Copies not
written for :data:`KEEP_DAYS` are removed when a table's first copy is written.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("consistent_stream")

FORMAT = 1
"""The copies' format; a copy of another is a miss."""

MAX_BEHIND = 32
"""The most commits a copy may be behind the table and still be used."""

KEEP_DAYS = 30
"""Copies not written for this many days are removed."""

ENV_DIR = "CONSISTENT_STREAM_CACHE_DIR"
ENV_SWITCH = "CONSISTENT_STREAM_LOG_CACHE"


def enabled() -> bool:
    """Whether copies are kept (``CONSISTENT_STREAM_LOG_CACHE`` is not ``off``)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in ("off", "0", "false", "no")


def directory() -> Path:
    """Where the copies are: ``$CONSISTENT_STREAM_CACHE_DIR/delta-logs``."""
    base = os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "consistent-stream")
    return Path(base) / "delta-logs"


class LogCopy:
    """The local copy of the replayed log of the Delta table at ``table_path`` (module
    docstring)."""

    def __init__(self, table_path: str):
        self.table = table_path
        self.file = directory() / (hashlib.sha256(table_path.encode()).hexdigest()[:32] + ".json")

    def read(self) -> tuple[str, dict] | None:
        """``(write tag of the copy's version's commit file, replay state)``, or None when there
        is no usable copy."""
        try:
            doc = json.loads(self.file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.debug("the log copy %s of %s is not read: %s", self.file, self.table, e)
            return None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("table") != self.table \
                or not doc.get("tag") or not isinstance(doc.get("log"), dict):
            return None
        return doc["tag"], doc["log"]

    def write(self, tag: str | None, state: dict) -> None:
        """Keep ``state`` (:meth:`.log.OwnedLog.replay_state`), whose version's commit file has
        write tag ``tag``; with no tag (a store without ETags), remove the copy instead."""
        if not tag:
            self.drop()
            return
        try:
            first = not self.file.exists()
            self.file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"format": FORMAT, "table": self.table, "tag": tag, "log": state},
                                      separators=(",", ":")))
            os.replace(tmp, self.file)
            if first:
                _remove_old(self.file.parent)
        except OSError as e:
            log.debug("the log copy of %s is not written: %s", self.table, e)

    def drop(self) -> None:
        """Remove the copy (if any)."""
        try:
            self.file.unlink()
        except OSError:
            pass


def _remove_old(where: Path) -> None:
    """Remove the copies not written for :data:`KEEP_DAYS`."""
    floor = time.time() - KEEP_DAYS * 86400
    for f in where.glob("*.json"):
        try:
            if f.stat().st_mtime < floor:
                f.unlink()
        except OSError:
            continue
