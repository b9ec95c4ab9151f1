"""The operator's view (consistent_stream.observe, through the ``consistent-stream`` command):
``status``, ``plot``, ``explain`` and ``verify --version``, on a model run with real Spark
and real Delta tables, and read back from its Delta log and checkpoint."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from consistent_stream.cli import main
from consistent_stream.job import run_job
from consistent_stream.verify import record_model
from scenario import Scenario

SQL = "select g, count(*) as n, sum(v) as s from src.t group by g"


@pytest.fixture(scope="module")
def project(spark, tmp_path_factory):
    """A model run twice (version 0 built, version 1 one inserted row later), recorded in a
    project directory as ``dbt run`` records it. Shared by this module's tests: they only add
    source rows, never run the model again."""
    tmp_path = tmp_path_factory.mktemp("observe")
    sc = Scenario(spark, tmp_path / "data", {"t": pa.table({"k": [1, 2, 3], "g": ["a", "a", "b"],
                                                            "v": [10, 20, 30]})}, {"t": ["k"]})
    job = sc.job(SQL, "g")
    run_job(spark, job, full_refresh=True)
    sc.insert("t", pa.table({"k": [4], "g": ["c"], "v": [5]}))
    run_job(spark, job)
    record_model(str(tmp_path), job)
    return sc, job, str(tmp_path)


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_shows_version_cut_lag_freshness_and_the_last_batch(project, capsys):
    sc, job, root = project
    code, out, _ = _run(capsys, "status", "--project-dir", root, "--json")
    [status] = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and status["model"] == "m" and status["target_version"] == 1 and status["batch_id"] == 1
    assert status["cut"] == {"src.t": 1} and status["lag_versions"] == 0 and status["lag_s"] == 0.0
    assert status["strategy"] == "incremental" and status["last_batch_changes"] == 1
    assert 0 < status["last_batch_s"] < 300 and 0 <= status["freshness_s"] < 300 and status["error"] is None
    sc.insert("t", pa.table({"k": [5], "g": ["a"], "v": [1]}))          # the sources move on, the model not
    sc.insert("t", pa.table({"k": [6], "g": ["a"], "v": [1]}))
    _, out, _ = _run(capsys, "status", "m", "--project-dir", root, "--json")
    lag = json.loads(out)["lag"]["src.t"]
    assert lag["cut"] == 1 and lag["latest"] == 3 and lag["versions"] == 2 and lag["seconds"] >= 0
    code, table, _ = _run(capsys, "status", "--project-dir", root)
    assert code == 0 and "lag (versions)" in table and "src.t@1" in table
    assert [line for line in table.splitlines() if "│ m " in line][0].split("│")[5].strip() == "2"


def test_status_of_a_project_without_models_says_what_to_do(tmp_path, capsys):
    code, _, err = _run(capsys, "status", "--project-dir", str(tmp_path))
    assert code == 2 and "no consistent_stream model has been run" in err and "dbt run" in err


def test_explain_shows_operators_their_state_keys_and_rows(project, capsys):
    code, out, _ = _run(capsys, "explain", "m", "--project-dir", project[2])
    assert code == 0 and "merged by unique_key ['g']" in out
    lines = out.splitlines()
    agg = next(i for i, line in enumerate(lines) if " Aggregate by " in line)
    assert "sum(" in lines[agg] and "Scan src.t ['g', 'v']" in out
    # the aggregate's state: one row per group (a, b, c) under its key
    assert any(line.strip().startswith("state ") and "key ['" in line and "3 rows in" in line
               for line in lines[agg + 1:agg + 3])


def test_plot_writes_a_png_of_every_version(project, tmp_path, capsys):
    png = tmp_path / "out" / "m.png"
    code, out, _ = _run(capsys, "plot", "m", "--project-dir", project[2], "--out", str(png))
    assert code == 0 and json.loads(out)["versions"] == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_verify_checks_any_retained_version(project, capsys):
    root = project[2]
    code, out, _ = _run(capsys, "verify", "m", "--project-dir", root, "--version", "0")
    assert code == 0 and json.loads(out.splitlines()[0])["target_version"] == 0
    assert json.loads(out.splitlines()[0])["rows_target"] == 2          # groups a, b before the insert
    code, _, err = _run(capsys, "verify", "m", "--project-dir", root, "--version", "7")
    assert code == 2 and "has versions 0..1, not 7" in err


def test_explain_says_how_each_operator_is_maintained_and_status_counts_rows_recomputed(spark, tmp_path, capsys):
    """A top-N per group over a window (incremental: touched partitions) beside a block
    without a delta rule (a kurtosis: recomputed); ``explain`` names each operator's mode and
    what a batch reads, ``status`` the last batch's rows recomputed."""
    sc = Scenario(spark, tmp_path / "data", {"t": pa.table({"k": [1, 2, 3, 4], "g": ["a", "a", "b", "b"],
                                                            "v": [10, 20, 30, 40]})}, {"t": ["k"]})
    sql = ("with ranked as (select g, k, v from src.t "
           "qualify row_number() over (partition by g order by v desc) <= 1), "
           "med as (select g, kurtosis(v) as m from src.t group by g) "
           "select r.g, r.k, r.v, med.m from ranked r join med on r.g = med.g")
    job = sc.job(sql, "g")
    job.model = "mixed"
    run_job(spark, job, full_refresh=True)
    sc.insert("t", pa.table({"k": [5], "g": ["a"], "v": [50]}))
    run_job(spark, job)
    record_model(str(tmp_path), job)
    code, out, _ = _run(capsys, "explain", "mixed", "--project-dir", str(tmp_path))
    ops = [line for line in out.splitlines() if line.strip()[:2].isdigit()]
    assert code == 0 and ops and all("[incremental: reads " in line or "[recompute: reads " in line for line in ops)
    window = next(line for line in ops if " Window " in line)
    assert ("[incremental: reads the state of the partitions the change touches" in window
            and "keeping ranks 1..1" in window)
    assert "[recompute: reads its whole inputs" in next(line for line in ops if " Recompute " in line)
    code, out, _ = _run(capsys, "status", "mixed", "--project-dir", str(tmp_path), "--json")
    assert json.loads(out)["last_batch_recomputed"] > 0
