"""``ref()`` chains of consistent_stream models: random change streams through two- and
three-level chains and a diamond; after every run, every committed version of every model
equals batch evaluation of the whole chain (each upstream recomputed from its SQL) at the
base cut the version records, in Spark and in DuckDB.

The sources are the property test's (``a``, ``b`` keyed, ``c`` a bag); every operation is
its own Delta commit, and source changes land *between* the runs of the models of one chain,
so upstreams reflect different source versions and the DAG cut rule has to align them.

CI runs three fixed seeds; for a wider random search set the number of extra seeds per chain::

    CS_CHAIN_SEEDS=20 .venv/bin/python -m pytest -q tests/test_chains.py -k whole_chain
"""
from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from consistent_stream.delta import DeltaTableRef
from consistent_stream.errors import SourceError
from consistent_stream.job import run_job
from consistent_stream.sources import Cut
from helpers import assert_target_equals_batch_evaluation, job_for, model_ref as ref
from change_streams import Sources, seeded_stream


def base_sources(src: Sources, *names: str) -> list[dict]:
    return [s for s in src.sources() if s["name"] in names]


def metas(job) -> list[dict]:
    """The commit metadata of every version of ``job``'s target, oldest first."""
    from consistent_stream.runtime import BatchMeta
    return [BatchMeta.from_commit(c) for c in reversed(DeltaTableRef(job.target_path).history())]


def check(spark, jobs, label: str, *, only_last_at_latest: bool = False) -> None:
    """The central check on every model; each at the newest cut a run would take now, or
    (``only_last_at_latest``: source changes landed after the upstreams' runs) only the last."""
    jobs = list(jobs)
    for job in jobs:
        assert_target_equals_batch_evaluation(spark, job, f"{job.model} {label}",
                                              at_latest=not only_last_at_latest or job is jobs[-1])


def random_ops(rnd: random.Random, n: int, tables: str = "abc") -> list:
    stream = seeded_stream(rnd.randint(0, 10**9))
    ops = [op for batch in stream["batches"] for op in batch]
    return [op for op in ops if op[0] in tables][:n] or ops[:n]


CHAIN2 = {
    # level 1: per-key aggregates of a (keyed by k, NULL k a group of its own)
    "a_by_k": "select k, count(*) as n, sum(x) as sx from src.a group by k",
    # level 2: a mart joining the upstream with one of its own base sources (a) and with b
    "mart": "select a.id, a.g, u.n, u.sx, b.y from src.a a join tests.a_by_k u on a.k = u.k "
            "left join src.b b on b.id = a.id",
}
CHAIN3 = {
    "a_by_k": CHAIN2["a_by_k"],
    # level 2: joins the upstream with b
    "b_enriched": "select b.id, b.k, b.y, u.n from src.b b left join tests.a_by_k u on b.k = u.k",
    # level 3: aggregates level 2 and joins level 1 again, plus c read directly
    "top": "select e.k, count(*) as rows_, sum(e.y) as sy, max(u.sx) as sx, count(c.z) as cz "
           "from tests.b_enriched e left join tests.a_by_k u on e.k = u.k "
           "left join (select distinct k, z from src.c) c on c.k = e.k group by e.k",
}


def build(spark, root: Path, src: Sources, models: dict, keys: dict | None = None) -> dict:
    """Jobs for ``models`` (name -> SQL) in order; a model reads ``tests.<earlier>`` as ref()."""
    jobs = {}
    for name, sql in models.items():
        refs = [ref(m, root) for m in jobs if re.search(rf"\btests\.{m}\b", sql)]
        bases = base_sources(src, *[t for t in "abc" if re.search(rf"\bsrc\.{t}\b", sql)])
        jobs[name] = (sql, bases, refs)
    return jobs


def make_job(root: Path, name: str, sql: str, bases: list, refs: list):
    return job_for(name, sql, bases + refs, None, root)


EXTRA_SEEDS = int(os.environ.get("CS_CHAIN_SEEDS", "0"))


@pytest.mark.parametrize("chain,seed", [("two_level", 11), ("three_level", 12), ("three_level", 13)]
                         + [(c, 1000 + i) for i in range(EXTRA_SEEDS) for c in ("two_level", "three_level")])
