"""The Structured Streaming source of a consistent_stream query: a log of planned cuts.

The driver plans each micro-batch's cut and appends it to the query's *cut log*, a directory
``<checkpoint>/cuts`` of small JSON files (``cut-<seq>.json``: the batch's start and end cut,
written atomically, never rewritten). The streaming query reads that directory with Spark's
own file source, one file per micro-batch (``maxFilesPerTrigger`` 1), so Spark's checkpoint
records which cut each batch processed, and a replayed batch reads the same cut:

* ``dbt run`` (trigger available-now): the driver plans the next batch towards the cut it
  takes at start (a backlog is split by :func:`.backlog.plan_cuts`), writes its file, and an
  available-now query processes it and stops; repeated until that cut is reached;
* continuous (processing-time trigger): a planner thread on the driver appends the next cut
  as the sources move (checking every trigger interval, or at once while a backlog is worked
  off), and only once the query has processed the planned cut, so a batch slower than the
  interval takes everything that arrived meanwhile; the query picks it up.

At most one planned cut is unprocessed at any time. Spark's file source admits up to
``maxFilesPerTrigger`` files per offset request, but a micro-batch's offset may span two
requests, and ``cleanSource`` deletes only the files of the batch's last request: with two
files planned ahead, batch ``n`` processed cut ``n`` and the unprocessed file of cut ``n + 1``
was deleted (found by the crash campaign: a model stuck until ``--full-refresh``). With one
file at a time, micro-batch ``n`` is exactly cut file ``n``.

Processed files are deleted by Spark (``cleanSource``). A cut is source key -> position
(:class:`~consistent_stream.sources.spec.Cut`).

(Spark's Python streaming data source, the first implementation, starts a Python runner
process for every query, a fixed cost of every ``dbt run`` larger than the file source's whole
way to its first batch; the file source costs no process.)
"""
from __future__ import annotations

import json
import os

from pyspark.sql import DataFrame, SparkSession

from .. import storage
from ..faults import fault_point
from .spec import Cut

SCHEMA = "seq bigint, start map<string, bigint>, `end` map<string, bigint>"


class CutLog:
    """The cut log of one query (see the module docstring), under ``directory``."""

    def __init__(self, directory: str):
        self.directory = directory

    def _files(self) -> list[str]:
        return sorted(n for n in storage.list_dir(self.directory) if n.startswith("cut-") and n.endswith(".json"))

    def last(self) -> tuple[int, Cut] | None:
        """The newest planned cut: ``(seq, end cut)``, or None when nothing is planned (or
        every planned file was processed and cleaned up)."""
        files = self._files()
        if not files:
            return None
        d = storage.load_json(os.path.join(self.directory, files[-1]))
        return int(d["seq"]), Cut.from_json(d["end"])

    def append(self, seq: int, start: Cut, end: Cut) -> None:
        """Plan one batch ``(start, end]`` as file ``seq``, atomically: the file appears whole
        and with its final modification time, at least 1 ms after every earlier file's.

        Spark's file source orders files by modification time in whole milliseconds, a tie in
        listing order, and deletes each file once processed (``cleanSource``).
        :func:`consistent_stream.storage.write_after` writes the file whole with a time after
        the newest planned file's: a time set after the file appeared let a process killed in
        between (the crash campaign's ``cut_planned``) leave two files in one millisecond, the
        later one was processed first and deleted, and the next batch's cut was lost.

        Not fsynced, as the files it sits among are not (Spark's offset and commit logs,
        delta-rs' commits of the state and the target): the stack's durability is the page
        cache's, so a killed process loses nothing and an operating system crash can tear
        any of them (a torn cut file is named by the next run, ``CommitError``). An fsync
        here waited for the journal behind the previous batch's writes (up to a large share
        of a run at SF 10, where a refresh round rewrites the source files), for a guarantee
        the commits beside it do not give."""
        storage.make_dirs(self.directory)
        path = os.path.join(self.directory, f"cut-{seq:012d}.json")
        prev = self._files()
        storage.write_after(path, json.dumps({"seq": seq, "start": start.versions, "end": end.versions},
                                             sort_keys=True).encode(),
                            os.path.join(self.directory, prev[-1]) if prev else None)
        fault_point("cut_planned")

    def stream(self, spark: SparkSession) -> DataFrame:
        """The streaming DataFrame of planned cuts, one file per micro-batch."""
        storage.make_dirs(self.directory)
        return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                .option("cleanSource", "delete").json(self.directory))

    def read(self, seq: int) -> tuple[Cut, Cut] | None:
        """The planned ``(start, end)`` cut of file ``seq`` (None when it is not there: already
        processed and cleaned up, or never planned). Micro-batch ``n`` reads file ``n`` (one
        file per batch), so a batch reads its cut here, on the driver, with no Spark job."""
        try:
            d = storage.load_json(os.path.join(self.directory, f"cut-{seq:012d}.json"))
        except FileNotFoundError:
            return None
        if int(d["seq"]) != seq:
            raise ValueError(f"cut file {seq} of {self.directory} holds seq {d['seq']}")
        return Cut.from_json(d["start"]), Cut.from_json(d["end"])

    @staticmethod
    def batch_cut(batch_df: DataFrame) -> tuple[Cut, Cut] | None:
        """A micro-batch's ``(start, end)`` cut (None for a batch without a file)."""
        rows = batch_df.collect()
        if not rows:
            return None
        r = rows[0]
        return Cut.from_json(r["start"]), Cut.from_json(r["end"])
