"""Every location on an object store: sources, targets, checkpoints (state tables, the cut log,
Spark's streaming checkpoint, the plan) and the warehouse on a real S3 API server (s3proxy, a
separate JVM on loopback, started here), read and written by delta-rs, obstore, pyarrow and
Spark's S3A. No local path holds any of it: the test checks the project directory is empty
of data afterwards.

Covered: the central check after inserts, updates and deletes; a ``ref()`` chain; kill -9
at the state commit and at the target commit, each followed by a run that repairs it;
``--full-refresh``; and the bad inputs: a bucket that does not exist, refused credentials, a
location whose scheme no engine reads, a model whose writer lock a live run holds.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from consistent_stream import location, storage
from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import ConcurrentWriterError, ConfigError, StorageError
from consistent_stream.job import run_job
from consistent_stream.observe import model_status
from consistent_stream.spec import JobSpec
from consistent_stream_testing import s3server
from dbt_recovery import BIG as DBT_BIG, TOTALS as DBT_TOTALS
from helpers import assert_target_equals_batch_evaluation

BUCKET = "cs-test"
LEASE_S = 4.0
"""The writer lock's lease here: a killed run's lock is free this long after its last renewal."""
CDF = {"delta.enableChangeDataFeed": "true"}
SQL = """
select c.id, c.name, count(o.oid) as orders, sum(o.amount) as total
from src.customers c left join src.orders o on c.id = o.cid
group by c.id, c.name
"""


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The S3 server, with the environment every engine here reads (the AWS variables; the
    two object_store ones let the tests' own delta-rs calls, which pass no options, reach
    it too)."""
    srv = s3server.start(tmp_path_factory.mktemp("s3server"), buckets=(BUCKET,), request_log=True)
    saved = dict(os.environ)
    os.environ.update(srv.env(), AWS_ALLOW_HTTP="true", AWS_CONDITIONAL_PUT="etag",
                      CONSISTENT_STREAM_LOCK_LEASE_S=str(LEASE_S),
                      CONSISTENT_STREAM_CACHE_DIR=str(tmp_path_factory.mktemp("cache")))
    location.reset()
    yield srv
    os.environ.clear()
    os.environ.update(saved)
    location.reset()
    srv.stop()


class S3Sources:
    """Source tables under ``s3://cs-test/<name>/src``."""

    def __init__(self, root: str, tables: dict[str, pa.Table], keys: dict[str, list[str]]):
        self.root, self.keys = root, keys
        storage.remove_tree(root)
        for name, data in tables.items():
            write_deltalake(self.path(name), data, configuration=CDF)

    def path(self, name: str) -> str:
        return f"{self.root}/src/{name}"

    def sources(self) -> list[dict]:
        return [{"source_name": "src", "name": n, "relation": f"src.{n}",
                 "meta": {"location": self.path(n), "primary_key": k}} for n, k in self.keys.items()]

    def job(self, project, sql: str, unique_key, name: str = "m", sources=None) -> JobSpec:
        return JobSpec.from_dbt(project_root=str(project), schema="s3t", identifier=name, model_name=name, sql=sql,
                                sources=sources or self.sources(),
                                config={"unique_key": unique_key, "location_root": f"{self.root}/targets"},
                                warehouse_dir=f"{self.root}/warehouse")


def _shop(root: str) -> S3Sources:
    return S3Sources(root, {
        "customers": pa.table({"id": [1, 2, 3], "name": ["ann", "bob", "cy"]}),
        "orders": pa.table({"oid": [10, 11, 12], "cid": [1, 1, 2], "amount": [5, 7, 1]}),
    }, {"customers": ["id"], "orders": ["oid"]})


def _no_local_data(project) -> None:
    left = [os.path.join(d, f) for d, _, files in os.walk(project) for f in files]
    assert not left, f"files written to the local project directory: {left[:5]}"


