"""A Debezium connector's initial snapshot on Kafka topics of any number of partitions.

Before it streams changes, a Debezium connector reads every captured table once and writes
each row as a snapshot read (``op: r``) to the table's topic. Its ``source.snapshot`` field
marks the first event of the whole snapshot (``first``), the first and last of each table
(``first_in_data_collection``, ``last_in_data_collection``), the last of the whole snapshot
(``last``), and ``true`` the others. The events go to the topic's partitions by their key (a
hash of the primary key), so on a topic of several partitions a table's events are spread
over them, and a reader meets them in whatever order it reads the partitions: the event
marked ``first`` can come after the one marked ``last``. Only the order *within* a partition
is the order the connector wrote them in.

**Attempts.** A connector that stops during its snapshot (a crash, a restart of Connect)
takes it again from the start: the topics then hold a partial first attempt and a whole
second one. Events are told apart by attempt from the connector's own snapshot position in
``source`` (:data:`ATTEMPT_FIELDS`: PostgreSQL's ``txId`` and ``lsn`` of the snapshot
transaction, MySQL's binlog ``file``/``pos``, ...; the same on every event of one attempt). Of
two attempts the newer is the one whose events follow the other's in some partition, else
the one with the greater position. Only the newest attempt's rows are kept: an older one's
are dropped and counted (:attr:`SnapshotAssembly.superseded`). A connector whose events carry
no such position starts a new attempt at a ``first`` marker in a partition that already holds
rows of that table; on a topic of several partitions its attempts cannot be told apart, and a
repeat is a SourceError.

**Complete.** A table's snapshot is read when the newest attempt's last event of it
(``last_in_data_collection``) or of the whole snapshot (``last``) was read, or a change of the
table was streamed (the connector streams only after its snapshot), or it has no snapshot row
while the snapshot is over (``last`` or a transaction read) or its topic does not exist. On
topics of several partitions the marker says that every other row was written before it, not
that the reader has read them: :class:`~.reader.KafkaReader` publishes the snapshot between two
reads of a refresh only when each table's own partitions prove it (:meth:`SnapshotAssembly.
table_evident`: a change read in every partition, each partition's rows being in the order the
connector wrote them), else after reading every partition to a high watermark taken after the
markers were read. A snapshot
read after the snapshot was published, or in a partition after a change of the same table,
is a SourceError (an incremental snapshot, which ``format: kafka`` does not read).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ...errors import SourceError
from ..debezium.events import ATTEMPT_FIELDS, FIRST, LAST_OF_TABLE

log = logging.getLogger(__name__)



def attempt_of(source: dict) -> tuple | None:
    """The snapshot attempt an event belongs to: the :data:`ATTEMPT_FIELDS` its ``source``
    block holds, as ``((field, value), ...)``; None when it holds none."""
    key = tuple((f, source[f]) for f in ATTEMPT_FIELDS if source.get(f) is not None)
    return key or None


def _describe(key: tuple | None) -> str:
    return ", ".join(f"{f} {v}" for f, v in key) if key else "no snapshot position"


@dataclass
class _Attempt:
    """One attempt of the snapshot: its rows per table (weighted rows, as the reader makes
    them), the tables whose last event was read, whether the snapshot's very last event was,
    and the partitions holding each table's rows (topic -> partitions)."""
    key: tuple | None
    rows: dict = field(default_factory=dict)
    done: set = field(default_factory=set)
    last_seen: bool = False
    partitions: dict = field(default_factory=dict)

    def row_count(self) -> int:
        return sum(len(r) for r in self.rows.values())


