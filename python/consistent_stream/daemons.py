"""What a local daemon (a warm session's Spark Connect server, :mod:`.warm_session`; and the
servers the test tooling starts, ``consistent_stream_testing``: the S3 server, the Kafka stack,
a throwaway PostgreSQL, a local Spark cluster) needs from the operating system: a free port to
listen on, and whether a process still runs."""
from __future__ import annotations

import os
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the kernel's pick). Another process may take it before
    the caller's daemon binds it; the daemon then fails to start, and its caller says so."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def process_alive(pid: int, *, reap: bool = False) -> bool:
    """Whether process ``pid`` runs: False for no pid (0 or negative), a pid that does not
    exist, and a zombie (exited, not yet waited for); True for a live process, another
    account's too. ``reap``: a zombie child of this process is also waited for (its exit
    status is then lost to a ``subprocess.Popen`` that holds it: only for a daemon started
    detached, whose status nobody reads)."""
    if not pid or pid < 0:
        return False
    if reap:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        except ChildProcessError:
            pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
