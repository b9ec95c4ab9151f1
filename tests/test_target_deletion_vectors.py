"""Targets whose incremental batches mark retracted rows in deletion vectors
(``consistent_stream.sink.rewrite`` with ``target_deletion_vectors``): every version equal to
batch evaluation and read alike by delta-spark (``VERSION AS OF``, its Change Data Feed),
delta-rs and the engine (``verify``, a ``ref()`` of the target); a file past the purge share
rewritten; the flag off writing plain files; and a run killed (SIGKILL) between writing a
vector file and the commit losing nothing, applying nothing twice, its vector file deleted by
maintenance."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from consistent_stream import settings
from consistent_stream.delta import DeltaTableRef
from consistent_stream.delta.deletion_vectors import FILE_PREFIX
from consistent_stream.job import run_job
from consistent_stream.sink.maintenance import vacuum_target
from consistent_stream.spec import JobSpec
from consistent_stream.verify import verify_target
from helpers import assert_target_equals_batch_evaluation

CDF = {"delta.enableChangeDataFeed": "true"}
ROOT = Path(__file__).resolve().parents[1]


def _source(path: str, n: int) -> None:
    k = np.arange(n, dtype=np.int64)
    write_deltalake(path, pa.table({"k": k, "g": k % 997, "x": k * 3}), configuration=CDF)


def _job(root: Path, name: str, sql: str, key: str, sources: list[dict], **config) -> JobSpec:
    return JobSpec.from_dbt(project_root=str(root), schema="dv", identifier=name, model_name=name, sql=sql,
                            sources=sources, config={"unique_key": key, "location_root": str(root / "targets"),
                                                     **config},
                            warehouse_dir=str(root / "wh"))


def _src(path: str) -> dict:
    return {"source_name": "src", "name": "t", "relation": "src.t", "meta": {"location": path, "primary_key": ["k"]}}


def _ref(root: Path, name: str) -> dict:
    return {"kind": "model", "name": name, "relation": f"dv.{name}", "schema": "dv", "identifier": name,
            "config": {"location_root": str(root / "targets")}}


def _actions(path: str) -> list[tuple[int, dict]]:
    """Every action of the table's commit files, with its version."""
    out = []
    for name in sorted(os.listdir(os.path.join(path, "_delta_log"))):
        if name.endswith(".json") and name[:20].isdigit():
            for line in Path(path, "_delta_log", name).read_text().splitlines():
                out.append((int(name[:20]), json.loads(line)))
    return out


def _rows(t: pa.Table, cols: list[str]) -> list:
    return sorted(zip(*[t.column(c).to_pylist() for c in cols]))


def _same_everywhere(spark, job: JobSpec, versions: range) -> None:
    """At each of ``versions``: delta-spark, delta-rs' scan and the engine's driver read give
    the same rows; ``verify`` (batch evaluation at that commit's cut) passes; and delta-spark's
    Change Data Feed of the version is the difference from the version before."""
    path, cols = job.target_path, None
    ref = DeltaTableRef(path)
    for v in versions:
        by_spark = spark.read.format("delta").option("versionAsOf", v).load(path)
        cols = by_spark.columns
        spark_rows = _rows(by_spark.toArrow(), cols)
        rs = QueryBuilder().register("t", DeltaTable(path, version=v)).execute("SELECT * FROM t").read_all()
        assert _rows(pa.table(rs), cols) == spark_rows, f"{job.model} version {v}: delta-rs"
        assert _rows(ref.read_snapshot_arrow(v), cols) == spark_rows, f"{job.model} version {v}: the engine"
        result = verify_target(spark, path, version=v)
        assert result.ok, f"{job.model} version {v}: {result}"
        if v > versions.start:
            before = _rows(spark.read.format("delta").option("versionAsOf", v - 1).load(path).toArrow(), cols)
            feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", v) \
                .option("endingVersion", v).load(path).toArrow()
            changed = [(tuple(r[c] for c in cols), r["_change_type"]) for r in feed.to_pylist()]
            plus = Counter(r for r, k in changed if k in ("insert", "update_postimage"))
            minus = Counter(r for r, k in changed if k in ("delete", "update_preimage"))
            assert minus - plus == Counter(before) - Counter(spark_rows) and \
                plus - minus == Counter(spark_rows) - Counter(before), \
                f"{job.model} version {v}: the Change Data Feed is not the difference"


