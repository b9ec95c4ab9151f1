"""Benchmark: where a whole `dbt run` after a small change spends its seconds, process start
included.

    .venv/bin/python benchmarks/dbt_run_start.py [--sf 0.01] [--runs 3] [--conf KEY=VALUE ...] [--command test]

Copies ``models/example`` to a temporary directory, generates TPC-H there (scale factor
``--sf``) and builds every model with one `dbt run`. Then, ``--runs`` times: one small refresh
round (``refresh_round(size=14)``: 14 orders and their lineitems inserted, deleted and
updated), and `dbt run` of the whole project in a fresh process, as a user or an
orchestrator starts it (``.venv/bin/dbt run --log-format json``). Each run is split by the
timestamps of dbt's own structured log events:

* ``start_s``: from the process's start to dbt's first event (the interpreter, dbt's and the
  adapter's imports);
* ``parse_s``: from there to dbt's manifest being ready (``FoundStats``: the project parsed,
  or its partial parse read);
* ``session_s``: from there to the first model's start line (``LogStartLine``): dbt opens
  its connection before any model to fill its relation cache, so this holds the JVM's and
  the Spark session's start (delta-spark's extension and catalog, the metastore) and dbt-spark's
  ``SHOW TABLE EXTENDED`` of each schema;
* ``models_s``: each model's node, from its start line to its result line
  (``LogModelResult``), summed; ``models`` gives each (the example project's five
  consistent_stream models and its one view, ``stg_lineitem``);
* ``end_s``: from the last result line to the process's exit (run results, the session's
  stop);
* ``rest_s``: what is between the nodes.

``--command test`` times `dbt test` instead (the project's 21 data tests, each a Spark query
of a model's table), after an untimed `dbt run` of each round's change; its "models" are the
tests.

``--conf`` adds a Spark conf to the profile's ``server_side_parameters`` (the ``local``
target's), to measure a setting against the profile as the project ships it.

Prints one JSON line per run and a summary line with the medians (seconds).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DBT = str(Path(sys.executable).parent / "dbt")


def _ts(event: dict) -> float:
    return datetime.datetime.fromisoformat(event["info"]["ts"].replace("Z", "+00:00")).timestamp()


def split(events: list[dict], t_start: float, t_end: float) -> dict:
    """The phases of one `dbt run` (see the module docstring) from its JSON log ``events``;
    ``t_start`` and ``t_end``: the process's start and exit (epoch seconds)."""
    first = _ts(events[0])
    parsed = next((_ts(e) for e in events if e["info"]["name"] == "FoundStats"), first)
    nodes: list[tuple[str, float, float]] = []
    started: dict[str, float] = {}
    for e in events:
        name = e["info"]["name"]
        node = e.get("data", {}).get("node_info", {}).get("unique_id")
        if name == "LogStartLine" and node:
            started[node] = _ts(e)
        elif name.startswith("Log") and name.endswith("Result") and node in started:
            nodes.append((node.split(".")[-1], started.pop(node), _ts(e)))
    nodes.sort(key=lambda n: n[1])
    first_node = nodes[0][1] if nodes else parsed
    last_node = max((end for _, _, end in nodes), default=first_node)
    out = {"wall_s": t_end - t_start, "start_s": first - t_start, "parse_s": parsed - first,
           "session_s": first_node - parsed, "models_s": sum(end - begin for _, begin, end in nodes),
           "end_s": t_end - last_node, "models": {n: round(end - begin, 3) for n, begin, end in nodes}}
    out["rest_s"] = out["wall_s"] - sum(out[k] for k in ("start_s", "parse_s", "session_s", "models_s", "end_s"))
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def dbt_run(project: Path, env: dict, command: str = "run", dbt: str = DBT,
            target: str | None = None) -> tuple[float, float, list[dict]]:
    """`dbt <command>` (default ``run``) of ``project`` in a fresh process (``dbt``: the
    executable, default this virtualenv's; ``target``: the profile's target, default its
    own): its start and exit (epoch seconds) and its JSON log events. Exits when dbt fails."""
    t0 = time.time()
    p = subprocess.run([dbt, command, "--log-format", "json", "--project-dir", str(project),
                        "--profiles-dir", str(project), *(["--target", target] if target else [])],
                       env=env, cwd=str(project), capture_output=True, text=True)
    t1 = time.time()
    events = []
    for line in p.stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    if p.returncode != 0:
        raise SystemExit(f"{dbt} {command} in {project} failed ({p.returncode}):\n"
                         f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return t0, t1, events


def with_confs(profiles: Path, confs: list[str]) -> None:
    """Add ``KEY=VALUE`` Spark confs to the ``local`` target's ``server_side_parameters`` in
    the profiles file ``profiles``."""
    import yaml
    doc = yaml.safe_load(profiles.read_text())
    params = doc["tpch_example"]["outputs"]["local"]["server_side_parameters"]
    for kv in confs:
        key, sep, value = kv.partition("=")
        if not sep:
            raise SystemExit(f"--conf {kv}: expected KEY=VALUE")
        params[key] = value
    profiles.write_text(yaml.safe_dump(doc))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark conf added to the profile's server_side_parameters")
    ap.add_argument("--command", choices=["run", "test"], default="run",
                    help="the dbt command timed (test: after an untimed run of each round)")
    ap.add_argument("--target", default="local",
                    help="the profile's target: local (a session in dbt's process) or warm (a warm session: the "
                         "first, untimed build starts its server, the timed runs reuse it; stopped at the end)")
    args = ap.parse_args()
    from consistent_stream_testing.tpch.refresh import refresh_round
    from noop_run import example_project

    rows = []
    with tempfile.TemporaryDirectory(prefix="cs-dbt-start-") as tmp:
        project, variables = example_project(tmp, args.sf)
        if args.conf:
            with_confs(project / "profiles.yml", args.conf)
        env = {**os.environ, **variables}
        try:
            dbt_run(project, env, target=args.target)   # the first build
            for i in range(args.runs):
                refresh_round(project / "data" / "tpch", i + 1, size=14)
                if args.command != "run":
                    dbt_run(project, env, target=args.target)
                t0, t1, events = dbt_run(project, env, args.command, target=args.target)
                row = {"run": i + 1, "command": args.command, "target": args.target, "sf": args.sf,
                       "confs": args.conf, **split(events, t0, t1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            from consistent_stream import warm_session
            warm_session.stop(project)
    keys = ("wall_s", "start_s", "parse_s", "session_s", "models_s", "end_s", "rest_s")
    print(json.dumps({"summary": True, "command": args.command, "target": args.target, "sf": args.sf,
                      "confs": args.conf, "runs": len(rows), "models": len(rows[0]["models"]),
                      **{f"{k}_median": round(statistics.median(r[k] for r in rows), 3) for k in keys}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
