"""Transaction ids held compactly: what a reader keeps per published transaction for as long as
it runs (:class:`~.landing_index.TxLog`, the Kafka reader's resume extents and its published
set, :mod:`.kafka`).

A catch-up publishes millions of transactions before its first cut is asked for. An id held
as a Python ``str`` costs about 56 bytes and, in a ``set``, as much again; it also pins the
heap pages around it, so that what a read freed is not given back to the OS. Debezium's
PostgreSQL ids (:func:`.kafka.transaction_keys`: the xid) and the landing format's are decimal
integers: those are held as int64 in a :class:`~.packed.PackedInts` column (a list: a byte or
two an id, as xids grow by small steps) or as one bit in a bitmap over the range the ids span
(a set); any other id (MySQL's GTIDs, ...) as the ``str`` it is. Both
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

    def compress(self, mask: np.ndarray) -> "TxIds":
        """The ids where ``mask`` (bool, one per id) is true, as a new TxIds."""
        out = TxIds()
        out._n = self._n.compress(mask)
        if self._other:
            at = np.cumsum(mask) - 1   # an id's index among those kept
            out._other = {int(at[i]): v for i, v in self._other.items() if mask[i]}
        return out


class TxIdSet:
    """A set of transaction ids (``str``): decimal ids (:func:`decimal_id`) as bits of a
    bitmap over ``[lo, lo + SPAN)``, ``lo`` the first decimal id added (a few bits per
    transaction where ids are dense, as PostgreSQL's xids are); every other id, and a decimal
    one outside that range, in a ``set``. ``add``, ``in``, ``len``, :meth:`intersection`."""

    SPAN = 1 << 27
    """Ids the bitmap covers (16 MB at most, grown as ids come)."""

    def __init__(self, ids=()):
        self._lo: int | None = None
        self._bits = bytearray()
        self._other: set[str] = set()
        self._len = 0
        for tx_id in ids:
            self.add(tx_id)

    def _bit(self, x: int | None) -> int | None:
        """The bit of decimal id ``x`` in the bitmap, None: not a decimal id, or outside."""
        if x is None or self._lo is None:
            return None
        d = x - self._lo
        return d if 0 <= d < self.SPAN else None

    def add(self, tx_id: str) -> None:
        x = decimal_id(tx_id)
        if self._lo is None and x is not None:
            self._lo = x
        d = self._bit(x)
        if d is None:
            if tx_id not in self._other:
                self._other.add(tx_id)
                self._len += 1
            return
        byte, mask = d >> 3, 1 << (d & 7)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        if not self._bits[byte] & mask:
            self._bits[byte] |= mask
            self._len += 1

    def __contains__(self, tx_id: str) -> bool:
        d = self._bit(decimal_id(tx_id))
        if d is None:
            return tx_id in self._other
        byte = d >> 3
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << (d & 7)))

    def __len__(self) -> int:
        return self._len

    def intersection(self, ids) -> set[str]:
        """The ids of ``ids`` that are in this set."""
        return {tx_id for tx_id in ids if tx_id in self}
