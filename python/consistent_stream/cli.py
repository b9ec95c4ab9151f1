"""The ``consistent-stream`` command.

    consistent-stream verify MODEL [--project-dir DIR]   # or --target-path PATH
    consistent-stream cut MODEL [MODEL ...] [--project-dir DIR]
    consistent-stream tpch-generate --sf 0.1 --dir data/tpch
    consistent-stream tpch-refresh --dir data/tpch --round 1
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

from .errors import ConsistentStreamError


def local_spark():
    """A local SparkSession for the command line (no Hive catalog needed, no tuning: the
    engine sizes each batch's shuffles itself)."""
    import consistent_stream  # noqa: F401  (sets PYSPARK_PYTHON before the session starts)
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(os.environ.get("CONSISTENT_STREAM_MASTER", "local[2]"))
             .appName("consistent-stream")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _cmd_verify(args) -> int:
    from .verify import index_path, verify_target
    path = args.target_path
    if path is None:
        idx = index_path(os.path.abspath(args.project_dir), args.model)
        if not os.path.exists(idx):
            print(f"verify: error: {idx} not found: model {args.model} has not been run by "
                  f"consistent_stream in project {args.project_dir} (or pass --target-path)", file=sys.stderr)
            return 2
        with open(idx) as f:
            path = json.load(f)["target_path"]
    try:
        res = verify_target(local_spark(), path)
    except ConsistentStreamError as e:
        print(f"verify: error: {e}", file=sys.stderr)
        return 2
    print(res.to_json())
    status = "OK: target equals batch evaluation" if res.ok else \
        f"FAILED: {res.missing} rows missing, {res.unexpected} unexpected"
    print(f"verify {res.model} version {res.target_version} (batch {res.batch_id}, "
          f"{res.rows_target} rows): {status}", file=sys.stderr)
    return 0 if res.ok else 1


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
    from .tpch.cli import add_tpch_commands
    p = argparse.ArgumentParser(prog="consistent-stream", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="diff a model's target against batch evaluation at its recorded cut")
    v.add_argument("model", help="the dbt model name")
    v.add_argument("--project-dir", default=".", help="the dbt project directory (default: .)")
    v.add_argument("--target-path", default=None, help="the target Delta table (instead of a model lookup)")
    v.set_defaults(func=_cmd_verify)
    cu = sub.add_parser("cut", help="the newest versions of several models that share one base cut")
    cu.add_argument("models", nargs="+", help="dbt model names (consistent_stream models)")
    cu.add_argument("--project-dir", default=".", help="the dbt project directory (default: .)")
    cu.set_defaults(func=_cmd_cut)
    add_tpch_commands(sub)
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
