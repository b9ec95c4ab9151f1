"""The compiler's corpus: record every model SQL the test suite compiles, then check that the
compiler still gives byte-identical results for each (plans, errors with their positions,
fingerprints, inferred unique keys). A refactoring tool, not a test: run it around a change
of the compiler's code.

Record (a pytest plugin; only compiles made in the pytest processes are seen, not those of
``dbt`` subprocesses)::

    CS_COMPILE_CORPUS=/tmp/corpus.jsonl .venv/bin/python -m pytest -p compile_corpus \
        -n 2 --dist loadfile tests            # with scripts/ on PYTHONPATH

Check (prints JSON: cases, distinct, identical, differing; exit 1 when any differs)::

    .venv/bin/python scripts/compile_corpus.py /tmp/corpus.jsonl

Each line of the corpus: ``{"sql", "sources": [SourceSpec fields], "schemas", "result"}``,
where ``result`` is :func:`describe` of what ``compile_model`` returned or raised.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys


def _value(v):
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        if hasattr(v, "children") and hasattr(v, "columns"):   # a plan node
            return _node(v)
        return {"__class__": type(v).__name__,
                **{f.name: _value(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _value(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return repr(v)


def _node(n) -> dict:
    fields = {f.name: _value(getattr(n, f.name)) for f in dataclasses.fields(n)}
    return {"__node__": type(n).__name__, **fields}


def describe(compile_model, sql: str, sources: list, schemas: dict) -> dict:
    """What ``compile_model(sql, sources, schemas)`` gives: the compiled model's fields, or
    the error's class, message and attributes."""
    try:
        c = compile_model(sql, sources, schemas)
    except Exception as e:  # noqa: BLE001 - every error is part of the compiler's answer
        return {"error": type(e).__name__, "message": str(e),
                "attrs": _value({k: v for k, v in vars(e).items() if not k.startswith("_")})}
    return {"compiled": {f.name: _value(getattr(c, f.name)) for f in dataclasses.fields(c)}}


def _record(path: str):
    from consistent_stream import plan
    from consistent_stream.plan import compile as compile_module
    original = compile_module.compile_model

    def recording(sql, sources, schemas):
        result = describe(original, sql, sources, schemas)
        line = json.dumps({"sql": sql, "sources": [dataclasses.asdict(s) for s in sources],
                           "schemas": schemas, "result": result}, sort_keys=True, default=repr)
        with open(path, "a") as f:
            f.write(line + "\n")
        return original(sql, sources, schemas)

    compile_module.compile_model = recording
    plan.compile_model = recording


def pytest_configure(config):  # the pytest plugin: record when CS_COMPILE_CORPUS names a file
    path = os.environ.get("CS_COMPILE_CORPUS")
    if path:
        _record(path)


def check(path: str) -> dict:
    from consistent_stream.plan import compile_model
    from consistent_stream.sources import SourceSpec
    seen, differing, cases = set(), [], 0
    with open(path) as f:
        for line in f:
            cases += 1
            d = json.loads(line)
            key = json.dumps([d["sql"], d["sources"], d["schemas"]], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            sources = [SourceSpec(**{**s, "primary_key": tuple(s["primary_key"])}) for s in d["sources"]]
            now = json.loads(json.dumps(describe(compile_model, d["sql"], sources, d["schemas"]),
                                        sort_keys=True, default=repr))
            if now != d["result"]:
                differing.append({"sql": d["sql"][:200], "was": str(d["result"])[:400], "now": str(now)[:400]})
    return {"cases": cases, "distinct": len(seen), "identical": len(seen) - len(differing),
            "differing": len(differing), "examples": differing[:5]}


if __name__ == "__main__":
    out = check(sys.argv[1])
    print(json.dumps(out, indent=1))
    sys.exit(1 if out["differing"] else 0)
