"""Ports for the local daemons this package starts (the S3 server, the Kafka stack, a
throwaway PostgreSQL, a warm session's Spark Connect server)."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the kernel's pick). Another process may take it before
    the caller's daemon binds it; the daemon then fails to start, and its caller says so."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