class SnapshotAssembly:
    """The snapshot events of one reader's topics, assembled into the newest attempt's rows
    (module docstring). Not thread-safe: the reader holds its lock.

    ``superseded``: rows of older attempts dropped; ``published``: whether :meth:`take` gave
    the rows out; ``attempt``: then, the published attempt's key (:func:`attempt_of`)."""

    def __init__(self):
        self._current: _Attempt | None = None
        self._older: set = set()                  # attempt keys superseded
        self._seen_in: dict[tuple, tuple] = {}    # (topic, partition) -> the attempt key last read there
        self._tables_in: dict[tuple, set] = {}    # (topic, partition) -> tables with rows of the current attempt
        self._streamed: dict[str, set] = {}       # topic -> partitions where a change of its table was read
        self.superseded = 0
        self.published = False
        self.attempt: tuple | None = None

    def streamed(self, topic: str, partition: int) -> None:
        """A change event (not a snapshot read) of ``topic``'s table was read in ``partition``."""
        self._streamed.setdefault(topic, set()).add(partition)

    def accept(self, topic: str, table: str, partition: int, source: dict, where: str, partitions: int,
               count: int = 1) -> list | None:
        """A snapshot read of ``table`` in ``topic``/``partition`` (``partitions``: how many
        the topic has), with its ``source`` block, and the ``count - 1`` reads that follow it
        there with the same attempt and no marker of meaning (``true``): returns the list their
        weighted rows go to (the newest attempt's rows of the table), or None when they belong
        to an older attempt (dropped). Records its marker. Raises SourceError (``where`` names topic, partition
        and offset) for a snapshot read after the snapshot was published or after a change of
        the table in the same partition, and for a repeated snapshot that cannot be told
        apart (see the module docstring)."""
        if self.published or partition in self._streamed.get(topic, ()):
            after = "the snapshot was complete" if self.published else f"a change of {table} in the same partition"
            raise SourceError(f"{where}: a snapshot read (op r) after {after}: either the table's topic did not exist "
                              f"yet when the other tables' snapshots were read (it was taken as empty: run "
                              f"--full-refresh now that it exists), or an incremental snapshot (signal), which "
                              f"format: kafka does not read (take a new snapshot under a new topic.prefix and run "
                              f"--full-refresh)")
        marker = str(source.get("snapshot", "")).lower()
        key, tp = attempt_of(source), (topic, partition)
        cur = self._current
        if cur is None:
            cur = self._start(key)
        elif key is None:
            if marker in FIRST and table in self._tables_in.get(tp, ()):
                if partitions > 1:
                    raise SourceError(f"{where}: the snapshot of {table} starts again (the connector repeated it), "
                                      f"and its events carry no snapshot position ({', '.join(ATTEMPT_FIELDS)}) to "
                                      f"tell the attempts apart across the topic's {partitions} partitions: delete "
                                      f"the topics and let the connector take its snapshot again, or give the topics "
                                      f"one partition")
                cur = self._replace(cur, None, where)
        elif key != cur.key:
            if key in self._older:
                self._drop(count)
                return None
            if self._newer(key, cur.key, tp):
                cur = self._replace(cur, key, where)
            else:
                self._older.add(key)
                self._drop(count)
                return None
        self._seen_in[tp] = key
        self._tables_in.setdefault(tp, set()).add(table)
        cur.partitions.setdefault(topic, set()).add(partition)
        if marker in LAST_OF_TABLE:
            cur.done.add(table)
        if marker == "last":
            cur.last_seen = True
        return cur.rows.setdefault(table, [])

    def _newer(self, key: tuple, than: tuple, tp: tuple) -> bool:
        """Whether attempt ``key``, met in ``tp``, is newer than ``than``: it follows ``than``
        in that partition, else it has the greater snapshot position."""
        if self._seen_in.get(tp) == than:
            return True
        try:
            return tuple(v for _, v in key) > tuple(v for _, v in than)
        except TypeError:
            return True   # positions of different kinds: the one met later

    def _start(self, key: tuple | None) -> _Attempt:
        self._current = _Attempt(key)
        self._tables_in = {}
        return self._current

    def _replace(self, old: _Attempt, key: tuple | None, where: str) -> _Attempt:
        n = old.row_count()
        log.warning("%s: the connector's snapshot starts again (%s after %s): the %d rows of the earlier attempt "
                    "are replaced", where, _describe(key), _describe(old.key), n)
        if old.key is not None:
            self._older.add(old.key)
        self._drop(n)
        return self._start(key)

    def _drop(self, n: int) -> None:
        self.superseded += n

    def table_complete(self, table: str, topic: str, *, over: bool, absent: bool) -> bool:
        """Whether ``table``'s snapshot is read (module docstring); ``over``: a transaction
        was read; ``absent``: its topic does not exist."""
        cur = self._current
        if cur is not None and (table in cur.done or cur.last_seen):
            return True
        if self._streamed.get(topic):
            return True
        return not (cur is not None and cur.rows.get(table)) and (over or absent)

    def table_evident(self, table: str, topic: str, partitions: int, *, absent: bool) -> bool:
        """Whether every snapshot row of ``table`` has been read, proven by its own topic's
        partitions alone, whatever is still unread in others (what a refresh may publish on,
        between two of its reads): each of the topic's ``partitions`` partitions had a change
        of the table read (the connector wrote its snapshot rows there before), or the topic
        has one partition and the table's own last snapshot event was read there, or the topic
        does not exist."""
        if absent:
            return True
        if partitions > 0 and len(self._streamed.get(topic, ())) >= partitions:
            return True
        return partitions == 1 and self._current is not None and table in self._current.done

    def waiting(self, tables: list[tuple[str, str, int]], *, over: bool, absent: set) -> list[str]:
        """What the snapshot still waits for, one line per table (``tables``: (topic, table,
        partitions of the topic)); empty when every table's snapshot is read."""
        cur = self._current
        out = []
        for topic, table, n in tables:
            if self.table_complete(table, topic, over=over, absent=topic in absent):
                continue
            rows = len(cur.rows.get(table, ())) if cur is not None else 0
            parts = sorted(cur.partitions.get(topic, ())) if cur is not None else []
            out.append(f"Kafka topic {topic} ({table}): {rows} snapshot rows read in partitions {parts} of {n}, but "
                       f"not the connector's last snapshot event of the table (source.snapshot = "
                       f"last_in_data_collection or last)" if rows else
                       f"Kafka topic {topic} ({table}): no snapshot row and no change read yet, and the connector's "
                       f"snapshot is not over (no event marked source.snapshot = last, no transaction)")
        return out

    def take(self) -> tuple[dict, dict]:
        """The newest attempt's rows (table -> weighted rows) and counts (table -> rows), once:
        the snapshot is published."""
        cur, self._current = self._current, None
        self.published = True
        self.attempt = cur.key if cur is not None else None
        self._tables_in, self._seen_in = {}, {}
        if cur is None:
            return {}, {}
        return cur.rows, {t: len(r) for t, r in cur.rows.items() if r}

    @property
    def told_apart(self) -> bool:
        """Whether the published attempt's rows can be found again among the topics' snapshot
        reads by its key alone (:mod:`.table`): it has a key, or no attempt was dropped."""
        return self.attempt is not None or not self.superseded
