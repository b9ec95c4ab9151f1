"""pgbench TPC-B against a real PostgreSQL 15 while ``consistent-stream capture postgres`` and a
consistent_stream model (built once from the snapshot, then continuous with a processing-time
trigger) run: the model's invariant at every committed target version, each version equal to
batch evaluation over snapshot + changes up to its recorded cut, and the foil: the same check
on the same data with per-table cuts. Two models (:data:`MODELS`):

* ``tpcb_sums``: ``sum(abalance) = sum(tbalance) = sum(bbalance)`` (three global sums);
* ``branch_balances`` (issue 8's model): per branch ``bbalance`` = the sum of its history's
  deltas (a LEFT JOIN with an aggregate), and three uncorrelated scalar subqueries
  ``asum = tsum = bsum``.

Used by ``tests/test_pgbench_consistency.py`` (short runs) and
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
from consistent_stream.sources.debezium.source import reader_for
from consistent_stream.spec import JobSpec
from postgres_server import Database, start_capture, stop_capture, wait_for

TABLES = ("pgbench_accounts", "pgbench_tellers", "pgbench_branches", "pgbench_history")


@dataclass(frozen=True)
class Model:
    """A model over the captured pgbench tables: its SQL (sources ``pg.<table>``), unique key,
    and ``consistent(rows)``: whether a version's rows (tuples in column order) satisfy the
    invariant every transaction-consistent state has."""
    name: str
    sql: str
    unique_key: str
    consistent: object


def _sums_equal(rows) -> bool:
    return len({r[1] for r in rows}) == 1


def _branches_balance(rows) -> bool:
    # bid, bbalance, hist, asum, tsum, bsum
    return bool(rows) and all(r[1] == r[2] and r[3] == r[4] == r[5] for r in rows)


MODELS = {
    "tpcb_sums": Model("tpcb_sums", """
select 'accounts' as which, sum(abalance) as total from pg.pgbench_accounts
union all
select 'tellers' as which, sum(tbalance) as total from pg.pgbench_tellers
union all
select 'branches' as which, sum(bbalance) as total from pg.pgbench_branches
""", "which", _sums_equal),
    "branch_balances": Model("branch_balances", """
select b.bid, b.bbalance, coalesce(h.total, 0) as hist,
       (select sum(abalance) from pg.pgbench_accounts) as asum,
       (select sum(tbalance) from pg.pgbench_tellers) as tsum,
       (select sum(bbalance) from pg.pgbench_branches) as bsum
