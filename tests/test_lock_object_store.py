"""The writer lock of an ``s3://`` checkpoint: an object taken with conditional puts and held
with a lease, against a real S3 API server (s3proxy on loopback, a separate JVM) and real
processes. A second writer is refused naming the holder, whether it is in this process or in
another; a holder killed with SIGKILL blocks the next run until its lease expires, and no
longer; a live holder's lease is renewed; a release frees the lock at once; a lock overwritten
under its holder is reported lost by ``check()``; a bad lease setting is a ConfigError."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import obstore
import pytest

from consistent_stream import location
from consistent_stream.errors import ConcurrentWriterError, ConfigError
from consistent_stream.sink.lock import LEASE_ENV, WriterLock
from consistent_stream_testing import s3server
from helpers import REPO

LEASE_S = 3.0
BUCKET = "lockbkt"
LOGGER = "consistent_stream.sink.lock"

# a writer in another process: takes the lock, says so, holds it (checking it) for argv[2]
# seconds, then releases it and says so
HOLDER = textwrap.dedent("""
    import sys, time
    from consistent_stream.sink.lock import WriterLock
    lock = WriterLock(sys.argv[1], "orders")
    lock.acquire()
    print("held", flush=True)
    deadline = time.time() + float(sys.argv[2])
    while time.time() < deadline:
        lock.check()
        time.sleep(0.1)
    lock.release()
    print("released", flush=True)
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = s3server.start(tmp_path_factory.mktemp("s3"), buckets=(BUCKET,))
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def s3env(server, monkeypatch):
    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(LEASE_ENV, str(LEASE_S))
    location.reset()
    yield
    location.reset()


@pytest.fixture
def checkpoint():
    return f"s3://{BUCKET}/{uuid.uuid4().hex}/orders__checkpoint"


