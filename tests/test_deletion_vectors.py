"""Delta deletion vectors read and written by ``consistent_stream.delta.deletion_vectors``:
the format round-trips (inline and in files, positions past 2^32), damaged bytes are refused,
and the vectors delta-spark writes read as the rows delta-rs says they delete."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from consistent_stream.delta import deletion_vectors as dv

CASES = {
    "empty": np.zeros(0, dtype=np.int64),
    "one": np.array([0]),
    "a run": np.arange(1000, 5000),
    "sparse": np.sort(np.random.default_rng(1).choice(3_000_000, 400, replace=False)),
    "past 2^32": np.array([5, 2**32 - 1, 2**32, 2**32 + 7, 3 * 2**32 + 1]),
}


def test_z85_is_zeromqs():
    """The example of ZeroMQ's RFC 32."""
    raw = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert dv.z85_encode(raw) == "HelloWorld"
    assert dv.z85_decode("HelloWorld") == raw
    with pytest.raises(ValueError, match="multiple of 4"):
        dv.z85_encode(b"abc")


@pytest.mark.parametrize("name", list(CASES))
def test_vectors_round_trip_inline_and_in_a_file(tmp_path, name):
    rows = CASES[name]
    assert dv.deserialize(dv.serialize(rows)).tolist() == rows.tolist()
    d = dv.inline(rows)
    assert (d.storage_type, d.cardinality, d.offset) == ("i", len(rows), None)
    assert dv.read(str(tmp_path), d).tolist() == rows.tolist()
    assert dv.Descriptor.of_action(json.loads(json.dumps(d.to_action()))) == d
    other = np.array([3, 4])
    first, second = dv.write_file(str(tmp_path), [rows, other])
    assert first.path_or_inline_dv == second.path_or_inline_dv and first.offset == 1
    assert (tmp_path / dv.file_name(first.path_or_inline_dv)).is_file()
    assert dv.read(str(tmp_path), first).tolist() == rows.tolist()
    assert dv.read(str(tmp_path), second).tolist() == [3, 4]


def test_positions_in_any_order_or_repeated_are_their_distinct_ascending_set():
    """``serialize`` takes positions unsorted and repeated, as ``distinct`` and ``union`` give
    them back; the bytes are those of the sorted set."""
    rng = np.random.default_rng(2)
    rows = np.concatenate([rng.integers(0, 2**34, 3000), rng.integers(0, 50, 200)])
    want = np.unique(rows)
    assert dv.serialize(rows) == dv.serialize(want)
    assert dv.deserialize(dv.serialize(rows)).tolist() == want.tolist()
    assert dv.distinct(rows).tolist() == want.tolist()
    a, b = np.unique(rows[:2000]), np.unique(rows[1500:])
    assert dv.union(a, b).tolist() == want.tolist()
    assert dv.union(a, np.zeros(0, np.int64)).tolist() == a.tolist()


@pytest.mark.parametrize("name", list(CASES))
def test_a_vectors_live_rows_are_the_rows_it_does_not_mark(name):
    """``live``: the mask of the rows kept, as a set difference gives it; positions past the
    file's rows mark nothing."""
    rows = CASES[name]
    n = 3_000_000
    got = dv.live(n, rows)
    assert got.dtype == bool and len(got) == n
    assert np.array_equal(np.flatnonzero(got), np.setdiff1d(np.arange(n), rows))


def test_damaged_vectors_are_refused(tmp_path):
    (d,) = dv.write_file(str(tmp_path), [np.arange(10)])
    path = tmp_path / dv.file_name(d.path_or_inline_dv)
    raw = bytearray(path.read_bytes())
    raw[-6] ^= 0xFF                          # a byte of the bitmap: the checksum no longer matches
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        dv.read(str(tmp_path), d)
    with pytest.raises(ValueError, match="the log says"):
        dv.read(str(tmp_path), dv.Descriptor("u", d.path_or_inline_dv, d.size_in_bytes + 1, 10, 1))
    with pytest.raises(ValueError, match="magic number"):
        dv.deserialize(b"\0" * 16)


def test_delta_sparks_vectors_read_as_the_rows_delta_rs_deletes(spark, tmp_path):
    """A delta-spark table with deletion vectors (two DELETEs, the second growing the first's
    vector): every vector its log names reads, through this module, as exactly the rows
    delta-rs' reader masks out of that file at that version, and serializes back to a vector
    that reads the same."""
    path = str(tmp_path / "t")
    spark.range(0, 20000, numPartitions=2).selectExpr("id", "id % 7 as g").write.format("delta") \
        .option("delta.enableDeletionVectors", "true").save(path)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 97 = 3")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id BETWEEN 4000 AND 4100 OR id = 15000")
    checked = 0
    for version in range(DeltaTable(path).version() + 1):
        table = DeltaTable(path, version=version)
        found = pa.RecordBatchReader.from_stream(table.deletion_vectors()).read_all()
        masks = {uri.rsplit("/", 1)[-1]: np.asarray(found.column(1)[i].values.to_numpy(zero_copy_only=False))
                 for i, uri in enumerate(found.column(0).to_pylist())}
        with open(f"{path}/_delta_log/{version:020d}.json") as f:
            adds = [json.loads(line)["add"] for line in f if '"add"' in line]
        for add in adds:
            if not add.get("deletionVector"):
                continue
            d = dv.Descriptor.of_action(add["deletionVector"])
            rows = dv.read(path, d)
            assert rows.tolist() == np.flatnonzero(~masks[add["path"]]).tolist(), (version, add["path"])
            assert dv.deserialize(dv.serialize(rows)).tolist() == rows.tolist()
            checked += 1
    assert checked >= 3     # both files after the first DELETE, one grown by the second