def test_a_model_on_s3_equals_batch_evaluation_through_changes_a_chain_and_a_full_refresh(spark, s3, tmp_path,
                                                                                         caplog):
    caplog.set_level("DEBUG", logger="consistent_stream")
    src = _shop(f"s3://{BUCKET}/central")
    job = src.job(tmp_path, SQL, "id")
    assert job.target_path.startswith("s3://") and job.checkpoint_location.startswith("s3://")
    run_job(spark, job, full_refresh=True)
    assert_target_equals_batch_evaluation(spark, job, "initial")

    write_deltalake(src.path("orders"), pa.table({"oid": [13, 14], "cid": [3, 3], "amount": [4, 9]}), mode="append")
    DeltaTable(src.path("customers")).update(updates={"name": "'bo'"}, predicate="id = 2")
    run_job(spark, job)
    assert_target_equals_batch_evaluation(spark, job, "after inserts and an update")
    DeltaTable(src.path("orders")).delete("oid = 10")
    summary = run_job(spark, job)
    assert_target_equals_batch_evaluation(spark, job, "after a delete")
    # the batch's requests, counted by the clients, are in its commit and so in `status`; the
    # target's commit wrote its version checksum to the store
    status = model_status(job)
    assert 0 < status.last_batch_requests < summary["object_store_requests"]["total"], (status, summary)
    assert storage.exists(f"{job.target_path}/_delta_log/{status.target_version:020d}.crc")

    # the checkpoint is on the store: the cut log, the state table, Spark's checkpoint
    names = storage.list_dir(job.checkpoint_location)
    assert names, "nothing under the checkpoint location on S3"

    # a ref() chain: a second model over the first one's target, on S3 as well
    down = src.job(tmp_path, "select count(*) as customers, sum(total) as total from s3t.m", None, name="d",
                   sources=[{"kind": "model", "name": "m", "relation": "s3t.m", "schema": "s3t", "identifier": "m",
                             "config": {"location_root": f"{src.root}/targets"}}])
    run_job(spark, down, full_refresh=True)
    assert_target_equals_batch_evaluation(spark, down, "chain, initial")
    write_deltalake(src.path("orders"), pa.table({"oid": [15], "cid": [1], "amount": [2]}), mode="append")
    run_job(spark, job)
    run_job(spark, down)
    assert_target_equals_batch_evaluation(spark, down, "chain, after a change")

    # --full-refresh: the checkpoint is removed from the store and rebuilt
    before = DeltaTableRef(job.target_path).latest_version()
    summary = run_job(spark, job, full_refresh=True)
    assert summary["batches"] >= 1 and DeltaTableRef(job.target_path).latest_version() > before
    assert_target_equals_batch_evaluation(spark, job, "after --full-refresh")
    _no_local_data(tmp_path)

    # the secret key is in no log line and in no object the runs stored (checkpoint files,
    # the job spec, commit metadata, the lock)
    secret = s3.secret_key
    assert secret not in caplog.text
    stored = [p for p in (Path(s3.directory) / "data" / BUCKET).rglob("*") if p.is_file()]
    assert stored and not [p for p in stored if secret.encode() in p.read_bytes()]


def test_a_runs_cut_is_taken_beside_the_targets_log_and_again_when_this_machines_copy_is_behind(
        spark, s3, tmp_path, monkeypatch, caplog):
    """On S3 the sources resume from the newest target commit this machine's copy of the
    target's log holds, while the target's LIST checks it (consistent_stream.job.
    _CutAhead). When another machine ran the model since (its run kept no copy here),
    the guess is dropped and the cut taken from the target as read: every version still equals
    batch evaluation."""
    import consistent_stream.job as job_module
    caplog.set_level("DEBUG", logger="consistent_stream")
    resumed = []
    real = job_module.resume_sources
    monkeypatch.setattr(job_module, "resume_sources", lambda *a: (resumed.append(1), real(*a))[1])
    src = _shop(f"s3://{BUCKET}/ahead")
    job = src.job(tmp_path, SQL, "id")
    run_job(spark, job, full_refresh=True)

    write_deltalake(src.path("orders"), pa.table({"oid": [13], "cid": [3], "amount": [4]}), mode="append")
    resumed.clear()
    run_job(spark, job)
    assert resumed == [], "the cut was not taken from this machine's copy of the target's log"
    assert_target_equals_batch_evaluation(spark, job, "a cut taken from the copy")

    # another machine runs the model: its run keeps nothing here, so this copy is a run behind
    write_deltalake(src.path("orders"), pa.table({"oid": [14], "cid": [1], "amount": [6]}), mode="append")
    monkeypatch.setenv("CONSISTENT_STREAM_LOCAL_CACHE", "off")
    run_job(spark, job)
    monkeypatch.delenv("CONSISTENT_STREAM_LOCAL_CACHE")
    DeltaTable(src.path("customers")).update(updates={"name": "'cyd'"}, predicate="id = 3")
    resumed.clear()
    caplog.clear()
    run_job(spark, job)
    assert resumed == [1] and "the sources are opened again" in caplog.text
    assert_target_equals_batch_evaluation(spark, job, "after a run elsewhere")


