"""The target's change-sized MERGE done here, copy-on-write (consistent_stream.sink.rewrite):
the same rows and the same Change Data Feed as delta-rs' MERGE of the same changes, NULL keys
as values, a bag's copies, only the files whose statistics may hold a changed key rewritten,
delta-spark reading the result and its feed; and delta-rs' MERGE kept where the table asks
for what the rewrite does not enforce."""
from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from consistent_stream.delta import DeltaTableRef, Txn
from consistent_stream.sink import rewrite
from consistent_stream.sink.target import commit_changes

CDF = {"delta.enableChangeDataFeed": "true"}


def _target(path, rows: dict, *, files: int = 1, partition_by=None, configuration=None) -> None:
    t = pa.table(rows)
    step = -(-t.num_rows // files)
    for i in range(files):
        write_deltalake(path, t.slice(i * step, step), mode="append", partition_by=partition_by,
                        configuration={**CDF, **(configuration or {})} if i == 0 else None)


def _one_large_file(tmp_path, monkeypatch, n: int = 200):
    """A keyed target of one file of ``n`` rows (``k`` 0 .. n - 1, ``v`` "v<k>"), large enough
    for a MERGE to mark its rows in a deletion vector (``DV_MIN_ROWS`` lowered to 100):
    ``(path, n, its handle, the file)``."""
    from consistent_stream import settings
    monkeypatch.setattr(settings, "DV_MIN_ROWS", 100)
    path = str(tmp_path / "t")
    _target(path, {"k": pa.array(range(n), pa.int64()), "v": [f"v{i}" for i in range(n)]})
    ref = DeltaTableRef(path, own_log=True)
    (big,) = ref.data_files(ref.version())
    return path, n, ref, big


def _changes(rows: dict, ops: list[str]) -> pa.Table:
    return pa.table(rows).append_column("__op", pa.array(ops, pa.string()))


def _sorted_rows(t: pa.Table, cols) -> list:
    return sorted(zip(*[t.column(c).to_pylist() for c in cols]), key=repr)


def _feed(path: str, version: int) -> list:
    t = pa.table(DeltaTable(path).load_cdf(starting_version=version, ending_version=version).read_all())
    return _sorted_rows(t, ["k", "v", "_change_type"])


KEYED = {"k": pa.array([1, 2, 3, None, 5, 6], pa.int64()), "v": ["a", "b", "c", "null", "e", "f"]}
KEYED_CHANGES = _changes({"k": pa.array([2, 3, None, 9], pa.int64()), "v": ["B", "c", "NULL", "i"]},
                         ["upsert", "delete", "upsert", "upsert"])


def test_a_keyed_merge_equals_delta_rs_and_its_feed(tmp_path):
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    _target(ours, KEYED, files=3)
    shutil.copytree(ours, theirs)
    ref = DeltaTableRef(ours, own_log=True)
    assert ref.rewritable() is None
    version, m = rewrite.merge(ref, KEYED_CHANGES, ["k"], txn=Txn("q", 1), metadata={"batch_id": 1})
    v2, _ = DeltaTableRef(theirs).merge_by_key(KEYED_CHANGES, ["k"], txn=Txn("q", 1), metadata={"batch_id": 1})
    assert version == v2 == 3
    assert _sorted_rows(DeltaTable(ours).to_pyarrow_table(), ["k", "v"]) == \
        _sorted_rows(DeltaTable(theirs).to_pyarrow_table(), ["k", "v"]) == \
        sorted([(1, "a"), (2, "B"), (None, "NULL"), (5, "e"), (6, "f"), (9, "i")], key=repr)
    assert _feed(ours, 3) == _feed(theirs, 3) == sorted(
        [(2, "b", "update_preimage"), (2, "B", "update_postimage"), (3, "c", "delete"),
         (None, "null", "update_preimage"), (None, "NULL", "update_postimage"), (9, "i", "insert")], key=repr)
    assert (m["num_target_rows_updated"], m["num_target_rows_deleted"], m["num_target_rows_inserted"]) == (2, 1, 1)
    assert DeltaTable(ours).transaction_version("q") == 1
    # the file holding keys 5 and 6 only was left as it was
    assert m["num_target_files_removed"] == 2 and m["num_target_rows_copied"] == 1


def test_a_bag_merge_deletes_every_copy_and_appends(tmp_path):
    path = str(tmp_path / "bag")
    _target(path, {"k": pa.array([1, 1, 1, 2, 3], pa.int64()), "v": ["x", "x", "y", "z", None]}, files=2)
    ref = DeltaTableRef(path, own_log=True)
    changes = _changes({"k": pa.array([1, 3, 1, 4], pa.int64()), "v": ["x", None, "x", "w"]},
                       ["delete", "delete", "insert", "insert"])
    version, m = rewrite.merge(ref, changes, None, txn=Txn("q", 1), metadata={})
    assert _sorted_rows(DeltaTable(path).to_pyarrow_table(), ["k", "v"]) == \
        sorted([(1, "x"), (1, "y"), (2, "z"), (4, "w")], key=repr)
    assert _feed(path, version) == sorted([(1, "x", "delete"), (1, "x", "delete"), (3, None, "delete"),
                                           (1, "x", "insert"), (4, "w", "insert")], key=repr)


def test_delta_spark_reads_the_rewritten_table_and_its_feed(tmp_path, spark):
    path = str(tmp_path / "t")
    _target(path, KEYED, files=2)
    ref = DeltaTableRef(path, own_log=True)
    version, _ = commit_changes(ref, KEYED_CHANGES, unique_key=["k"], txn=Txn("q", 1), metadata={})[0], None
    rows = sorted(((r["k"], r["v"]) for r in spark.read.format("delta").load(path).collect()), key=repr)
    assert rows == sorted([(1, "a"), (2, "B"), (None, "NULL"), (5, "e"), (6, "f"), (9, "i")], key=repr)
    feed = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
            .option("endingVersion", version).load(path).collect())
    assert sorted(((r["k"], r["v"], r["_change_type"]) for r in feed), key=repr) == _feed(path, version)


