"""Append-only int64 columns held in a few bytes a value: what a reader keeps per published
transaction (:class:`~.landing_index.TxLog`, :class:`~.tx_ids.TxIds`, the Kafka reader's resume
extents) for as long as it runs.

A catch-up publishes millions of transactions before its first cut is asked for, and what it
keeps of each (positions, commit times, ids, offsets, LSNs) grows by small steps from one
transaction to the next. :class:`PackedInts` seals every :attr:`PackedInts.BLOCK` values into
a block stored as their differences from the block's minimum in the narrowest unsigned NumPy
type that holds them (frame-of-reference encoding, as Lucene's packed ints and Parquet's
integer encodings do): one or two bytes a value where the steps are small, eight at worst, and
any value read by decoding its one block. The newest block grows as an ``array('q')``.

A sealed block is written to one process-wide temporary file (:class:`_SpillFile`, unnamed,
gone with the process) and only its place is kept in memory (three values a block):
what a reader keeps per transaction no longer grows its memory with the history, only that
file (the same few bytes a value). A read decodes one block from it (``pread``) and keeps the
last block decoded. Blocks a column no longer holds (:meth:`PackedInts.compress` makes a new
column, of whole blocks only: a small batch's trim writes none) stay in the file as dead bytes
until the process ends.
"""
from __future__ import annotations

import bisect
import os
import tempfile
import threading
from array import array

import numpy as np

_MOD = 1 << 64
_UNSIGNED = (np.uint8, np.uint16, np.uint32, np.uint64)


class _SpillFile:
    """An append-only temporary file of sealed blocks (module docstring), opened at the first
    write; thread-safe. Raises OSError naming the temporary directory when it cannot be
    written (``TMPDIR`` chooses it)."""

    def __init__(self):
        self._file = None
        self._end = 0
        self._lock = threading.Lock()

    def write(self, data: bytes) -> int:
        """Append ``data``; returns its offset."""
        with self._lock:
            try:
                if self._file is None:
                    self._file = tempfile.TemporaryFile(prefix="consistent-stream-bookkeeping-")
                at = self._end
                os.pwrite(self._file.fileno(), data, at)
            except OSError as e:
                raise OSError(e.errno, f"the readers' transaction bookkeeping could not be written to a temporary "
                                       f"file in {tempfile.gettempdir()} ({e.strerror}); set TMPDIR to a local "
                                       f"directory with space") from e
            self._end += len(data)
            return at

    def read(self, at: int, n: int) -> bytes:
        return os.pread(self._file.fileno(), n, at)

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._end


SPILL = _SpillFile()


class PackedInts:
    """An append-only column of int64 values in sealed frame-of-reference blocks (module
    docstring). ``append`` (``array('q').append`` itself: as cheap as a list's), ``extend``
    (any iterable of ints or an int64 NumPy array), ``len``, indexing (``int``), :meth:`numpy`,
    :meth:`blocks`, :meth:`compress`; :meth:`searchsorted` on a column whose values never
    decrease. Values appended stay 8 bytes each until :meth:`settle` seals them (into
    :data:`SPILL`), which the reading methods do and an owner appending many calls every few
    thousand rows. Raises IndexError out of range, OverflowError for a value outside int64,
    OSError when the spill file cannot be written."""

    BLOCK = 4096
    """Values per sealed block: a block's span stays small where values grow by small steps."""

    def __init__(self, values=()):
        self._blocks: list[tuple[int, int, str]] = []   # (minimum, offset in SPILL, unsigned type of value - minimum)
        self._cached: tuple[int, np.ndarray] | None = None   # the last block decoded
        self._firsts: list[int] = []                        # each sealed block's first value
        self._tail = array("q")
        self.append = self._tail.append
        self.extend(values)

    def extend(self, values) -> None:
        if isinstance(values, np.ndarray):
            self._tail.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
        else:
            self._tail.extend(values)
        self.settle()

    def settle(self) -> None:
        """Seal every whole block of the values appended."""
        while len(self._tail) >= self.BLOCK:
            a = np.frombuffer(self._tail, dtype=np.int64, count=self.BLOCK).copy()
            lo = int(a.min())
            span = int(a.max()) - lo
            dtype = next(t for t in _UNSIGNED if span <= np.iinfo(t).max)
            # x - lo in modular uint64 arithmetic: exact, since 0 <= x - lo < 2**64
            off = (a.view(np.uint64) - np.uint64(lo % _MOD)).astype(dtype)
            self._blocks.append((lo, SPILL.write(off.tobytes()), off.dtype.char))
            self._firsts.append(int(a[0]))
            del self._tail[:self.BLOCK]

    def __len__(self) -> int:
        return len(self._blocks) * self.BLOCK + len(self._tail)

    def __getitem__(self, i: int) -> int:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("PackedInts index out of range")
        b, j = divmod(i, self.BLOCK)
        if b >= len(self._blocks):
            return self._tail[i - len(self._blocks) * self.BLOCK]
        return int(self._block(b)[j])

    def _block(self, b: int) -> np.ndarray:
        """Sealed block ``b`` (``len(_blocks)``: the tail) as int64 (read-only)."""
        if b == len(self._blocks):
            return np.frombuffer(self._tail, dtype=np.int64).copy() if self._tail else np.zeros(0, np.int64)
        if self._cached is not None and self._cached[0] == b:
            return self._cached[1]
        lo, at, char = self._blocks[b]
        dtype = np.dtype(char)
        off = np.frombuffer(SPILL.read(at, self.BLOCK * dtype.itemsize), dtype=dtype)
        values = (off.astype(np.uint64) + np.uint64(lo % _MOD)).view(np.int64)
        values.flags.writeable = False
        self._cached = (b, values)
        return values

    def blocks(self, start: int = 0, stop: int | None = None):
        """``(first index, int64 array)`` of the values in ``[start, stop)``, one block at a
        time: a pass over the column whose transient is one block."""
        self.settle()
        stop = len(self) if stop is None else min(stop, len(self))
        i = max(start, 0)
        while i < stop:
            b = i // self.BLOCK
            lo = b * self.BLOCK
            yield i, self._block(b)[i - lo:min(stop, lo + self.BLOCK) - lo]
            i = lo + self.BLOCK

    def numpy(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The values in ``[start, stop)`` as one int64 array."""
        parts = [a for _, a in self.blocks(start, stop)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def compress(self, mask: np.ndarray) -> "PackedInts":
        """The values where ``mask`` (bool, one per value) is true, as a new column."""
        out = type(self)()
        for i, a in self.blocks():
            out.extend(a[mask[i:i + len(a)]])
        return out

    def searchsorted(self, x: int) -> int:
        """The number of values ``<= x``, for a column whose values never decrease (a binary
        search over the blocks' first values, then within one block)."""
        self.settle()
        b = bisect.bisect_right(self._firsts, x)
        if b == len(self._firsts) and self._tail and self._tail[0] <= x:
            b += 1   # into the unsealed tail
        if b == 0:
            return 0
        return (b - 1) * self.BLOCK + int(np.searchsorted(self._block(b - 1), x, side="right"))