def test_a_cut_guessed_while_the_lock_is_taken_is_dropped_when_another_run_committed_meanwhile(
        spark, s3, tmp_path, monkeypatch, caplog):
    """The sources' logs are listed while the run takes its writer lock (consistent_stream.job.
    _CutAhead), so the guess is made before the lock is held. Another machine's run that takes
    the lock and commits in between (here: inside the first run's lock acquisition, after its
    guess was read) moves the target past the commit the guess resumed from: the guess is
    dropped, the sources opened again, and every version still equals batch evaluation."""
    import consistent_stream.job as job_module
    from consistent_stream.sink.lock import WriterLock
    caplog.set_level("DEBUG", logger="consistent_stream")
    src = _shop(f"s3://{BUCKET}/meanwhile")
    job = src.job(tmp_path, SQL, "id")
    run_job(spark, job, full_refresh=True)
    write_deltalake(src.path("orders"), pa.table({"oid": [13], "cid": [3], "amount": [4]}), mode="append")
    run_job(spark, job)                          # this machine's copy of the target's log: its newest commit

    guesses: list = []
    real_start, real_acquire = job_module._CutAhead.start, WriterLock.acquire
    monkeypatch.setattr(job_module._CutAhead, "start",
                        staticmethod(lambda j, fr: guesses.append(real_start(j, fr)) or guesses[-1]))
    elsewhere: list = []

    def acquire(lock):
        if not elsewhere:                        # the first run's: its guess read, then another machine runs
            elsewhere.append(1)
            assert guesses[0] is not None and guesses[0]._pending() is not None
            write_deltalake(src.path("orders"), pa.table({"oid": [14], "cid": [1], "amount": [6]}), mode="append")
            monkeypatch.setenv("CONSISTENT_STREAM_LOCAL_CACHE", "off")   # (keeps nothing here)
            try:
                run_job(spark, job)
            finally:
                monkeypatch.delenv("CONSISTENT_STREAM_LOCAL_CACHE")
        real_acquire(lock)
    monkeypatch.setattr(WriterLock, "acquire", acquire)
    write_deltalake(src.path("orders"), pa.table({"oid": [15], "cid": [2], "amount": [1]}), mode="append")
    caplog.clear()
    run_job(spark, job)
    assert elsewhere and "the sources are opened again" in caplog.text
    assert_target_equals_batch_evaluation(spark, job, "after a run elsewhere while the lock was taken")


def _parquet_under(table: str) -> set[str]:
    """The data files of table ``table`` on the store (relative paths), not the log's or the
    Change Data Feed's."""
    root = table.rstrip("/") + "/"
    return {p[len(root):] for p, _ in storage.list_files(table, skip_dirs=lambda n: n.startswith("_"))
            if p.endswith(".parquet")}


def test_a_merge_on_s3_gets_only_the_files_this_process_did_not_write(s3):
    """The target's change-sized MERGE (``sink.rewrite``) GETs each file it rewrites; the file
    the previous MERGE of this process wrote is held (``delta.files.HELD``), not fetched again:
    no data-file GET in the second MERGE, and the rows are the changes' applied."""
    from consistent_stream.delta import Txn
    from consistent_stream.sink import rewrite
    path = f"s3://{BUCKET}/held/t"
    storage.remove_tree(path)
    write_deltalake(path, pa.table({"k": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}), configuration=CDF)
    ref = DeltaTableRef(path, own_log=True)
    gets = []
    for i, (rows, ops) in enumerate([({"k": [2], "v": ["B"]}, ["upsert"]),
                                     ({"k": [3, 1], "v": ["C", "a"]}, ["upsert", "delete"])], 1):
        before = location.REQUESTS.snapshot()
        changes = pa.table({"k": pa.array(rows["k"], pa.int64()), "v": rows["v"], "__op": ops})
        rewrite.merge(ref, changes, ["k"], txn=Txn("q", i), metadata={})
        gets.append(location.REQUESTS.snapshot()[("GET", "data_files")] - before[("GET", "data_files")])
    assert gets == [1, 0]
    assert sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=repr) == \
        [{"k": 2, "v": "B"}, {"k": 3, "v": "C"}]


