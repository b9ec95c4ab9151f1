"""One writer per model: an exclusive lock held for a whole run.

Two runs of one model at once (two schedulers, a ``dbt run`` while the continuous query is
up) would both plan cuts, write state and race for the target's next version. The Delta txn
makes each *batch* idempotent, but the cut log and the state are not shared-writer safe, so a
run takes the model's writer lock before it reads or writes anything of the model's (its
checkpoint, state and target), and keeps it until it ends. (On an object store a run lists its
sources' logs while it takes the lock: a run only reads its sources, and what that read
assumed of the target is checked once the lock is held, :class:`consistent_stream.job._CutAhead`.)

The lock is ``<checkpoint_location>.lock`` (beside the checkpoint, so ``--full-refresh``,
which deletes the checkpoint, keeps it). It records the holder (pid, host, model, start
time) for the message a second writer gets (:meth:`WriterLock.holder`; ``{}`` once released),
and it is never deleted. :class:`WriterLock` takes it in one of two ways, by where the
checkpoint is.

**A local path**: the lock file is held with ``flock(LOCK_EX | LOCK_NB)`` on an open file
description. A process that dies, however it dies (SIGKILL, the OOM killer), loses its flock
with its file descriptors: the kernel releases it, so a lock left behind is stale by
construction and the next run takes it over (and logs the previous holder). The file is never
deleted, so two runs can never lock two different files. ``flock`` is honoured between
processes of one host on local file systems; on a network file system shared by several hosts
it may not be (NFS emulates it with byte-range locks, some FUSE file systems ignore it): run
one scheduler per model there. :meth:`WriterLock.check` has nothing to check.

**An object store** (an ``s3://`` checkpoint, :func:`consistent_stream.location.is_remote`),
where there is no flock: the lock is the object ``<checkpoint_location>.lock`` in the same
bucket, a JSON record (pid, host, model, started, a random owner ``token``, ``lease_s`` and
``lease_expires``, the holder's clock in UTC epoch seconds, for people), taken with the store's
conditional writes and held with a lease.

* Exclusion, across hosts, is the store's: a run takes a missing lock with a put-if-absent
  (``If-None-Match: *``), and every other write of the object (a takeover, a renewal, the
  release) is a put conditional on the ETag of the version the writer last read or wrote
  (``If-Match``). Of two runs racing for one version the store admits one; the other gets
  412 and is refused with ConcurrentWriterError naming the winner.
* The lease bounds how long a crashed holder blocks the next run: the holder rewrites its
  record every lease / 3 seconds (default lease 60 s; ``CONSISTENT_STREAM_LOCK_LEASE_S``, a
  number > 0). A run killed with SIGKILL stops renewing, and its lock expires one lease after
  its last write; until then a second run is refused and told when it expires, after that the
  next run takes the lock over (and logs the previous holder).
* Clocks: expiry is judged in the store's time alone. A lock has expired when the store's
  clock is past the object's ``last_modified`` (stamped by the store at the holder's last
  write) by more than the holder's lease plus one second (``Last-Modified`` counts whole
  seconds). The store's "now" is the ``last_modified`` of a probe object the next writer puts,
  ``<checkpoint_location>.lock.clock`` (only when it finds the lock held: two requests). No
  host's clock is compared with another's or with the store's, so hosts' clocks may disagree;
  only their *rates* must agree over one lease, which any running clock does. The holder counts
  its lease on its monotonic clock from before it sends each write, so it gives the lock up
  (below) no later than the store's time lets another run take it.
* A lost lock: a renewal that finds the object changed (another run took it over, someone
  overwrote or deleted it), or renewals that have failed (the store unreachable: each failure is
  a warning, retried at the next tick) until the lease ran out, mark the lock lost, logged as an
  error; :meth:`WriterLock.check` raises ConcurrentWriterError from then on, and a run calls it
  before each commit. A lease is not a fence: a holder stalled for longer than its lease (a
  frozen VM, a stopped process) that wakes up between its check and its commit can still write
  once after another run took over (the Delta commit itself, a put-if-absent of the next
  version, stays single-writer; the checkpoint's other files do not).
* The release writes an empty record with ``If-Match`` on the holder's last ETag, and does
  not delete the object: obstore's delete is unconditional (no ``If-Match``), so a delete after
  the check could remove a lock another run took over in between, while an empty object is a
  free lock to the next run (taken with ``If-Match`` on its ETag), as the empty local file is.
  A release that finds the object changed leaves it alone: it is another run's.
* Taking a lock this machine released: the release keeps the empty object's ETag on this
  machine (:mod:`consistent_stream.local_cache`, kind ``locks``), and the next run here first
  tries the conditional put on that ETag alone (one request instead of a GET and a put). It
  succeeds only while the object is an empty record, which is a free lock; otherwise (another
  run holds it or has written it since) the store refuses it and the run reads the lock as
  above.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Protocol

from .. import local_cache, location
from ..errors import ConcurrentWriterError, ConfigError

log = logging.getLogger(__name__)

LEASE_ENV = "CONSISTENT_STREAM_LOCK_LEASE_S"
DEFAULT_LEASE_S = 60.0
# Last-Modified has a resolution of one second: a lock expires a second after its lease, so a
# lease counts in full whatever the truncation of the two stamps compared
_STAMP_RESOLUTION_S = 1.0


def lease_seconds() -> float:
    """The object-store lock's lease in seconds: ``CONSISTENT_STREAM_LOCK_LEASE_S`` (a number
    > 0), default 60. Raises ConfigError naming the variable for any other value."""
    raw = os.environ.get(LEASE_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{LEASE_ENV}={raw!r}: the writer lock's lease must be a number of seconds > 0 "
                          f"(default {DEFAULT_LEASE_S:g})")
    return value


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _busy(model: str, holder: dict, path: str, released: str) -> ConcurrentWriterError:
    return ConcurrentWriterError(
        f"model {model} is being written by another run: pid {holder.get('pid', '?')} on host "
        f"{holder.get('host', '?')}, started {holder.get('started', '?')} (lock {path}). Nothing of "
        f"the model was read or written; wait for that run to end, or stop it ({released})")


class _Backend(Protocol):
    """How one kind of storage holds the lock; :class:`WriterLock` states the contract."""
    path: str

    def holder(self) -> dict: ...

    def acquire(self) -> None: ...

    def check(self) -> None: ...

    def release(self) -> None: ...


class _FileLock:
    """An flock on the local file ``<checkpoint>.lock`` (module docstring, "A local path")."""

    def __init__(self, checkpoint_location: str, model: str):
        self.path = os.path.normpath(checkpoint_location) + ".lock"
        self.model = model
        self._fd: int | None = None

    def holder(self) -> dict:
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
            raise _busy(self.model, self.holder(), self.path,
                        "a run that is killed releases the lock by itself") from None
        previous = self.holder()
        if previous.get("pid"):
            log.warning("%s: taking over the writer lock %s left by pid %s on host %s (started %s), which "
                        "ended without releasing it", self.model, self.path, previous.get("pid"),
                        previous.get("host"), previous.get("started"))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "model": self.model, "started": _now_iso()}
        # the holder record is for messages only (the flock is the lock), so it is not
        # fsynced: it outlives the process in the page cache, and a machine crash that loses
        # it loses a message, never the lock's exclusion (an fsync would make every run wait
        # on the disk for nothing the lock needs)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        self._fd = fd

    def check(self) -> None:
        """Nothing: the kernel keeps an flock for as long as the process lives."""

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class _ObjectStoreLock:
    """The object ``<checkpoint>.lock`` taken with conditional puts and held with a lease
    renewed by a daemon thread (module docstring, "An object store")."""

    _ATTEMPTS = 3   # reads and conditional writes before a lock that keeps changing counts as held

    def __init__(self, checkpoint_location: str, model: str):
        self.path = location.normalize(checkpoint_location) + ".lock"
        self.model = model
        self.lease_s = lease_seconds()
        self._mutex = threading.Lock()      # the fields below; never held across a request
        self._token: str | None = None      # set while held
        self._etag: str | None = None       # of our last write
        self._record: dict = {}
        self._written_at = 0.0              # monotonic, taken before sending our last write
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._released = local_cache.Kept("locks", self.path) if local_cache.enabled() else None

    # -- the store --------------------------------------------------------------------------

    def _store(self):
        return location.object_store(self.path)

    def _read(self) -> tuple[dict, str | None, datetime.datetime | None]:
        """``(record, etag, last_modified)``; ``({}, None, None)`` when there is no object."""
        import obstore
        from obstore.exceptions import NotFoundError
        store, key = self._store()
        try:
            location.REQUESTS.add("GET", self.path)
            got = obstore.get(store, key)
            data = bytes(got.bytes())
        except (FileNotFoundError, NotFoundError):
            return {}, None, None
        try:
            record = json.loads(data or b"{}")
        except ValueError:
            record = {}
        return (record if isinstance(record, dict) else {}), got.meta["e_tag"], got.meta["last_modified"]

    def _store_now(self) -> datetime.datetime:
        """The store's clock: the ``last_modified`` of a probe object put now."""
        import obstore
        store, key = self._store()
        location.REQUESTS.add("PUT", self.path + ".clock")
        obstore.put(store, key + ".clock", b"")
        location.REQUESTS.add("HEAD", self.path + ".clock")
        return obstore.head(store, key + ".clock")["last_modified"]

    def _expiry(self, record: dict, last_modified: datetime.datetime) -> datetime.datetime:
        try:
            lease = float(record.get("lease_s") or self.lease_s)
        except (TypeError, ValueError):
            lease = self.lease_s
        return last_modified + datetime.timedelta(seconds=lease + _STAMP_RESOLUTION_S)

    def _new_record(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(), "model": self.model, "started": _now_iso(),
                "token": secrets.token_hex(16), "lease_s": self.lease_s,
                "lease_expires": round(time.time() + self.lease_s, 3)}

    # -- the contract -----------------------------------------------------------------------

    def holder(self) -> dict:
        from obstore.exceptions import BaseError
        try:
            return self._read()[0]
        except (OSError, BaseError):
            return {}

    def acquire(self) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError
        if self._token is not None:
            raise ConcurrentWriterError(f"model {self.model}: this WriterLock already holds {self.path}")
        store, key = self._store()
        me = self._new_record()
        body = json.dumps(me).encode()
        current: dict = {}
        expires: datetime.datetime | None = None
        sent = time.monotonic()
        free = (self._released.read() or {}).get("etag") if self._released is not None else None
        if free:   # the empty record this machine's last release wrote, if it is still there
            try:
                location.REQUESTS.add("PUT", self.path)
                return self._hold(me, obstore.put(store, key, body, mode={"e_tag": free})["e_tag"], sent)
            except (PreconditionError, NotFoundError, FileNotFoundError):
                pass                                        # written since, or gone: read it
            except Exception as e:  # noqa: BLE001 (the store's other answers: read it, which reports them)
                log.debug("%s: taking the writer lock %s on its released ETag failed: %s", self.model, self.path, e)
        for _ in range(self._ATTEMPTS):
            # read first: a model's lock object stays after a release (empty), so a create
            # would fail in all but a model's first run (a GET and a PUT, not three requests)
            current, etag, last_modified = self._read()
            expires = None
            if etag is None:                                # no lock object: create it
                sent = time.monotonic()
                try:
                    location.REQUESTS.add("PUT", self.path)
                    result = obstore.put(store, key, body, mode="create")
                    return self._hold(me, result["e_tag"], sent)
                except AlreadyExistsError:
                    continue                                # created since (or our create retried): read it
            if current.get("token") == me["token"]:         # our create went through, then was retried
                return self._hold(me, etag, sent)
            if current.get("token"):
                expires = self._expiry(current, last_modified)
                if self._store_now() <= expires:
                    break                                   # held, its lease running
            sent = time.monotonic()
            try:
                location.REQUESTS.add("PUT", self.path)
                result = obstore.put(store, key, body, mode={"e_tag": etag})
            except PreconditionError:
                continue                                    # changed since we read it: read it again
            if current.get("pid"):
                log.warning("%s: taking over the writer lock %s left by pid %s on host %s (started %s), whose "
                            "lease expired at %s", self.model, self.path, current.get("pid"), current.get("host"),
                            current.get("started"), expires.isoformat() if expires else "?")
            return self._hold(me, result["e_tag"], sent)
        when = f", at {expires.isoformat()}" if expires else ""
        raise _busy(self.model, current, self.path,
                    f"a run that is killed releases the lock when its lease expires{when}")

    def _hold(self, record: dict, etag: str, sent: float) -> None:
        with self._mutex:
            self._record, self._token, self._etag, self._written_at = record, record["token"], etag, sent
            self._lost = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name=f"writer-lock-{self.model}", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            if not self._renew():
                return

    def _renew(self) -> bool:
        """One renewal; False once the lock is lost or released (the loop ends). The mutex
        guards our state only, never a request, so :meth:`check` never waits on the store."""
        import obstore
        from obstore.exceptions import NotFoundError, PreconditionError
        with self._mutex:
            if self._token is None or self._lost:
                return False
            token, etag, written_at = self._token, self._etag, self._written_at
            record = {**self._record, "lease_expires": round(time.time() + self.lease_s, 3)}
        store, key = self._store()
        sent = time.monotonic()
        try:
            location.REQUESTS.add("PUT", self.path)
            result = obstore.put(store, key, json.dumps(record).encode(), mode={"e_tag": etag})
        except (PreconditionError, NotFoundError, FileNotFoundError):
            try:
                now, now_etag, _ = self._read()
            except Exception as e:
                now, now_etag = {"pid": f"? ({type(e).__name__} reading it)", "token": "?"}, None
            with self._mutex:
                if self._token != token:
                    return False
                if now.get("token") == token and now_etag:
                    # only this holder writes its token: this very write went through and
                    # obstore retried it after a lost response (412 to the retry)
                    self._record, self._etag, self._written_at = record, now_etag, sent
                    return True
                self._lose(f"the lock object was changed by another writer (it names pid {now.get('pid', '?')} on "
                           f"host {now.get('host', '?')})" if now.get("token") else
                           "the lock object was cleared or deleted by another writer")
            return False
        except Exception as e:   # the network, the store: try again at the next tick
            with self._mutex:
                if self._token != token:
                    return False
                if time.monotonic() - written_at >= self.lease_s:
                    self._lose(f"its lease ran out while renewals failed ({type(e).__name__}: {e})")
                    return False
            log.warning("%s: renewing the writer lock %s failed, retrying in %.1f s: %s: %s", self.model,
                        self.path, self.lease_s / 3, type(e).__name__, e)
            return True
        with self._mutex:
            if self._token != token:
                return False
            self._record, self._etag, self._written_at = record, result["e_tag"], sent
            return True

    def _lose(self, why: str) -> None:
        """Mark the lock lost (the mutex held)."""
        if self._lost is None:
            self._lost = why
            log.error("%s: lost the writer lock %s: %s; the run stops before its next commit",
                      self.model, self.path, why)

    def check(self) -> None:
        with self._mutex:
            if self._token is None:
                return
            if self._lost is None and time.monotonic() - self._written_at >= self.lease_s:
                self._lose(f"its lease of {self.lease_s:g} s ran out before a renewal went through")
            if self._lost is not None:
                raise ConcurrentWriterError(
                    f"model {self.model} lost the writer lock {self.path}: {self._lost}. Another run may be "
                    f"writing the model now; this run stops here, before its next commit")

    def release(self) -> None:
        import obstore
        from obstore.exceptions import BaseError, NotFoundError, PreconditionError
        if self._token is None:
            return
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.lease_s)
        with self._mutex:
            etag, lost = self._etag, self._lost
            self._token = self._etag = None
            self._record = {}
        if lost:
            return                  # not ours any more
        if thread is not None and thread.is_alive():
            log.warning("%s: a renewal of the writer lock %s is still under way; the lock is left to expire with "
                        "its lease of %g s", self.model, self.path, self.lease_s)
            return
        store, key = self._store()
        try:
            location.REQUESTS.add("PUT", self.path)
            released = obstore.put(store, key, b"", mode={"e_tag": etag})
            if self._released is not None and released.get("e_tag"):
                self._released.write({"etag": released["e_tag"]})
        except (PreconditionError, NotFoundError, FileNotFoundError):
            now = self.holder()
            if now.get("token"):    # (no token: this release went through, and obstore retried it)
                log.warning("%s: the writer lock %s was taken by another run (pid %s on host %s) before this run "
                            "released it; left as it is", self.model, self.path, now.get("pid"), now.get("host"))
        except (OSError, BaseError) as e:
            log.warning("%s: could not release the writer lock %s (%s: %s); it is free once its lease of %g s "
                        "expires", self.model, self.path, type(e).__name__, e, self.lease_s)


