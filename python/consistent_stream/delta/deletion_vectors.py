"""Delta deletion vectors as the protocol stores them (Delta's PROTOCOL.md, "Deletion Vector
Format" and "Deletion Vector Descriptor Schema"), read and written here.

A deletion vector marks rows of one data file as deleted: row ``i`` is the ``i``-th row of
the Parquet file (0-based). Its bytes are a ``RoaringBitmapArray`` in the portable format:

* the magic number 1681511377 (int32, little-endian);
* the number of 32-bit bitmaps (int64, little-endian), then for each, its key (the high 32
  bits of the positions it holds; int32, little-endian) and the bitmap in Roaring's portable
  serialization (pyroaring, CRoaring's own).

A descriptor (an ``add`` or ``remove`` action's ``deletionVector``) says where the bytes are:

* ``storageType: "i"`` (inline): ``pathOrInlineDv`` is the bytes in Z85 (zero-padded to a
  multiple of 4), ``sizeInBytes`` their length;
* ``"u"``: a file ``deletion_vector_<uuid>.bin`` under the table's root (under a random prefix
  directory when ``pathOrInlineDv`` has more than the 20 Z85 characters of the UUID);
  ``"p"``: an absolute path. Such a file is a version byte (1), then for each vector it holds,
  its size (int32, big-endian), its bytes and their CRC-32 (big-endian); ``offset`` is where
  the size is;
* ``cardinality``: the number of rows marked.

Positions in and out are numpy ``int64`` arrays, ascending and distinct. Raises ValueError for
bytes that are not a deletion vector (wrong magic, version, size or checksum), naming what is
wrong.
"""
from __future__ import annotations

import array
import base64
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from pyroaring import BitMap

from .. import location, storage

MAGIC = 1681511377
_FILE_VERSION = 1
_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_TO_Z85 = str.maketrans(_B85, _Z85)
_FROM_Z85 = str.maketrans(_Z85, _B85)


def z85_encode(data: bytes) -> str:
    """``data`` (a multiple of 4 bytes) in Z85, the alphabet Delta encodes deletion vectors
    and their file names in (ZeroMQ RFC 32). Python's ``base64.b85encode`` is the same
    big-endian base-85 code in RFC 1924's alphabet; the characters are mapped across."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes a multiple of 4 bytes, not {len(data)}")
    return base64.b85encode(data).decode("ascii").translate(_TO_Z85)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 ``text`` (a multiple of 5 characters)."""
    if len(text) % 5:
        raise ValueError(f"Z85 text has a multiple of 5 characters, not {len(text)}: {text!r}")
    return base64.b85decode(text.translate(_FROM_Z85).encode("ascii"))


def serialize(positions) -> bytes:
    """The ``RoaringBitmapArray`` bytes of row ``positions`` (the module docstring)."""
    return _serialized(positions)[0]


def _serialized(positions) -> tuple[bytes, int]:
    """:func:`serialize`'s bytes and the number of distinct positions (the cardinality)."""
    rows = distinct(positions)
    if len(rows) and rows[0] < 0:
        raise ValueError(f"a row position is negative: {int(rows[0])}")
    highs = rows >> 32
    cuts = np.flatnonzero(highs[1:] != highs[:-1]) + 1   # (ascending rows: each high is one run)
    out = [struct.pack("<Iq", MAGIC, len(cuts) + 1 if len(rows) else 0)]
    for part in np.split(rows, cuts) if len(rows) else []:
        # a BitMap from an ``array.array`` copies its buffer; from a numpy array it iterates
        bm = BitMap(array.array("I", (part & 0xFFFFFFFF).astype(np.uint32).tobytes()))
        bm.run_optimize()
        out.append(struct.pack("<I", int(part[0] >> 32)) + bm.serialize())
    return b"".join(out), len(rows)


def distinct(positions) -> np.ndarray:
    """``positions`` as an ascending ``int64`` array without repeats: as given when they are
    so already (one pass: a batch's positions are), else sorted and the repeats dropped
    (numpy 2's ``unique`` took four times as long as the sort on a file's vector)."""
    rows = np.asarray(positions, dtype=np.int64)
    if len(rows) < 2 or bool(np.all(rows[1:] > rows[:-1])):
        return rows
    rows = np.sort(rows)
    return rows[np.concatenate(([True], rows[1:] != rows[:-1]))]


