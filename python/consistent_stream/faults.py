"""Fault injection for crash testing: kill the whole process group at a named step of the
exactly-once protocol, as the OOM killer or a CI timeout would.

``CONSISTENT_STREAM_FAULT=<point>[@<n>]`` makes the n-th (default first) time this process
reaches :func:`fault_point` ``(point)`` send SIGKILL to its own process group: the Python
driver, Spark's JVM (a child in the same group) and its Python workers die at once, with no
``finally``, no ``atexit`` and no flush. Unset (the default), a fault point is one dict
lookup. ``benchmarks/crash_campaign.py`` sets it in a child process started in its own
session (``start_new_session=True``) so that only that run dies.

The points, in protocol order (``runtime.py`` steps):

* ``changes_read``: step 1 done, the batch's changelogs are on the driver;
* ``files_written``: a Delta commit's data files are written, its log entry is not
  (:meth:`~consistent_stream.delta.DeltaTableRef.commit_files`: state tables, rebuilt
  targets);
* ``compacted``: a state compaction's new files are written, the state commit is not;
* ``state_committed``: step 4 done, the state commit holds txn ``b``, the target does not;
* ``target_committed``: step 5 done, the target holds txn ``b``; after a query's first batch,
  its checkpoint record does not say it committed yet (:mod:`consistent_stream.checkpoint`);
* ``publishing``: catalog publishing has linked the version's files, the catalog statement
  has not run.
"""
from __future__ import annotations

import os
import signal

ENV = "CONSISTENT_STREAM_FAULT"
POINTS = ("changes_read", "files_written", "compacted", "state_committed",
          "target_committed", "publishing")


def _parse(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    point, _, n = value.partition("@")
    if point not in POINTS:
        raise ValueError(f"{ENV}={value!r}: unknown fault point {point!r}; one of {', '.join(POINTS)}")
    return point, int(n or 1)


_ARMED = _parse(os.environ.get(ENV))
_hits: dict[str, int] = {}


def fault_point(point: str) -> None:
    """Reached step ``point`` (one of :data:`POINTS`): SIGKILL the process group when
    ``CONSISTENT_STREAM_FAULT`` names this point and this is its n-th hit; else nothing."""
    if _ARMED is None or _ARMED[0] != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] == _ARMED[1]:
        os.killpg(os.getpgrp(), signal.SIGKILL)
