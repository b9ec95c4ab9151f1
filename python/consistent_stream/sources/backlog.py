"""Where the next micro-batch ends: admission control over a backlog of source commits.

A query that falls behind (a ``dbt run`` after a day of changes, a continuous model after a
pause) has a backlog between the last cut and the newest one. Reading it all in one batch
makes the batch's memory grow with the backlog; instead :func:`plan_cuts` ends each batch at
the newest *transaction-consistent* cut whose change stays within ``max_rows`` source change
rows, and the batches that follow reach the newest cut:

* the backlog's commits are ordered by commit time (a Debezium landing directory's
  transactions in commit order, every table of the directory together; each Delta version of
  each table is its own transaction), and a batch takes a prefix of that order, at least
  one commit, so a batch never splits a transaction and the tables never disagree about
  what happened before what;
* a model that reads upstream models (``ref()``) is not split: its cut must agree with the
  upstream versions' base cuts (:mod:`.dag`), which an intermediate cut would not;
* a first batch (a rebuild from snapshots, whose cost does not depend on the backlog) and a
  backlog larger than ``recompute_threshold`` x the sources' rows (which the batch will
  recompute from snapshots, as Enzyme would) go to the newest cut in one batch.

Commit sizes come from each source's log (Debezium END counts; Delta commit metrics), without
reading any change; a commit of unknown size counts as ``max_rows`` (a batch of its own).
"""
from __future__ import annotations

import logging
from typing import NamedTuple

from .spec import INITIAL

log = logging.getLogger(__name__)


class SourceCommit(NamedTuple):
    """One commit of a source in a backlog: its position (Delta version or transaction
    position), commit time (ms since epoch) and change rows (None: unknown). A named tuple:
    a backlog has hundreds of thousands."""
    position: int
    ts_ms: int
    rows: int | None


def plan_cuts(sources: list, start: dict[str, int], end: dict[str, int], *, max_rows: int,
              recompute_threshold: float) -> list[dict[str, int]]:
    """The cuts the batches after ``start`` end at, in order, the last one ``end`` (see the
    module docstring); empty when ``start`` is already at ``end``. One pass over the
    backlog's commits (read once, sorted once), whatever the number of batches.
    ``sources``: :class:`~consistent_stream.sources.formats.Source` objects, keyed by
    ``spec.key`` in the cuts."""
    keys = sorted(end)
    if all(start.get(k, INITIAL) >= end[k] for k in keys):
        return []
    if any(start.get(k, INITIAL) == INITIAL for k in keys):
        return [dict(end)]
    by_key = {s.spec.key: s for s in sources}
    if not all(s.splits_backlog for s in sources):
        # an intermediate cut would have to be consistent across the DAG too (an upstream
        # version and the base positions it reflects): not split, one batch to the cut
        return [dict(end)]
    # one event per transaction: the commits of one clock (a Delta table alone, the tables
    # of a Debezium landing directory together) at one position are one transaction
    events: dict[tuple, list] = {}   # (ts, clock, position) -> [change rows (None: unknown), {key: position}]
    for k in keys:
        group = by_key[k].clock
        last_ts = 0
        for position, ts, rows in by_key[k].commits(start[k], end[k]):
            if ts < last_ts:
                ts = last_ts  # a table's commits stay in order
            last_ts = ts
            e = events.get((ts, group, position))
            if e is None:
                events[(ts, group, position)] = [rows, {k: position}]
            else:
                e[1][k] = position
                e[0] = None if e[0] is None or rows is None else e[0] + rows
    total = sum((max_rows if e[0] is None else e[0]) for e in events.values())
    if total <= max_rows:
        return [dict(end)]
    source_rows = sum(by_key[k].rows(end[k]) for k in keys)
    if total > recompute_threshold * max(source_rows, 1):
        log.warning("backlog of %d change rows > recompute_threshold %s x %d source rows: one version to the cut, "
                    "recomputed from the snapshots (max_batch_rows %d does not split it; a recompute_threshold "
                    "above %.3g would)", total, recompute_threshold, source_rows, max_rows,
                    total / max(source_rows, 1))
        return [dict(end)]
    cuts: list[dict[str, int]] = []
    cut = dict(start)
    acc = 0
    for event in sorted(events):
        rows, positions = events[event]
        if rows is None:
            rows = max_rows
        if acc and acc + rows > max_rows:
            cuts.append({k: max(cut[k], start[k]) for k in keys})
            acc = 0
        acc += rows
        cut.update(positions)
    cuts.append(dict(end))
    log.info("backlog of %d change rows: %d batches of at most max_batch_rows %d each (a commit larger than "
             "that is a batch of its own)", total, len(cuts), max_rows)
    return cuts


def pending(sources: list, cut: dict[str, int], latest: dict[str, int]) -> tuple[int, int | None]:
    """The lag behind ``cut``: the change rows the sources committed after it up to
    ``latest`` (a commit of unknown size counts 0) and the commit time (ms since epoch) of the
    oldest such commit (None: nothing is pending). One pass over each source's log."""
    rows, oldest = 0, None
    for s in sources:
        k = s.spec.key
        if k not in cut or latest.get(k, INITIAL) <= cut[k]:
            continue
        for _, ts, n in s.commits(cut[k], latest[k]):
            rows += n or 0
            if oldest is None or ts < oldest:
                oldest = ts
    return rows, oldest


class BacklogPlanner:
    """:func:`plan_cuts` once per backlog, its cuts handed out one at a time.

    A run plans one cut at a time (:func:`consistent_stream.query.plan_next_cut`: one cut
    file per micro-batch), so calling :func:`plan_cuts` for every batch would read the
    backlog's commits again for each of
    its batches: quadratic in the backlog (a 410,000-event pgbench backlog in 9 batches spent
    more time planning than processing). The planner keeps the last plan: asked for the cuts
    from ``start`` to ``end`` again, where ``start`` is a cut of that plan and ``end`` is the
    same, it returns the rest of the plan. That is what :func:`plan_cuts` itself would return
    from ``start``: its greedy packing restarts at every cut it makes, and the rest of a
    backlog is smaller than the whole, so it is below ``recompute_threshold`` when the whole
    was. Any other ``start`` or ``end`` (a new cut taken by a continuous query) plans anew.
    """

    def __init__(self, sources: list, *, max_rows: int, recompute_threshold: float):
        self.sources = list(sources)
        self.max_rows = max_rows
        self.recompute_threshold = recompute_threshold
        self._end: dict[str, int] | None = None
        self._cuts: list[dict[str, int]] = []

    def cuts(self, start: dict[str, int], end: dict[str, int]) -> list[dict[str, int]]:
        """The cuts after ``start`` up to ``end``, as :func:`plan_cuts` gives them."""
        start = {k: int(v) for k, v in start.items()}
        end = {k: int(v) for k, v in end.items()}
        if self._end == end:
            for i, c in enumerate(self._cuts):
                if c == start:
                    return self._cuts[i + 1:]
        planned = plan_cuts(self.sources, start, end, max_rows=self.max_rows,
                            recompute_threshold=self.recompute_threshold)
        self._end = end
        self._cuts = [start] + [{k: int(v) for k, v in c.items()} for c in planned]
        return self._cuts[1:]
