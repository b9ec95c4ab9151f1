"""A consistent_stream model over Debezium sources captured from a real PostgreSQL 15: every
committed version equals batch evaluation (Spark and DuckDB) over snapshot + changes up to its
recorded cut, the cut is one transaction position shared by all tables, and the commit records
the cut's LSN and the source commit time."""
from __future__ import annotations

import json
import random
import threading
import time

import pytest

from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import ConfigError
from consistent_stream.job import run_job
from consistent_stream.sources import SourceSpec
from consistent_stream.sources.debezium.source import reader_for
from consistent_stream.sources.landing import parse_lsn
from helpers import assert_target_equals_batch_evaluation, delta_pandas, job_for
from postgres_server import Database, start_capture, stop_capture, wait_for

SQL = """
with t as (select dst, count(*) as n, sum(amount) as received from bank.transfers group by dst)
select a.branch, count(*) as accounts, sum(a.balance) as balance,
       sum(coalesce(t.n, 0)) as transfers_in, sum(coalesce(t.received, 0)) as received
from bank.accounts a left join t on t.dst = a.id
group by a.branch
"""
N_ACCOUNTS = 40


def _sources(landing):
    return [{"source_name": "bank", "name": n, "relation": f"bank.{n}",
             "meta": {"format": "debezium", "location": landing, "table": f"public.{n}", "primary_key": k}}
            for n, k in (("accounts", ["id"]), ("transfers", ["tid"]))]


def _transfers(db: Database, n: int, seed: int) -> int:
    """n transactions, each moving money between two accounts and recording the transfer."""
    rng = random.Random(seed)
    conn = db.connect()
    conn.autocommit = False
    cur = conn.cursor()
    for _ in range(n):
        src, dst = rng.sample(range(N_ACCOUNTS), 2)
        amt = rng.randint(1, 50)
        cur.execute("update accounts set balance = balance - %s where id = %s", (amt, src))
        cur.execute("insert into transfers (src, dst, amount) values (%s, %s, %s) returning tid", (src, dst, amt))
        cur.execute("update accounts set balance = balance + %s where id = %s", (amt, dst))
        conn.commit()
    cur.execute("select max(tid) from transfers")
    last = cur.fetchone()[0]
    conn.close()
    return last


def _bank(tmp_path, slot: str):
    """A database with N_ACCOUNTS accounts of 1000 and no transfers, captured into
    ``tmp_path/landing`` through replication slot ``slot``: (database, landing, capture)."""
    db = Database()
    db.execute(f"""create table accounts (id int primary key, branch int, balance bigint);
                   create table transfers (tid serial primary key, src int, dst int, amount int);
                   alter table accounts replica identity full; alter table transfers replica identity full;
                   insert into accounts select g, g % 4, 1000 from generate_series(0, {N_ACCOUNTS - 1}) g;""")
    landing = str(tmp_path / "landing")
    cap = start_capture(db.dsn, "public.accounts,public.transfers", slot, landing, log_path=str(tmp_path / "cap.log"))
    return db, landing, cap


