"""Secrets stay secret: a password planted in the capture's DSN appears in no error, log,
landing file, checkpoint or target file that the capture and a model run produce; the
capture can take its connection from the environment instead of the command line; the
landing directory and the writer lock are owner-only."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from consistent_stream.capture.postgres import CaptureConfig, PostgresCapture, redact_dsn
from consistent_stream.errors import ConsistentStreamError
from consistent_stream.job import run_job
from consistent_stream.sources.debezium.source import reader_for
from helpers import assert_target_equals_batch_evaluation, job_for
from postgres_server import Database, start_capture, stop_capture, wait_for

PASSWORD = "Pl4nted-s3cret-9731"


def test_redact_dsn_hides_the_password_in_both_forms():
    assert PASSWORD not in redact_dsn(f"host=h port=1 user=u password={PASSWORD} dbname=d")
    assert "password=***" in redact_dsn(f"host=h password={PASSWORD}")
    assert PASSWORD not in redact_dsn(f"postgresql://u:{PASSWORD}@h:5/d")
    assert PASSWORD not in redact_dsn(f"host=h password='{PASSWORD}' bad bad")


def test_a_connection_error_names_the_dsn_without_its_password(tmp_path):
    cfg = CaptureConfig(dsn=f"host=127.0.0.1 port=1 user=u password={PASSWORD} dbname=d connect_timeout=2",
                        tables=("public.t",), slot="s", landing=str(tmp_path / "landing"))
    with pytest.raises(ConsistentStreamError) as e:
        PostgresCapture(cfg).run()
    assert "port=1" in str(e.value) and "password=***" in str(e.value)
    assert PASSWORD not in str(e.value)


def _files_containing(root: Path, needle: bytes) -> list[str]:
    hits = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                with open(path, "rb") as f:
                    if needle in f.read():
                        hits.append(path)
            except OSError:
                pass
    return hits


def test_a_planted_password_is_found_nowhere(spark, tmp_path):
    db = Database()
    db.execute("create table items (id int primary key, v int); alter table items replica identity full; "
               "insert into items select g, g from generate_series(1, 20) g;")
    landing = str(tmp_path / "landing")
    # the whole DSN, password included, through the environment (no --dsn, so `ps` shows no
    # secret); the test database trusts local connections, so the password is not needed
    cap = start_capture(None, "public.items", "s_secret", landing,
                        env={"CONSISTENT_STREAM_PG_DSN": f"{db.dsn} password={PASSWORD}"},
                        log_path=str(tmp_path / "capture.log"))
    try:
        wait_for(lambda: reader_for(landing).latest_position() > 0, what="the snapshot")
        p0 = reader_for(landing).latest_position()
        db.execute("update items set v = v + 1 where id < 5")
        wait_for(lambda: reader_for(landing).latest_position() > p0, what="the update to land")
        sources = [{"source_name": "pg", "name": "items", "relation": "pg.items",
                    "meta": {"format": "debezium", "location": landing, "table": "public.items",
                             "primary_key": ["id"]}}]
        job = job_for("items_sum", "select sum(v) as s, count(*) as n from pg.items", sources, None, tmp_path)
        run_job(spark, job, full_refresh=True)
        assert_target_equals_batch_evaluation(spark, job, "over the capture")
    finally:
        stop_capture(cap)
    # a DSN with the password in it, to a server that is not there: the error is logged
    bad = start_capture(f"host=127.0.0.1 port=1 password={PASSWORD} connect_timeout=2", "public.items",
                        "s_secret2", str(tmp_path / "landing2"), log_path=str(tmp_path / "capture.log"))
    bad.wait(timeout=60)
    assert bad.returncode != 0
    assert "password=***" in (tmp_path / "capture.log").read_text()
    assert _files_containing(tmp_path, PASSWORD.encode()) == []
    assert stat.S_IMODE(os.stat(landing).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(job.checkpoint_location + ".lock").st_mode) == 0o600
