"""Independent calls run at once on threads: on an object store each call's requests then
share one round trip; pyarrow's and DuckDB's work releases the GIL, so their CPU work overlaps
too.

The threads are the process's: one pool (:data:`SHARED_THREADS` of them), started as calls
need them and kept, since a small batch makes a few dozen such calls and starting a pool's
threads for each cost more than the calls' own work on local disk. A call made from one of
those threads (a change read at once with others that reads its files at once) runs on
threads of its own instead, so that no pool thread ever waits for another pool thread: the
pool cannot run out of threads with every one of them waiting.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

SHARED_THREADS = 16
"""Threads of the process's pool (calls beyond wait their turn; no pool thread waits)."""

_LOCK = threading.Lock()
_POOL: tuple[int, ThreadPoolExecutor] | None = None   # (the pid it was started in, the pool)
_LOCAL = threading.local()


def _pool() -> ThreadPoolExecutor:
    """The process's pool (a new one in a forked child, whose copy has no threads)."""
    global _POOL
    with _LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=SHARED_THREADS, thread_name_prefix="cs-at-once",
                                                     initializer=_mark))
        return _POOL[1]


def _mark() -> None:
    _LOCAL.pooled = True


def at_once(fn: Callable, items: list, name: str, limit: int = 4) -> list:
    """``fn`` of each of ``items``, in order, at most ``limit`` at a time, on the process's
    threads (one item: on this thread; called from one of those threads: on new threads
    named ``name``). Raises what the first failing call (in the order of ``items``) raised,
    after every call ended."""
    if len(items) < 2:
        return [fn(x) for x in items]
    lanes = min(len(items), max(1, limit))
    if getattr(_LOCAL, "pooled", False):
        with ThreadPoolExecutor(max_workers=lanes, thread_name_prefix=name) as pool:
            return list(pool.map(fn, items))
    results: list = [None] * len(items)
    errors: list = [None] * len(items)
    order = iter(range(len(items)))
    take = threading.Lock()

    def lane() -> None:
        while True:
            with take:
                i = next(order, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as e:  # noqa: BLE001 (raised on the calling thread, below)
                errors[i] = e
    pool = _pool()
    for f in [pool.submit(lane) for _ in range(lanes)]:
        f.result()
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        raise failed
    return results


def begin(fn: Callable[[], object], name: str) -> Callable[[], object]:
    """Start ``fn()`` on the process's threads and return a callable that waits for it and
    returns what it returned (or raises what it raised): work whose result is needed later,
    its requests' round trip spent meanwhile. Called from one of those threads, ``fn`` runs on a
    thread of its own named ``name`` instead (no pool thread waits for another)."""
    if getattr(_LOCAL, "pooled", False):
        own = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        future = own.submit(fn)
        own.shutdown(wait=False)
    else:
        future = _pool().submit(fn)
    return future.result