def test_chains_stay_equal_to_batch_evaluation_of_the_whole_chain(spark, chain, seed):
    models = CHAIN2 if chain == "two_level" else CHAIN3
    rnd = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix=f"chain_{chain}_"))
    try:
        src = Sources(root, seeded_stream(seed))
        specs = build(spark, root, src, models)
        jobs = {}
        for name, (sql, bases, refs) in specs.items():   # the initial build, in DAG order
            jobs[name] = make_job(root, name, sql, bases, refs)
            run_job(spark, jobs[name], full_refresh=True)
        check(spark, jobs.values(), "initial")
        for rnd_round in range(3):
            for name in jobs:                               # changes land between the models' runs
                for op in random_ops(rnd, rnd.randint(1, 3)):
                    src.apply(op)
                run_job(spark, jobs[name])
            check(spark, jobs.values(), f"round {rnd_round + 1}", only_last_at_latest=True)
            if rnd_round == 0:
                # a full refresh of the first level rewrites its target in one commit, which its
                # downstream models read as a change like any other
                first = next(iter(jobs.values()))
                run_job(spark, first, full_refresh=True)
                for job in list(jobs.values())[1:]:
                    run_job(spark, job)
                check(spark, jobs.values(), "after a full refresh of the first level")
        # every version of the last model names upstream versions that agree with each other
        last = list(jobs.values())[-1]
        for meta in metas(last):
            assert meta.base_cut, meta
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_diamond_never_mixes_source_versions(spark):
    """Two models over one source (a count and a sum per key of ``a``), a third joining both:
    when one upstream reflects a newer version of ``a`` than the other, the diamond stays at
    the newest version both reflect, and moves on once they agree again."""
    root = Path(tempfile.mkdtemp(prefix="diamond_"))
    try:
        src = Sources(root, seeded_stream(21))
        left = make_job(root, "left_n", "select k, count(*) as n from src.a group by k", base_sources(src, "a"), [])
        right = make_job(root, "right_s", "select k, sum(x) as sx from src.a group by k", base_sources(src, "a"), [])
        a = DeltaTableRef(src.path("a"))

        def step(op, job):
            src.apply(op)
            return run_job(spark, job)

        run_job(spark, left, full_refresh=True)
        run_job(spark, right, full_refresh=True)
        both = make_job(root, "both", "select l.k, l.n, r.sx from tests.left_n l full join tests.right_s r "
                                      "on l.k = r.k", [], [ref("left_n", root), ref("right_s", root)])
        run_job(spark, both, full_refresh=True)
        v0 = a.latest_version()
        check(spark, [both], "initial")
        step(("a", "insert", 0, {"k": 1, "g": "p", "x": 3, "seq": 1}), left)     # left at a@v0+1
        step(("a", "update", 0, {"k": 2, "g": "q", "x": 4, "seq": 2}), right)    # right at a@v0+2
        out = run_job(spark, both)                                                 # no agreeing newer cut
        assert out["batches"] == 0 and out["cut"]["model.left_n"] == 0 and out["cut"]["model.right_s"] == 0
        assert metas(both)[-1].base_cut == {"src.a": v0}
        run_job(spark, left)                                                       # left catches up to a@v0+2
        out = run_job(spark, both)
        assert out["batches"] == 1
        m = metas(both)[-1]
        assert m.base_cut == {"src.a": v0 + 2}
        assert m.cut == {"model.left_n": 2, "model.right_s": 1}
        check(spark, [both], "after the upstreams agree")
        for meta in metas(both):            # every version: both inputs at one version of a
            ups = [metas(left)[meta.cut["model.left_n"]], metas(right)[meta.cut["model.right_s"]]]
            assert {u.base_cut["src.a"] for u in ups} == {meta.base_cut["src.a"]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_upstreams_that_never_agree_fail_clearly(spark):
    root = Path(tempfile.mkdtemp(prefix="disagree_"))
    try:
        src = Sources(root, seeded_stream(22))
        left = make_job(root, "l1", "select k, count(*) as n from src.a group by k", base_sources(src, "a"), [])
        right = make_job(root, "r1", "select k, max(x) as mx from src.a group by k", base_sources(src, "a"), [])
        run_job(spark, left, full_refresh=True)
        src.apply(("a", "insert", 0, {"k": 1, "g": "p", "x": 3, "seq": 1}))
        run_job(spark, right, full_refresh=True)
        both = make_job(root, "lr", "select l.k, l.n, r.mx from tests.l1 l join tests.r1 r on l.k = r.k",
                        [], [ref("l1", root), ref("r1", root)])
        with pytest.raises(SourceError, match=r"ref\('l1'\) version 0 reflects \{'src.a': 0\}.*ref\('r1'\)"):
            run_job(spark, both, full_refresh=True)
        assert not DeltaTableRef(both.target_path).exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_ref_of_a_model_that_never_ran_names_it(tmp_path):
    with pytest.raises(SourceError, match=r"ref\('nope'\).*has no target.*run it first"):
        job_for("x", "select * from tests.nope", [ref("nope", tmp_path)], None, tmp_path)


def test_verify_recomputes_the_chain(spark):
    from consistent_stream.verify import verify_target
    root = Path(tempfile.mkdtemp(prefix="verify_chain_"))
    try:
        src = Sources(root, seeded_stream(31))
        up = make_job(root, "a_by_k", CHAIN2["a_by_k"], base_sources(src, "a"), [])
        run_job(spark, up, full_refresh=True)
        mart = make_job(root, "mart", CHAIN2["mart"], base_sources(src, "a", "b"), [ref("a_by_k", root)])
        run_job(spark, mart, full_refresh=True)
        src.apply(("a", "insert", 0, {"k": 0, "g": "q", "x": 2, "seq": 3}))
        run_job(spark, up)
        src.apply(("b", "insert", 0, {"k": 0, "y": 1}))
        run_job(spark, mart)
        res = verify_target(spark, mart.target_path)
        assert res.ok, res
        assert set(res.base_cut) == {"src.a", "src.b"} and set(res.cut) == {"src.a", "src.b", "model.a_by_k"}
        assert Cut(res.base_cut).versions["src.a"] == DeltaTableRef(src.path("a")).latest_version()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_chain_over_a_temporal_model_is_checked_at_each_models_own_instant(spark, monkeypatch):
    """An upstream that reads the clock (the rows of ``a`` dated within 40 days of today) and
    a mart over it that runs 20 days after it: the mart's versions record the instant of the
    upstream version they read, and the whole chain equals batch evaluation with each model at
    its own instant (the upstream's rows as of its run, not as of the mart's)."""
    import datetime

    from consistent_stream import runtime
    from consistent_stream.runtime import BatchMeta
    now = {"t": datetime.datetime(2024, 1, 20, tzinfo=datetime.timezone.utc)}
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    monkeypatch.setattr(runtime, "wall_clock_micros", lambda: (now["t"] - epoch) // datetime.timedelta(microseconds=1))
    root = Path(tempfile.mkdtemp(prefix="chain_temporal_"))
    try:
        src = Sources(root, seeded_stream(31))
        specs = build(spark, root, src, {
            "recent": "select id, k, d from src.a where d >= date_sub(current_date(), 40)",
            "recent_by_k": "select k, count(*) as n, max(d) as last_d from tests.recent group by k"})
        jobs = {}
        for name, (sql, bases, refs) in specs.items():
            jobs[name] = make_job(root, name, sql, bases, refs)
            run_job(spark, jobs[name], full_refresh=True)
        check(spark, jobs.values(), "initial")
        recent, by_k = jobs.values()
        for step, days in enumerate((5, 30, 45)):
            for op in random_ops(random.Random(step), 2, "a"):
                src.apply(op)
            now["t"] += datetime.timedelta(days=days)
            run_job(spark, recent)
            now["t"] += datetime.timedelta(days=20)   # the mart runs later: rows crossed the bound since
            run_job(spark, by_k)
            check(spark, jobs.values(), f"step {step + 1}")
        up, down = (BatchMeta.from_commit(DeltaTableRef(j.target_path).latest_commit()) for j in jobs.values())
        assert down.upstream_clocks == {"recent": up.clock}
    finally:
        shutil.rmtree(root, ignore_errors=True)