def test_a_new_process_reads_the_data_files_this_machine_kept_without_a_get(s3, monkeypatch):
    """The data files kept on this machine (``local_cache.DATA_FILES``): a MERGE in a new
    process (nothing held in memory: ``HELD.clear()``) GETs no file an earlier MERGE here wrote
    or read, whether it reads the file whole or probes it by its key column; a kept file that
    is not the log's (truncated here), or is damaged inside (it does not decode), is dropped
    and fetched again; with
    ``CONSISTENT_STREAM_DATA_CACHE_MB=0`` every file is fetched. Each version equals the
    changes applied."""
    from consistent_stream import settings
    from consistent_stream.delta import Txn
    from consistent_stream.delta.files import HELD, HELD_KEYS
    from consistent_stream.local_cache import directory
    from consistent_stream.sink import rewrite
    monkeypatch.setattr(settings, "DV_MIN_ROWS", 100)
    path = f"s3://{BUCKET}/kept/t"
    storage.remove_tree(path)
    small = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})          # read whole
    large = pa.table({"k": pa.array(range(100, 400), pa.int64()), "v": ["x"] * 300})      # probed
    write_deltalake(path, small, configuration=CDF)
    write_deltalake(path, large, mode="append")
    want = {r["k"]: r["v"] for r in pa.concat_tables([small, large]).to_pylist()}

    def merge(i: int, keys: list[int]) -> int:
        HELD.clear()
        HELD_KEYS.clear()
        before = location.REQUESTS.snapshot()
        ref = DeltaTableRef(path, own_log=True)
        changes = pa.table({"k": pa.array(keys, pa.int64()), "v": [f"b{i}"] * len(keys),
                            "__op": ["upsert"] * len(keys)})
        rewrite.merge(ref, changes, ["k"], txn=Txn("q", i), metadata={}, deletion_vectors=True)
        want.update({k: f"b{i}" for k in keys})
        got = DeltaTableRef(path).read_snapshot_arrow(ref.version())
        assert dict(zip(got.column("k").to_pylist(), got.column("v").to_pylist())) == want and got.num_rows == len(want)
        return location.REQUESTS.snapshot()[("GET", "data_files")] - before[("GET", "data_files")]
    assert merge(1, [2, 150]) == 2            # the two files delta-rs wrote: fetched, and kept
    assert merge(2, [1, 151]) == 0            # the small file the first MERGE wrote, the large one it read
    kept = list(directory("data-files").iterdir())
    assert kept
    for f in kept:
        f.write_bytes(f.read_bytes()[:-1])     # no longer the size the log gives
    assert merge(3, [3, 152]) == 2
    for f in directory("data-files").iterdir():   # framed and sized as the log says, footer whole,
        data = bytearray(f.read_bytes())           # its pages damaged: opens, does not decode
        if not f.name.endswith(f"-{len(data)}"):
            continue                               # (one truncated above that no live file is)
        pages_end = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
        data[4:pages_end] = bytes(pages_end - 4)
        f.write_bytes(bytes(data))
    for f in directory("data-keys").iterdir():
        f.unlink()                                 # so that the probe reads the large file too
    assert merge(4, [2, 153]) == 2                 # each damaged copy dropped, the file fetched again
    assert merge(5, [3, 154]) == 0
    monkeypatch.setenv("CONSISTENT_STREAM_DATA_CACHE_MB", "0")
    assert merge(6, [1, 155]) == 2


def test_an_owned_table_reopened_on_s3_from_its_local_copy_lists_its_log_and_reads_only_newer_commits(s3):
    """An owned table's log reopened from this machine's copy of its replay
    (``delta.log``, ``local_cache``): one LIST and no GET when nothing was committed since; one GET per
    commit another writer made since; what it holds is what a replay from the store holds."""
    from consistent_stream.delta.log import OwnedLog
    path = f"s3://{BUCKET}/copy/t"
    storage.remove_tree(path)
    rows = pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    write_deltalake(path, rows)
    write_deltalake(path, rows, mode="append")

    def reopen() -> tuple[OwnedLog, dict]:
        before = location.REQUESTS.snapshot()
        own = OwnedLog(path)
        assert own.load()
        return own, location.REQUESTS.since(before)["by_method"]
    first, _ = reopen()
    assert not first.from_copy and first.version == 1
    again, requests = reopen()
    assert again.from_copy and again.files == first.files and requests == {"LIST": 1}
    write_deltalake(path, rows, mode="append")     # another writer's commit: read on top of the copy
    newer, requests = reopen()
    assert newer.from_copy and requests == {"LIST": 1, "GET": 1}
    plain = OwnedLog(path, copy=False)
    assert plain.load() and (newer.version, newer.files) == (plain.version, plain.files) == (2, plain.files)


