"""The ``consistent-stream`` command.

    consistent-stream verify MODEL [--project-dir DIR] [--version N] [--float-tolerance REL[,ABS]]
                                   # or --target-path PATH instead of --project-dir
    consistent-stream status [MODEL ...] [--project-dir DIR] [--json]
    consistent-stream plot MODEL [--project-dir DIR] [--out PNG]
    consistent-stream explain MODEL [--project-dir DIR]
    consistent-stream cut MODEL [MODEL ...] [--project-dir DIR]
    consistent-stream capture postgres --dsn DSN --tables public.a,public.b --slot NAME --landing DIR

``verify`` prints one JSON line and exits 1 when the target differs from batch evaluation
of the model's SQL over the sources at the target's recorded cut, 2 on an error. ``cut``
prints the newest versions of the models that share one base cut (JSON), 2 when there is
none.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from . import storage
from .errors import ConsistentStreamError


def local_spark():
    """A SparkSession for the command line (no Hive catalog needed, no tuning: the engine sizes
    each batch's shuffles itself), with delta-spark (:mod:`consistent_stream.session`):
    ``local[2]``, or ``$CONSISTENT_STREAM_MASTER`` (e.g. a standalone cluster's
    ``spark://127.0.0.1:7077``; the driver then binds ``$SPARK_LOCAL_IP``, default
    127.0.0.1, :func:`consistent_stream.session.driver_conf`). With ``$SPARK_REMOTE``
    (``sc://<host>:<port>``, pyspark's own variable) a Spark Connect session to that server
    instead, and no JVM in this process."""
    remote = os.environ.get("SPARK_REMOTE", "")
    if remote.startswith("sc://"):
        from pyspark.sql import SparkSession
        return SparkSession.builder.remote(remote).getOrCreate()
    import consistent_stream  # noqa: F401  (sets PYSPARK_PYTHON before the session starts)
    from pyspark.sql import SparkSession
    from .session import with_delta
    master = os.environ.get("CONSISTENT_STREAM_MASTER", "local[2]")
    b = (with_delta(SparkSession.builder, master=master)
         .appName("consistent-stream")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC"))
    if master.startswith("spark://"):  # a standalone cluster: the driver on $SPARK_LOCAL_IP (loopback)
        from .session import driver_conf
        for k, v in driver_conf(master).items():
            b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _cmd_verify(args) -> int:
    from .verify import index_path, verify_target
    path = args.target_path
    if path is None:
        idx = index_path(os.path.abspath(args.project_dir), args.model)
        if not storage.exists(idx):
            print(f"verify: error: {idx} not found: model {args.model} has not been run by "
                  f"consistent_stream in project {args.project_dir} (or pass --target-path)", file=sys.stderr)
            return 2
        path = storage.load_json(idx)["target_path"]
    from .compare import FloatTolerance
    try:
        tolerance = FloatTolerance.parse(args.float_tolerance) if args.float_tolerance else FloatTolerance()
    except ValueError as e:
        print(f"verify: error: {e}", file=sys.stderr)
        return 2
    try:
        res = verify_target(local_spark(), path, version=args.version, tolerance=tolerance, model=args.model)
    except ConsistentStreamError as e:
        print(f"verify: error: {e}", file=sys.stderr)
        return 2
    print(res.to_json())
    status = "OK: target equals batch evaluation" if res.ok else \
        f"FAILED: {res.missing} rows missing, {res.unexpected} unexpected"
    floats = ""
    if res.inexact_columns:
        floats = (f"; floating-point columns {', '.join(res.inexact_columns)} compared within relative "
                  f"{tolerance.relative:g} (absolute {tolerance.absolute:g})")
        d = res.largest_difference
        floats += (f", largest difference {d['relative']:.3g} relative in {d['column']}" if d else
                   ", every matched value equal")
    print(f"verify {res.model} version {res.target_version} (batch {res.batch_id}, "
          f"{res.rows_target} rows): {status}{floats}", file=sys.stderr)
    for example in res.examples if not res.ok else []:
        print(f"  {json.dumps(example, default=str)}", file=sys.stderr)
    return 0 if res.ok else 1


def _model_jobs(args, models: list[str]):
    from .observe import load_model, project_models
    root = os.path.abspath(args.project_dir)
    names = models or project_models(root)
    if not names:
        raise ConsistentStreamError(f"no consistent_stream model has been run in project {args.project_dir} "
                                    f"(nothing under .consistent_stream/models): run dbt run first")
    return [load_model(root, m) for m in names]


def _cmd_status(args) -> int:
    from .observe import model_status
    try:
        statuses = [model_status(job) for job in _model_jobs(args, args.models)]
    except ConsistentStreamError as e:
        print(f"status: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        for s in statuses:
            print(json.dumps(s.to_dict(), default=str))
        return 0
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"consistent_stream models in {args.project_dir}")
    for column, justify in (("model", "left"), ("version", "right"), ("batch", "right"), ("cut", "left"),
                            ("lag (versions)", "right"), ("lag (s)", "right"), ("freshness (s)", "right"),
                            ("age (s)", "right"), ("last batch", "right")):
        table.add_column(column, justify=justify, overflow="fold")

    def num(v) -> str:
        return "-" if v is None else f"{v:,.1f}" if isinstance(v, float) else f"{v:,}"
    for s in statuses:
        if s.error and s.target_version is None:
            table.add_row(s.model, "-", "-", s.error, "-", "-", "-", "-", "-")
            continue
        cut = "\n".join(f"{k}@{v}" for k, v in sorted(s.cut.items()))
        last = "-" if s.last_batch_changes is None else (
            f"{s.last_batch_changes:,} changes"
            + (f" in {s.last_batch_s:.1f} s" if s.last_batch_s is not None else "")
            + (f", {s.last_batch_requests:,} object-store requests before its commit" if s.last_batch_requests else "")
            + (f", {s.last_batch_recomputed:,} rows recomputed" if s.last_batch_recomputed else ""))
        table.add_row(s.model, num(s.target_version), num(s.batch_id), cut + (f" ({s.error})" if s.error else ""),
                      num(s.lag_versions), num(s.lag_s), num(s.freshness_s), num(s.age_s), last)
    console = Console()
    (console if console.is_terminal else Console(width=160)).print(table)
    for s in statuses:
        told = set()
        for key, waiting in sorted(s.waiting.items()):
            for w in waiting:
                if w["id"] in told:
                    continue
                told.add(w["id"])
                what = (f"END arrived, events missing: {w['missing']}" if w["end_seen"]
                        else "its END has not arrived")
                print(f"{s.model}: source {key}: upstream transaction {w['id']} has waited {w['age_s']:,.1f} s "
                      f"({what}); {w['waiting_behind']} later transactions wait behind it, and nothing after it "
                      f"is committed until it is complete")
    return 0


def _cmd_plot(args) -> int:
    from .observe import plot_history
    try:
        [job] = _model_jobs(args, [args.model])
        out = args.out or f"{args.model}_history.png"
        points = plot_history(job, out, limit=args.versions)
    except ConsistentStreamError as e:
        print(f"plot: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"model": args.model, "png": os.path.abspath(out), "versions": len(points)}))
    return 0


def _cmd_explain(args) -> int:
    from .observe import explain_model
    try:
        [job] = _model_jobs(args, [args.model])
        print(explain_model(job))
    except ConsistentStreamError as e:
        print(f"explain: error: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_cut(args) -> int:
    from .cut import cut_json, models_at_one_cut
    try:
        models = models_at_one_cut(os.path.abspath(args.project_dir), args.models)
    except ConsistentStreamError as e:
        print(f"cut: error: {e}", file=sys.stderr)
        return 2
    print(cut_json(models))
    return 0


def _cmd_capture_postgres(args) -> int:
    import logging
    from .capture.postgres import CaptureConfig, capture_postgres, summary_json
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    dsn = args.dsn if args.dsn is not None else os.environ.get("CONSISTENT_STREAM_PG_DSN", "")
    cfg = CaptureConfig(dsn=dsn, tables=tuple(t for t in args.tables.split(",") if t.strip()),
                        slot=args.slot, landing=args.landing, max_seconds=args.max_seconds,
                        flush_interval_s=args.flush_interval,
                        set_replica_identity_full=args.set_replica_identity_full)
    try:
        summary = capture_postgres(cfg)
    except ConsistentStreamError as e:
        print(f"capture: error: {e}", file=sys.stderr)
        return 2
    print(summary_json(summary))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .warm_session import add_warm_session_command
    p = argparse.ArgumentParser(prog="consistent-stream", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="diff a model's target against batch evaluation at its recorded cut")
    v.add_argument("model", help="the dbt model name")
    v.add_argument("--project-dir", default=".", help="the dbt project directory (default: .)")
    v.add_argument("--target-path", default=None, help="the target Delta table (instead of a model lookup)")
    v.add_argument("--version", type=int, default=None,
                   help="check this retained version of the target instead of the latest")
    v.add_argument("--float-tolerance", default=None, metavar="REL[,ABS]",
                   help="how far floating-point values may differ: relative, and absolute near zero (default "
                        "1e-9,1e-12); exact columns are always compared exactly")
    v.set_defaults(func=_cmd_verify)
    st = sub.add_parser("status", help="every consistent_stream model of a project: version, cut, lag, freshness, "
                                       "last batch")
    st.add_argument("models", nargs="*", help="dbt model names (default: every model run in the project)")
    st.add_argument("--project-dir", default=".", help="the dbt project directory (default: .)")
    st.add_argument("--json", action="store_true", help="one JSON line per model instead of a table")
    st.set_defaults(func=_cmd_status)
    pl = sub.add_parser("plot", help="a PNG of a model's freshness and batch time over its target's versions")
    pl.add_argument("model", help="the dbt model name")
    pl.add_argument("--project-dir", default=".", help="the dbt project directory (default: .)")
    pl.add_argument("--out", default=None, help="the PNG to write (default: <model>_history.png)")
    pl.add_argument("--versions", type=int, default=1000, help="the newest this many versions (default 1000)")
    pl.set_defaults(func=_cmd_plot)
    ex = sub.add_parser("explain", help="a model's incremental plan: operators, their state and keys")
    ex.add_argument("model", help="the dbt model name")
    ex.add_argument("--project-dir", default=".", help="the dbt project directory (default: .)")
    ex.set_defaults(func=_cmd_explain)
    cu = sub.add_parser("cut", help="the newest versions of several models that share one base cut")
    cu.add_argument("models", nargs="+", help="dbt model names (consistent_stream models)")
    cu.add_argument("--project-dir", default=".", help="the dbt project directory (default: .)")
    cu.set_defaults(func=_cmd_cut)
    add_warm_session_command(sub)
    c = sub.add_parser("capture", help="capture a database's changes into a landing directory (Debezium JSON)")
    csub = c.add_subparsers(dest="database", required=True)
    pg = csub.add_parser("postgres", help="PostgreSQL logical replication (wal2json): snapshot, then committed "
                                          "transactions, resumable after a crash")
    pg.add_argument("--dsn", default=None,
                    help="libpq connection string, e.g. 'host=.. port=.. dbname=.. user=..' (default: "
                         "$CONSISTENT_STREAM_PG_DSN, else libpq's PGHOST/PGPORT/PGUSER/PGDATABASE/PGPASSWORD, "
                         "~/.pgpass or PGSERVICE; keep passwords out of --dsn, where `ps` shows them)")
    pg.add_argument("--tables", required=True, help="comma-separated schema.table names")
    pg.add_argument("--slot", required=True, help="logical replication slot name (created on the first run)")
    pg.add_argument("--landing", required=True, help="landing directory for event files and table schemas")
    pg.add_argument("--max-seconds", type=float, default=None, help="stop after this many seconds (default: run "
                                                                    "until SIGTERM/SIGINT)")
    pg.add_argument("--flush-interval", type=float, default=0.2, help="seconds of transactions per file (0.2)")
    pg.add_argument("--set-replica-identity-full", action="store_true",
                    help="ALTER TABLE .. REPLICA IDENTITY FULL on tables that lack it (else an error)")
    pg.set_defaults(func=_cmd_capture_postgres)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
