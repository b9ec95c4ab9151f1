"""consistent_stream.threads.at_once: results in order, at most ``limit`` calls at a time, the
first failure (in the items' order) raised after every call ended, and calls made from the
process's threads (nested) never waiting for those threads."""
from __future__ import annotations

import threading
import time

import pytest

from consistent_stream import threads
from consistent_stream.threads import SHARED_THREADS, at_once


def test_results_come_in_the_items_order_at_most_limit_at_a_time():
    running, most, lock = [0], [0], threading.Lock()

    def work(x):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01 * (x % 3))
        with lock:
            running[0] -= 1
        return x * x

    assert at_once(work, list(range(20)), "t", limit=3) == [x * x for x in range(20)]
    assert 1 < most[0] <= 3
    assert at_once(work, [7], "t") == [49]   # one item: on the calling thread
    assert at_once(work, [], "t") == []


def test_the_first_failure_in_the_items_order_is_raised_after_every_call_ended():
    ended = []

    def work(x):
        time.sleep(0.05 if x == 1 else 0)
        ended.append(x)
        if x in (1, 3):
            raise ValueError(f"item {x}")
        return x

    with pytest.raises(ValueError, match="item 1"):
        at_once(work, [0, 1, 2, 3, 4], "t", limit=5)
    assert sorted(ended) == [0, 1, 2, 3, 4]


def test_calls_from_the_processes_threads_run_on_their_own_and_never_exhaust_the_pool():
    """Every pool thread busy with a call that itself runs calls at once: without threads of
    their own for the nested calls, each would wait for a pool thread that never frees."""
    def inner(x):
        return at_once(lambda y: (x, y, threading.current_thread().name), [0, 1], "nested", limit=2)

    out = at_once(inner, list(range(2 * SHARED_THREADS)), "outer", limit=2 * SHARED_THREADS)
    assert [[(x, y) for x, y, _ in pairs] for pairs in out] == [[(x, 0), (x, 1)] for x in range(2 * SHARED_THREADS)]
    assert all(name.startswith("nested") for pairs in out for _, _, name in pairs)


def test_the_pool_threads_are_kept_between_calls():
    at_once(lambda x: x, [1, 2], "t")
    first = threads._POOL[1]
    names = set(at_once(lambda x: threading.current_thread().name, list(range(8)), "t"))
    assert threads._POOL[1] is first and all(n.startswith("cs-at-once") for n in names)