def test_a_runs_small_files_are_listed_and_only_the_changed_ones_read_from_the_store(s3):
    """The checkpoint's small files read at a run's start (``storage.read_once_under``): with
    this machine's copies of them (``local_cache``), one LIST of their directory and a GET of
    each whose ETag changed since (a write from this machine keeps its copy); an absent one is
    absent, a changed one reads as it is now."""
    d = f"s3://{BUCKET}/once/_consistent_stream"
    storage.remove_tree(d)
    paths = [f"{d}/{n}" for n in ("a.json", "b.json", "c.json", "gone.json")]

    def written_elsewhere(path: str, text: str) -> None:   # by another machine: no copy here
        import obstore
        store, key = location.object_store(path)
        obstore.put(store, key, text.encode())
    for p in paths[:3]:
        written_elsewhere(p, f'{{"v": "{p[-6]}"}}')

    def read() -> tuple[list, dict]:
        before = location.REQUESTS.snapshot()
        with storage.read_once_under(d, prefetch=tuple(paths)):
            texts = [storage.read_text(p) for p in paths]   # (the prefetch's, read meanwhile: no request of their own)
            return texts, location.REQUESTS.since(before)["by_method"]
    first, requests = read()
    assert first == ['{"v": "a"}', '{"v": "b"}', '{"v": "c"}', None] and requests == {"LIST": 1, "GET": 3}
    again, requests = read()
    assert again == first and requests == {"LIST": 1}
    storage.replace_text(paths[1], '{"v": "B"}')             # written here: its copy written with it
    changed, requests = read()
    assert changed == ['{"v": "a"}', '{"v": "B"}', '{"v": "c"}', None] and requests == {"LIST": 1}
    written_elsewhere(paths[2], '{"v": "C"}')
    changed, requests = read()
    assert changed == ['{"v": "a"}', '{"v": "B"}', '{"v": "C"}', None] and requests == {"LIST": 1, "GET": 1}


def test_merges_on_s3_mark_rows_in_deletion_vectors(s3, monkeypatch):
    """The MERGE's merge-on-read commits on the store: a file probed by its key column (one
    GET, whose bytes also give the matched rows), vectors inline and in a vector file PUT beside
    the data, and every version read back by delta-rs and the engine as the changes applied."""
    from consistent_stream import settings
    from consistent_stream.delta import Txn
    from consistent_stream.delta.deletion_vectors import FILE_PREFIX
    from consistent_stream.sink import rewrite
    monkeypatch.setattr(settings, "DV_MIN_ROWS", 100)
    path = f"s3://{BUCKET}/dv/t"
    storage.remove_tree(path)
    n = 1_000
    write_deltalake(path, pa.table({"k": pa.array(range(n), pa.int64()), "v": [f"v{i}" for i in range(n)]}),
                    configuration=CDF)
    want = {k: f"v{k}" for k in range(n)}
    batches = [([3, 500], ["upsert", "delete"]),                     # a small vector, inline
               (list(range(1, n, 5)), ["delete"] * len(range(1, n, 5)))]   # 200 rows: a vector file
    for i, (keys, ops) in enumerate(batches, 1):
        ref = DeltaTableRef(path, own_log=True)
        changes = pa.table({"k": pa.array(keys, pa.int64()), "v": [f"b{i}"] * len(keys), "__op": ops})
        _, m = rewrite.merge(ref, changes, ["k"], txn=Txn("q", i), metadata={}, deletion_vectors=True)
        assert m["num_target_deletion_vectors_added"] == 1 and m["num_target_rows_copied"] == 0
        for k, op in zip(keys, ops):
            want.pop(k) if op == "delete" else want.__setitem__(k, f"b{i}")
        got = DeltaTableRef(path).read_snapshot_arrow(ref.version())
        assert dict(zip(got.column("k").to_pylist(), got.column("v").to_pylist())) == want and got.num_rows == len(want)
    assert [p for p, _ in storage.list_files(path, skip_dirs=lambda d: d.startswith("_"))
            if p.rsplit("/", 1)[-1].startswith(FILE_PREFIX)]


