"""Transaction ids held compactly: what a reader keeps per published transaction for as long as
it runs (:class:`~.landing_index.TxLog`, the Kafka reader's resume extents and its published
set, :mod:`.kafka`).

A catch-up publishes millions of transactions before its first cut is asked for. An id held
as a Python ``str`` costs about 56 bytes and, in a ``set``, as much again; it also pins the
heap pages around it, so that what a read freed is not given back to the OS. Debezium's
PostgreSQL ids (:func:`.kafka.assembly.transaction_keys`: the xid) and the landing format's are decimal
integers: those are held as int64 in a :class:`~.packed.PackedInts` column (a list: a byte or
two an id, as xids grow by small steps) or as one bit in a paged bitmap (a set); any other id
(MySQL's GTIDs, ...) as the ``str`` it is. Both
classes take and give ``str`` ids: which representation holds one is not seen outside.
"""
from __future__ import annotations

import numpy as np

from .packed import PackedInts

_NOT_DECIMAL = -1


def decimal_id(tx_id: str) -> int | None:
    """``tx_id`` as a non-negative int when it is the canonical decimal text of one (no sign,
    no leading zero, at most 18 digits: it fits int64 and reads back as the same text), else
    None."""
    if type(tx_id) is str and 0 < len(tx_id) <= 18 and tx_id.isdigit() and tx_id.isascii() \
            and (tx_id[0] != "0" or len(tx_id) == 1):
        return int(tx_id)
    return None


class TxIds:
    """A list of transaction ids (``str``): decimal ids (:func:`decimal_id`) as int64 in a
    :class:`~.packed.PackedInts`, others as they are, by index. ``append``, ``len``, indexing
    (``str``), :meth:`compress`."""

    def __init__(self, ids=()):
        self._n = PackedInts()
        self._other: dict[int, str] = {}
        for tx_id in ids:
            self.append(tx_id)

    def append(self, tx_id: str) -> None:
        x = decimal_id(tx_id)
        if x is None:
            self._other[len(self._n)] = tx_id
            x = _NOT_DECIMAL
        self._n.append(x)

    def __len__(self) -> int:
        return len(self._n)

    def settle(self) -> None:
        """:meth:`.packed.PackedInts.settle`."""
        self._n.settle()

    def __getitem__(self, i: int) -> str:
        if i < 0:
            i += len(self._n)
        x = self._n[i]
        return self._other[i] if x == _NOT_DECIMAL else str(x)

    def range(self, start: int, stop: int) -> list[str]:
        """The ids at ``[start, stop)``, decoded a block at a time."""
        return [self._other[i] if x == _NOT_DECIMAL else str(x)
                for i, x in enumerate(self._n.numpy(start, stop).tolist(), start)]

    def compress(self, mask: np.ndarray) -> "TxIds":
        """The ids where ``mask`` (bool, one per id) is true, as a new TxIds."""
        out = TxIds()
        out._n = self._n.compress(mask)
        if self._other:
            at = np.cumsum(mask) - 1   # an id's index among those kept
            out._other = {int(at[i]): v for i, v in self._other.items() if mask[i]}
        return out


class TxIdSet:
    """A set of transaction ids (``str``): decimal ids (:func:`decimal_id`) as bits of a paged
    bitmap (pages of :attr:`PAGE` ids, 8 KB each, made as ids come: about a bit per
    transaction where ids are dense, as PostgreSQL's xids are, over any range of them); every
    other id in a ``set``, and so is a decimal id whose page would leave the pages on average
    less than 1/64 full past the first :attr:`FREE_PAGES` (sparse ids: a page each would cost
    more than the ``str``). ``add``, ``in``, ``len``, :meth:`intersection`."""

    PAGE_BITS = 16
    PAGE = 1 << PAGE_BITS
    """Ids a page covers."""
    FREE_PAGES = 16
    """Pages made whatever the ids' density (128 KB)."""

    def __init__(self, ids=()):
        self._pages: dict[int, bytearray] = {}
        self._in_pages = 0
        self._other: set[str] = set()
        self._len = 0
        for tx_id in ids:
            self.add(tx_id)

    def _new_page(self, x: int) -> bytearray | None:
        """A page for decimal id ``x`` when the density rule allows one, else None."""
        if len(self._pages) < self.FREE_PAGES or self._in_pages * 64 >= len(self._pages) * self.PAGE:
            page = self._pages[x >> self.PAGE_BITS] = bytearray(self.PAGE >> 3)
            return page
        return None

    def add(self, tx_id: str) -> None:
        x = decimal_id(tx_id)
        if x is not None:
            page = self._pages.get(x >> self.PAGE_BITS) or self._new_page(x)
            if page is not None:
                byte, bit = (x & (self.PAGE - 1)) >> 3, 1 << (x & 7)
                if page[byte] & bit or (self._other and tx_id in self._other):
                    return
                page[byte] |= bit
                self._in_pages += 1
                self._len += 1
                return
        if tx_id not in self._other:
            self._other.add(tx_id)
            self._len += 1

    def __contains__(self, tx_id: str) -> bool:
        x = decimal_id(tx_id)
        if x is not None:
            page = self._pages.get(x >> self.PAGE_BITS)
            if page is not None and page[(x & (self.PAGE - 1)) >> 3] & (1 << (x & 7)):
                return True
        return bool(self._other) and tx_id in self._other

    def __len__(self) -> int:
        return self._len

    def intersection(self, ids) -> set[str]:
        """The ids of ``ids`` that are in this set."""
        return {tx_id for tx_id in ids if tx_id in self}
