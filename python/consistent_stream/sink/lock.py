"""One writer per model: an exclusive lock held for a whole run.

Two runs of one model at once (two schedulers, a ``dbt run`` while the continuous query is
up) would both plan cuts, write state and race for the target's next version. The Delta txn
makes each *batch* idempotent, but the cut log and the state are not shared-writer safe, so a
run takes the model's writer lock before it reads or writes anything, and keeps it until it
ends.

The lock is ``<checkpoint_location>.lock`` (beside the checkpoint, so ``--full-refresh``,
which deletes the checkpoint, keeps it), held with ``flock(LOCK_EX | LOCK_NB)`` on an open
file description. The file records the holder (pid, host, model, start time) for the
message a second writer gets. A process that dies, however it dies (SIGKILL, the OOM
killer), loses its flock with its file descriptors: the kernel releases it, so a lock left
behind is stale by construction and the next run takes it over (and logs the previous
holder). The file is never deleted, so two runs can never lock two different files.

``flock`` is honoured between processes of one host on local file systems; on a network
file system shared by several hosts it may not be (NFS emulates it with byte-range locks,
some FUSE file systems ignore it): run one scheduler per model there.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket

from ..errors import ConcurrentWriterError

log = logging.getLogger(__name__)


# An flock on a local file, not through storage.py: a lock for object stores replaces it in the object-storage work.
class WriterLock:
    """The writer lock of the model whose checkpoint is ``checkpoint_location``; a context
    manager. :meth:`acquire` raises :class:`ConcurrentWriterError` naming the holder when
    another process holds it."""

    def __init__(self, checkpoint_location: str, model: str):
        self.path = os.path.normpath(checkpoint_location) + ".lock"
        self.model = model
        self._fd: int | None = None

    def holder(self) -> dict:
        """What the lock file says of its last holder (``{}`` when it says nothing)."""
        try:
            with open(self.path) as f:
                return json.loads(f.read() or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            h = self.holder()
            raise ConcurrentWriterError(
                f"model {self.model} is being written by another run: pid {h.get('pid', '?')} on host "
                f"{h.get('host', '?')}, started {h.get('started', '?')} (lock {self.path}). Nothing was "
                f"read or written; wait for that run to end, or stop it (a run that is killed releases "
                f"the lock by itself)") from None
        previous = self.holder()
        if previous.get("pid"):
            log.warning("%s: taking over the writer lock %s left by pid %s on host %s (started %s), which "
                        "ended without releasing it", self.model, self.path, previous.get("pid"),
                        previous.get("host"), previous.get("started"))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "model": self.model,
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        # the holder record is for messages only (the flock is the lock), so it is not
        # fsynced: it outlives the process in the page cache, and a machine crash that loses
        # it loses a message, never the lock's exclusion (an fsync would make every run wait
        # on the disk for nothing the lock needs)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Clear the holder and unlock (the file stays: see the module docstring)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "WriterLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
