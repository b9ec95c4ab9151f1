"""A run that goes on from a cut reads its Delta sources' change from the log's tail, without
opening them (consistent_stream.delta.tail): inserts, updates and deletes, whole files
removed, OPTIMIZE, partitioned tables; and opens the table instead for what the tail does not
read (a schema change); and tells the table the cut read from one created again under its path
by the cut version's commit file, read only when its write tag is not the one the cut
recorded. Every run equals batch evaluation (Scenario.run's central check)."""
from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import consistent_stream.delta.reader as delta_reader
import consistent_stream.delta.tail as delta_tail
from consistent_stream.delta import DeltaTableRef
from consistent_stream.job import run_job
from consistent_stream.runtime import BatchMeta
from scenario import CDF, Scenario

SQL = "select g, count(*) as n, sum(v) as s from src.t group by g"


@pytest.fixture()
def opened(monkeypatch):
    """The paths delta-rs opened (a DeltaTable made for them) since the fixture began."""
    paths: list[str] = []
    real = delta_reader.DeltaTable

    class Counting(real):
        def __init__(self, path, *a, **k):
            paths.append(str(path))
            super().__init__(path, *a, **k)
    monkeypatch.setattr(delta_reader, "DeltaTable", Counting)
    return paths


def _run(sc, job, opened, path: str) -> dict:
    """Run ``job`` and check it against batch evaluation, and the source's row count its
    commit records for the next run against the table's; returns the run's summary with
    ``opened``: how many times the run itself opened the table at ``path``."""
    before = opened.count(path)
    summary = run_job(sc.spark, job)
    summary["opened"] = opened.count(path) - before
    sc.check(job)
    meta = BatchMeta.from_commit(DeltaTableRef(job.target_path).latest_commit())
    hint = meta.cut_offsets["source:src.t"]
    assert hint["version"] == meta.cut["src.t"]
    if hint["rows"] is not None:   # None: not known without opening the table (an overwrite's removed rows)
        assert hint["rows"] == DeltaTable(path, version=hint["version"]).to_pyarrow_table().num_rows, hint
    summary["rows_known"] = hint["rows"] is not None
    return summary


def _t(ks, gs, vs) -> pa.Table:
    return pa.table({"k": pa.array(ks, pa.int64()), "g": gs, "v": pa.array(vs, pa.int64())})


def test_inserts_updates_deletes_and_optimize_are_read_from_the_tail_without_opening_the_source(spark, tmp_path,
                                                                                                 opened):
    sc = Scenario(spark, tmp_path, {"t": _t([1, 2, 3], ["a", "a", "b"], [10, 20, 30])}, {"t": ["k"]})
    job = sc.job(SQL, "g")
    sc.run(job, full_refresh=True)
    src = sc.path("t")
    sc.insert("t", _t([4, 5], ["b", "c"], [40, 50]))            # an append: add files, no cdc
    r = _run(sc, job, opened, src)
    assert r["opened"] == 0 and r["rows_known"], r
    sc.update("t", {"v": "v + 1"}, "k = 1")                    # cdc files
    sc.delete("t", "k = 5")
    r = _run(sc, job, opened, src)
    assert r["opened"] == 0 and r["rows_known"], r
    DeltaTable(src).optimize.compact()                         # dataChange false: no change
    sc.insert("t", _t([6], ["a"], [60]))
    r = _run(sc, job, opened, src)
    assert r["opened"] == 0 and r["rows_known"], r
    write_deltalake(src, _t([7], ["d"], [70]), mode="overwrite")   # every file removed, one added
    summary = _run(sc, job, opened, src)
    assert summary["opened"] == 0 and summary["changes_read"] > 0 and summary["strategies"] == ["incremental"]


def test_a_partitioned_source_is_read_from_the_tail(spark, tmp_path, opened):
    sc = Scenario(spark, tmp_path, {}, {"t": ["k"]})
    src = sc.path("t")
    write_deltalake(src, _t([1, 2, 3], ["a", "a", "b"], [10, 20, 30]), partition_by=["g"], configuration=CDF)
    job = sc.job(SQL, "g")
    sc.run(job, full_refresh=True)
    sc.insert("t", _t([4], ["b"], [40]))
    sc.update("t", {"v": "0"}, "g = 'a'")
    assert _run(sc, job, opened, src)["opened"] == 0


def test_a_schema_change_in_the_tail_opens_the_table_and_goes_on(spark, tmp_path, opened):
    sc = Scenario(spark, tmp_path, {"t": _t([1, 2], ["a", "b"], [10, 20])}, {"t": ["k"]})
    job = sc.job(SQL, "g")
    sc.run(job, full_refresh=True)
    t = _t([3], ["a"], [30]).append_column("w", pa.array([1.5]))
    write_deltalake(sc.path("t"), t, mode="append", schema_mode="merge")   # a metaData action: a new column
    assert _run(sc, job, opened, sc.path("t"))["opened"] > 0             # opened, the change read by delta-rs
    sc.insert("t", _t([4], ["b"], [40]).append_column("w", pa.array([2.5])))
    assert _run(sc, job, opened, sc.path("t"))["opened"] == 0            # and the tail again from there


def test_the_cut_versions_commit_is_read_again_only_when_its_write_tag_changed(spark, tmp_path, opened, monkeypatch):
    sc = Scenario(spark, tmp_path, {"t": _t([1, 2], ["a", "b"], [10, 20])}, {"t": ["k"]})
    job = sc.job(SQL, "g")
    sc.run(job, full_refresh=True)
    src = sc.path("t")
    read: list[str] = []
    real = delta_tail.storage.read_many

    def recording(paths, name="read"):
        read.extend(paths)
        return real(paths, name)
    monkeypatch.setattr(delta_tail.storage, "read_many", recording)

    def cut_commit_read(version: int) -> bool:
        return f"{src}/_delta_log/{version:020d}.json" in read

    sc.insert("t", _t([3], ["a"], [30]))                       # v1; the rebuild's cut (v0) recorded no tag
    assert _run(sc, job, opened, src)["opened"] == 0 and cut_commit_read(0)
    for version in (1, 2):                                     # the cut's tag recorded from the tail's listing
        read.clear()
        sc.insert("t", _t([10 + version], ["b"], [version]))
        assert _run(sc, job, opened, src)["opened"] == 0 and not cut_commit_read(version)
    hint = BatchMeta.from_commit(DeltaTableRef(job.target_path).latest_commit()).cut_offsets["source:src.t"]
    assert hint["version"] == 3 and hint["commit_tag"]

    # the table created again under the path with as many versions and one more: other writes of
    # the same file names, told apart by the tag, then by the commit's time; the model is rebuilt
    shutil.rmtree(src)
    write_deltalake(src, _t([1, 2], ["c", "c"], [1, 2]), configuration=CDF)
    for k in range(3, 7):
        sc.insert("t", _t([k], ["c"], [k]))
    read.clear()
    sc.run(job)
    assert cut_commit_read(3)
