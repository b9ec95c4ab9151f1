"""Arrangements: the stored inputs (integrals) of stateful operators, as Delta tables.

An arrangement is an append-only *log* of Z-set deltas, one Delta commit per
micro-batch with txn ``(app id, batch id)``: reading it at the version recorded for batch
``b-1`` gives the operator's input as of ``b-1`` (bilinear operators such as joins can use
the log unconsolidated; aggregates sum it per group). When the log grows past
``COMPACT_AFTER_FILES`` files, the batch's commit instead overwrites it with the compacted
contents (still one commit, same txn) — differential dataflow's spine merge, done rarely.

State tables live at ``<checkpoint>/state/<operator id>_<input>`` and are written with
delta-rs; Spark reads them as the Parquet files of one version.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from ..changelog import consolidate
from ..delta import DeltaTableRef, Txn

log = logging.getLogger(__name__)

COMPACT_AFTER_FILES = 32


@dataclass
class _Staged:
    name: str
    delta: DataFrame
    compact: Callable[[DataFrame], DataFrame]


class StateStore:
    """All arrangements of one query: reads as of the previous batch, staged writes, and the
    idempotent commit of step 3 of the exactly-once protocol (see DESIGN.md).

    ``versions``: arrangement name -> Delta version as of batch ``b-1`` (from the target's
    commit metadata); a name missing there is empty.
    """

    def __init__(self, spark: SparkSession, root: str, versions: dict[str, int]):
        self.spark, self.root, self.versions = spark, root, dict(versions)
        self.staged: list[_Staged] = []

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def read(self, name: str, schema: StructType) -> DataFrame:
        """The log of ``name`` as of the previous batch (empty DataFrame of ``schema`` if none)."""
        v = self.versions.get(name)
        if v is None:
            return self.spark.createDataFrame([], schema)
        df = DeltaTableRef(self.path(name)).read_snapshot(self.spark, v)
        return df.select(*[f"`{f.name}`" for f in schema.fields])

    def stage(self, name: str, delta: DataFrame,
              compact: Callable[[DataFrame], DataFrame] = consolidate) -> None:
        """Stage ``delta`` (appended to the log at commit). ``compact`` maps a log to an
        equivalent smaller one (default: consolidate the Z-set)."""
        if any(s.name == name for s in self.staged):
            raise ValueError(f"state {name} staged twice in one batch")
        self.staged.append(_Staged(name, delta, compact))

    def commit(self, txn: Txn, batch_meta: dict) -> dict[str, int]:
        """Commit every staged delta with ``txn``; a table that already holds this txn was
        committed by a crashed attempt and is skipped (replays are deterministic).
        Returns the new versions of all arrangements."""
        out = dict(self.versions)
        for s in self.staged:
            table = DeltaTableRef(self.path(s.name))
            done = table.txn_version(txn.app_id)
            if done is not None and done >= txn.version:
                log.info("state %s already holds batch %s; skipped", s.name, txn.version)
                out[s.name] = table.latest_version()
                continue
            prev = self.versions.get(s.name)
            first = prev is None
            if not first and len(table.files(prev)) >= COMPACT_AFTER_FILES:
                data = s.compact(self.read(s.name, s.delta.schema).unionByName(s.delta))
                mode = "overwrite"
            else:
                data = s.delta  # a log needs no consolidation; compaction happens when it grows
                mode = "overwrite" if first else "append"
            arrow = data.toArrow()
            if arrow.num_rows == 0 and mode == "append":
                out[s.name] = table.commit_empty(txn=txn, metadata=batch_meta)
            else:
                out[s.name] = table.write(arrow, mode=mode, txn=txn, metadata=batch_meta)
        return out
