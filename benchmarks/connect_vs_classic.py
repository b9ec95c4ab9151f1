"""Benchmark: a small batch's run with dbt as a Spark Connect client against dbt in a classic
session, on the same standalone cluster.

    .venv/bin/python benchmarks/connect_vs_classic.py [--sf 0.01] [--runs 10]

Starts a loopback cluster (``consistent_stream_testing.cluster``: one master, ``--workers`` workers of
one core) with its Spark Connect server, and makes two copies of ``models/example`` with TPC-H
at ``--sf`` generated once (the same data in both):

* ``classic``: the profile's ``cluster`` target, dbt's process the driver of a classic session
  joined to the cluster (its JVM started by each `dbt run`);
* ``connect``: the profile's ``connect`` target, dbt a Spark Connect client of the cluster's
  server, from ``.venv-connect`` (pyspark-client, no JVM) when it exists (``make .venv-connect``),
  else from this virtualenv.

Each application may take one core (``spark.cores.max=1``), so both hold executors on the
same cluster. Both projects are built once (untimed); then ``--runs`` times the same small
refresh round (``refresh_round(size=14)``: 14 orders and their lineitems inserted, deleted and
updated) is applied to both, and each gets a `dbt run` in a fresh process (which goes first
alternates). A run is split by dbt's structured log (``dbt_run_start.split``): each model's
node time (``models``: the five consistent_stream models and the view) and the whole process
(``wall_s``, process start and the session included).

Prints one JSON line per run and variant, and a summary line: per model the median node
seconds of each variant and ``connect / classic``, the same for the whole run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))


def _cores_max(profiles: Path) -> None:
    """The ``cluster`` target's session takes at most one core of the cluster."""
    import yaml
    doc = yaml.safe_load(profiles.read_text())
    doc["tpch_example"]["outputs"]["cluster"]["server_side_parameters"]["spark.cores.max"] = "1"
    profiles.write_text(yaml.safe_dump(doc))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from consistent_stream_testing import cluster
    from consistent_stream_testing.tpch.refresh import refresh_round
    from dbt_run_start import dbt_run, split
    from helpers import free_port
    from noop_run import example_project

    client = REPO / ".venv-connect" / "bin" / "dbt"
    dbt = {"classic": str(Path(sys.executable).parent / "dbt"),
           "connect": str(client) if client.exists() else str(Path(sys.executable).parent / "dbt")}
    rows: dict[str, list[dict]] = {"classic": [], "connect": []}
    with tempfile.TemporaryDirectory(prefix="cs-connect-vs-classic-") as tmp:
        c = cluster.start(workers=args.workers, cores_per_worker=1, memory_per_worker="1g", port=free_port(),
                          webui_port=free_port(), connect_port=free_port(), directory=Path(tmp) / "cluster",
                          connect_conf={"spark.cores.max": "1"})
        try:
            classic, variables = example_project(Path(tmp) / "classic", args.sf)
            connect = Path(tmp) / "connect" / "example"
            shutil.copytree(classic, connect)
            _cores_max(classic / "profiles.yml")
            projects = {"classic": classic, "connect": connect}
            envs = {name: {**os.environ, **variables, "DBT_PROJECT_DIR": str(p), "DBT_PROFILES_DIR": str(p)}
                    for name, p in projects.items()}
            envs["classic"].update({"DBT_TARGET": "cluster", "CONSISTENT_STREAM_MASTER": c.master_url})
            envs["connect"].update({"DBT_TARGET": "connect", "SPARK_REMOTE": c.connect_url})
            for name in projects:
                dbt_run(projects[name], envs[name], dbt=dbt[name])   # the initial build
            for i in range(args.runs):
                for p in projects.values():
                    refresh_round(p / "data" / "tpch", i + 1, size=14)
                for name in (("classic", "connect") if i % 2 == 0 else ("connect", "classic")):
                    t0, t1, events = dbt_run(projects[name], envs[name], dbt=dbt[name])
                    row = {"run": i + 1, "variant": name, "sf": args.sf, "dbt": dbt[name], **split(events, t0, t1)}
                    rows[name].append(row)
                    print(json.dumps(row), flush=True)
        finally:
            cluster.stop(Path(tmp) / "cluster")

    def median(name: str, key: str, model: str | None = None) -> float:
        return round(statistics.median(r["models"][model] if model else r[key] for r in rows[name]), 3)

    models = {}
    for m in rows["classic"][0]["models"]:
        a, b = median("classic", "", m), median("connect", "", m)
        models[m] = {"classic_s": a, "connect_s": b, "connect_vs_classic": round(b / a, 2) if a else None}
    summary = {"summary": True, "sf": args.sf, "runs": args.runs, "workers": args.workers, "models": models}
    for key in ("wall_s", "models_s", "session_s"):
        a, b = median("classic", key), median("connect", key)
        summary[key] = {"classic": a, "connect": b, "connect_vs_classic": round(b / a, 2) if a else None}
    summary["worst_model_ratio"] = max(v["connect_vs_classic"] for v in models.values() if v["connect_vs_classic"])
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