@pytest.mark.parametrize("kind", ["partitioned", "check constraint"])
def test_tables_the_rewrite_does_not_enforce_keep_delta_rs_merge(tmp_path, kind):
    path = str(tmp_path / "t")
    if kind == "partitioned":
        _target(path, {**KEYED, "p": ["x"] * 6}, partition_by=["p"])
        changes = _changes({"k": pa.array([2], pa.int64()), "v": ["B"], "p": ["x"]}, ["upsert"])
    else:
        _target(path, KEYED)
        DeltaTable(path).alter.add_constraint({"v_set": "v IS NOT NULL"})
        changes = _changes({"k": pa.array([2], pa.int64()), "v": ["B"]}, ["upsert"])
    ref = DeltaTableRef(path, own_log=True)
    assert ref.rewritable() is not None
    version, _, _ = commit_changes(ref, changes, unique_key=["k"], txn=Txn("q", 1), metadata={})
    assert DeltaTable(path).history(1)[0]["operation"] == "MERGE"
    assert DeltaTable(path).history(1)[0].get("engineInfo", "").startswith("delta-rs")
    assert ("B" in DeltaTable(path).to_pyarrow_table().column("v").to_pylist())


def test_a_change_touching_more_rows_than_the_driver_rewrites_goes_to_delta_rs(tmp_path, monkeypatch):
    from consistent_stream import settings
    path = str(tmp_path / "t")
    _target(path, KEYED)
    monkeypatch.setattr(settings, "REWRITE_ROWS", 5)   # the one file holds 6 rows
    ref = DeltaTableRef(path, own_log=True)
    assert ref.rewritable() is None
    version, _, _ = commit_changes(ref, KEYED_CHANGES, unique_key=["k"], txn=Txn("q", 1), metadata={})
    assert DeltaTable(path).history(1)[0].get("engineInfo", "").startswith("delta-rs")
    assert _sorted_rows(DeltaTable(path).to_pyarrow_table(), ["k", "v"]) == \
        sorted([(1, "a"), (2, "B"), (None, "NULL"), (5, "e"), (6, "f"), (9, "i")], key=repr)


