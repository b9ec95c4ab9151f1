"""This machine's kept plans (consistent_stream.plan_cache): a plan read back is the plan a
compile makes, of every operator and field; another SQL, other columns, other sources or
other compiler code is another key; a torn document, a plan that does not compile and the
cache turned off all compile."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from consistent_stream import local_cache, plan_cache
from consistent_stream.errors import CompileError
from consistent_stream.plan import compile_model
from helpers import job_for

SQL = """
with o as (select o_custkey, o_orderkey, o_totalprice from tpch.orders where o_orderstatus <> 'X')
select c.c_name, count(*) as n, sum(o.o_totalprice) as total,
       row_number() over (partition by c.c_nationkey order by c.c_custkey) as rn
from tpch.customer c join o on o.o_custkey = c.c_custkey
group by c.c_name, c.c_custkey, c.c_nationkey
"""
COLUMNS = {"tpch.customer": ["c_custkey", "c_name", "c_nationkey"],
           "tpch.orders": ["o_orderkey", "o_custkey", "o_totalprice", "o_orderstatus"]}


def _sources(tmp_path, where: str = "data"):
    sources = [{"source_name": "tpch", "name": t, "relation": f"tpch.{t}",
                "meta": {"format": "delta", "location": str(tmp_path / where / t), "primary_key": [k]}}
               for t, k in (("customer", "c_custkey"), ("orders", "o_orderkey"))]
    return job_for("m", SQL, sources, None, tmp_path).sources


def _shape(value):
    """Every field of a plan, recursively, as plain values (plan nodes compare by identity)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return (type(value).__name__, tuple((f.name, _shape(getattr(value, f.name))) for f in fields))
    if isinstance(value, (list, tuple)):
        return tuple(_shape(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _shape(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(_shape(v)) for v in value))
    return value


@pytest.fixture()
def compiles(monkeypatch, tmp_path):
    """How many times plan_cache compiled, with a cache directory of the test's own."""
    monkeypatch.setenv(local_cache.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(local_cache.ENV_SWITCH, raising=False)
    calls = []

    def counting(*a, **k):
        calls.append(a[0])
        return compile_model(*a, **k)
    monkeypatch.setattr(plan_cache, "compile_model", counting)
    return calls


def test_a_kept_plan_is_the_plan_a_compile_makes_and_a_new_object_each_time(tmp_path, compiles):
    sources = _sources(tmp_path)
    first = plan_cache.compiled(SQL, sources, COLUMNS)
    second = plan_cache.compiled(SQL, sources, COLUMNS)
    third = plan_cache.compiled(SQL, sources, COLUMNS)
    assert len(compiles) == 1
    assert second is not third and second.root is not third.root
    fresh = compile_model(SQL, sources, COLUMNS)
    assert _shape(second) == _shape(fresh) == _shape(first)
    assert second.sources == sources and second.fingerprint == fresh.fingerprint


def test_other_inputs_or_compiler_code_are_other_keys(tmp_path, compiles, monkeypatch):
    sources = _sources(tmp_path)
    plan_cache.compiled(SQL, sources, COLUMNS)
    plan_cache.compiled(SQL.replace("<> 'X'", "<> 'Y'"), sources, COLUMNS)          # other SQL
    wider = {**COLUMNS, "tpch.orders": COLUMNS["tpch.orders"] + ["o_comment"]}
    assert "o_comment" not in str(_shape(plan_cache.compiled(SQL, sources, wider)))   # other columns
    moved = plan_cache.compiled(SQL, _sources(tmp_path, "elsewhere"), COLUMNS)        # other locations
    assert moved.sources[0].location.endswith("elsewhere/customer")
    plan_cache.compiled(SQL, sources, COLUMNS, incremental_only=True)
    assert len(compiles) == 5
    monkeypatch.setattr(plan_cache, "code_version", lambda: "another compiler")
    plan_cache.compiled(SQL, sources, COLUMNS)
    assert len(compiles) == 6


def test_a_torn_plan_an_sql_that_does_not_compile_and_the_cache_off_compile(tmp_path, compiles, monkeypatch):
    sources = _sources(tmp_path)
    plan_cache.compiled(SQL, sources, COLUMNS)
    kept = plan_cache.local_cache.Kept(plan_cache.KIND, plan_cache._key(SQL, sources, COLUMNS, False))
    kept.write({"pickle": "bm90IGEgcGlja2xl"})             # base64 of bytes that are no pickle
    assert _shape(plan_cache.compiled(SQL, sources, COLUMNS)) == _shape(compile_model(SQL, sources, COLUMNS))
    assert len(compiles) == 2
    assert pickle.loads(__import__("base64").b64decode(kept.read()["pickle"]))   # kept again
    bad = "select o_custkey, rand() as r from tpch.orders"
    for _ in range(2):
        with pytest.raises(CompileError):
            plan_cache.compiled(bad, sources, COLUMNS)
    assert len(compiles) == 4
    monkeypatch.setenv(local_cache.ENV_SWITCH, "off")
    plan_cache.compiled(SQL, sources, COLUMNS)
    plan_cache.compiled(SQL, sources, COLUMNS)
    assert len(compiles) == 6
