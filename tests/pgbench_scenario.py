"""pgbench TPC-B against a real PostgreSQL 15 while ``consistent-stream capture postgres`` and a
consistent_stream model (continuous, processing-time trigger) run: the invariant
``sum(abalance) = sum(tbalance) = sum(bbalance)`` at every committed target version, each
version equal to batch evaluation over snapshot + changes up to its recorded cut, and the foil:
the same check on the same data with per-table cuts.

Used by ``tests/test_pgbench_consistency.py`` (a short run) and
``benchmarks/pgbench_consistency.py`` (>= 50 versions).

The foil's per-table cuts model a reader whose sources report their offsets independently
(as Spark's own multi-source micro-batches do, each source's latest offset fetched in turn):
for a version whose transaction cut is at commit time t, table i of (accounts, tellers,
branches) is cut at the last transaction committed by t + i * ``foil_skew_ms``. Each table is
still cut between transactions; only the tables disagree on which one.
"""
from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field

from consistent_stream.delta import DeltaTableRef
from consistent_stream.job import run_job
from consistent_stream.oracle import batch_dataframe, duckdb_result
from consistent_stream.sources import Cut
from consistent_stream.sources.debezium import reader_for
from consistent_stream.spec import JobSpec
from postgres_server import Database, start_capture, stop_capture, wait_for

TABLES = ("pgbench_accounts", "pgbench_tellers", "pgbench_branches")
SQL = """
select 'accounts' as which, sum(abalance) as total from pg.pgbench_accounts
union all
select 'tellers' as which, sum(tbalance) as total from pg.pgbench_tellers
union all
select 'branches' as which, sum(bbalance) as total from pg.pgbench_branches
"""


@dataclass
class Outcome:
    versions: int = 0                 # committed target versions checked
    transactions: int = 0             # TPC-B transactions captured
    pgbench_tps: float = 0.0
    invariant_violations: int = 0     # versions whose three sums differ (must be 0)
    oracle_mismatches: int = 0        # versions that differ from batch evaluation (must be 0)
    spark_checked: int = 0
    foil_violations: int = 0          # versions whose per-table-cut sums differ
    foil_versions: int = 0
    cut_positions: list = field(default_factory=list)
    freshness_s: list = field(default_factory=list)
    final_matches_database: bool = False   # the last version equals PostgreSQL's own sums
    seconds: float = 0.0


def _sums(rows) -> dict:
    return {w: (None if t is None else int(t)) for w, t in rows}


