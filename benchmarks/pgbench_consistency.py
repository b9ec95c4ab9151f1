"""pgbench TPC-B (>= 4 clients) against a real PostgreSQL 15 while capture and a continuous
consistent_stream model run, until the model has committed at least ``--min-versions``
versions (issue 4's "done when"). Prints one JSON line: versions checked, invariant violations
and oracle mismatches (both must be 0), the foil's violations with per-table cuts, pgbench's
tps, freshness percentiles.

    .venv/bin/python benchmarks/pgbench_consistency.py --seconds 420 --clients 4 --rate 100
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import consistent_stream  # noqa: E402,F401
from consistent_stream.cli import local_spark  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=420)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rate", type=int, default=100, help="pgbench -R (tps); 0 = unlimited")
    p.add_argument("--trigger", type=float, default=0.5)
    p.add_argument("--foil-skew-ms", type=int, default=20)
    p.add_argument("--min-versions", type=int, default=50)
    p.add_argument("--model", default="tpcb_sums", help="tpcb_sums or branch_balances (tests/pgbench_scenario.py)")
    a = p.parse_args()
    import pgbench_scenario
    spark = local_spark()
    with tempfile.TemporaryDirectory(prefix="cs-pgbench-") as d:
        o = pgbench_scenario.run(spark, Path(d), seconds=a.seconds, clients=a.clients, rate=a.rate or None,
                                 trigger_s=a.trigger, foil_skew_ms=a.foil_skew_ms, model=a.model)
    fresh = sorted(o.freshness_s)
    out = {k: v for k, v in asdict(o).items() if k not in ("cut_positions", "freshness_s")}
    out["freshness_s_p50"] = fresh[len(fresh) // 2] if fresh else None
    out["freshness_s_max"] = fresh[-1] if fresh else None
    out["model"] = a.model
    out["ok"] = (o.versions >= a.min_versions and o.invariant_violations == 0 and o.oracle_mismatches == 0
                 and o.final_matches_database)
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("CONSISTENT_STREAM_MASTER", "local[2]")
    sys.exit(main())