def _holder_process(checkpoint: str, hold_s: float) -> subprocess.Popen:
    """A process holding the lock (returns once it says ``held``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, checkpoint, str(hold_s)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()
    if line.strip() != "held":
        proc.kill()
        raise AssertionError(f"the holder process did not take the lock: {line!r} {proc.stderr.read()[-2000:]}")
    return proc


def test_a_second_lock_in_this_process_is_refused_naming_the_holder(checkpoint):
    with WriterLock(checkpoint, "orders") as first:
        assert first.path == checkpoint + ".lock"
        assert first.holder()["pid"] == os.getpid()
        for other in (checkpoint, checkpoint.replace("s3://", "s3a://") + "/"):   # one lock, however written
            with pytest.raises(ConcurrentWriterError,
                               match=rf"model orders is being written by another run: pid {os.getpid()} on host "
                                     rf"{socket.gethostname()}, started .*\(lock {checkpoint}\.lock\)\. Nothing of "
                                     rf"the model was read or written.*lease expires, at "):
                WriterLock(other, "orders").acquire()
        first.check()                                       # still ours


def test_a_live_holder_in_another_process_refuses_and_once_killed_its_lease_expires(checkpoint, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    proc = _holder_process(checkpoint, 60)
    try:
        lock = WriterLock(checkpoint, "orders")
        with pytest.raises(ConcurrentWriterError, match=rf"pid {proc.pid} on host {socket.gethostname()}, started "
                                                        rf".*Nothing of the model was read or written; wait"):
            lock.acquire()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = time.monotonic()
    assert lock.holder()["pid"] == proc.pid                 # left behind by the killed process
    refused = 0
    while True:
        try:
            lock.acquire()
            break
        except ConcurrentWriterError:
            refused += 1
            assert time.monotonic() - killed < LEASE_S + 5, "the killed holder's lease never expired"
            time.sleep(0.25)
    try:
        waited = time.monotonic() - killed
        # its last renewal was at most lease/3 before the kill: the lock was not taken before
        # the rest of its lease had run out
        assert refused and waited > LEASE_S * 2 / 3 - 0.2, waited
        assert lock.holder()["pid"] == os.getpid()
        assert any("taking over the writer lock" in r.getMessage() and f"left by pid {proc.pid}" in r.getMessage()
                   and "whose lease expired at" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        lock.release()


def test_a_live_holders_lease_is_renewed_and_its_release_frees_the_lock_at_once(checkpoint, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    hold_s = 2.5 * LEASE_S
    proc = _holder_process(checkpoint, hold_s)
    started = time.monotonic()
    try:
        lock = WriterLock(checkpoint, "orders")
        tries = 0
        while time.monotonic() - started < hold_s - 0.5:    # past two whole leases, still refused
            with pytest.raises(ConcurrentWriterError, match=rf"pid {proc.pid} on host"):
                lock.acquire()
            tries += 1
            time.sleep(0.5)
        assert tries >= 2 * LEASE_S
        assert proc.stdout.readline().strip() == "released", proc.stderr.read()[-2000:]
        assert proc.wait(timeout=10) == 0, proc.stderr.read()[-2000:]
        assert lock.holder() == {}                          # cleared by the release
        lock.acquire()                                      # at once: no lease to wait for
        lock.release()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not [r for r in caplog.records if "taking over" in r.getMessage()], caplog.text


def test_a_release_clears_the_lock_so_the_next_acquire_succeeds_at_once(checkpoint, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    first = WriterLock(checkpoint, "orders")
    first.acquire()
    first.release()
    first.release()                                         # a second release does nothing
    assert first.holder() == {}
    t0 = time.monotonic()
    with WriterLock(checkpoint, "orders") as second:
        assert second.holder()["pid"] == os.getpid()
    assert time.monotonic() - t0 < 1.0
    with WriterLock(checkpoint, "orders"):                  # and again, after a release from a holder
        pass
    assert not caplog.records, caplog.text                  # a released lock is taken with no warning


def test_a_lock_this_machine_released_is_taken_with_one_conditional_put_unless_written_since(checkpoint):
    """The release keeps the empty record's ETag on this machine (``local_cache``): the next
    acquire here is one conditional PUT on it; once another run has written the lock, that PUT
    is refused and the lock is read, its holder named as always."""
    with WriterLock(checkpoint, "orders"):
        pass
    before = location.REQUESTS.snapshot()
    lock = WriterLock(checkpoint, "orders")
    lock.acquire()
    taken = location.REQUESTS.since(before)["by_method"]
    try:
        assert taken == {"PUT": 1} and lock.holder()["pid"] == os.getpid()
    finally:
        lock.release()
    proc = _holder_process(checkpoint, 60)     # (it takes the lock on that ETag too)
    try:
        with pytest.raises(ConcurrentWriterError, match=rf"pid {proc.pid} on host {socket.gethostname()}"):
            WriterLock(checkpoint, "orders").acquire()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_lock_overwritten_under_its_holder_is_lost_and_check_raises(checkpoint, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    lock = WriterLock(checkpoint, "orders")
    lock.acquire()
    lock.check()
    store, key = location.object_store(lock.path)
    other = {"pid": 4242, "host": "elsewhere", "model": "orders", "started": "2026-01-01T00:00:00+00:00",
             "token": "0" * 32, "lease_s": 600.0, "lease_expires": time.time() + 600}
    obstore.put(store, key, json.dumps(other).encode())     # unconditionally: another holder's record
    deadline = time.monotonic() + LEASE_S
    while True:
        try:
            lock.check()
        except ConcurrentWriterError as e:
            assert f"model orders lost the writer lock {lock.path}" in str(e)
            assert "pid 4242 on host elsewhere" in str(e)
            break
        assert time.monotonic() < deadline, "the renewal did not notice the lock was overwritten"
        time.sleep(0.1)
    assert any(r.levelno == logging.ERROR and "lost the writer lock" in r.getMessage() for r in caplog.records)
    lock.release()                                          # must not clear the other holder's record
    assert lock.holder()["host"] == "elsewhere"
    with pytest.raises(ConcurrentWriterError, match="pid 4242 on host elsewhere"):
        WriterLock(checkpoint, "orders").acquire()          # its lease (600 s) is running


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_lease_setting_is_a_config_error_naming_the_variable(checkpoint, monkeypatch, value, tmp_path):
    monkeypatch.setenv(LEASE_ENV, value)
    with pytest.raises(ConfigError, match=rf"{LEASE_ENV}=.*must be a number of seconds > 0"):
        WriterLock(checkpoint, "orders")
    with WriterLock(str(tmp_path / "ckpt"), "orders") as local:   # an flock has no lease
        local.check()


def test_a_holder_that_cannot_reach_the_store_for_a_whole_lease_has_lost_the_lock(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    own = s3server.start(tmp_path / "s3", buckets=(BUCKET,))    # a store of its own, to stop under the holder
    try:
        for k, v in own.env().items():
            monkeypatch.setenv(k, v)
        location.reset()
        lock = WriterLock(f"s3://{BUCKET}/unreachable/orders__checkpoint", "orders")
        lock.acquire()
        lock.check()
    finally:
        own.stop()
    t0 = time.monotonic()
    while True:
        try:
            lock.check()
        except ConcurrentWriterError as e:
            assert "lost the writer lock" in str(e) and "ran out" in str(e), str(e)
            break
        assert time.monotonic() - t0 < LEASE_S + 1, "the lease ran out unnoticed"
        time.sleep(0.1)
    assert time.monotonic() - t0 > LEASE_S / 3                  # not before the lease could have run out
    lock.release()                                              # gives up without the store, within a lease
    assert time.monotonic() - t0 < 2 * LEASE_S + 2