def run(spark, tmp_path, *, seconds: float, clients: int = 4, rate: int | None = 200, scale: int = 1,
        trigger_s: float = 0.5, foil_skew_ms: int = 20, spark_checks: int = 3) -> Outcome:
    t0 = time.time()
    db = Database()
    srv = db.server
    init = subprocess.run([srv.bin("pgbench"), "-i", "-s", str(scale), "-q", "-h", "127.0.0.1", "-p", str(srv.port),
                           "-U", "postgres", db.name], capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    landing = str(tmp_path / "landing")
    tables = ",".join(f"public.{t}" for t in (*TABLES, "pgbench_history"))
    cap = start_capture(db.dsn, tables, "s_pgbench", landing, "--set-replica-identity-full",
                        log_path=str(tmp_path / "capture.log"))
    try:
        wait_for(lambda: json.load(open(f"{landing}/_capture.json")).get("snapshot_done"), what="the snapshot")
        sources = [{"source_name": "pg", "name": t, "relation": f"pg.{t}",
                    "meta": {"format": "debezium", "location": landing, "table": f"public.{t}"}} for t in TABLES]
        job = JobSpec.from_dbt(project_root=str(tmp_path), schema="bench", identifier="tpcb_sums",
                               model_name="tpcb_sums", sql=SQL, sources=sources,
                               config={"unique_key": "which", "location_root": str(tmp_path / "targets"),
                                       "trigger": f"processing_time:{trigger_s}"},
                               warehouse_dir=str(tmp_path / "wh"))
        bench = subprocess.Popen([srv.bin("pgbench"), "-c", str(clients), "-j", "2", "-T", str(int(seconds)), "-n",
                                  *(["-R", str(rate)] if rate else []), "-h", "127.0.0.1", "-p", str(srv.port),
                                  "-U", "postgres", db.name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # the model runs continuously while pgbench writes and capture lands files
        run_job(spark, job, full_refresh=True, timeout_s=seconds + 2)
        out, _ = bench.communicate(timeout=120)
        assert bench.returncode == 0, out
        tps = [line for line in out.splitlines() if line.startswith("tps")]
        # against the database itself: once capture has landed everything, one more run
        # (available-now) brings the view to the database's final sums
        final = _sums(db.execute("select 'accounts', sum(abalance) from pgbench_accounts union all "
                                 "select 'tellers', sum(tbalance) from pgbench_tellers union all "
                                 "select 'branches', sum(bbalance) from pgbench_branches"))
        n_history = db.execute("select count(*) from pgbench_history")[0][0]
        r = reader_for(landing)
        wait_for(lambda: r.refresh().changes("public.pgbench_history", -1, r.latest_position(), ["tid"]).num_rows
                 == n_history, what="capture to land every pgbench transaction")
        catch_up = JobSpec(**{**job.__dict__, "trigger": "available_now"})
        run_job(spark, catch_up)
        last = DeltaTableRef(job.target_path).latest_version()
        final_matches = _sums(_target_rows(job.target_path, last)) == final
    finally:
        stop_capture(cap)

    o = Outcome(pgbench_tps=float(tps[0].split("=")[1].split()[0]) if tps else 0.0, final_matches_database=final_matches)
    reader = reader_for(landing)
    txs = [t for t in reader.transactions() if not t.snapshot]
    o.transactions = len(txs)
    target = DeltaTableRef(job.target_path)
    commits = [c for c in target.history() if "cut" in c.metadata]
    commits.sort(key=lambda c: c.version)
    spark_at = {commits[i].version for i in {0, len(commits) // 2, len(commits) - 1}} if commits else set()
    spark_at = set(list(spark_at)[:spark_checks])
    for c in commits:
        cut = Cut.from_json(c.metadata["cut"])
        pos = set(cut.versions.values())
        assert len(pos) == 1, f"version {c.version}: tables cut at different positions {cut.versions}"
        x = pos.pop()
        o.cut_positions.append(x)
        o.freshness_s.append((c.timestamp_ms - int(c.metadata["source_commit_ms"])) / 1000.0)
        got = _sums(_target_rows(job.target_path, c.version))
        o.versions += 1
        if len(set(got.values())) != 1:
            o.invariant_violations += 1
        expected = _sums(duckdb_result(SQL, job.sources, cut)[["which", "total"]].itertuples(index=False))
        if got != expected:
            o.oracle_mismatches += 1
        if c.version in spark_at:
            o.spark_checked += 1
            if _sums(batch_dataframe(spark, SQL, job.sources, cut).collect()) != got:
                o.oracle_mismatches += 1
        # the foil: per-table cuts on the same data
        ts = reader.commit_ms(x)
        per_table = {}
        for i, s in enumerate(job.sources):
            limit = ts + i * foil_skew_ms
            per_table[s.key] = max([t.position for t in txs if t.ts_ms <= limit] + [x])
        foil = _sums(duckdb_result(SQL, job.sources, Cut(per_table))[["which", "total"]].itertuples(index=False))
        o.foil_versions += 1
        if len(set(foil.values())) != 1:
            o.foil_violations += 1
    o.seconds = round(time.time() - t0, 1)
    return o


def _target_rows(path: str, version: int):
    from helpers import delta_pandas
    df = delta_pandas(path, version)
    return list(df[["which", "total"]].itertuples(index=False))