def test_maintenance_on_s3_is_counted_by_the_run_and_leaves_what_retention_keeps(spark, s3, tmp_path,
                                                                                   monkeypatch):
    """A maintenance pass after every batch (retention 0, a checkpoint every 2 commits) on the
    store: it reads both tables through the run's replayed logs (no delta-rs open) and makes
    every request through the package's own storage (its deletes in bulk), so the run's count
    equals the server's log; afterwards the target holds only its live files and the log from its newest
    checkpoint, the state only the files of its two newest versions."""
    import consistent_stream.sink.maintenance as maintenance
    monkeypatch.setattr(maintenance, "EVERY_BATCHES", 1)
    reports = []
    run_pass = maintenance.Maintenance.run

    def recorded(self, *a):
        reports.append(run_pass(self, *a))
        return reports[-1]
    monkeypatch.setattr(maintenance.Maintenance, "run", recorded)
    src = _shop(f"s3://{BUCKET}/maintained")
    job = src.job(tmp_path, SQL, "id")
    job = JobSpec(**{**job.__dict__, "checkpoint_interval": 2, "log_retention_hours": 0,
                     "deleted_file_retention_hours": 0, "state_retention_versions": 2})
    run_job(spark, job, full_refresh=True)
    # (five batches: the fourth merges delta files, whose old ones the fifth's pass may delete)
    for i in range(5):
        write_deltalake(src.path("orders"), pa.table({"oid": [100 + i], "cid": [i % 3 + 1], "amount": [i]}),
                        mode="append")
        DeltaTable(src.path("orders")).update(updates={"amount": str(i)}, predicate=f"oid = {10 + i % 3}")
        time.sleep(0.01)   # the target's superseded files older than retention 0 by a clock tick
        since = s3.log_offset()
        summary = run_job(spark, job)
        served = sum(s3.requests(since).values())
        counted = summary["object_store_requests"]
        assert summary["batches"] == 1 and reports and not reports[-1].errors, (summary, reports)
        assert counted["delta_rs_opens"] == 0, counted
        assert counted["total"] == served, (counted, dict(s3.requests(since)))   # a bulk DELETE is a POST
    assert sum(r.target_log_files for r in reports) and sum(r.state_data_files for r in reports), reports
    target = DeltaTableRef(job.target_path)
    live = set(target.files(target.latest_version()))
    assert _parquet_under(job.target_path) == live
    log_names = storage.list_dir(f"{job.target_path}/_delta_log")
    checkpoints = sorted(n for n in log_names if n.endswith(".checkpoint.parquet"))
    assert checkpoints and min(int(n[:20]) for n in log_names if n[:20].isdigit()) == int(checkpoints[-1][:20])
    state = DeltaTableRef(job.state_root)
    sv = state.latest_version()
    assert _parquet_under(job.state_root) <= set(state.files(sv)) | set(state.files(sv - 1))
    assert_target_equals_batch_evaluation(spark, job, "after maintained batches")


