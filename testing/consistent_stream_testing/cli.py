"""The consistent-stream-testing command: the test, benchmark and demo tools of
dbt-consistent-stream that have a command line (:mod:`consistent_stream_testing`).

    consistent-stream-testing tpch-generate --sf 0.1 --dir data/tpch
    consistent-stream-testing tpch-refresh --dir data/tpch --round 1
    consistent-stream-testing cluster start|stop|status|tasks [--dir D] [--workers N] ...

Also ``python -m consistent_stream_testing ...``. The S3 server and the Kafka stack have theirs:
``python -m consistent_stream_testing.s3server`` and ``python -m
consistent_stream_testing.kafka_stack``.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from .cluster import add_cluster_command
    from .tpch.cli import add_tpch_commands
    p = argparse.ArgumentParser(prog="consistent-stream-testing", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    add_tpch_commands(sub)
    add_cluster_command(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
