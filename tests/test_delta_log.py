"""The state table's log replayed and committed by this package (consistent_stream.delta.log):
its commits and checkpoints are a Delta table delta-rs and delta-spark read as it says, a
commit another writer made meanwhile is taken in when it changes no data and refused
otherwise, and a reopened log (from its checkpoint) says what the committing one said."""
from __future__ import annotations

import os
import shutil
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from consistent_stream import storage
from consistent_stream.delta import DeltaTableRef, Txn
from consistent_stream.delta.files import write_arrow
from consistent_stream.delta.checkpoint_rows import CHECKPOINT_SCHEMA, checkpoint_table, file_key
from consistent_stream.delta.log import MAX_BEHIND, OwnedLog, log_path, settle
from consistent_stream.local_cache import Kept
from consistent_stream.errors import CommitError

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("__arrangement", pa.string())])


def _file(root: str, name: str, keys: list[int]):
    data = pa.table({"k": pa.array(keys, pa.int64()), "s": [f"v{k}" for k in keys]})
    return write_arrow(root, f"__arrangement={name}/delta-{keys[0]}", data, {"__arrangement": name})


def _commit(ref: DeltaTableRef, adds, removes, batch: int, **kw) -> int:
    return ref.commit_files(adds, removes, schema=SCHEMA, txn=Txn("q", batch), metadata={"batch_id": batch},
                            partition_by=["__arrangement"], **kw)


def _rows(table) -> list[tuple]:
    return sorted(zip(*[table.column(c).to_pylist() for c in ("k", "s", "__arrangement")]))


def test_commits_and_checkpoints_read_the_same_in_delta_rs_and_delta_spark(tmp_path, spark):
    root = str(tmp_path / "state")
    ref = DeltaTableRef(root, own_log=True)
    assert not ref.exists()
    rows = {}   # live file -> its rows

    def add(name, keys):
        f = _file(root, name, keys)
        rows[f.path] = [(k, f"v{k}", name) for k in keys]
        return f
    live = [add("a", [1, 2]), add("b", [3])]
    assert _commit(ref, live, [], 0, configuration={"delta.checkpointInterval": "3"}) == 0
    for batch in range(1, 8):
        new = add("ab"[batch % 2], [10 * batch, 10 * batch + 1])
        gone = [live.pop(0)] if batch % 2 == 0 else []
        for f in gone:
            del rows[f.path]
        live.append(new)
        assert _commit(ref, [new], gone, batch) == batch
        assert ref.txn_version("q") == batch
    settle()   # (a checkpoint is written after its commit returns)
    names = os.listdir(os.path.join(root, "_delta_log"))
    assert {"00000000000000000003.checkpoint.parquet", "00000000000000000006.checkpoint.parquet",
            "_last_checkpoint"} <= set(names)
    want = sorted(r for rs in rows.values() for r in rs)

    dt = DeltaTable(root)
    assert dt.version() == 7 and dt.transaction_version("q") == 7
    assert _rows(dt.to_pyarrow_table()) == want
    assert sorted(f.path for f in ref.data_files(7)) == sorted(pa.table(dt.get_add_actions(flatten=True))
                                                               .column("path").to_pylist())
    # delta-spark reads the log from our checkpoint at 6, then commit 7
    df = spark.read.format("delta").load(root)
    assert sorted((r["k"], r["s"], r["__arrangement"]) for r in df.collect()) == want

    again = DeltaTableRef(root, own_log=True)
    assert again.exists() and again.version() == 7 and again.txn_version("q") == 7
    assert again.replayed_log().checkpoint_version == 6
    assert sorted(f.path for f in again.data_files(7)) == sorted(f.path for f in ref.data_files(7))
    assert again.commit_at(7).metadata["batch_id"] == "7"