CHILD = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    from consistent_stream.session import with_delta
    from consistent_stream.job import run_job
    from consistent_stream.spec import JobSpec
    spark = (with_delta(SparkSession.builder, master="local[1]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    run_job(spark, JobSpec.load(sys.argv[1]), timeout_s=float(sys.argv[2]) or None)
""")


def _child(job: JobSpec, tmp_path, *, fault: str | None = None, timeout_s: float = 0) -> subprocess.Popen:
    spec = tmp_path / f"{job.model}-{time.time_ns()}.json"
    spec.write_text(job.to_json())
    env = {k: v for k, v in os.environ.items() if k != "CONSISTENT_STREAM_FAULT"}
    if fault:
        env["CONSISTENT_STREAM_FAULT"] = fault
    return subprocess.Popen([sys.executable, "-c", CHILD, str(spec), str(timeout_s)], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.parametrize("point", ["state_committed", "target_committed"])
def test_kill_9_at_a_commit_on_s3_is_repaired_by_the_next_run(spark, s3, tmp_path, point):
    src = _shop(f"s3://{BUCKET}/kill-{point}")
    job = src.job(tmp_path / "p", SQL, "id", name=f"k_{point}")
    run_job(spark, job, full_refresh=True)
    write_deltalake(src.path("orders"), pa.table({"oid": [20, 21], "cid": [2, 3], "amount": [3, 8]}), mode="append")
    target = DeltaTableRef(job.target_path)
    before = target.latest_version()
    proc = _child(job, tmp_path, fault=point)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -9, f"the child was not killed at {point}: rc {proc.returncode}\n{err.decode()[-2000:]}"
    after_kill = DeltaTableRef(job.target_path).latest_version()
    assert after_kill == before + (1 if point == "target_committed" else 0)
    with pytest.raises(ConcurrentWriterError, match="lease"):   # the killed run's lock, until its lease ends
        run_job(spark, job)
    deadline = time.time() + 2 * LEASE_S + 3   # the lease, renewed up to a third of it before the kill, and
    while True:                                # the store's whole-second clock
        try:
            run_job(spark, job)
            break
        except ConcurrentWriterError:
            assert time.time() < deadline, "the killed run's lock was not released by its lease"
            time.sleep(0.5)
    assert_target_equals_batch_evaluation(spark, job, f"after kill -9 at {point}")
    from consistent_stream.runtime import BatchMeta
    batches = [(m.app_id, m.batch_id) for m in map(BatchMeta.from_commit, DeltaTableRef(job.target_path).history())
               if m is not None]
    assert len(batches) == len(set(batches)), f"a batch committed twice: {batches}"


def test_bad_locations_are_named_before_anything_is_written(spark, s3, tmp_path):
    src = _shop(f"s3://{BUCKET}/bad")
    good = src.job(tmp_path, SQL, "id")

    # a bucket that does not exist
    cfg = {"unique_key": "id", "location_root": "s3://no-such-bucket-here/targets"}
    job = JobSpec.from_dbt(project_root=str(tmp_path), schema="s3t", identifier="nb", model_name="nb", sql=SQL,
                           sources=src.sources(), config=cfg, warehouse_dir=str(tmp_path / "wh"))
    with pytest.raises(StorageError, match=r"model nb: target \(location_root\) s3://no-such-bucket-here/targets/nb: "
                                           r"bucket 'no-such-bucket-here' does not exist"):
        run_job(spark, job)

    # a scheme no engine here reads
    with pytest.raises(ConfigError, match=r"config location_root 'gs://b/x': scheme gs:// is not supported"):
        JobSpec.from_dbt(project_root=str(tmp_path), schema="s3t", identifier="gs", model_name="gs", sql=SQL,
                         sources=src.sources(), config={"unique_key": "id", "location_root": "gs://b/x"},
                         warehouse_dir=str(tmp_path / "wh"))
    bad_source = [{**src.sources()[0],
                   "meta": {"location": "abfss://c@a.dfs.core.windows.net/t", "primary_key": ["id"]}}]
    with pytest.raises(ConfigError, match=r"meta.consistent_stream.location .*scheme abfss:// is not supported"):
        src.job(tmp_path, "select id from src.customers", None, name="az", sources=bad_source)

    # credentials the store refuses; the secret is in no message
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    os.environ["AWS_SECRET_ACCESS_KEY"] = "wrong-" + secret[:4]
    location.reset()
    try:
        with pytest.raises(StorageError, match=r"refused the credentials from the AWS chain") as e:
            run_job(spark, good)
        assert secret[:4] not in str(e.value) or "wrong-" not in str(e.value)
    finally:
        os.environ["AWS_SECRET_ACCESS_KEY"] = secret
        location.reset()
    assert not DeltaTableRef(good.target_path).exists(), "a refused run wrote the target"


def test_a_second_writer_on_another_host_gets_the_holders_name(spark, s3, tmp_path):
    """The writer lock is an object on the store with a lease: a run in another process (as
    another host would run it: it shares nothing with this one but the store) holds it; this
    run is refused with the holder's pid and host and nothing written."""
    src = _shop(f"s3://{BUCKET}/lock")
    job = src.job(tmp_path, SQL, "id", name="locked")
    spec = tmp_path / "continuous.json"
    spec.write_text(job.to_json().replace('"trigger": "available_now"', '"trigger": "processing_time:1"'))
    job = JobSpec.load(str(spec))
    assert job.trigger == "processing_time:1"
    proc = _child(job, tmp_path, timeout_s=120)
    try:
        lock = job.checkpoint_location + ".lock"
        deadline = time.time() + 120
        while time.time() < deadline and not storage.exists(lock):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.5)
        with pytest.raises(ConcurrentWriterError, match=rf"pid {proc.pid} on host .*Nothing of the model was read"):
            run_job(spark, src.job(tmp_path, SQL, "id", name="locked"))
    finally:
        proc.kill()
        proc.wait()


DBT_SCHEMA = """
version: 2
models:
  - name: totals
    columns:
      - name: cid
        data_tests: [unique, not_null]
"""


def test_dbt_run_and_test_with_every_location_on_s3(spark, s3, tmp_path):
    """`dbt run` and `dbt test` of a model and a ``ref()`` of it, sources and targets on S3:
    the targets are Delta tables in Spark's catalog at their S3 locations, and `dbt test`
    reads them there."""
    import uuid

    from test_dbt_end_to_end import SOURCES
    from test_dbt_plugin import PROJECT, dbt, messages, profile, write
    schema = f"s3dbt_{uuid.uuid4().hex[:8]}"
    root = f"s3://{BUCKET}/dbt-{schema}"
    src = f"{root}/src/orders"
    write_deltalake(src, pa.table({"oid": [1, 2, 3], "cid": [1, 1, 2], "amount": [5, 6, 7]}), configuration=CDF)
    write(tmp_path, {
        "dbt_project.yml": PROJECT,
        "profiles.yml": profile(schema, tmp_path / "spark", "s3"),
        "models/sources.yml": SOURCES.format(loc=src),
        "models/totals.sql": DBT_TOTALS.format(root=f"{root}/targets"),
        "models/big.sql": DBT_BIG.format(root=f"{root}/targets"),
        "models/schema.yml": DBT_SCHEMA,
    })
    res = dbt(tmp_path, "run")
    assert res.success, messages(res)
    assert {r["cid"]: r["total"] for r in spark.table(f"{schema}.totals").collect()} == {1: 11, 2: 7}
    location_of = {r.col_name: r.data_type for r in spark.sql(f"DESCRIBE TABLE EXTENDED {schema}.totals").collect()}
    assert location_of["Location"].startswith(("s3://", "s3a://")), location_of["Location"]
    res = dbt(tmp_path, "test")
    assert res.success, messages(res)

    write_deltalake(src, pa.table({"oid": [4], "cid": [2], "amount": [8]}), mode="append")
    DeltaTable(src).delete("oid = 1")
    res = dbt(tmp_path, "run")
    assert res.success, messages(res)
    assert {r["cid"]: r["total"] for r in spark.table(f"{schema}.totals").collect()} == {1: 6, 2: 15}
    assert {r["cid"]: r["total"] for r in spark.table(f"{schema}.big").collect()} == {2: 15}
    local = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert not [f for f in local if f.endswith(".parquet") or "_delta_log" in f or "checkpoint" in f], local


def test_a_deleted_target_on_s3_whose_catalog_entry_remains_is_named_and_rebuilt(spark, s3, tmp_path, capsys):
    import uuid

    from dbt_recovery import deleted_target_is_named_and_rebuilt
    schema = f"s3gone_{uuid.uuid4().hex[:8]}"
    deleted_target_is_named_and_rebuilt(spark, capsys, tmp_path, schema, f"s3://{BUCKET}/dbt-{schema}")
    spark.sql(f"drop schema if exists {schema} cascade")


def test_a_capture_lands_on_s3_and_a_model_over_it_stays_exact(spark, s3, tmp_path):
    """``consistent-stream capture postgres`` with its landing directory on the store (event
    files, schemas, its state, the landing index), and a model over the captured tables whose
    targets and checkpoint are there too: every version equals batch evaluation at its cut,
    and money is conserved."""
    from consistent_stream.sources.debezium.source import reader_for
    from postgres_server import Database, start_capture, stop_capture, wait_for
    from test_debezium_model import N_ACCOUNTS, SQL as BANK_SQL, _sources, _transfers
    db = Database()
    db.execute(f"""create table accounts (id int primary key, branch int, balance bigint);
                   create table transfers (tid serial primary key, src int, dst int, amount int);
                   alter table accounts replica identity full; alter table transfers replica identity full;
                   insert into accounts select g, g % 4, 1000 from generate_series(0, {N_ACCOUNTS - 1}) g;""")
    landing = f"s3://{BUCKET}/capture/landing"
    cap = start_capture(db.dsn, "public.accounts,public.transfers", "s_s3", landing, log_path=str(tmp_path / "cap.log"))

    def landed(tid: int) -> bool:
        r = reader_for(landing)
        return tid in r.table_at("public.transfers", r.latest_position()).column("tid").to_pylist()

    try:
        wait_for(lambda: reader_for(landing).latest_position() > 0, what="the snapshot on S3")
        first = _transfers(db, 10, 1)
        wait_for(lambda: landed(first), what="the transfers to land on S3")
        job = JobSpec.from_dbt(project_root=str(tmp_path), schema="s3t", identifier="bank", model_name="bank",
                               sql=BANK_SQL, sources=_sources(landing),
                               config={"unique_key": "branch", "location_root": f"s3://{BUCKET}/capture/targets"},
                               warehouse_dir=f"s3://{BUCKET}/capture/warehouse")
        run_job(spark, job, full_refresh=True)
        assert_target_equals_batch_evaluation(spark, job, "capture on S3, initial")
        last = _transfers(db, 15, 2)
        wait_for(lambda: landed(last), what="more transfers to land on S3")
        run_job(spark, job)
        assert_target_equals_batch_evaluation(spark, job, "capture on S3, after transfers")
    finally:
        stop_capture(cap)
    rows = DeltaTable(job.target_path).to_pyarrow_table().to_pylist()
    assert sum(r["balance"] for r in rows) == N_ACCOUNTS * 1000
    assert storage.list_dir(landing), "nothing landed on the store"