def union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The positions of ``a`` or ``b`` (each ascending and distinct), ascending and distinct:
    the rows a file's deletion vector marks once a batch's are added to those it marked."""
    if not len(a) or not len(b):
        return distinct(a if len(a) else b)
    return distinct(np.concatenate([np.asarray(a, np.int64), np.asarray(b, np.int64)]))


def deserialize(data: bytes) -> np.ndarray:
    """The row positions of ``RoaringBitmapArray`` bytes (ascending ``int64``)."""
    if len(data) < 12:
        raise ValueError(f"a deletion vector of {len(data)} bytes is shorter than its header")
    magic, count = struct.unpack_from("<Iq", data, 0)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector: magic number {magic}, expected {MAGIC}")
    at, parts = 12, []
    for _ in range(count):
        (high,) = struct.unpack_from("<I", data, at)
        bm = BitMap.deserialize(data[at + 4:])
        at += 4 + len(bm.serialize())     # the same container types serialize to the same size
        parts.append(np.asarray(bm.to_array(), dtype=np.int64) | (np.int64(high) << 32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Descriptor:
    """A deletion vector descriptor as an action carries it (the module docstring)."""
    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    def to_action(self) -> dict:
        """The descriptor as the log's JSON has it (``offset`` absent for an inline one)."""
        out = {"storageType": self.storage_type, "pathOrInlineDv": self.path_or_inline_dv}
        if self.offset is not None:
            out["offset"] = self.offset
        out.update(sizeInBytes=self.size_in_bytes, cardinality=self.cardinality)
        return out

    @staticmethod
    def of_action(d: dict) -> "Descriptor":
        """A descriptor from an action's ``deletionVector``; KeyError naming a missing field."""
        return Descriptor(d["storageType"], d["pathOrInlineDv"], int(d["sizeInBytes"]), int(d["cardinality"]),
                          None if d.get("offset") is None else int(d["offset"]))

    @property
    def unique_id(self) -> str:
        """The vector's identity within its table (the protocol's ``uniqueId``)."""
        return self.storage_type + self.path_or_inline_dv + ("" if self.offset is None else f"@{self.offset}")


def live(num_rows: int, deleted: np.ndarray) -> np.ndarray:
    """Which of a file's ``num_rows`` rows its deletion vector keeps: a boolean mask, False at
    the positions of ``deleted`` (int64, as :func:`deserialize` gives them; a position past the
    file's rows marks nothing). One pass over the rows, where a set lookup per row
    (``np.isin``) sorts both sides."""
    keep = np.ones(num_rows, dtype=bool)
    if len(deleted):
        d = np.asarray(deleted, dtype=np.int64)
        keep[d[(d >= 0) & (d < num_rows)]] = False
    return keep


def descriptor_of(deletion_vector: dict | None) -> Descriptor | None:
    """The descriptor of an action's (or :class:`~.values.DataFile`'s) ``deletionVector``, None
    for a file without one."""
    return Descriptor.of_action(deletion_vector) if deletion_vector else None


def inline(positions) -> Descriptor:
    """An inline descriptor of row ``positions``: the bytes in the log itself, for a vector small
    enough that a file of its own costs more than the commit's extra bytes."""
    return _inline(*_serialized(positions))


def _inline(data: bytes, cardinality: int) -> Descriptor:
    padded = data + b"\0" * (-len(data) % 4)
    return Descriptor("i", z85_encode(padded), len(data), cardinality)


def file_name(path_or_inline_dv: str) -> str:
    """The relative path of a ``"u"`` descriptor's file: its random prefix directory (the
    characters before the last 20, if any) and ``deletion_vector_<uuid>.bin``."""
    prefix, encoded = path_or_inline_dv[:-20], path_or_inline_dv[-20:]
    name = f"{FILE_PREFIX}{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def file_of(action: dict) -> str | None:
    """The relative path (decoded) of the deletion vector file an ``add`` or ``remove`` action's
    vector is stored in; None for a file without a vector, an inline one or an absolute path."""
    dv = action.get("deletionVector")
    return file_name(dv["pathOrInlineDv"]) if dv and dv.get("storageType") == "u" else None


FILE_PREFIX = "deletion_vector_"
"""How the name of a deletion vector file (``"u"``) starts."""


def file_bytes(vectors: list) -> tuple[bytes, list[tuple[int, int, int]]]:
    """The bytes of a deletion vector file holding ``vectors`` (each a positions array), and
    each vector's ``(offset, sizeInBytes, cardinality)`` in it."""
    return _file_bytes([_serialized(positions) for positions in vectors])


def _file_bytes(serialized: list[tuple[bytes, int]]) -> tuple[bytes, list[tuple[int, int, int]]]:
    out, placed, at = [bytes([_FILE_VERSION])], [], 1
    for data, cardinality in serialized:
        placed.append((at, len(data), cardinality))
        out.append(struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data)))
        at += 8 + len(data)
    return b"".join(out), placed


def write_file(table_path: str, vectors: list) -> list[Descriptor]:
    """Write ``vectors`` (each a positions array) into one new ``deletion_vector_<uuid>.bin`` at
    ``table_path``'s root and return their ``"u"`` descriptors, in order. The file is not in the
    table until a commit's ``add`` refers to it: a file no commit names is garbage that VACUUM
    (and the sink's maintenance) removes."""
    return _write_file(table_path, [_serialized(positions) for positions in vectors])


