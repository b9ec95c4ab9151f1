"""This machine's copies of compiled plans, so that a run in a new process (each ``dbt run`` is
one) does not compile its model's SQL again.

Why. A plan is a function of what it is compiled from, yet every run compiled it: sqlglot's
parse of the SQL, the lowering and the passes of :func:`consistent_stream.plan.compile_model`,
which cost a small incremental run as much as its own source reads.

Key (its SHA-256, which the document holds and is compared with when a plan is read back; the
SQL and the sources' options are not written out): the SQL, the sources
(every field of each :class:`~consistent_stream.sources.SourceSpec`), their column names,
``incremental_only``, and the code that compiles: the bytes of the compiler's modules (the
``plan`` package and ``sources/spec.py``), sqlglot's version and Python's. A plan is
deterministic in these, so a kept plan found under its key is the plan a compile would make
now, and is used without a check against anything (unlike what :mod:`.local_cache` keeps of an
object store, which changes under its key). Any other code or input is another key.

Kept as :class:`~consistent_stream.local_cache.Kept` documents of kind ``plans`` (the pickled
:class:`~consistent_stream.plan.compile.CompiledModel`, base64), written only by this account
(the directory is its own, mode 0700); ``CONSISTENT_STREAM_LOCAL_CACHE=off`` keeps none and
compiles every time. A document that is missing, torn or cannot be unpickled is no document:
the SQL is compiled, and the plan kept again.

Out of :func:`compiled`: a new :class:`CompiledModel` each call (the caller may set its fields).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import pickle
import sys
from pathlib import Path

from . import local_cache
from .plan import CompiledModel, compile_model
from .sources import SourceSpec

log = logging.getLogger("consistent_stream")

KIND = "plans"


@functools.cache
def code_version() -> str:
    """A hash of what a plan depends on besides its inputs: the compiler's source files (the
    ``plan`` package, ``sources/spec.py``), sqlglot's version and Python's."""
    import sqlglot
    package = Path(__file__).resolve().parent
    h = hashlib.sha256(f"sqlglot {sqlglot.__version__}|python {sys.version_info[:2]}".encode())
    files = sorted((package / "plan").glob("*.py")) + [package / "sources" / "spec.py"]
    if not all(f.is_file() for f in files) or len(files) < 2:
        return ""   # (an install without its sources: no plans kept)
    for f in files:
        h.update(f"|{f.name}|".encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:32]


def _key(sql: str, sources: list[SourceSpec], schemas: dict[str, list[str]], incremental_only: bool) -> str:
    text = json.dumps({"code": code_version(), "sql": sql, "sources": [repr(s) for s in sources],
                       "schemas": {k: list(v) for k, v in sorted(schemas.items())},
                       "incremental_only": bool(incremental_only)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def compiled(sql: str, sources: list[SourceSpec], schemas: dict[str, list[str]],
             incremental_only: bool = False) -> CompiledModel:
    """:func:`~consistent_stream.plan.compile_model` of these arguments: this machine's kept
    plan for them when there is one (the module docstring), else compiled and kept. Raises
    what ``compile_model`` raises (CompileError, NoDeltaRule): a plan that does not compile is
    not kept."""
    if not local_cache.enabled() or not code_version():
        return compile_model(sql, sources, schemas, incremental_only=incremental_only)
    kept = local_cache.Kept(KIND, _key(sql, sources, schemas, incremental_only))
    doc = kept.read()
    if doc is not None:
        try:
            plan = pickle.loads(base64.b64decode(doc["pickle"]))
            if isinstance(plan, CompiledModel):
                return plan
        except Exception as e:  # noqa: BLE001 (torn, or of classes that changed: compiled again)
            log.debug("the kept plan %s is not read: %s", kept.file, e)
    plan = compile_model(sql, sources, schemas, incremental_only=incremental_only)
    kept.write({"pickle": base64.b64encode(pickle.dumps(plan)).decode()})
    return plan
