"""Independent calls run at once on threads: on an object store each call's requests then
share one round trip; pyarrow's and DuckDB's work releases the GIL, so their CPU work overlaps
too."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable


def at_once(fn: Callable, items: list, name: str, limit: int = 4) -> list:
    """``fn`` of each of ``items``, in order, on up to ``limit`` threads named ``name`` (one
    item: on this thread). Raises what the first failing call raised, after every call ended."""
    if len(items) < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(len(items), limit), thread_name_prefix=name) as pool:
        return list(pool.map(fn, items))