class WriterLock:
    """The writer lock of the model whose checkpoint is ``checkpoint_location``; a context
    manager (:meth:`acquire` on entry, :meth:`release` on exit). A local checkpoint's lock is
    an flock, an ``s3://`` checkpoint's a leased object (the module docstring).

    ``path`` is the lock's path or URI. :meth:`acquire` raises :class:`ConcurrentWriterError`
    naming the holder (pid, host, start time) when another process holds the lock, and takes
    over a lock its holder left behind (killed, or its lease expired), logging a warning that
    names that holder. :meth:`check` raises ConcurrentWriterError when a held lock has been
    lost (an object-store lock whose lease ran out or was taken over; never for an flock); a
    run calls it before each commit. Raises ConfigError for a bad
    ``CONSISTENT_STREAM_LOCK_LEASE_S`` (object stores only)."""

    def __init__(self, checkpoint_location: str, model: str):
        self.model = model
        self._backend: _Backend = (_ObjectStoreLock(checkpoint_location, model)
                                   if location.is_remote(checkpoint_location)
                                   else _FileLock(checkpoint_location, model))
        self.path = self._backend.path

    def holder(self) -> dict:
        """What the lock says of its last holder (``{}`` when it says nothing: never taken,
        released, or unreadable)."""
        return self._backend.holder()

    def acquire(self) -> None:
        """Take the lock, or raise ConcurrentWriterError naming its live holder."""
        self._backend.acquire()

    def check(self) -> None:
        """Raise ConcurrentWriterError when this held lock has been lost (nothing otherwise,
        nor when it is not held)."""
        self._backend.check()

    def release(self) -> None:
        """Clear the holder and give the lock up (the lock file or object stays: see the
        module docstring); nothing when it is not held."""
        self._backend.release()

    def __enter__(self) -> "WriterLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
