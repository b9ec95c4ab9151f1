"""The published transactions a resume point may still need, kept compact.

In: each published transaction of a :class:`.clocks.TransactionClock` (position, id, its
END's commit LSN, the first and last offsets of its records per partition:
:attr:`.assembly.Published.extent`). Out: what :meth:`.reader.KafkaReader.resume_point`
asks: the first offsets of the transactions after a position, and which transactions up to
it a read from given offsets meets again.
"""
from __future__ import annotations

import numpy as np

from ..packed import PackedInts
from ..tx_ids import TxIds


class Extents:
    """The published transactions a resume point may still need (:meth:`.reader.KafkaReader.resume_point`),
    as columns: position, id (:class:`..tx_ids.TxIds`), the END's commit LSN (-1: not a
    PostgreSQL id), and the first and last offsets of the transaction's records in each
    partition it has records in, as sparse entries (a transaction's entries one after another:
    partition index into ``partitions``, first offset, last offset less first (``span``: small,
    where the offsets of one block of entries are far apart); ``ends``: the entries up to and
    including each transaction's). A catch-up publishes millions of transactions before its
    first cut is asked for, each with records in a few of the partitions read: every column a
    :class:`..packed.PackedInts` (a byte or a few a value), not two dicts of boxed offsets nor a
    column per partition; the questions a resume point asks are answered block by block."""

    def __init__(self):
        self.position, self.lsn, self.ends = PackedInts(), PackedInts(), PackedInts()
        self.ids = TxIds()
        self.partitions: list[tuple] = []
        self._index: dict[tuple, int] = {}
        self.part, self.first, self.span = PackedInts(), PackedInts(), PackedInts()
        self._n = self._entries = 0   # transactions and entries appended

    def append(self, position: int, tx_id: str, lsn: int | None, first: dict, last: dict) -> None:
        self.position.append(position)
        self.lsn.append(-1 if lsn is None else lsn)
        self.ids.append(tx_id)
        part, firsts, span = self.part.append, self.first.append, self.span.append
        for tp, f in first.items():
            i = self._index.get(tp)
            if i is None:
                i = self._index[tp] = len(self.partitions)
                self.partitions.append(tp)
            part(i)
            firsts(f)
            span(last[tp] - f)
        self._entries += len(first)
        self.ends.append(self._entries)
        self._n += 1
        if not self._n & 1023:
            self.settle()

    def settle(self) -> None:
        """Seal every column's whole blocks (:meth:`..packed.PackedInts.settle`)."""
        for c in (self.position, self.lsn, self.ends, self.part, self.first, self.span, self.ids):
            c.settle()

    def split(self, position: int) -> tuple[int, int]:
        """``(k, e)``: the transactions at or before ``position`` are the first ``k`` (positions
        grow), their entries the first ``e``."""
        k = self.position.searchsorted(position)
        return k, (self.ends[k - 1] if k else 0)

    def first_offsets(self, e: int) -> dict:
        """``(topic, partition)`` -> the first offset of a record there of the transactions
        whose entries start at entry ``e``; partitions none of them has records in are left out."""
        low = np.full(len(self.partitions), np.iinfo(np.int64).max, np.int64)
        for (_, part), (_, first) in zip(self.part.blocks(e), self.first.blocks(e)):
            np.minimum.at(low, part, first)
        return {tp: int(low[i]) for i, tp in enumerate(self.partitions) if low[i] != np.iinfo(np.int64).max}

    def read_again(self, k: int, e: int, offsets: dict) -> np.ndarray:
        """The indices (ascending) of the first ``k`` transactions (entries ``[0, e)``) with a
        record at or after ``offsets`` (``(topic, partition)`` -> offset) in its partition:
        what a read from those offsets meets again. One comparison per entry, block by block."""
        limit = np.full(len(self.partitions), np.iinfo(np.int64).max, np.int64)
        for tp, o in offsets.items():
            if tp in self._index:
                limit[self._index[tp]] = o
        hits = [i + np.flatnonzero(first + span >= limit[part])
                for (i, part), (_, first), (_, span) in zip(self.part.blocks(0, e), self.first.blocks(0, e),
                                                             self.span.blocks(0, e))]
        hit = np.concatenate(hits) if hits else np.zeros(0, np.int64)
        if not hit.size:
            return hit
        return np.unique(np.searchsorted(self.ends.numpy(0, k), hit, side="right"))

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the transactions where ``mask`` (bool, one per transaction) is true."""
        counts = np.diff(self.ends.numpy(), prepend=0)   # entries per transaction
        entries = np.repeat(mask, counts)
        self.position, self.lsn = self.position.compress(mask), self.lsn.compress(mask)
        self.ids = self.ids.compress(mask)
        self.ends = PackedInts(np.cumsum(counts[mask]))
        self.part, self.first, self.span = (c.compress(entries) for c in (self.part, self.first, self.span))
        self._n, self._entries = len(self.position), len(self.part)
