"""A source's writer in a process of its own, as it is when a user runs dbt.

The benchmarks generate TPC-H and apply its refresh rounds (:mod:`.tpch`) with delta-rs and
Arrow, in Python. Called in the process that then times the model's runs, the writer left its
heap there, so the peak and starting memory the benchmarks report were the writer's as much as
the model's (``refresh_vs_full.py``'s records before and after the change show the driver's
starting memory drop; its run times did not move). A user's source is written by another
process (a Spark job, a CDC pipeline), so the benchmarks call their writer through
:func:`in_child`.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

_CHILD = """
import pickle, sys
from consistent_stream_testing.apart import _answer
with open(sys.argv[1], "rb") as f:
    fn, args, kwargs = pickle.load(f)
_answer(sys.argv[2], fn, args, kwargs)
"""


def in_child(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run in a new Python process (``sys.executable``; a new process,
    not a fork of one that holds a JVM gateway or DuckDB's threads), returning its result.

    ``fn`` must be importable by name (a module-level function) and its arguments and result
    picklable; the child has this process's environment and ``sys.path``, and its output goes
    where this process's does. Raises what ``fn`` raised, or ``RuntimeError`` naming ``fn`` when
    the child died without an answer (killed, out of memory) or its exception does not pickle."""
    name = f"{fn.__module__}.{fn.__qualname__}"
    with tempfile.TemporaryDirectory(prefix="consistent-stream-apart-") as d:
        call, answer = Path(d, "call.pickle"), Path(d, "answer.pickle")
        call.write_bytes(pickle.dumps((fn, args, kwargs)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(call), str(answer)], env=env, check=False)
        if not answer.exists():
            raise RuntimeError(f"{name} in a child process: it exited with {proc.returncode} and no answer")
        ok, value = pickle.loads(answer.read_bytes())
    if ok:
        return value
    if isinstance(value, BaseException):
        raise value
    raise RuntimeError(f"{name} in a child process failed:\n{value}")


def _answer(path: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """The child's side of :func:`in_child`: ``(True, result)`` or ``(False, exception)``
    pickled to ``path``, the exception as its formatted traceback when it does not pickle."""
    try:
        out: tuple[bool, Any] = (True, fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 (handed to the parent, which raises it)
        out = (False, e)
    try:
        data = pickle.dumps(out)
    except Exception:  # noqa: BLE001 (an exception or result that does not pickle)
        data = pickle.dumps((False, traceback.format_exc() if out[0] else
                             "".join(traceback.format_exception(out[1]))))
    Path(path).write_bytes(data)