def test_model_over_captured_postgres_tables_equals_batch_evaluation_at_every_cut(spark, tmp_path):
    db, landing, cap = _bank(tmp_path, "s_model")
    try:
        job = job_for("bank_branches", SQL, _sources(landing), "branch", tmp_path)
        # writes keep going while the model runs: cuts land between transactions, never inside
        stop = threading.Event()
        writer = threading.Thread(target=lambda: [(_transfers(db, 5, i), time.sleep(0.05))
                                                  for i in range(10_000) if not stop.is_set()])
        wait_for(lambda: reader_for(landing).latest_position() > 0, what="the snapshot")
        writer.start()
        versions = []
        for round_ in range(2):
            t0 = time.time()
            summary = run_job(spark, job, full_refresh=(round_ == 0))
            t1 = time.time()
            assert summary["batches"] == 1
            versions.append(summary["target_version"])
            # the writer goes on: the sources are already past the run's cut
            assert_target_equals_batch_evaluation(spark, job, f"round {round_}", at_latest=False)
            print(f"round {round_}: run {t1 - t0:.1f}s, check {time.time() - t1:.1f}s, "
                  f"{summary['changes_read']} changes")
            time.sleep(0.3)
        stop.set()
        writer.join()
        last_tid = _transfers(db, 3, 99)
        wait_for(lambda: last_tid in reader_for(landing).table_at("public.transfers", reader_for(landing)
                                                                  .latest_position()).column("tid").to_pylist(),
                 what="the last transfer to land")
        run_job(spark, job)
        assert_target_equals_batch_evaluation(spark, job, "after the writes")
    finally:
        stop_capture(cap)

    reader = reader_for(landing)
    positions = {t.position for t in reader.transactions()}
    target = DeltaTableRef(job.target_path)
    cuts = []
    for v in versions:
        meta = target.commit_at(v).metadata
        cut = meta["cut"] if isinstance(meta["cut"], dict) else json.loads(meta["cut"])
        # one transaction position for every table of the landing directory
        assert len(set(cut.values())) == 1 and next(iter(cut.values())) in positions
        lsn = meta["cut_lsn"] if isinstance(meta["cut_lsn"], dict) else json.loads(meta["cut_lsn"])
        assert parse_lsn(lsn[landing]) == next(iter(cut.values()))
        assert int(meta["source_commit_ms"]) == reader.commit_ms(next(iter(cut.values()))) > 0
        cuts.append(next(iter(cut.values())))
    assert cuts == sorted(cuts) and len(set(cuts)) > 1, cuts
    # money is conserved at every version: a transfer is never half-visible
    for v in versions:
        assert delta_pandas(job.target_path, v)["balance"].sum() == N_ACCOUNTS * 1000
    # the final state is the database's
    final = delta_pandas(job.target_path).sort_values("branch")
    expected = db.execute("select branch, sum(balance) from accounts group by branch order by branch")
    assert [(int(b), int(s)) for b, s in zip(final["branch"], final["balance"])] == expected


def test_debezium_source_config_names_the_missing_key(tmp_path):
    bad = {"source_name": "bank", "name": "accounts", "relation": "bank.accounts",
           "meta": {"format": "debezium", "location": str(tmp_path)}}
    with pytest.raises(ConfigError, match=r"meta.consistent_stream.table is required .* table: public.accounts"):
        SourceSpec.from_dbt(bad, str(tmp_path))


def test_chain_over_one_landing_directory_reads_every_table_at_the_upstreams_transaction(spark, tmp_path):
    """An upstream model over transfers, a downstream joining it with accounts read directly
    from the same landing directory, while transactions keep landing: the downstream reads
    accounts at the transaction position its upstream version reflects (one clock), never a
    newer one, and equals batch evaluation of the chain there."""
    from helpers import model_ref
    db, landing, cap = _bank(tmp_path, "s_chain")
    stop = threading.Event()
    writer = threading.Thread(target=lambda: [(_transfers(db, 5, i), time.sleep(0.05))
                                              for i in range(10_000) if not stop.is_set()])
    try:
        accounts, transfers = _sources(landing)
        up = job_for("received", "select dst, count(*) as n, sum(amount) as received from bank.transfers "
                                 "group by dst", [transfers], None, tmp_path)
        wait_for(lambda: reader_for(landing).latest_position() > 0, what="the snapshot")
        writer.start()
        down = None
        for round_ in range(3):
            run_job(spark, up, full_refresh=(round_ == 0))
            time.sleep(0.3)   # transactions land between the upstream's run and the downstream's
            wait_for(lambda: reader_for(landing).latest_position() >
                     json.loads(DeltaTableRef(up.target_path).latest_commit().metadata["cut"])["bank.transfers"],
                     what="a transaction after the upstream's cut")
            if down is None:
                down = job_for("branch_received", "select a.branch, sum(a.balance) as balance, "
                               "sum(coalesce(u.received, 0)) as received from bank.accounts a "
                               "left join tests.received u on u.dst = a.id group by a.branch",
                               [accounts, model_ref("received", tmp_path)], "branch", tmp_path)
            run_job(spark, down, full_refresh=(round_ == 0))
            meta = DeltaTableRef(down.target_path).latest_commit().metadata
            cut, base = json.loads(meta["cut"]), json.loads(meta["base_cut"])
            up_base = json.loads(DeltaTableRef(up.target_path).commit_at(cut["model.received"]).metadata["base_cut"])
            assert base["bank.accounts"] == base["bank.transfers"] == up_base["bank.transfers"] \
                == cut["bank.accounts"], (cut, base, up_base)
            assert cut["bank.accounts"] < reader_for(landing).latest_position()
            assert_target_equals_batch_evaluation(spark, down, f"chain round {round_}")
            assert delta_pandas(down.target_path)["balance"].sum() == N_ACCOUNTS * 1000
    finally:
        stop.set()
        if writer.is_alive():
            writer.join()
        stop_capture(cap)