def test_a_commit_that_changes_no_data_is_taken_in_and_a_data_commit_refused(tmp_path):
    root = str(tmp_path / "state")
    ref = DeltaTableRef(root, own_log=True)
    _commit(ref, [_file(root, "a", [1])], [], 0)
    # table maintenance with delta-rs (a property): version 1, no data change
    DeltaTable(root).alter.set_table_properties({"delta.checkpointInterval": "5"})
    assert _commit(ref, [_file(root, "a", [2])], [], 1) == 2
    assert ref.version() == 2 and ref.txn_version("q") == 1
    # another writer's data: version 3; our commit is refused and writes nothing
    write_deltalake(root, pa.table({"k": pa.array([9], pa.int64()), "s": ["x"], "__arrangement": ["a"]}),
                    mode="append")
    with pytest.raises(CommitError, match="version 3 was committed by another writer"):
        _commit(ref, [_file(root, "a", [3])], [], 2)
    assert DeltaTable(root).version() == 3 and DeltaTable(root).transaction_version("q") == 1


def test_the_targets_version_checksums_are_what_delta_spark_computes(tmp_path, spark, monkeypatch):
    """A table committed with ``checksums=True`` (a model's target) has a version checksum
    per commit that delta-spark takes its protocol and metadata from and validates against its
    own state reconstruction, also after a reopen from a checkpoint and after files are
    removed; delta-spark then commits on top of it (its own checksum follows from ours)."""
    import json
    monkeypatch.setenv("CONSISTENT_STREAM_LOCAL_CACHE", "off")   # (reopened from the checkpoint, not a local copy)
    root = str(tmp_path / "target")
    ref = DeltaTableRef(root, own_log=True, checksums=True)
    live = [_file(root, "a", [1, 2]), _file(root, "b", [3])]
    _commit(ref, live, [], 0, configuration={"delta.checkpointInterval": "3"})
    for batch in range(1, 5):
        new = _file(root, "ab"[batch % 2], [10 * batch])
        _commit(ref, [new], [live.pop(0)] if batch % 2 == 0 else [], batch)
        live.append(new)
    again = DeltaTableRef(root, own_log=True, checksums=True)   # replayed from the checkpoint at 3
    assert again.exists() and again.replayed_log().checkpoint_version == 3
    _commit(again, [_file(root, "a", [99])], [live.pop(0)], 5)
    settle()   # (a checksum is written after its commit returns)
    log_dir = os.path.join(root, "_delta_log")
    crc = json.loads(open(os.path.join(log_dir, "00000000000000000005.crc")).read())
    adds = pa.table(DeltaTable(root).get_add_actions(flatten=True))
    assert crc["numFiles"] == adds.num_rows and crc["tableSizeBytes"] == sum(adds.column("size_bytes").to_pylist())
    assert all(os.path.exists(os.path.join(log_dir, f"{v:020d}.crc")) for v in range(1, 6))

    jlog = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, root)
    snap = jlog.unsafeVolatileSnapshot()
    assert snap.version() == 5 and snap.checksumOpt().isDefined()
    assert snap.validateChecksum(getattr(snap, "validateChecksum$default$1")())
    spark.createDataFrame([(7, "v7", "a")], "k long, s string, __arrangement string") \
        .write.format("delta").mode("append").save(root)
    assert os.path.exists(os.path.join(log_dir, "00000000000000000006.crc"))
    assert spark.read.format("delta").load(root).count() == DeltaTable(root).to_pyarrow_table().num_rows


def _add(f) -> dict:
    return {"path": log_path(f.path), "partitionValues": dict(f.partition_values), "size": int(f.size),
            "modificationTime": 1, "dataChange": True, "stats": f.stats}