def _write_file(table_path: str, serialized: list[tuple[bytes, int]]) -> list[Descriptor]:
    data, placed = _file_bytes(serialized)
    encoded = z85_encode(uuid.uuid4().bytes)
    storage.create_bytes(_join(table_path, file_name(encoded)), data)
    return [Descriptor("u", encoded, size, cardinality, offset) for offset, size, cardinality in placed]


def write(table_path: str, vectors: list, *, inline_bytes: int) -> list[Descriptor]:
    """Descriptors of ``vectors`` (each a positions array, ascending and distinct), in order:
    inline those whose bytes are at most ``inline_bytes`` long, the others in one new vector
    file (:func:`write_file`; none when every vector is inline). Each is remembered
    (:data:`KNOWN`), so the next batch reads none of them."""
    out: list[Descriptor | None] = [None] * len(vectors)
    spilled = []
    for i, positions in enumerate(vectors):
        data, cardinality = _serialized(positions)
        if len(data) <= inline_bytes:
            out[i] = _inline(data, cardinality)
        else:
            spilled.append((i, (data, cardinality)))
    if spilled:
        for (i, _), d in zip(spilled, _write_file(table_path, [x for _, x in spilled])):
            out[i] = d
    for d, positions in zip(out, vectors):
        KNOWN.put(d.unique_id, np.asarray(positions, dtype=np.int64))
    return out


def read(table_path: str, descriptor: Descriptor) -> np.ndarray:
    """The row positions ``descriptor`` marks, of a data file of the table at ``table_path``;
    ValueError when its bytes do not match the descriptor (size, checksum, cardinality)."""
    return read_many(table_path, [descriptor])[0]


def read_many(table_path: str, descriptors: list[Descriptor | None]) -> list[np.ndarray]:
    """The row positions of each of ``descriptors`` (None: no row deleted, an empty array),
    in order: each vector file read once (on an object store one GET each, all at once), the
    vectors this process wrote or read lately (:data:`KNOWN`) without a read. Raises as
    :func:`read` does."""
    out: list[np.ndarray | None] = [np.zeros(0, dtype=np.int64) if d is None else KNOWN.get(d.unique_id)
                                    for d in descriptors]
    paths = sorted({_stored_at(table_path, d) for d, o in zip(descriptors, out) if o is None and d.storage_type != "i"})
    raw = dict(zip(paths, storage.read_many(paths, "dv-read")))
    for i, (d, o) in enumerate(zip(descriptors, out)):
        if o is None:
            data = (z85_decode(d.path_or_inline_dv)[:d.size_in_bytes] if d.storage_type == "i"
                    else _in_file(_stored_at(table_path, d), raw[_stored_at(table_path, d)], d))
            rows = deserialize(data)
            if len(rows) != d.cardinality:
                raise ValueError(f"a deletion vector of {len(rows)} rows, the log says {d.cardinality}")
            out[i] = KNOWN.put(d.unique_id, rows)
    return out


def _stored_at(table_path: str, d: Descriptor) -> str:
    """Where a ``"u"`` or ``"p"`` vector's file is."""
    if d.storage_type == "u":
        return _join(table_path, file_name(d.path_or_inline_dv))
    if d.storage_type == "p":
        return d.path_or_inline_dv
    raise ValueError(f"unknown deletion vector storageType {d.storage_type!r}")


def _in_file(path: str, raw: bytes, d: Descriptor) -> bytes:
    """The bytes of the vector at ``d.offset`` of vector file ``path`` (``raw``), checked."""
    at = d.offset or 1
    if raw[:1] != bytes([_FILE_VERSION]):
        raise ValueError(f"{path}: deletion vector file version {raw[:1]!r}, expected {_FILE_VERSION}")
    (size,) = struct.unpack_from(">i", raw, at)
    if size != d.size_in_bytes:
        raise ValueError(f"{path}@{at}: a deletion vector of {size} bytes, the log says {d.size_in_bytes}")
    data = raw[at + 4:at + 4 + size]
    (crc,) = struct.unpack_from(">I", raw, at + 4 + size)
    if zlib.crc32(data) != crc:
        raise ValueError(f"{path}@{at}: the deletion vector's checksum does not match its bytes")
    return data


class KnownVectors:
    """The positions of the deletion vectors the process wrote or read lately, by ``uniqueId``
    (a vector never changes: a new one has a new id), at most ``limit`` of them, least
    recently used first out."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, unique_id: str) -> np.ndarray | None:
        with self._lock:
            rows = self._rows.get(unique_id)
            if rows is not None:
                self._rows.move_to_end(unique_id)
            return rows

    def put(self, unique_id: str, rows: np.ndarray) -> np.ndarray:
        with self._lock:
            self._rows[unique_id] = rows
            while len(self._rows) > self.limit:
                self._rows.popitem(last=False)
        return rows


KNOWN = KnownVectors()
"""The process's :class:`KnownVectors`."""


def _join(table_path: str, rel: str) -> str:
    return location.fs_path(f"{table_path.rstrip('/')}/{rel}")
