"""Benchmark: a `dbt run` of the example project when no source changed, per model.

    .venv/bin/python benchmarks/noop_run.py [--sf 0.1] [--runs 3]

Copies ``models/example`` to a temporary directory, generates TPC-H there (scale factor
``--sf``), runs ``dbt run`` once to build every model, then ``--runs`` more times without any
source change, all in this process (dbt's programmatic runner; the Spark session is started
by the first run and reused, as in a dbt process that runs several commands). Prints one
JSON line: per model, dbt's own execution time of the model in each no-op run (from
``run_results``: the materialization, the engine's up-to-date check, the catalog check), and
the wall time of each no-op `dbt run`; then one line with a fourth run after a refresh round,
for comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def example_project(tmp: str | Path, sf: float) -> tuple[Path, dict[str, str]]:
    """A copy of ``models/example`` under ``tmp`` (without data, warehouse, metastore or dbt's
    output) with TPC-H at scale factor ``sf`` generated in it; returns its directory and the
    environment variables a `dbt run` of it needs (project and profiles directory, the TPC-H
    directory, no usage statistics)."""
    from consistent_stream_testing.tpch.generate import generate
    project = Path(tmp) / "example"
    shutil.copytree(REPO / "models" / "example", project,
                    ignore=shutil.ignore_patterns("data", "spark-warehouse", "metastore_db", "target", "logs"))
    generate(sf, project / "data" / "tpch")
    return project, {"DBT_PROJECT_DIR": str(project), "DBT_PROFILES_DIR": str(project), "TPCH_DIR": "data/tpch",
                     "DBT_SEND_ANONYMOUS_USAGE_STATS": "false"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=0.1)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import consistent_stream  # noqa: F401
    from dbt.cli.main import dbtRunner
    from consistent_stream_testing.tpch.refresh import refresh_round

    with tempfile.TemporaryDirectory(prefix="cs-noop-") as tmp:
        project, env = example_project(tmp, args.sf)
        os.environ.update(env)
        os.chdir(project)
        runner = dbtRunner()

        def dbt_run() -> tuple[float, dict]:
            t0 = time.time()
            res = runner.invoke(["run", "--project-dir", str(project), "--profiles-dir", str(project)])
            wall = time.time() - t0
            if not res.success:
                raise SystemExit(f"dbt run failed: {res.exception}")
            per_model = {r.node.name: round(r.execution_time, 3) for r in res.result.results}
            return round(wall, 3), per_model

        build_wall, build = dbt_run()
        noop = [dbt_run() for _ in range(args.runs)]
        refresh_round(project / "data" / "tpch", 1)
        after_change = dbt_run()
    models = sorted(build)
    print(json.dumps({
        "sf": args.sf, "models": models,
        "noop_model_s": {m: [r[1][m] for r in noop] for m in models},
        "noop_model_s_max": max(r[1][m] for r in noop for m in models),
        "noop_dbt_run_wall_s": [r[0] for r in noop],
        "initial_build_model_s": build, "initial_build_wall_s": build_wall,
        "after_refresh_model_s": after_change[1], "after_refresh_wall_s": after_change[0],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
