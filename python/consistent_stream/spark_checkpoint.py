"""Spark's streaming checkpoint (``JobSpec.spark_checkpoint``) read as the files Spark
writes, without a running query: the query id (``metadata``), and the metadata logs
(``offsets``, ``commits``, a file source's ``sources/<n>``), each a directory of files
named by batch id, ``<id>`` or, for a compacted log, ``<id>.compact``
(``HDFSMetadataLog`` / ``CompactibleFileStreamLog``). Spark writes a log file under a
temporary name and renames it; names that are not a batch id (``.tmp`` files, Hadoop's
``.<name>.crc`` checksums) are not entries.

Used by the preflight checks (:mod:`.preflight`), the streaming query (:mod:`.query`) and the
file source log's trimming (:mod:`.sink.maintenance`)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from . import storage


QUERY_START_CONFS = {"fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs"}
"""Session confs our streaming queries start with, set from ``start()`` until the first
micro-batch begins (or the query ends): Spark builds the Hadoop configuration of the offset
and commit logs in ``start()``, and that of the file source's log when the query's thread
first plans, so neither the session nor other queries keep them. Hadoop's default local
``FileContext`` is ``ChecksumFs``: every log file gets a ``.<name>.crc`` beside it, written
and renamed with it. A run of one micro-batch writes four log files (offsets, the file
source's log, commits, and ``metadata`` once), and each checksum is one more file written and
renamed: a sizable part of a short available-now query's fixed cost. Atomicity does not
depend on the checksum: Spark writes each log file under a temporary name and renames it, on
either file system. What is given up is detecting bytes that rot on disk at read time; the
logs are JSON and a corrupt one still fails Spark's parse. Only ``file://`` paths are affected."""


def fs_path(path: str) -> str:
    """A location as Spark writes it, as :mod:`.storage` takes it: a local ``file:`` URI as a
    path (``file:///x``, as Spark's checkpoints and delta-rs write it, and ``file:/x``, as
    Spark's catalog shows a location, give ``/x``), ``s3a://b/k`` as ``s3://b/k``; other
    paths unchanged."""
    if path.startswith("file:"):
        return "/" + path[len("file:"):].lstrip("/")
    if path.startswith("s3a://"):
        return "s3://" + path[len("s3a://"):]
    return path


@dataclass(frozen=True)
class LogEntry:
    """One file of a Spark metadata log: the batch it is named by, its path, and whether it
    is a compaction (``<batch>.compact``: every entry up to that batch)."""
    batch_id: int
    path: str
    compact: bool


def log_entries(directory: str) -> list[LogEntry]:
    """The entries of one of Spark's metadata logs, oldest first; empty when the directory
    does not exist."""
    try:
        names = storage.list_dir(fs_path(directory))
    except OSError:
        return []
    out = []
    for name in names:
        head, _, suffix = name.partition(".")
        if head.isdigit() and suffix in ("", "compact"):
            out.append(LogEntry(int(head), os.path.join(fs_path(directory), name), suffix == "compact"))
    return sorted(out, key=lambda e: e.batch_id)


def query_id(spark_checkpoint: str) -> str | None:
    """The id of the streaming query the checkpoint belongs to (its ``metadata`` file), or
    None when it has none yet."""
    text = storage.read_text(os.path.join(fs_path(spark_checkpoint), "metadata"))
    return None if text is None else json.loads(text)["id"]


def last_committed(spark_checkpoint: str) -> int | None:
    """The newest batch the checkpoint records as committed (its ``commits`` log), or None."""
    entries = log_entries(os.path.join(spark_checkpoint, "commits"))
    return entries[-1].batch_id if entries else None
