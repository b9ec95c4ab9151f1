"""pgbench TPC-B through PostgreSQL -> Debezium (Kafka Connect) -> Kafka -> a continuous
consistent_stream model over ``format: kafka`` sources, checked at every committed version:
the model's invariant, batch evaluation at the version's recorded cut (DuckDB at every
version, Spark at three), and PostgreSQL's own answer at the end. Faults on the way: the
Connect worker SIGKILLed and started again mid-run (its connector re-sends what it had not
recorded as sent), the model's own run SIGKILLed mid-batch (a subprocess) and run again.

The foil: the same topics read per topic (``consistency: per_topic``, no transaction
metadata), each table cut at the events its topic held ``i * foil_skew_ms`` after the version's
cut (table i), the way independent per-topic readers progress; its control (zero skew) must
keep the invariant, so the foil's violations come from reading per topic, not from how the
check is built.

Used by ``tests/test_kafka_debezium.py``; the Kafka stack is started once by its fixture.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from consistent_stream.delta import DeltaTableRef
from consistent_stream.job import run_job
from consistent_stream.oracle import duckdb_result
from consistent_stream.sources import Cut
from consistent_stream.sources.formats import open_source
from consistent_stream.spec import JobSpec
from pgbench_scenario import MODELS, TABLES, _rows, _target_rows, count_mismatches
from postgres_server import Database, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Outcome:
    versions: int = 0
    transactions: int = 0
    invariant_violations: int = 0
    oracle_mismatches: int = 0
    spark_checked: int = 0
    foil_versions: int = 0
    foil_violations: int = 0
    control_violations: int = 0
    duplicates_dropped: int = 0
    connect_killed: bool = False
    run_killed: bool = False
    final_matches_database: bool = False
    cut_positions: list = field(default_factory=list)
    snapshot_rows: dict = field(default_factory=dict)   # table -> rows of the connector's snapshot
    seconds: float = 0.0
    prefix: str = ""


# pgbench_history is empty after `pgbench -i`: Debezium creates its topic at its first insert,
# so its columns are declared (the others come from the first event's schema envelope)
HISTORY_COLUMNS = {"tid": "int", "bid": "int", "aid": "int", "delta": "int", "mtime": "timestamp_ntz",
                   "filler": "string"}


def kafka_sources(bootstrap: str, prefix: str, sql: str, consistency: str = "transaction",
                  driver_read_records: int | None = None) -> list[dict]:
    """The dbt sources of the pgbench tables the model's SQL reads, as Debezium topics
    (``driver_read_records``: the sources' setting, default when None)."""
    limit = {} if driver_read_records is None else {"driver_read_records": driver_read_records}
    return [{"source_name": "pg", "name": t, "relation": f"pg.{t}",
             "meta": {"format": "kafka", "bootstrap_servers": bootstrap, "topic": f"{prefix}.public.{t}",
                      "consistency": consistency, **limit,
                      **({"columns": HISTORY_COLUMNS} if t == "pgbench_history" else {})}}
            for t in TABLES if f"pg.{t}" in sql]


# TPC-B as pgbench's built-in script runs it, over BRANCHES branches of 10 tellers each (the
# built-in script takes its scale from pgbench_branches' row count, which would also scale the
# accounts' range); accounts are pgbench's 100,000 of scale 1
BRANCHES = 500
TPCB_SCRIPT = """\\set aid random(1, 100000)
\\set bid random(1, :branches)
\\set tid random(1, 10 * :branches)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
"""


def pgbench(db: Database, script: str, *args: str, clients: int = 4) -> subprocess.Popen:
    """pgbench running :data:`TPCB_SCRIPT` (the file ``script``, written by
    :func:`start_pgbench_connector`) against ``db`` from ``clients`` connections; ``args`` say
    how long and how fast (``-T 25 -R 100``, ``-t 150`` transactions per client)."""
    srv = db.server
    return subprocess.Popen([srv.bin("pgbench"), "-n", "-f", script, "-D", f"branches={BRANCHES}", "-c", str(clients),
                             "-j", "2", *args, "-h", "127.0.0.1", "-p", str(srv.port), "-U", "postgres", db.name],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Workload:
    """pgbench (:func:`pgbench`) at ``rate`` transactions a second from ``clients`` connections,
    for at least ``seconds`` and then until :meth:`stop`: rounds of ``-T round_s`` one after
    another in a thread, so a run that needs more versions than the machine's load gave it in
    ``seconds`` keeps getting transactions. :meth:`finish` stops it and raises AssertionError
    with pgbench's output when a round failed."""

    def __init__(self, db: Database, script: str, *, seconds: float, rate: int, clients: int,
                 round_s: int = 5):
        self._args = (db, script)
        self._round = ["-T", str(round_s), "-R", str(rate)]
        self._clients = clients
        self._until = time.time() + seconds
        self._stop = threading.Event()
        self._failures: list[str] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not (self._stop.is_set() and time.time() >= self._until):
            p = pgbench(*self._args, *self._round, clients=self._clients)
            out, _ = p.communicate()
            if p.returncode != 0:
                self._failures.append(out)
                return

    def stop(self) -> None:
        """Let the workload end once its ``seconds`` have passed (the current round finishes)."""
        self._stop.set()

    def finish(self, timeout_s: float = 120) -> None:
        self.stop()
        self._thread.join(timeout=timeout_s)
        assert not self._thread.is_alive(), f"pgbench still running {timeout_s:.0f} s after it was stopped"
        assert not self._failures, self._failures[0]


def start_pgbench_connector(stack, db: Database, prefix: str, script: str, partitions: int = 1) -> None:
    """pgbench's tables in ``db``, full before the connector starts: ``pgbench -i`` (100,000
    accounts), :data:`BRANCHES` branches and ten times as many tellers, and 600 TPC-B
    transactions (600 history rows); REPLICA IDENTITY FULL; then a Debezium connector named
    ``prefix`` captures them (its snapshot, then their changes) into topics
    ``<prefix>.public.<table>`` of ``partitions`` partitions each. Writes :data:`TPCB_SCRIPT`
    to the file ``script`` for :func:`pgbench`."""
    with open(script, "w") as f:
        f.write(TPCB_SCRIPT)
    srv = db.server
    init = subprocess.run([srv.bin("pgbench"), "-i", "-s", "1", "-q", "-h", "127.0.0.1", "-p", str(srv.port),
                           "-U", "postgres", db.name], capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    db.execute(f"INSERT INTO pgbench_branches (bid, bbalance) SELECT g, 0 FROM generate_series(2, {BRANCHES}) g; "
               f"INSERT INTO pgbench_tellers (tid, bid, tbalance) SELECT g, (g - 1) / 10 + 1, 0 "
               f"FROM generate_series(11, {10 * BRANCHES}) g")
    warm = pgbench(db, script, "-t", "150")
    out, _ = warm.communicate(timeout=120)
    assert warm.returncode == 0, out
    for t in TABLES:
        db.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    stack.register_postgres(prefix, db.dsn, [f"public.{t}" for t in TABLES], prefix, slot=f"s_{prefix}",
                            partitions=partitions)


def remove_connector(stack, db: Database, name: str, slot: str, timeout_s: float = 60.0) -> None:
    """Delete connector ``name`` and drop its replication slot ``slot`` (Debezium keeps it;
    :meth:`postgres_server.Database.drop_replication_slot`)."""
    stack.delete_connector(name)
    if not db.drop_replication_slot(slot, timeout_s):
        raise AssertionError(f"replication slot {slot} is still in use {timeout_s:.0f} s after its connector "
                             f"{name} was deleted")


def _run_in_subprocess(job: JobSpec, path: str, seconds: float) -> subprocess.Popen:
    """The model's continuous run in a process of its own (to be SIGKILLed)."""
    spec = os.path.join(path, "job.json")
    with open(spec, "w") as f:
        f.write(job.to_json())
    code = ("import json,sys; sys.path.insert(0, %r)\n"
            "from consistent_stream.spec import JobSpec\n"
            "from consistent_stream.job import run_job\n"
            "from consistent_stream.session import with_delta\n"
            "from pyspark.sql import SparkSession\n"
            "s = with_delta(SparkSession.builder, master='local[2]').config('spark.ui.enabled','false')"
            ".config('spark.sql.session.timeZone','UTC').getOrCreate()\n"
            "job = JobSpec.load(%r)\n"
            "run_job(s, job, timeout_s=%f)\n") % (os.path.join(REPO, "tests"), spec, seconds)
    return subprocess.Popen([sys.executable, "-c", code], stdout=open(os.path.join(path, "run.log"), "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def run(spark, stack, tmp_path, *, seconds: float, clients: int = 4, rate: int = 100,
        model: str = "branch_balances", kill_connect_after_s: float | None = None,
        kill_run_after_s: float | None = None, foil_skew_ms: int = 20, spark_checks: int = 3,
        trigger_s: float = 1.0, partitions: int = 1, driver_read_records: int | None = None,
        min_versions: int = 0, extra_s: float = 90) -> Outcome:
    """The module docstring's run: pgbench's tables full before the connector starts
    (:func:`start_pgbench_connector`), its data topics of ``partitions`` partitions (the foil,
    whose per-topic cuts are offsets of one partition, runs only with one); the model's
    sources read with ``driver_read_records`` (0: every read through Spark's Kafka source).

    The continuous run lasts ``seconds``; when the target then has fewer than ``min_versions``
    versions (a loaded machine commits fewer batches in the same time), pgbench and the run go
    on, up to ``extra_s`` more, until it has them."""
    t0 = time.time()
    o = Outcome()
    db = Database()
    prefix = o.prefix = f"pgb{db.name}"
    m = MODELS[model]
    script = str(tmp_path / "tpcb.sql")
    start_pgbench_connector(stack, db, prefix, script, partitions=partitions)
    bench = None
    try:
        sources = kafka_sources(stack.bootstrap, prefix, m.sql, driver_read_records=driver_read_records)
        job = JobSpec.from_dbt(project_root=str(tmp_path), schema="bench", identifier=m.name, model_name=m.name,
                               sql=m.sql, sources=sources,
                               config={"unique_key": m.unique_key, "location_root": str(tmp_path / "targets"),
                                       "trigger": f"processing_time:{trigger_s}"},
                               warehouse_dir=str(tmp_path / "wh"))
        first = open_source(job.sources[0])
        wait_for(lambda: first.latest_position() >= 0, timeout=120, what="Debezium's snapshot on Kafka")
        available_now = JobSpec(**{**job.__dict__, "trigger": "available_now"})
        run_job(spark, available_now, full_refresh=True)
        bench = Workload(db, script, seconds=seconds, rate=rate, clients=clients)
        bench_started = time.time()
        if kill_connect_after_s is not None:
            def bounce():
                time.sleep(kill_connect_after_s)
                stack.kill_connect()
                o.connect_killed = True
                time.sleep(2)
                stack.start_connect()
                stack.wait_running(prefix)
            bouncer = threading.Thread(target=bounce, daemon=True)
            bouncer.start()
        if kill_run_after_s is not None:
            p = _run_in_subprocess(job, str(tmp_path), seconds + 30)
            time.sleep(kill_run_after_s)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            o.run_killed = True
            run_job(spark, job, timeout_s=max(seconds - kill_run_after_s, 5) + 2)
        else:
            run_job(spark, job, timeout_s=seconds + 2)
        while (DeltaTableRef(job.target_path).latest_version() + 1 < min_versions
               and time.time() < bench_started + seconds + extra_s):
            run_job(spark, job, timeout_s=10)
        bench.finish()
        if kill_connect_after_s is not None:
            bouncer.join(timeout=180)
        final = _rows(db.execute(m.sql.replace("pg.pgbench_", "public.pgbench_")))
        n_history = db.execute("select count(*) from pgbench_history")[0][0]
        hist = open_source(next(s for s in job.sources if s.name == "pgbench_history"))

        def landed():
            pos = hist.latest_position()
            return hist.reader().row_count("public.pgbench_history", pos) == n_history
        wait_for(landed, timeout=180, what="Kafka to hold every pgbench transaction")
        run_job(spark, available_now)
        target = DeltaTableRef(job.target_path)
        o.final_matches_database = _rows(_target_rows(job.target_path, target.latest_version())) == final
        reader = hist.reader()
        o.duplicates_dropped = reader.skipped["duplicates"]
        o.transactions = len([t for t in reader.transactions() if not t.snapshot])
        o.snapshot_rows = next((dict(t.counts) for t in reader.transactions() if t.snapshot), {})
        _check_versions(o, spark, m, job, target, spark_checks)
        if partitions == 1:
            _foil(o, m, job, reader, stack.bootstrap, prefix, foil_skew_ms)
    finally:
        if bench is not None:
            bench.stop()
        remove_connector(stack, db, prefix, f"s_{prefix}")
    o.seconds = round(time.time() - t0, 1)
    return o


def _check_versions(o: Outcome, spark, m, job: JobSpec, target: DeltaTableRef, spark_checks: int) -> None:
    commits = sorted((c for c in target.history() if "cut" in c.metadata), key=lambda c: c.version)
    spark_at = {commits[i].version for i in {0, len(commits) // 2, len(commits) - 1}} if commits else set()
    spark_at = set(sorted(spark_at)[:spark_checks])
    for c in commits:
        cut = Cut.from_json(c.metadata["cut"])
        pos = set(cut.versions.values())
        assert len(pos) == 1, f"version {c.version}: tables cut at different positions {cut.versions}"
        o.cut_positions.append(pos.pop())
        got = _rows(_target_rows(job.target_path, c.version))
        o.versions += 1
        o.invariant_violations += not m.consistent(got)
        o.oracle_mismatches += count_mismatches(spark, m.sql, job, c.version, cut, c.version in spark_at)
        o.spark_checked += c.version in spark_at


def _foil(o: Outcome, m, job: JobSpec, reader, bootstrap: str, prefix: str, skew_ms: int) -> None:
    """Per-topic reads of the same topics at each version's cut (module docstring)."""
    specs = JobSpec.from_dbt(project_root=os.path.dirname(job.target_path), schema="bench", identifier=m.name + "_foil",
                             model_name=m.name + "_foil", sql=m.sql,
                             sources=kafka_sources(bootstrap, prefix, m.sql, "per_topic"),
                             config={"unique_key": m.unique_key},
                             warehouse_dir=os.path.dirname(job.target_path)).sources
    events = {}
    for s in specs:
        r = open_source(s).reader(refresh=True)
        events[s.key] = [(t.ts_ms, t.position) for t in r.transactions()]
    commits = sorted((c for c in DeltaTableRef(job.target_path).history() if "cut" in c.metadata),
                     key=lambda c: c.version)
    for c in commits:
        x = next(iter(Cut.from_json(c.metadata["cut"]).versions.values()))
        if x <= 0:
            continue   # the snapshot: one position, nothing to split
        ts = reader.commit_ms(x)
        for skew in (skew_ms, 0):
            per_topic = {}
            for i, s in enumerate(specs):
                limit = ts + i * skew
                per_topic[s.key] = max([p for t, p in events[s.key] if t <= limit], default=-1)
            result = _rows(duckdb_result(m.sql, specs, Cut(per_topic)).itertuples(index=False))
            if skew:
                o.foil_versions += 1
                o.foil_violations += not m.consistent(result)
            else:
                o.control_violations += not m.consistent(result)