def _set_fields(value):
    """``value`` with the None fields of its dicts left out (recursively)."""
    if isinstance(value, dict):
        return {k: _set_fields(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return type(value)(_set_fields(v) for v in value)
    return value


def _replay(root: str, *, copy: bool, from_copy: bool = False) -> OwnedLog:
    own = OwnedLog(root, copy=copy)
    assert own.load() and own.from_copy == from_copy
    return own


def same(a: OwnedLog, b: OwnedLog) -> None:
    """``a`` and ``b`` hold the same replay."""
    # (a checkpoint's row has its absent fields as NULLs, a commit's JSON leaves them out)
    def held(o: OwnedLog):
        return _set_fields((o.version, o.files, o.txns, o.protocol, o.metadata, set(o.tombstones)))
    assert held(a) == held(b)


def test_a_log_reopened_from_its_local_copy_equals_one_replayed_from_the_table(tmp_path, monkeypatch):
    """The local copy (consistent_stream.local_cache) is used only while it is the
    table's: reopened from it, a log says what a replay from the checkpoint says, with the
    commits made since by others read on top; a table dropped and made again at the same path
    (same version, other commit) and a copy too far behind are misses."""
    monkeypatch.setenv("CONSISTENT_STREAM_CACHE_DIR", str(tmp_path / "cache"))
    root = str(tmp_path / "state")
    ref = DeltaTableRef(root, own_log=True)
    _commit(ref, [_file(root, "a", [1, 2])], [], 0, configuration={"delta.checkpointInterval": "3"})
    writer = OwnedLog(root, copy=True)
    assert writer.load() and writer.version == 0
    copy = Kept("delta-logs", root)
    assert copy.read() is not None
    for batch in range(1, 5):
        new = _file(root, "b", [10 * batch])
        gone = [{"path": p, "dataChange": True,
                 "deletionTimestamp": int(time.time() * 1000)} for p in list(writer.files)[:1]]
        writer.commit([_add(new)], gone, txn=("q", batch), info={"operation": "WRITE"})
    writer.flush()   # (a commit's copy is written on the checksums' thread)
    assert OwnedLog(root, copy=True).kept_head().version == 4
    assert copy.read()["log"]["checkpoint_version"] == 3   # (the checkpoint written after the commit at 3)

    reopened = _replay(root, copy=True, from_copy=True)
    same(reopened, _replay(root, copy=False))
    assert reopened.commits[4].txns == {"q": 4}   # commits kept (the checkpoint at 3 has none)
    # a property set by delta-rs after the copy: read on top of it
    DeltaTable(root).alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    reopened = _replay(root, copy=True, from_copy=True)
    same(reopened, _replay(root, copy=False))
    assert reopened.version == 5 and reopened.configuration["delta.logRetentionDuration"] == "interval 30 days"

    # dropped and made again (by a writer keeping no copy, as another machine would): the
    # copy's version has another commit -> replayed from the table
    shutil.rmtree(root)
    monkeypatch.setenv("CONSISTENT_STREAM_LOCAL_CACHE", "off")
    ref = DeltaTableRef(root, own_log=True)
    monkeypatch.delenv("CONSISTENT_STREAM_LOCAL_CACHE")
    _commit(ref, [_file(root, "c", [7])], [], 0)
    for batch in range(1, 6):
        _commit(ref, [_file(root, "c", [7 + batch])], [], batch)
    assert copy.read()["log"]["version"] == 5
    reopened = _replay(root, copy=True)
    same(reopened, _replay(root, copy=False))
    assert {f["partitionValues"]["__arrangement"] for f in reopened.files.values()} == {"c"}

    # more than MAX_BEHIND commits since the copy: replayed from the checkpoint
    for batch in range(6, 6 + MAX_BEHIND + 1):
        _commit(ref, [_file(root, "c", [100 + batch])], [], batch)
    reopened = _replay(root, copy=True)
    same(reopened, _replay(root, copy=False))
    assert _replay(root, copy=True, from_copy=True).version == 6 + MAX_BEHIND   # (the miss wrote it again)
    # a torn copy is no copy
    copy.file.write_text('{"format": 1, "tab')
    same(_replay(root, copy=True), _replay(root, copy=False))


def test_tombstones_past_their_retention_leave_the_replay_at_a_checkpoint(tmp_path, monkeypatch):
    """A checkpoint leaves out the removes older than ``delta.deletedFileRetentionDuration``
    (as Delta's do), and the committing replay drops them too: it holds what a replay from the
    checkpoint holds, and its local copy does not grow with every file a long run removed."""
    monkeypatch.setenv("CONSISTENT_STREAM_CACHE_DIR", str(tmp_path / "cache"))
    root = str(tmp_path / "state")
    ref = DeltaTableRef(root, own_log=True)
    _commit(ref, [_file(root, "a", [1])], [], 0, configuration={
        "delta.checkpointInterval": "4", "delta.deletedFileRetentionDuration": "interval 1 hours"})
    writer = OwnedLog(root, copy=True)
    assert writer.load()
    now_ms = int(time.time() * 1000)
    for batch, age_ms in zip(range(1, 4), (3 * 3600_000, 2 * 3600_000, 0)):   # removed 3 h, 2 h and 0 h ago
        gone = [{"path": p, "dataChange": True, "deletionTimestamp": now_ms - age_ms} for p in writer.files]
        writer.commit([_add(_file(root, "a", [10 * batch]))], gone, txn=("q", batch), info={"operation": "WRITE"})
    assert len(writer.tombstones) == 3
    writer.commit([_add(_file(root, "a", [40]))], [], txn=("q", 4), info={"operation": "WRITE"})   # checkpoint at 4
    writer.flush()
    assert [r["deletionTimestamp"] for r in writer.tombstones.values()] == [now_ms]
    assert len(_replay(root, copy=True, from_copy=True).tombstones) == 1   # (the copy's journal says so)
    from_checkpoint = _replay(root, copy=False)
    assert from_checkpoint.checkpoint_version == 4
    assert set(from_checkpoint.tombstones) == set(writer.tombstones)


def test_a_commit_appends_to_the_local_copys_journal_and_a_reopened_log_replays_it(tmp_path, monkeypatch):
    """A commit adds its actions to the local copy's journal instead of writing the whole replay
    again (a long run's target holds a week of tombstones); a log reopened from the copy replays
    the journal's entries of that copy in consecutive versions, up to a torn line, passing over
    those of another copy, and reads the rest from the table; a writer whose copy another
    handle replaced writes its own again; a commit bigger than the copy writes it whole."""
    monkeypatch.setenv("CONSISTENT_STREAM_CACHE_DIR", str(tmp_path / "cache"))
    root = str(tmp_path / "target")
    ref = DeltaTableRef(root, own_log=True)
    _commit(ref, [_file(root, "a", [i]) for i in range(80)], [], 0, configuration={"delta.checkpointInterval": "1000"})
    writer = OwnedLog(root, copy=True)
    assert writer.load()
    copy = Kept("delta-logs", root)
    document = copy.file.read_bytes()

    def batch(n: int) -> None:
        gone = [{"path": p, "dataChange": True, "deletionTimestamp": int(time.time() * 1000)}
                for p in list(writer.files)[:1]]
        writer.commit([_add(_file(root, "a", [n]))], gone, txn=("q", n), info={"operation": "WRITE"})
        writer.flush()

    for n in range(1, 5):
        batch(n)
    assert copy.file.read_bytes() == document   # (not written again)
    assert [e["version"] for e in copy.read_journal()] == [1, 2, 3, 4]
    read = []
    real_read_many = storage.read_many
    monkeypatch.setattr(storage, "read_many", lambda paths, *a: read.extend(paths) or real_read_many(paths, *a))
    reopened = _replay(root, copy=True, from_copy=True)
    assert read == []   # (every commit from the copy)
    same(reopened, _replay(root, copy=False))
    assert reopened.commits[4].txns == {"q": 4} and reopened.commits[4].removed

    # a torn last line: the entries before it, and the commit it held read from the table
    copy.journal.write_bytes(copy.journal.read_bytes()[:-20])
    assert [e["version"] for e in copy.read_journal()] == [1, 2, 3]
    read.clear()
    same(_replay(root, copy=True, from_copy=True), _replay(root, copy=False))
    assert [p.rsplit("/", 1)[1] for p in read[:1]] == [f"{4:020d}.json"]

    # the copy replaced by another handle (its document gone, written again by a new replay):
    # the first writer sees another document on disk (its stamp) and writes its own again
    # rather than entries the new document's readers would pass over
    writer = _replay(root, copy=True, from_copy=True)
    copy.drop()
    _replay(root, copy=True)
    for n in range(5, 7):
        batch(n)
    assert copy.read()["log"]["version"] == 5 and [e["version"] for e in copy.read_journal()] == [6]
    # an entry of another copy (appended by a process that missed a replacement) is passed over
    copy.append({"copy": "another", "version": 7, "tag": "x", "actions": []})
    read.clear()
    reopened = _replay(root, copy=True, from_copy=True)
    assert read == []
    same(reopened, _replay(root, copy=False))
    assert reopened.version == 6

    # a commit with more actions than the copy holds writes it whole
    writer = reopened
    many = [_add(_file(root, "b", [100 + i])) for i in range(40)]
    writer.commit(many, [], txn=("q", 7), info={"operation": "WRITE"})
    writer.flush()
    assert copy.read()["log"]["version"] == 7 and copy.read_journal() == []
    same(_replay(root, copy=True, from_copy=True), _replay(root, copy=False))


def test_a_checkpoint_table_holds_every_action_as_the_log_does():
    """The checkpoint's columns, built field by field, hold what Arrow builds from the actions
    row by row: maps as pairs, a deletion vector, tags, a protocol with table features, the
    fields a commit leaves out as NULLs, a field the schema does not know left out."""
    dv = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1, "sizeInBytes": 36,
          "cardinality": 2}
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["appendOnly", "invariants", "deletionVectors"]}
    metadata = {"id": "m", "format": {"provider": "parquet", "options": {}}, "schemaString": "{}",
                "partitionColumns": ["p"], "configuration": {"delta.checkpointInterval": "4"}, "createdTime": 7}
    txns = [{"appId": "q", "version": 3, "lastUpdated": 9}, {"appId": "r", "version": 1}]
    files = [{"path": "p=1/a.parquet", "partitionValues": {"p": "1"}, "size": 10, "modificationTime": 1,
              "dataChange": True, "stats": '{"numRecords":2}', "tags": {"t": "x"}, "deletionVector": dv},
             {"path": "b.parquet", "partitionValues": {}, "size": 11, "modificationTime": 2, "dataChange": False,
              "baseRowId": 5}]
    tombstones = [{"path": "c.parquet", "deletionTimestamp": 5, "dataChange": True},
                  {"path": "p=1/a.parquet", "deletionTimestamp": 6, "dataChange": True, "extendedFileMetadata": True,
                   "partitionValues": {"p": "1"}, "size": 10, "deletionVector": dict(dv, offset=None)}]

    def pairs(action: dict, *names: str) -> dict:
        return {k: (list(v.items()) if k in names and isinstance(v, dict) else v) for k, v in action.items()}
    rows = ([{"protocol": protocol}, {"metaData": {**pairs(metadata, "configuration"),
                                                  "format": {"provider": "parquet", "options": []}}}]
            + [{"txn": t} for t in txns] + [{"add": pairs(a, "partitionValues", "tags")} for a in files]
            + [{"remove": pairs(r, "partitionValues")} for r in tombstones])
    want = pa.Table.from_pylist(rows, schema=CHECKPOINT_SCHEMA)
    got = checkpoint_table(protocol, metadata, txns, files, tombstones)
    assert got.schema == CHECKPOINT_SCHEMA and got.to_pylist() == want.to_pylist()


