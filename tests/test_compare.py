"""The one rule that compares a target with batch evaluation (consistent_stream.compare), by
itself and through ``consistent-stream verify``: exact columns equal, floating-point columns
(and columns computed from a floating-point SUM) within a tolerance, rows matched one to one."""
from __future__ import annotations

import decimal
import json
import math

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable

from consistent_stream.cli import main
from consistent_stream.compare import FloatTolerance, compare_tables
from consistent_stream.job import run_job
from consistent_stream.verify import record_model
from scenario import Scenario

# the pair of the report that made verify print FAILED on correct data: a ulp apart, and 9
# significant digits round them to different numbers
ROUNDING_PAIR = (1167.448435, 1167.4484349999998)


def test_values_a_ulp_apart_across_a_rounding_boundary_match():
    a, b = ROUNDING_PAIR
    assert math.nextafter(a, 0) == b and f"{a:.9g}" != f"{b:.9g}"
    r = compare_tables(pa.table({"k": [1], "x": [a]}), pa.table({"k": [1], "x": [b]}))
    assert r.ok and r.largest_difference["column"] == "x" and r.largest_difference["relative"] < 1e-15


def test_values_1e_6_apart_differ_and_the_difference_is_shown():
    r = compare_tables(pa.table({"k": [1, 2], "x": [1.0, 2.000001]}), pa.table({"k": [1, 2], "x": [1.0, 2.0]}))
    assert not r.ok and (r.missing, r.unexpected) == (1, 1)
    [missing] = [e for e in r.examples if "missing" in e]
    assert missing["missing"] == {"k": 2, "x": 2.0} and missing["nearest"] == {"k": 2, "x": 2.000001}
    d = missing["difference"]["x"]
    assert d["target"] == 2.000001 and d["expected"] == 2.0 and d["absolute"] == pytest.approx(1e-6)
    assert compare_tables(pa.table({"x": [2.000001]}), pa.table({"x": [2.0]}), tolerance=FloatTolerance(1e-5)).ok


def test_a_row_matches_at_most_one_row():
    # two target rows close to one expected row: one of them is unexpected, whatever the order
    got = pa.table({"k": [1, 1], "x": [1.0, 1.0 + 1e-12]})
    want = pa.table({"k": [1, 1], "x": [1.0, 5.0]})
    r = compare_tables(got, want)
    assert (r.missing, r.unexpected) == (1, 1) and r.examples[0]["missing"]["x"] == 5.0
    # a pairing the sorted order misses (x close to y only crosswise) is still found
    got = pa.table({"k": [1, 1], "x": [1.0, 2.0], "y": [2.0, 1.0]})
    want = pa.table({"k": [1, 1], "x": [2.0 + 1e-13, 1.0], "y": [1.0, 2.0 - 1e-13]})
    assert compare_tables(got, want).ok


def test_exact_columns_stay_exact_and_nan_null_and_infinities_follow_their_rules():
    assert not compare_tables(pa.table({"k": [1], "d": pa.array([decimal.Decimal("1.01")], pa.decimal128(9, 2))}),
                              pa.table({"k": [1], "d": pa.array([decimal.Decimal("1.00")], pa.decimal128(9, 2))})).ok
    assert not compare_tables(pa.table({"k": [10**15], "x": [1.0]}), pa.table({"k": [10**15 + 1], "x": [1.0]})).ok
    nan, inf = float("nan"), float("inf")
    assert compare_tables(pa.table({"x": [nan, inf, None, -0.0]}), pa.table({"x": [0.0, None, inf, nan]})).ok
    assert not compare_tables(pa.table({"x": [inf]}), pa.table({"x": [-inf]})).ok
    assert not compare_tables(pa.table({"x": [None]}), pa.table({"x": [0.0]})).ok
    with pytest.raises(ValueError, match="columns differ"):
        compare_tables(pa.table({"x": [1.0]}), pa.table({"y": [1.0]}))


def test_a_decimal_computed_from_a_double_may_differ_by_one_unit_in_its_last_place():
    got = pa.table({"d": pa.array([decimal.Decimal("0.13")], pa.decimal128(18, 2))})
    one_unit = pa.table({"d": pa.array([decimal.Decimal("0.12")], pa.decimal128(18, 2))})
    two_units = pa.table({"d": pa.array([decimal.Decimal("0.11")], pa.decimal128(18, 2))})
    assert not compare_tables(got, one_unit).ok                              # an exact column
    assert compare_tables(got, one_unit, inexact=["d"], unit={"d": 0.01}).ok
    assert not compare_tables(got, two_units, inexact=["d"], unit={"d": 0.01}).ok


def test_rows_tied_at_a_top_n_boundary_are_found_when_one_engine_types_the_key_double():
    """q78's ratio: Spark's DECIMAL division, DuckDB's DOUBLE. Two rows tie at the LIMIT 1
    boundary (ratio 1.13); each engine may keep either, so they are compared by the key only."""
    from consistent_stream.compare import TopN, compare_top_n
    got = pa.table({"ratio": pa.array([decimal.Decimal("1.13")], pa.decimal128(20, 2)), "item": [110]})
    duck = pa.table({"ratio": pa.array([1.13], pa.float64()), "item": [7]})
    top = TopN(keys=((0, True, False),))
    assert compare_top_n(got, duck, top).ok
    other = pa.table({"ratio": pa.array([1.14], pa.float64()), "item": [110]})
    assert not compare_top_n(got, other, top).ok