def test_mostly_distinct_columns_are_written_plain_and_repeated_ones_as_a_dictionary(tmp_path):
    """A rewritten file's keys and prices are encoded plain (pyarrow's dictionary of a
    mostly-distinct column is hashed whole, then abandoned), its repeated flags as a
    dictionary; the rows read back the same."""
    import pyarrow.parquet as pq
    from consistent_stream.delta.files import write_arrow
    n = 30_000
    t = pa.table({"k": pa.array(range(n), pa.int64()), "flag": pa.array(["A", "N", "R"] * (n // 3)),
                  "price": pa.array([i * 0.25 for i in range(n)])})
    f = write_arrow(str(tmp_path), "part-x", t)
    md = pq.read_metadata(str(tmp_path / f.path))
    encodings = {md.schema.column(i).name: md.row_group(0).column(i).encodings for i in range(md.num_columns)}
    assert not any("DICTIONARY" in e for e in encodings["k"] + encodings["price"]), encodings
    assert any("DICTIONARY" in e for e in encodings["flag"]), encodings
    assert pq.read_table(str(tmp_path / f.path)).equals(t)


def test_merges_batch_after_batch_read_the_file_the_previous_one_wrote_from_memory(tmp_path):
    """The file a MERGE wrote is held (``delta.files.HELD``) and is what the next MERGE of the
    process reads; the files a MERGE removed are let go; the rows and the feed are delta-rs'
    MERGE's of the same changes, batch after batch."""
    import pyarrow.parquet as pq
    from consistent_stream.delta.files import HELD
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    _target(ours, KEYED, files=2)
    shutil.copytree(ours, theirs)
    ref, other = DeltaTableRef(ours, own_log=True), DeltaTableRef(theirs)
    rounds = [KEYED_CHANGES,
              _changes({"k": pa.array([9, 1, 7], pa.int64()), "v": ["I", "a", "g"]}, ["upsert", "delete", "upsert"]),
              _changes({"k": pa.array([7, None], pa.int64()), "v": ["G", None]}, ["upsert", "delete"])]
    written: list = []
    for i, changes in enumerate(rounds, 1):
        version, m = rewrite.merge(ref, changes, ["k"], txn=Txn("q", i), metadata={})
        v2, _ = other.merge_by_key(changes, ["k"], txn=Txn("q", i), metadata={})
        assert version == v2
        assert _sorted_rows(DeltaTable(ours).to_pyarrow_table(), ["k", "v"]) == \
            _sorted_rows(DeltaTable(theirs).to_pyarrow_table(), ["k", "v"])
        assert _feed(ours, version) == _feed(theirs, version)
        assert all(HELD.get(p, s) is None for p, s in written), "a removed file is still held"
        files = ref.data_files(version)
        written = [(ref.file_path(f.path), f.size) for f in files]
        held = [HELD.get(p, s) for p, s in written]
        assert all(t is not None for t in held) and m["num_target_files_added"] == 1
        assert pa.concat_tables(held).sort_by("k").equals(
            pa.concat_tables([pq.read_table(p) for p, _ in written]).sort_by("k"))
    assert _sorted_rows(DeltaTable(ours).to_pyarrow_table(), ["k", "v"]) == \
        sorted([(2, "B"), (5, "e"), (6, "f"), (9, "I"), (7, "G")], key=repr)


def test_rows_marked_deleted_take_their_pre_images_from_the_changelog_and_keys_are_held(tmp_path, monkeypatch):
    """A merge-on-read MERGE into a large file reads its key column once (then held,
    ``delta.files.HELD_KEYS``), and takes the feed's pre-images of the rows it marks from the
    changelog's retractions where they hold every matched key, reading the file by position
    only where they do not: the second MERGE runs with the file's bytes gone."""
    from consistent_stream.delta.files import HELD_KEYS
    path, n, ref, big = _one_large_file(tmp_path, monkeypatch)
    changes = _changes({"k": pa.array([3, 7], pa.int64()), "v": ["X", None]}, ["upsert", "delete"])
    # the retractions lack key 7: its pre-image is read from the file; key 3's is the changelog's
    retracted = pa.table({"k": pa.array([3], pa.int64()), "v": ["v3 as the view had it"]})
    v1, m = rewrite.merge(ref, changes, ["k"], txn=Txn("q", 1), metadata={}, deletion_vectors=True,
                          retracted=retracted)
    assert m["num_target_deletion_vectors_added"] == 1 and m["num_target_rows_copied"] == 0
    assert _feed(path, v1) == sorted([(3, "v3 as the view had it", "update_preimage"), (3, "X", "update_postimage"),
                                      (7, "v7", "delete")], key=repr)
    assert HELD_KEYS.get(ref.file_path(big.path), big.size) is not None
    with open(ref.file_path(big.path), "r+b") as f:   # the file's bytes are not read again
        f.truncate(0)
    changes = _changes({"k": pa.array([4, 150], pa.int64()), "v": ["Y", None]}, ["upsert", "delete"])
    retracted = pa.table({"k": pa.array([150, 4], pa.int64()), "v": ["v150", "v4"]})
    v2, m = rewrite.merge(ref, changes, ["k"], txn=Txn("q", 2), metadata={}, deletion_vectors=True,
                          retracted=retracted)
    assert m["num_target_deletion_vectors_added"] == 1 and m["num_target_rows_deleted"] == 1
    assert _feed(path, v2) == sorted([(4, "v4", "update_preimage"), (4, "Y", "update_postimage"),
                                      (150, "v150", "delete")], key=repr)
    marked = [f for f in ref.data_files(v2) if f.path == big.path]
    assert len(marked) == 1 and marked[0].live_records == n - 4


def test_a_new_process_probes_a_large_file_by_the_keys_this_machine_kept(tmp_path, monkeypatch):
    """A MERGE in a new process (nothing held in memory: ``HELD_KEYS.clear()``) finds the
    rows to mark in a large file by the key column this machine kept when an earlier MERGE read
    it (``local_cache.DATA_KEYS``), without reading the file: here its bytes are gone, and the
    changelog's retractions give every pre-image. Without kept keys
    (``CONSISTENT_STREAM_DATA_CACHE_MB=0``) the same MERGE reads the file."""
    from consistent_stream.delta.files import HELD_KEYS
    path, n, ref, big = _one_large_file(tmp_path, monkeypatch)
    rewrite.merge(ref, _changes({"k": pa.array([3], pa.int64()), "v": ["X"]}, ["upsert"]), ["k"], txn=Txn("q", 1),
                  metadata={}, deletion_vectors=True, retracted=pa.table({"k": pa.array([3], pa.int64()), "v": ["v3"]}))
    HELD_KEYS.clear()
    saved = open(ref.file_path(big.path), "rb").read()
    with open(ref.file_path(big.path), "r+b") as f:   # the file's bytes are not read again
        f.truncate(0)
    changes = _changes({"k": pa.array([4, 150], pa.int64()), "v": ["Y", None]}, ["upsert", "delete"])
    retracted = pa.table({"k": pa.array([150, 4], pa.int64()), "v": ["v150", "v4"]})
    monkeypatch.setenv("CONSISTENT_STREAM_DATA_CACHE_MB", "0")
    with pytest.raises(pa.ArrowInvalid, match="size is 0 bytes"):   # the file, read again
        rewrite.merge(ref, changes, ["k"], txn=Txn("q", 2), metadata={}, deletion_vectors=True, retracted=retracted)
    monkeypatch.delenv("CONSISTENT_STREAM_DATA_CACHE_MB")
    HELD_KEYS.clear()
    v2, m = rewrite.merge(ref, changes, ["k"], txn=Txn("q", 2), metadata={}, deletion_vectors=True,
                          retracted=retracted)
    assert m["num_target_deletion_vectors_added"] == 1 and m["num_target_rows_deleted"] == 1
    assert _feed(path, v2) == sorted([(4, "v4", "update_preimage"), (4, "Y", "update_postimage"),
                                      (150, "v150", "delete")], key=repr)
    with open(ref.file_path(big.path), "wb") as f:
        f.write(saved)
    got = DeltaTableRef(path).read_snapshot_arrow(v2)
    assert dict(zip(got.column("k").to_pylist(), got.column("v").to_pylist())) == \
        {**{k: f"v{k}" for k in range(n) if k != 150}, 3: "X", 4: "Y"}


def test_held_files_are_bounded_least_recently_used_first_and_known_by_size(monkeypatch):
    from consistent_stream.delta import files
    held = files.HeldFiles()
    t = pa.table({"k": pa.array(range(1000), pa.int64())})   # 8,000 bytes
    monkeypatch.setattr(files, "HELD_BYTES", 20_000)
    held.put("/t/a.parquet", 10, t)
    held.put("/t/b.parquet", 10, t)
    assert held.get("/t/a.parquet", 10) is t   # a is now the most recently used
    held.put("/t/c.parquet", 10, t)
    assert held.get("/t/b.parquet", 10) is None and held.get("/t/a.parquet", 10) is t
    assert held.get("/t/a.parquet", 11) is None   # another size: another file
    held.put("/t/big.parquet", 10, pa.concat_tables([t] * 3))   # larger than the bound: not kept
    assert held.get("/t/big.parquet", 10) is None and held.get("/t/c.parquet", 10) is not None
    held.drop(["/t/a.parquet"])
    assert held.get("/t/a.parquet", 10) is None


def test_a_data_file_without_a_column_the_table_has_is_named(tmp_path):
    from consistent_stream.delta.files import read_whole, write_arrow
    f = write_arrow(str(tmp_path), "part-x", pa.table({"k": [1]}))
    for hold in (False, True):
        with pytest.raises(pa.ArrowInvalid, match=r"data file .*part-x/.*\.parquet.*\bv\b"):
            read_whole([str(tmp_path / f.path)], [f.size], ["k", "v"], hold=hold)