def test_targets_with_deletion_vectors_read_alike_everywhere_and_purge(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "DV_MIN_ROWS", 100)   # the tests' files are small
    src = str(tmp_path / "src" / "t")
    _source(src, 30_000)
    # batches of a sixth of the rows stay incremental (not recomputed), to reach the purge
    rows = _job(tmp_path, "rows", "SELECT k, g, x FROM src.t WHERE x % 7 <> 3", "k", [_src(src)],
                state_file_rows=10_000, recompute_threshold=0.9)
    groups = _job(tmp_path, "groups", "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM src.t GROUP BY g", "g",
                  [_src(src)], state_file_rows=400, recompute_threshold=0.9)
    jobs = [rows, groups]
    for job in jobs:
        run_job(spark, job)
    first = {job.model: DeltaTable(job.target_path).version() for job in jobs}
    by_g = _job(tmp_path, "by_g", "SELECT g % 10 AS d, COUNT(*) AS n, SUM(x) AS s FROM dv.rows GROUP BY g % 10",
                "d", [_ref(tmp_path, "rows")])
    run_job(spark, by_g)
    dt = DeltaTable(src)
    steps = [lambda: dt.update(updates={"x": "x + 1"}, predicate="k % 151 = 5"),   # scattered updates
             lambda: dt.delete("k % 211 = 7"),                                 # scattered deletes
             lambda: write_deltalake(src, pa.table({"k": pa.array(range(30_000, 30_050), pa.int64()),
                                                    "g": pa.array([1] * 50, pa.int64()),
                                                    "x": pa.array(range(50), pa.int64())}), mode="append"),
             lambda: dt.update(updates={"x": "x + 2"}, predicate="k % 6 = 1"),   # a sixth: marked, under the share
             lambda: dt.update(updates={"x": "x + 3"}, predicate="k % 6 = 2")]   # another: past it, purged
    for step in steps:
        step()
        dt.update_incremental()
        for job in jobs + [by_g]:
            run_job(spark, job)
            assert_target_equals_batch_evaluation(spark, job, job.model)
    for job in jobs:
        acts = _actions(job.target_path)
        adds = [a["add"] for _, a in acts if "add" in a]
        kinds = {a["deletionVector"]["storageType"] for a in adds if a.get("deletionVector")}
        assert kinds == {"i", "u"} or (job is groups and kinds), f"{job.model}: vectors stored as {kinds}"
        protocol = DeltaTable(job.target_path).protocol()
        assert "deletionVectors" in protocol.reader_features and protocol.min_reader_version == 3
        assert any(f.startswith(FILE_PREFIX) for f in os.listdir(job.target_path)) == ("u" in kinds)
        _same_everywhere(spark, job, range(first[job.model], DeltaTable(job.target_path).version() + 1))
    # the last step marked more than a quarter of some file: that file was rewritten (purged)
    last = max(v for v, _ in _actions(rows.target_path))
    removed = [a["remove"] for v, a in _actions(rows.target_path) if v == last and "remove" in a]
    readded = {a["add"]["path"] for v, a in _actions(rows.target_path) if v == last and "add" in a}
    assert any(r.get("deletionVector") and r["path"] not in readded for r in removed), "nothing purged"
    # delta-spark reads the target as dbt test does, through the catalog name too
    spark.sql(f"CREATE TABLE IF NOT EXISTS dv_rows USING delta LOCATION '{rows.target_path}'")
    try:
        n = spark.sql("SELECT COUNT(*) FROM dv_rows").first()[0]
        assert n == DeltaTableRef(rows.target_path).read_snapshot_arrow(last).num_rows
    finally:
        spark.sql("DROP TABLE IF EXISTS dv_rows")


def test_the_flag_off_writes_plain_files(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "DV_MIN_ROWS", 1_000)
    src = str(tmp_path / "src" / "t")
    _source(src, 5_000)
    job = _job(tmp_path, "plain", "SELECT k, g, x FROM src.t", "k", [_src(src)], target_deletion_vectors=False)
    run_job(spark, job)
    DeltaTable(src).update(updates={"x": "x + 1"}, predicate="k % 97 = 5")
    run_job(spark, job)
    assert_target_equals_batch_evaluation(spark, job, job.model)
    assert not any(a.get("add", {}).get("deletionVector") for _, a in _actions(job.target_path))
    protocol = DeltaTable(job.target_path).protocol()
    assert protocol.min_reader_version == 1 and not protocol.reader_features


