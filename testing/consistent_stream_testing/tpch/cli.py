"""Command-line entry points for the TPC-H data: ``tpch-generate`` and ``tpch-refresh``.

``add_tpch_commands(subparsers)`` registers both on an existing argparse parser (the
``consistent-stream-testing`` command, :mod:`consistent_stream_testing.cli`);
``python -m consistent_stream_testing.tpch`` runs them standalone. Each command prints one
line of JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

__all__ = ["add_tpch_commands", "main"]


def _table_list(text: str | None) -> list[str]:
    """The table names of a comma-separated option (``--tables``, ``--without-cdf``); [] when unset."""
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def _cmd_generate(args: argparse.Namespace) -> int:
    from consistent_stream.errors import ConsistentStreamError
    from .generate import ALL, TpchGenError, generate

    t0 = time.perf_counter()
    tables = _table_list(args.tables) or ALL
    try:
        counts = generate(args.sf, args.dir, tables=tables, without_cdf=_table_list(args.without_cdf))
    except (TpchGenError, ValueError, OSError, ConsistentStreamError) as e:
        print(f"tpch-generate: error: {e}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "command": "tpch-generate",
                "sf": args.sf,
                "dir": str(args.dir),
                "rows": counts,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        ),
        flush=True,
    )
    return 0


def _cmd_refresh(args: argparse.Namespace) -> int:
    from consistent_stream.errors import ConsistentStreamError
    from .refresh import refresh_round

    t0 = time.perf_counter()
    try:
        result = refresh_round(args.dir, args.round, seed=args.seed)
    except (ValueError, OSError, ConsistentStreamError) as e:
        print(f"tpch-refresh: error: {e}", file=sys.stderr)
        return 1
    out = {"command": "tpch-refresh", "dir": str(args.dir), **result.to_dict()}
    out["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(out), flush=True)
    return 0


def add_tpch_commands(subparsers) -> None:
    """Register ``tpch-generate`` and ``tpch-refresh`` on ``subparsers``.

    ``subparsers`` is what ``ArgumentParser.add_subparsers()`` returns. Each sub-parser
    gets ``func`` set to a callable taking the parsed ``argparse.Namespace`` and
    returning an exit code (0, or 1 after printing ``<command>: error: ...`` to stderr
    for a missing tool or table, a bad argument, data in the way or an object store that
    cannot be reached); the caller dispatches with ``args.func(args)``. ``--dir`` is a
    local directory or an S3 URI (``s3://bucket/prefix``, reached through the AWS chain:
    ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` ...).

    * ``tpch-generate --sf FLOAT --dir PATH [--tables a,b,...] [--without-cdf a,b,...]``: see
      :func:`consistent_stream_testing.tpch.generate.generate`.
    * ``tpch-refresh --dir PATH --round N [--seed S]``: see
      :func:`consistent_stream_testing.tpch.refresh.refresh_round`.
    """
    g = subparsers.add_parser(
        "tpch-generate",
        help="generate TPC-H tables as Delta tables with Change Data Feed",
        description="Generate the 8 TPC-H tables with tpchgen-cli and write each as a "
        "Delta table DIR/<table> with delta.enableChangeDataFeed=true (false for --without-cdf).",
    )
    g.add_argument("--sf", type=float, required=True, help="TPC-H scale factor, e.g. 0.1")
    g.add_argument("--dir", required=True, help="root directory (or s3://bucket/prefix) of the Delta tables")
    g.add_argument(
        "--tables",
        default=None,
        help="comma-separated subset of tables (default: all 8)",
    )
    g.add_argument(
        "--without-cdf",
        default=None,
        help="comma-separated tables written with the Change Data Feed off (default: none)",
    )
    g.set_defaults(func=_cmd_generate)

    r = subparsers.add_parser(
        "tpch-refresh",
        help="apply one TPC-H refresh round (RF1 inserts, RF2 deletes, updates)",
        description="Apply one deterministic refresh round to the TPC-H Delta tables "
        "under DIR: 6 Delta commits on orders, lineitem and customer.",
    )
    r.add_argument("--dir", required=True, help="root directory (or s3://bucket/prefix) of the Delta tables")
    r.add_argument("--round", type=int, required=True, help="round number")
    r.add_argument("--seed", type=int, default=0, help="stream seed (default 0)")
    r.set_defaults(func=_cmd_refresh)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m consistent_stream_testing.tpch COMMAND ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m consistent_stream_testing.tpch",
        description="TPC-H source data for consistent_stream.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_tpch_commands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