def test_a_checkpoint_is_an_entry_of_the_local_copys_journal(tmp_path, monkeypatch):
    """A commit that writes a checkpoint adds an entry to the journal too (the copy is not
    written whole at every checkpoint, every four commits on an object store), with the floor
    below which the checkpoint dropped tombstones: a log reopened from the copy drops them too
    (at the last checkpoint's entry alone, the floors never falling) and holds what the replay
    from the checkpoint holds, an old tombstone made after the last checkpoint kept."""
    monkeypatch.setenv("CONSISTENT_STREAM_CACHE_DIR", str(tmp_path / "cache"))
    root = str(tmp_path / "target")
    ref = DeltaTableRef(root, own_log=True)
    _commit(ref, [_file(root, "a", [i]) for i in range(90)], [], 0, configuration={
        "delta.checkpointInterval": "2", "delta.deletedFileRetentionDuration": "interval 1 hours"})
    writer = OwnedLog(root, copy=True)
    assert writer.load()
    copy = Kept("delta-logs", root)
    document = copy.file.read_bytes()
    now_ms = int(time.time() * 1000)
    old_ms, removed = 3 * 3600_000, []
    for n, age_ms in zip(range(1, 6), (old_ms, 0, old_ms, 0, old_ms)):   # removed 3 h ago or just now
        gone = [{"path": list(writer.files)[0], "dataChange": True, "deletionTimestamp": now_ms - age_ms}]
        removed.append(gone[0]["path"])
        writer.commit([_add(_file(root, "a", [100 + n]))], gone, txn=("q", n), info={"operation": "WRITE"})
    writer.flush()
    assert copy.file.read_bytes() == document
    entries = copy.read_journal()
    assert [e["version"] for e in entries] == [1, 2, 3, 4, 5]
    assert ["checkpoint" in e for e in entries] == [False, True, False, True, False]
    # the old ones of commits 1 and 3 expired at the checkpoints at 2 and 4; commit 5's is kept
    assert sorted(k[0] for k in writer.tombstones) == sorted([removed[1], removed[3], removed[4]])
    reopened = _replay(root, copy=True, from_copy=True)
    assert reopened.checkpoint_version == 4 and set(reopened.tombstones) == set(writer.tombstones)
    from_checkpoint = _replay(root, copy=False)
    assert from_checkpoint.checkpoint_version == 4
    same(reopened, from_checkpoint)


