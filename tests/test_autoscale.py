"""The lag-based autoscaling policy (consistent_stream.autoscale, after Blink's autoscaler)
on synthetic batch metrics: the formulas, the triggers, the stable period, the bounds."""
from __future__ import annotations

import math

import pytest

from consistent_stream.autoscale import Autoscaler, AutoscaleConfig, BatchSample
from consistent_stream.errors import ConfigError
from consistent_stream.spec import JobSpec

CFG = AutoscaleConfig(min_parallelism=1, max_parallelism=8, lag_threshold_s=5, scale_down_ratio=2,
                      safety_factor=3, stable_s=10, window=3)


def feed(a: Autoscaler, batches: list[tuple], t0: float = 0.0, every: float = 1.0):
    """batches: (rows, cost in core-seconds per row, lag_s[, state_rows]); a batch takes
    rows x cost / parallelism seconds (the policy's model: no skew); one ends every ``every`` s."""
    out = []
    for i, b in enumerate(batches):
        rows, cost, lag_s = b[:3]
        seconds = rows * cost / a.parallelism
        out.append(a.observe(BatchSample(t0 + i * every, rows, seconds, a.parallelism, lag_rows=int(lag_s * 100),
                                         lag_s=lag_s, state_rows=b[3] if len(b) > 3 else 0)))
    return out


def test_a_steady_load_without_lag_holds():
    a = Autoscaler(CFG, initial=2)
    decisions = feed(a, [(1000, 0.0004, 0.5)] * 20)
    assert {d.action for d in decisions} == {"hold"} and a.parallelism == 2
    assert decisions[0].reason.startswith("collecting metrics")


def test_a_growing_lag_scales_up_to_the_seed_s_target():
    """Lag grows 1 s per second (the sources produce twice what is processed): tps_target =
    tps_current x (1 + 1); the per-row cost x 3 gives the parallelism."""
    a = Autoscaler(CFG, initial=1)
    lags = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    decisions = feed(a, [(1000, 0.0009, lag) for lag in lags])
    up = [d for d in decisions if d.action == "up"]
    assert up, [d.reason for d in decisions]
    d = up[0]
    i = decisions.index(d)
    assert lags[i] > CFG.lag_threshold_s and i * 1.0 >= CFG.stable_s   # after the threshold and the stable period
    tps = 3 * 1000 / 3.0          # 3 batches of the window over 3 s
    cost = 0.9 * 1 / 1000         # core-seconds per row at parallelism 1
    assert d.inputs["tps_current"] == pytest.approx(tps) and d.inputs["delay_increasing_rate"] == pytest.approx(1.0)
    assert d.parallelism == math.ceil(tps * 2 * cost * 3) == 6 and d.previous == 1
    # before the stable period the same trigger is held, saying why
    held = decisions[i - 1]
    assert held.action == "hold" and "since the last change" in held.reason


def test_scale_down_after_the_load_passes_only_past_the_ratio_and_the_stable_period():
    a = Autoscaler(CFG, initial=8)
    # light load, no lag: target = ceil(1000 rows/s x 0.0008 core-s/row x 3) = 3; 8 / 3 > 2
    decisions = feed(a, [(1000, 0.0008, 0.0)] * 15)
    downs = [d for d in decisions if d.action == "down"]
    assert len(downs) == 1 and decisions.index(downs[0]) >= CFG.stable_s
    assert downs[0].parallelism == 3 and a.parallelism == 3
    # at parallelism 3 the ratio is within scale_down_ratio: it stays
    more = feed(a, [(1000, 0.0008, 0.0)] * 15, t0=15)
    assert {d.action for d in more} == {"hold"} and a.parallelism == 3


def test_bounds_and_the_state_minimum():
    a = Autoscaler(AutoscaleConfig(max_parallelism=4, lag_threshold_s=1, stable_s=0, window=2), initial=1)
    decisions = feed(a, [(1000, 0.0009, 10 + 5 * i) for i in range(4)])
    assert max(d.parallelism for d in decisions) == 4   # the target (> 4) is clamped to max_parallelism
    b = Autoscaler(AutoscaleConfig(max_parallelism=8, stable_s=0, window=2, state_rows_per_task=1000), initial=1)
    decisions = feed(b, [(10, 0.001, 0.0, 3500)] * 4)
    assert b.parallelism == 4   # 3,500 state rows at 1,000 per task
    assert any("state of 3500 rows" in d.reason for d in decisions)


@pytest.mark.parametrize("bad", [dict(min_parallelism=0), dict(min_parallelism=5, max_parallelism=4),
                                 dict(scale_down_ratio=1), dict(window=0), dict(stable_s=-1)])
def test_bad_config_names_the_key(bad):
    with pytest.raises(ValueError, match="autoscale: "):
        AutoscaleConfig(**bad)


@pytest.mark.parametrize("config, message", [
    ({"autoscale": True}, "config autoscale needs a continuous trigger"),
    ({"autoscale": {"lag_threshold": 5}, "trigger": "processing_time:1"},
     r"config autoscale has unknown keys \['lag_threshold'\]"),
    ({"autoscale": {"min_parallelism": 0}, "trigger": "processing_time:1"},
     "config autoscale: need 1 <= min_parallelism"),
    ({"autoscale": "fast", "trigger": "processing_time:1"}, "config autoscale must be true or a mapping"),
])
def test_the_model_config_names_what_is_wrong(tmp_path, config, message):
    with pytest.raises(ConfigError, match=f"model m: {message}"):
        JobSpec.from_dbt(project_root=str(tmp_path), schema="s", identifier="m", model_name="m", sql="select 1",
                         sources=[], config=config, warehouse_dir=str(tmp_path))