# ---- through verify ------------------------------------------------------------------------------
SQL = "select g, sum(x) as total, cast(sum(x) as decimal(18, 2)) as total_2dp, count(*) as n from src.t group by g"


@pytest.mark.parametrize("match_on", ["driver", "spark"])
def test_compare_frames_counts_rows_as_a_multiset_on_spark(spark, monkeypatch, match_on):
    """verify's comparison of two DataFrames: repeated rows count (two expected, one in the
    target: one missing), NULLs and NaN equal themselves, floats within the tolerance match,
    the matching of the rows left done on the driver or (past DRIVER_MATCH_ROWS) by Spark."""
    import consistent_stream.verify as verify
    if match_on == "spark":
        monkeypatch.setattr(verify, "DRIVER_MATCH_ROWS", 0)
    nan = float("nan")
    cols = "k string, x double, n int"
    expected = spark.createDataFrame([("a", 1.0, None), ("a", 1.0, None), ("b", nan, 2), ("c", 3.0, 3),
                                      ("d", 4.0, 4)], cols)
    got = spark.createDataFrame([("a", 1.0, None), ("b", nan, 2), ("c", 3.0 * (1 + 1e-12), 3), ("d", 4.5, 4),
                                 ("e", 5.0, 5)], cols)
    r = verify.compare_frames(got, expected, tolerance=FloatTolerance(), inexact=["x"], unit={})
    assert (r.rows_target, r.rows_expected, r.missing, r.unexpected) == (5, 5, 2, 2), r.describe()
    missing = sorted(e["missing"]["k"] for e in r.examples if "missing" in e)
    unexpected = sorted(e["unexpected"]["k"] for e in r.examples if "unexpected" in e)
    assert (missing, unexpected) == (["a", "d"], ["d", "e"]) and r.inexact_columns == ["x"]
    same = verify.compare_frames(expected, expected, tolerance=FloatTolerance(), inexact=["x"], unit={})
    assert same.ok and (same.rows_target, same.rows_expected) == (5, 5)


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("verify_floats")
    sc = Scenario(spark, root / "data", {"t": pa.table({"k": [1, 2, 3], "g": ["a", "b", "b"],
                                                        "x": [ROUNDING_PAIR[0], 0.5, 0.25]})}, {"t": ["k"]})
    job = sc.job(SQL, "g")
    run_job(spark, job, full_refresh=True)
    record_model(str(root), job)
    return job, str(root)


def _tamper(job, values: dict, group: str = "a") -> None:
    """Overwrite a group's values in the target as a new version that keeps the batch's commit
    metadata (verify then compares it with the batch's cut)."""
    dt = DeltaTable(job.target_path)
    meta = {k: v for k, v in dt.history(1)[0].items() if k.startswith("consistent_stream.")}
    dt.update(updates=values, predicate=f"g = '{group}'", commit_properties=CommitProperties(custom_metadata=meta))


def _verify(capsys, root: str, *extra) -> tuple[int, dict, str]:
    code = main(["verify", "m", "--project-dir", root, *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out.splitlines()[0]), out.err


def test_verify_reports_ok_on_values_a_ulp_apart_and_failed_on_values_1e_6_apart(built, capsys):
    job, root = built
    code, res, err = _verify(capsys, root)
    assert code == 0 and res["ok"] and res["inexact_columns"] == ["total", "total_2dp"]
    assert res["float_tolerance"] == {"relative": 1e-9, "absolute": 1e-12}

    _tamper(job, {"total": repr(ROUNDING_PAIR[1])})    # the last bit, across 9 digits' rounding boundary
    code, res, err = _verify(capsys, root)
    assert code == 0 and res["ok"] and "OK" in err
    assert res["largest_difference"]["column"] == "total" and 0 < res["largest_difference"]["relative"] < 1e-15
    assert "largest difference" in err

    _tamper(job, {"total": repr(0.75 + 1e-6)}, group="b")   # 1.3e-6 relative
    code, res, err = _verify(capsys, root)
    assert code == 1 and not res["ok"] and (res["missing"], res["unexpected"]) == (1, 1) and "FAILED" in err
    [shown] = [e for e in res["examples"] if "missing" in e]
    diff = shown["difference"]["total"]
    assert diff["expected"] == 0.75 and diff["target"] == 0.75 + 1e-6
    assert diff["absolute"] == pytest.approx(1e-6, rel=1e-6) and '"difference"' in err

    code, res, _ = _verify(capsys, root, "--float-tolerance", "1e-5")
    assert code == 0 and res["ok"] and res["float_tolerance"]["relative"] == 1e-5

    _tamper(job, {"total": "0.75"}, group="b")
    _tamper(job, {"total_2dp": "total_2dp - 0.01"})                                   # one unit: a rounding
    assert _verify(capsys, root)[0] == 0
    _tamper(job, {"total_2dp": "total_2dp - 0.01"})                                   # two units: wrong
    assert _verify(capsys, root)[0] == 1
    code = main(["verify", "m", "--project-dir", root, "--float-tolerance", "lots"])
    assert code == 2 and "--float-tolerance 'lots'" in capsys.readouterr().err
