"""Test helpers: render example models, build jobs, compare results across engines."""
from __future__ import annotations

import datetime
import decimal
import os
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
import pyarrow as pa
from deltalake import DeltaTable

from consistent_stream.spec import JobSpec

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_MODELS = REPO / "models" / "example" / "models"
TPCH_PK = {"customer": ["c_custkey"], "orders": ["o_orderkey"], "lineitem": ["l_orderkey", "l_linenumber"],
           "nation": ["n_nationkey"], "region": ["r_regionkey"], "part": ["p_partkey"],
           "supplier": ["s_suppkey"], "partsupp": ["ps_partkey", "ps_suppkey"]}


def render_model(path: Path) -> tuple[str, dict, list[tuple[str, str]], list[str]]:
    """Render a dbt model's Jinja the way dbt does for source(), ref() and config():
    returns (compiled SQL, config, [(source_name, table)], [ref'd model]); ``ref(m)``
    renders as ``tests.m`` (the schema of :func:`job_for`)."""
    config, used, refs = {}, [], []

    def source(s, t):
        used.append((s, t))
        return f"{s}.{t}"

    def ref(m):
        refs.append(m)
        return f"tests.{m}"

    def cfg(**kw):
        config.update(kw)
        return ""
    sql = jinja2.Template(path.read_text()).render(source=source, ref=ref, config=cfg)
    return sql, config, used, refs


def model_ref(name: str, root: Path) -> dict:
    """The materialization's description of ``ref(name)`` for a model built by :func:`job_for`."""
    return {"kind": "model", "name": name, "relation": f"tests.{name}", "schema": "tests", "identifier": name,
            "config": {"location_root": str(root / "targets")}}


def expand_macro(path: Path, call: str) -> str:
    """The SQL a dbt macro file expands to for ``call`` (e.g. ``"m('src.t', 'k')"``), rendered
    with plain Jinja as dbt would (no adapter context)."""
    env = jinja2.Environment(extensions=["jinja2.ext.do"])
    return env.from_string(path.read_text() + "{{ " + call + " }}").render().strip()


def tpch_sources(tpch_dir: str, used) -> list[dict]:
    return [{"source_name": s, "name": t, "relation": f"{s}.{t}",
             "meta": {"format": "delta", "location": os.path.join(tpch_dir, t), "primary_key": TPCH_PK[t]}}
            for s, t in dict.fromkeys(used)]


def job_for(name: str, sql: str, sources: list[dict], unique_key, root: Path, schema: str = "tests") -> JobSpec:
    return JobSpec.from_dbt(project_root=str(root), schema=schema, identifier=name, model_name=name, sql=sql,
                            sources=sources, config={"unique_key": unique_key, "location_root": str(root / "targets")},
                            warehouse_dir=str(root / "wh"))


def delta_pandas(path: str, version: int | None = None) -> pd.DataFrame:
    return pa.table(DeltaTable(path, version=version).to_pyarrow_table()).to_pandas()


def _norm(s: pd.Series) -> pd.Series:
    vals = s.dropna()
    if len(vals) and isinstance(vals.iloc[0], decimal.Decimal):
        return s.map(lambda v: None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)).astype(float)
    if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        return s.astype(float)
    if len(vals) and isinstance(vals.iloc[0], (datetime.date, datetime.datetime)):
        s = pd.to_datetime(s)
    if pd.api.types.is_datetime64_any_dtype(s):
        return s.dt.strftime("%Y-%m-%d %H:%M:%S").where(s.notna(), None)
    return s.map(lambda v: None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v))


def assert_same_rows(got: pd.DataFrame, expected: pd.DataFrame, what: str, rtol: float = 1e-9,
                     atol: float = 1e-9) -> None:
    """Multiset equality of two results, numbers compared as floats (relative ``rtol``)."""
    got = got[[c for c in expected.columns]] if set(expected.columns) <= set(got.columns) else got
    assert list(got.columns) == list(expected.columns), f"{what}: columns {list(got.columns)} != {list(expected.columns)}"
    assert len(got) == len(expected), f"{what}: {len(got)} rows != {len(expected)} expected"
    g = pd.DataFrame({c: _norm(got[c]) for c in got.columns})
    e = pd.DataFrame({c: _norm(expected[c]) for c in expected.columns})
    keys = list(g.columns)
    g = g.sort_values(keys, na_position="first").reset_index(drop=True)
    e = e.sort_values(keys, na_position="first").reset_index(drop=True)
    for c in keys:
        a, b = g[c], e[c]
        if a.dtype == float or b.dtype == float:
            ok = np.isclose(a.astype(float), b.astype(float), rtol=rtol, atol=atol, equal_nan=True)
        else:
            ok = (a == b) | (a.isna() & b.isna())
        bad = np.flatnonzero(~np.asarray(ok))
        assert len(bad) == 0, f"{what}: column {c} differs at {len(bad)} rows, first:\n{g.iloc[bad[0]]}\n!=\n{e.iloc[bad[0]]}"


DUCKDB_TOL = {"rtol": 1e-9, "atol": 1e-6}
"""DuckDB's AVG over DECIMAL(p, s) returns a DOUBLE at full precision where Spark rounds to
scale s+4 (0.050081 vs 0.0500806..): compare with DuckDB to 1e-6 absolute."""


def assert_target_equals_batch_evaluation(spark, job, label: str = "") -> int:
    """The central contract on the target's latest commit: it equals the model's SQL evaluated
    in batch over the sources at the recorded base cut (upstream models of a ``ref()`` chain
    recomputed from their SQL), in Spark and in DuckDB. Returns its rows."""
    from consistent_stream.delta import DeltaTableRef
    from consistent_stream.oracle import batch_dataframe, duckdb_result
    from consistent_stream.sources import Cut
    target = DeltaTableRef(job.target_path)
    commit = target.commit_at(target.latest_version())
    cut = Cut.from_json(commit.metadata.get("base_cut") or commit.metadata["cut"])
    got = delta_pandas(job.target_path, commit.version)
    assert_same_rows(got, batch_dataframe(spark, job.sql, job.sources, cut, chain=True).toPandas(),
                     f"{label} vs Spark")
    assert_same_rows(got, duckdb_result(job.sql, job.sources, cut, chain=True), f"{label} vs DuckDB",
                     **DUCKDB_TOL)
    return len(got)