def test_a_build_keeps_its_files_key_columns_for_the_first_merge(spark, tmp_path, monkeypatch):
    """The first incremental MERGE after a build probes every file whose key range holds a
    changed key: the build keeps its files' key columns on this machine, so that MERGE (in a
    new process: nothing held in memory) reads none from the files. With the flag off nothing
    is kept (no MERGE of that target probes)."""
    import pyarrow.parquet as pq

    from consistent_stream.delta.files import HELD, HELD_KEYS, kept_keys
    from consistent_stream.sink import rewrite
    monkeypatch.setattr(settings, "DV_MIN_ROWS", 1_000)
    src = str(tmp_path / "src" / "t")
    _source(src, 5_000)
    on = _job(tmp_path, "keys_kept", "SELECT k, g, x FROM src.t", "k", [_src(src)])
    off = _job(tmp_path, "keys_not_kept", "SELECT k, g, x FROM src.t", "k", [_src(src)],
               target_deletion_vectors=False)
    key_schema = pa.schema([("k", pa.int64())])
    for job in (on, off):
        run_job(spark, job)
        ref = DeltaTableRef(job.target_path)
        files = pa.table(DeltaTable(job.target_path).get_add_actions(flatten=True)).to_pylist()
        assert files and all(f["num_records"] >= 1_000 for f in files)
        for f in files:
            path = ref.file_path(f["path"])
            kept = kept_keys(path, f["size_bytes"], key_schema)
            if job is on:
                assert kept is not None and kept.equals(pq.read_table(path, columns=["k"])), f["path"]
            else:
                assert kept is None, f["path"]
    HELD.clear()
    HELD_KEYS.clear()   # as a new process starts
    read = []
    real = rewrite.keep_keys
    monkeypatch.setattr(rewrite, "keep_keys", lambda *a: (read.append(a[0]), real(*a)))
    DeltaTable(src).update(updates={"x": "x + 1"}, predicate="k % 97 = 5")   # spread over the keys
    run_job(spark, on)
    assert read == [], "the first MERGE read key columns from the files"
    last = max(v for v, _ in _actions(on.target_path))
    assert any(a.get("add", {}).get("deletionVector") for v, a in _actions(on.target_path) if v == last)
    assert_target_equals_batch_evaluation(spark, on, on.model)


def test_a_rebuild_with_new_columns_replaces_a_target_with_deletion_vectors(spark, tmp_path, monkeypatch):
    """A definition change that changes the output's columns replaces the target (delta-rs'
    CREATE OR REPLACE): every file goes with its vector, the protocol is plain again, and the
    next batch that marks rows upgrades it once more."""
    monkeypatch.setattr(settings, "DV_MIN_ROWS", 100)
    src = str(tmp_path / "src" / "t")
    _source(src, 3_000)
    job = _job(tmp_path, "m", "SELECT k, g, x FROM src.t", "k", [_src(src)])
    run_job(spark, job)
    DeltaTable(src).update(updates={"x": "x + 1"}, predicate="k % 97 = 5")
    run_job(spark, job)
    assert DeltaTable(job.target_path).protocol().min_reader_version == 3
    wider = _job(tmp_path, "m", "SELECT k, g, x, x + 1 AS y FROM src.t", "k", [_src(src)])
    run_job(spark, wider)
    assert_target_equals_batch_evaluation(spark, wider, "rebuilt")
    protocol = DeltaTable(wider.target_path).protocol()
    assert protocol.min_reader_version == 1 and not protocol.writer_features, protocol
    DeltaTable(src).update(updates={"x": "x + 1"}, predicate="k % 89 = 3")
    run_job(spark, wider)
    assert_target_equals_batch_evaluation(spark, wider, "after a batch")
    assert DeltaTable(wider.target_path).protocol().reader_features == ["deletionVectors"]


RUNNER = """
import sys
from pyspark.sql import SparkSession
from consistent_stream.job import run_job
from consistent_stream.session import with_delta
from consistent_stream.spec import JobSpec
spark = with_delta(SparkSession.builder, master="local[1]").config("spark.ui.enabled", "false").getOrCreate()
run_job(spark, JobSpec.load(sys.argv[1]))
"""


def test_a_run_killed_between_its_vector_file_and_the_commit(spark, tmp_path):
    src = str(tmp_path / "src" / "t")
    _source(src, 25_000)     # one target file of 25,000 rows: at least settings.DV_MIN_ROWS
    job = _job(tmp_path, "killed", "SELECT k, g, x FROM src.t", "k", [_src(src)])
    run_job(spark, job)
    before = DeltaTable(job.target_path).version()
    DeltaTable(src).update(updates={"x": "x + 1"}, predicate="k % 41 = 5")   # 610 rows: a vector too large to be inline
    spec = tmp_path / "killed.json"
    spec.write_text(job.to_json())
    env = {**os.environ, "CONSISTENT_STREAM_FAULT": "files_written",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(spec)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, start_new_session=True, timeout=600)
    assert proc.returncode == -9, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert DeltaTable(job.target_path).version() == before
    orphans = [f for f in os.listdir(job.target_path) if f.startswith(FILE_PREFIX)]
    assert orphans, "the killed run wrote no vector file before its commit"
    run_job(spark, job)
    assert_target_equals_batch_evaluation(spark, job, job.model)
    assert DeltaTable(job.target_path).version() == before + 1     # applied once
    named = {a["add"]["deletionVector"]["pathOrInlineDv"] for _, a in _actions(job.target_path)
             if a.get("add", {}).get("deletionVector", {}).get("storageType") == "u"}
    assert named, "the rerun marked no rows in a vector file"
    ref = DeltaTableRef(job.target_path, own_log=True, checksums=True)
    ref.replayed_log().write_checkpoint()      # maintenance vacuums a target once it has a checkpoint
    time.sleep(0.05)
    vacuum_target(ref, 0.0, time.time())
    left = [f for f in os.listdir(job.target_path) if f.startswith(FILE_PREFIX)]
    assert not set(orphans) & set(left) and len(left) == len(named)
    assert verify_target(spark, job.target_path).ok