from pg.pgbench_branches b
left join (select bid, sum(delta) as total from pg.pgbench_history group by bid) h on h.bid = b.bid
""", "bid", _branches_balance),
}


@dataclass
class Outcome:
    """What one run found (counts of committed target versions)."""
    versions: int = 0                 # committed target versions checked
    transactions: int = 0             # TPC-B transactions captured
    pgbench_tps: float = 0.0
    invariant_violations: int = 0     # versions whose three sums differ (must be 0)
    oracle_mismatches: int = 0        # versions that differ from batch evaluation (must be 0)
    spark_checked: int = 0
    foil_violations: int = 0          # versions whose per-table-cut sums differ
    foil_versions: int = 0
    control_violations: int = 0       # the foil's check with zero skew (one cut): must be 0
    cut_positions: list = field(default_factory=list)
    freshness_s: list = field(default_factory=list)
    final_matches_database: bool = False   # the last version equals PostgreSQL's own sums
    seconds: float = 0.0


def _rows(rows) -> list:
    """A result as sorted tuples of ints/strings (NULL kept), comparable across engines."""
    out = []
    for r in rows:
        out.append(tuple(None if v is None else (v if isinstance(v, str) else int(v)) for v in r))
    return sorted(out, key=lambda t: tuple((v is None, v) for v in t))


def run(spark, tmp_path, *, seconds: float, clients: int = 4, rate: int | None = 200, scale: int = 1,
        trigger_s: float = 0.5, foil_skew_ms: int = 20, spark_checks: int = 3,
        model: str = "tpcb_sums") -> Outcome:
    t0 = time.time()
    db = Database()
    srv = db.server
    init = subprocess.run([srv.bin("pgbench"), "-i", "-s", str(scale), "-q", "-h", "127.0.0.1", "-p", str(srv.port),
                           "-U", "postgres", db.name], capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    landing = str(tmp_path / "landing")
    tables = ",".join(f"public.{t}" for t in TABLES)
    m = MODELS[model]
    # replication slots are per server, not per database: one per test database
    cap = start_capture(db.dsn, tables, f"s_{db.name}", landing, "--set-replica-identity-full",
                        log_path=str(tmp_path / "capture.log"))
    try:
        wait_for(lambda: json.load(open(f"{landing}/_capture.json")).get("snapshot_done"), what="the snapshot")
        sources = [{"source_name": "pg", "name": t, "relation": f"pg.{t}",
                    "meta": {"format": "debezium", "location": landing, "table": f"public.{t}"}} for t in TABLES
                   if f"pg.{t}" in m.sql]
        job = JobSpec.from_dbt(project_root=str(tmp_path), schema="bench", identifier=m.name,
                               model_name=m.name, sql=m.sql, sources=sources,
                               config={"unique_key": m.unique_key, "location_root": str(tmp_path / "targets"),
                                       "trigger": f"processing_time:{trigger_s}"},
                               warehouse_dir=str(tmp_path / "wh"))
        # the initial build from the snapshot first, as a user runs it (one `dbt run`), so the
        # continuous run below starts from a built view and spends its time on pgbench's changes
        available_now = JobSpec(**{**job.__dict__, "trigger": "available_now"})
        run_job(spark, available_now, full_refresh=True)
        bench = subprocess.Popen([srv.bin("pgbench"), "-c", str(clients), "-j", "2", "-T", str(int(seconds)), "-n",
                                  *(["-R", str(rate)] if rate else []), "-h", "127.0.0.1", "-p", str(srv.port),
                                  "-U", "postgres", db.name],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # the model runs continuously while pgbench writes and capture lands files
        run_job(spark, job, timeout_s=seconds + 2)
        out, _ = bench.communicate(timeout=120)
        assert bench.returncode == 0, out
        tps = [line for line in out.splitlines() if line.startswith("tps")]
        # against the database itself: once capture has landed everything, one more run
        # (available-now) brings the view to the model's SQL evaluated by PostgreSQL
        final = _rows(db.execute(m.sql.replace("pg.pgbench_", "public.pgbench_")))
        n_history = db.execute("select count(*) from pgbench_history")[0][0]
        r = reader_for(landing)
        wait_for(lambda: r.refresh().changes("public.pgbench_history", -1, r.latest_position(), ["tid"]).num_rows
                 == n_history, what="capture to land every pgbench transaction")
        run_job(spark, available_now)
        last = DeltaTableRef(job.target_path).latest_version()
        final_matches = _rows(_target_rows(job.target_path, last)) == final
    finally:
        stop_capture(cap)

    o = Outcome(pgbench_tps=float(tps[0].split("=")[1].split()[0]) if tps else 0.0,
                final_matches_database=final_matches)
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
        got = _rows(_target_rows(job.target_path, c.version))
        o.versions += 1
        if not m.consistent(got):
            o.invariant_violations += 1
        o.oracle_mismatches += count_mismatches(spark, m.sql, job, c.version, cut, c.version in spark_at)
        o.spark_checked += c.version in spark_at
        # the foil: per-table cuts on the same data; its control: the same construction with
        # zero skew, which must give one cut and keep the invariant (so the foil's
        # violations come from the skew, not from how the foil builds or checks its cuts)
        ts = reader.commit_ms(x)
        for skew in (foil_skew_ms, 0):
            per_table = {}
            for i, s in enumerate(job.sources):
                limit = ts + i * skew
                per_table[s.key] = max([t.position for t in txs if t.ts_ms <= limit] + [x])
            result = _rows(duckdb_result(m.sql, job.sources, Cut(per_table)).itertuples(index=False))
            if skew:
                o.foil_versions += 1
                o.foil_violations += not m.consistent(result)
            else:
                o.control_violations += not m.consistent(result)
    o.seconds = round(time.time() - t0, 1)
    return o


def count_mismatches(spark, sql: str, job: JobSpec, version: int, cut: Cut, with_spark: bool) -> int:
    """How many of the batch evaluations (DuckDB, and Spark when ``with_spark``) of ``sql`` at
    ``cut`` the target's ``version`` differs from, by the project's comparison rule
    (consistent_stream.compare)."""
    from deltalake import DeltaTable
    from consistent_stream.compare import compare_tables
    got = DeltaTable(job.target_path, version=version).to_pyarrow_table()
    expected = [duckdb_result(sql, job.sources, cut, arrow=True)]
    if with_spark:
        expected.append(batch_dataframe(spark, sql, job.sources, cut).toArrow())
    return sum(not compare_tables(got, e).ok for e in expected)


def _target_rows(path: str, version: int):
    from helpers import delta_pandas
    return list(delta_pandas(path, version).itertuples(index=False))
