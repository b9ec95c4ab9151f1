"""Temporal filters over time: a batch reads only the rows whose bound the clock crossed (the
state is kept in the order of the time key), a run whose sources did not move commits a batch
at the same cut only when a row crossed a bound, the session time zone decides
``current_date()``, and a replayed batch keeps the instant its first attempt had; a range join
reads the other side by the range of its compared columns, as a temporal filter reads by time."""
from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from consistent_stream import runtime
from consistent_stream.delta import DeltaTableRef
from consistent_stream.runtime import BatchMeta
from scenario import Scenario

UTC = datetime.timezone.utc
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)
DAYS = 400


class Clock:
    """The instants the runs take (``runtime.wall_clock_micros``)."""

    def __init__(self, monkeypatch, start: datetime.datetime):
        self.now = start
        monkeypatch.setattr(runtime, "wall_clock_micros",
                            lambda: (self.now - EPOCH) // datetime.timedelta(microseconds=1))

    def advance(self, **kw) -> None:
        self.now += datetime.timedelta(**kw)


def _scenario(spark, tmp_path) -> Scenario:
    start = datetime.date(2024, 1, 1)
    return Scenario(spark, tmp_path / "data", {"e": pa.table({
        "id": pa.array(range(DAYS), pa.int64()),
        "d": pa.array([start + datetime.timedelta(days=i) for i in range(DAYS)], pa.date32())})}, {"e": ["id"]})


def _meta(job) -> BatchMeta:
    return BatchMeta.from_commit(DeltaTableRef(job.target_path).latest_commit())


def test_a_moving_clock_reads_only_the_rows_whose_bound_it_crossed(spark, tmp_path, monkeypatch):
    clock = Clock(monkeypatch, datetime.datetime(2024, 6, 1, 12, tzinfo=UTC))
    sc = _scenario(spark, tmp_path)
    job = sc.job("select id, d from src.e where d >= date_sub(current_date(), 30) and d < current_date()", "id")
    job.state_file_rows = 20           # 20 base files, each a range of dates
    job.driver_rebuild_rows = 0
    sc.run(job, full_refresh=True)
    version = DeltaTableRef(job.target_path).latest_version()

    clock.advance(hours=6)             # the same day: nothing crossed a bound, nothing to commit
    summary = sc.run(job)
    assert summary["batches"] == 0 and summary["up_to_date"], summary
    assert DeltaTableRef(job.target_path).latest_version() == version

    clock.advance(days=3)              # the sources did not move, time did: rows enter and leave
    summary = sc.run(job)
    assert summary["batches"] == 1, summary
    m = summary["metrics"][0]
    assert m["changes_read"] == 0 and summary["rows_written"] == 6
    assert 0 < m["state_rows_read"] <= 80, m   # the files around the two bounds, of 400 rows
    assert _meta(job).cut == BatchMeta.from_commit(DeltaTableRef(job.target_path).commit_at(version)).cut

    sc.insert("e", pa.table({"id": [1000], "d": [datetime.date(2024, 5, 20)]}))
    clock.advance(days=1)              # a change and a moving clock in one batch
    summary = sc.run(job)
    assert summary["batches"] == 1 and summary["metrics"][0]["changes_read"] == 1


def test_the_session_time_zone_decides_current_date(spark, tmp_path, monkeypatch):
    """At 2024-06-01 20:00 UTC it is already 2024-06-02 in Tokyo: the view keeps the rows of
    the session's day, and its commit records the zone beside the instant."""
    Clock(monkeypatch, datetime.datetime(2024, 6, 1, 20, tzinfo=UTC))   # patches the run's wall clock
    sc = _scenario(spark, tmp_path)
    job = sc.job("select id, d from src.e where d = current_date()", "id")
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    try:
        sc.run(job, full_refresh=True)
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)
    assert _meta(job).clock.time_zone == "Asia/Tokyo"
    target = DeltaTableRef(job.target_path)
    rows = target.read_snapshot(spark, target.latest_version()).collect()
    assert [r.d for r in rows] == [datetime.date(2024, 6, 2)]
    sc.check(job)   # batch evaluation at the recorded instant and zone, whatever the session's zone now


def test_a_replayed_batch_keeps_the_instant_of_its_first_attempt(spark, tmp_path, monkeypatch):
    clock = Clock(monkeypatch, datetime.datetime(2024, 6, 1, 12, tzinfo=UTC))
    sc = _scenario(spark, tmp_path)
    job = sc.job("select id, d from src.e where d >= date_sub(current_date(), 10)", "id")
    sc.run(job, full_refresh=True)
    sc.insert("e", pa.table({"id": [1000], "d": [datetime.date(2024, 5, 25)]}))
    clock.advance(days=2)
    first_attempt = clock.now

    def crash(*a, **k):
        raise RuntimeError("injected crash before the target commit")
    with monkeypatch.context() as m:
        m.setattr(runtime, "commit_changes", crash)
        with pytest.raises(RuntimeError, match="injected crash"):
            sc.run(job)
    clock.advance(days=5)              # the replay runs later: it evaluates the first attempt's instant
    summary = sc.run(job)
    metas = [BatchMeta.from_commit(c) for c in reversed(DeltaTableRef(job.target_path).history())]
    replayed = metas[1]
    assert replayed.clock.micros == (first_attempt - EPOCH) // datetime.timedelta(microseconds=1)
    assert summary["batches"] == 2, summary   # the replay, then a batch at the same cut for the clock
    assert metas[2].cut == replayed.cut and metas[2].clock.micros > replayed.clock.micros


def test_a_range_join_reads_only_the_files_its_change_falls_in(spark, tmp_path):
    """``e.d between p.valid_from and p.valid_to`` (periods of two days over 400 days of
    events): each side is arranged by its first compared column, so a new event reads the
    periods' files whose range can hold its day, and a changed period the events' files in
    its range, not the other side's whole state; every version equals batch evaluation."""
    start = datetime.date(2024, 1, 1)
    sc = _scenario(spark, tmp_path)
    periods = pa.table({"pid": pa.array(range(DAYS // 2), pa.int64()),
                        "valid_from": pa.array([start + datetime.timedelta(days=2 * i) for i in range(DAYS // 2)],
                                               pa.date32()),
                        "valid_to": pa.array([start + datetime.timedelta(days=2 * i + 1) for i in range(DAYS // 2)],
                                             pa.date32())})
    from deltalake import write_deltalake
    from scenario import CDF
    write_deltalake(sc.path("p"), periods, configuration=CDF)
    sc.keys["p"] = ["pid"]
    job = sc.job("select e.id, p.pid from src.e e join src.p p on e.d between p.valid_from and p.valid_to",
                 ["id", "pid"])
    job.state_file_rows = 20           # 20 base files of events, 10 of periods, each a range
    job.driver_rebuild_rows = 0
    sc.run(job, full_refresh=True)

    sc.insert("e", pa.table({"id": [1000], "d": [datetime.date(2024, 5, 20)]}))
    m = sc.run(job)["metrics"][0]
    assert 0 < m["state_rows_read"] <= 40, m     # a file or two of the 200 periods

    sc.update("p", {"valid_to": "valid_to + INTERVAL '2 days'"}, "pid = 50")
    m = sc.run(job)["metrics"][0]
    assert 0 < m["state_rows_read"] <= 60, m     # the events' files around its days, of 401
