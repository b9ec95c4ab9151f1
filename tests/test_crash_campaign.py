"""The short crash campaign (``benchmarks/crash_campaign.py``): at least 12 trials, each a run
of three models (a join + aggregate, a bag, a ``ref()`` chain) in a child process killed with
SIGKILL of its whole process group at a fault-injection point (every point of
:data:`consistent_stream.faults.POINTS` killed at least once; every fourth trial a continuous
query while changes land) or after a random delay, then restarted here and checked: every
target version equals DuckDB's batch evaluation at its base cut, the latest base cut is the
sources' latest versions, and no transaction is in a Delta log twice.

Twelve trials take the six points in turn (one in ten kills after a random delay instead), so
each point is killed once or twice, more trials when one was not reached; the long campaigns,
hundreds of trials, local and on S3, are the benchmark's (``benchmarks/results/crash_campaign.jsonl``)."""
from __future__ import annotations

import json
import sys

from consistent_stream.faults import POINTS
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import crash_campaign  # noqa: E402

MIN_TRIALS = 12
MAX_TRIALS = 40


def test_short_crash_campaign_loses_nothing_and_applies_nothing_twice(spark, tmp_path):
    campaign = crash_campaign.Campaign(tmp_path, seed=20261123, spark=spark, random_kills=0.1)
    campaign.setup()
    try:
        while campaign.trials < MIN_TRIALS or (campaign.summary(0)["points_never_killed"]
                                               and campaign.trials < MAX_TRIALS):
            print(json.dumps(campaign.trial()), flush=True)
    finally:
        campaign.close()
    summary = campaign.summary(0)
    print(json.dumps(summary))
    assert summary["failures"] == 0, json.dumps(summary["failed_trials"], indent=1)
    assert not summary["points_never_killed"], summary
    assert set(POINTS) <= set(summary["kills"])