def test_a_checkpoints_removes_built_from_the_last_one_are_the_replays_tombstones(tmp_path):
    """The remove column a checkpoint builds from the previous checkpoint's (the rows expired or
    replaced since dropped, the tombstones made since appended) holds exactly the replay's
    tombstones, which equal a replay's from that checkpoint: random commits of adds, removes
    of live and of removed files (a path removed again, a file re-added, a deletion vector's
    remove and add), removes of several ages around the retention (some kept by one checkpoint
    and expired by the next)."""
    import random
    rnd = random.Random(7)
    root = str(tmp_path / "t")
    os.makedirs(os.path.join(root, "_delta_log"))
    log = OwnedLog(root, copy=False)
    log.load()
    meta = {"id": "m", "format": {"provider": "parquet", "options": {}}, "schemaString": "{}", "partitionColumns": [],
            "configuration": {"delta.checkpointInterval": "2",
                              "delta.deletedFileRetentionDuration": "interval 1 hours"}}
    log.commit([], [], txn=None, info={}, table=[{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
                                                  {"metaData": meta}])
    paths = [f"f{i}.parquet" for i in range(30)]

    def add(path, dv=None):
        a = {"path": path, "partitionValues": {}, "size": 1, "modificationTime": 1, "dataChange": True}
        return dict(a, deletionVector=dv) if dv else a
    checkpoints = 0
    for n in range(1, 41):
        now = int(time.time() * 1000)
        adds, removes = [], []
        for path in rnd.sample(paths, 4):
            live = log.files.get(path)
            # (the retention less 40 ms: kept by this checkpoint, expired by the next one)
            age = rnd.choice([0, 20 * 60_000, 3600_000 - 40, 2 * 3600_000])
            if live is None:
                adds.append(add(path))
            elif rnd.random() < 0.3:   # rows of it marked deleted: its vector's remove and add
                dv = {"storageType": "i", "pathOrInlineDv": f"v{n}{path}", "sizeInBytes": 4, "cardinality": 1}
                removes.append({**live, "deletionTimestamp": now - age, "dataChange": True})
                adds.append(add(path, dv))
            else:
                removes.append({"path": path, "deletionTimestamp": now - age, "dataChange": True,
                                **({"deletionVector": live["deletionVector"]} if live.get("deletionVector") else {})})
        log.commit(adds, removes, txn=("q", n), info={})
        time.sleep(0.05)
        if n % 2 == 0:
            log.flush()
            checkpoints += 1
            written = pq.read_table(os.path.join(root, "_delta_log", f"{log.version:020d}.checkpoint.parquet"))
            rows = [r for r in written.column("remove").to_pylist() if r is not None]
            assert sorted((file_key(r), r["deletionTimestamp"]) for r in rows) == \
                sorted((k, r["deletionTimestamp"]) for k, r in log.tombstones.items())
            again = OwnedLog(root, copy=False)
            again.load()
            assert again.checkpoint_version == log.version and set(again.tombstones) == set(log.tombstones)
    assert checkpoints == 20 and log._removes is not None   # (the column was kept, not built again)
