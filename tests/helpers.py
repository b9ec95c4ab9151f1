"""Test helpers: render example models, build jobs, compare results across engines."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jinja2
import pandas as pd
import pyarrow as pa
from deltalake import DeltaTable

from consistent_stream.spec import JobSpec

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "models" / "example"
EXAMPLE_MODELS = EXAMPLE / "models"
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


def _arrow(data) -> pa.Table:
    return data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)


def assert_same_rows(got, expected, what: str, rtol: float = 1e-9, atol: float = 1e-12,
                     inexact: tuple[str, ...] = (), unit: dict | None = None, top=None) -> None:
    """Multiset equality of two results (Arrow tables or pandas DataFrames) by the project's one
    rule (:mod:`consistent_stream.compare`): the same columns in the same order (none dropped),
    and a matching of rows in which exact columns are equal (integers, decimals, strings,
    booleans, dates, timestamps to the microsecond; a date never equals a timestamp, a string
    never a number) and floating-point columns (either side's FLOAT or DOUBLE, and
    ``inexact``) agree within ``rtol``/``atol``. ``top``: the results of an ORDER BY .. LIMIT
    (a :class:`~consistent_stream.compare.TopN`), whose rows tied at the boundary are compared
    by their ORDER BY values only."""
    from consistent_stream.compare import FloatTolerance, compare_tables, compare_top_n
    got, expected = _arrow(got), _arrow(expected)
    assert got.column_names == expected.column_names, f"{what}: columns {got.column_names} != {expected.column_names}"
    kw = dict(tolerance=FloatTolerance(rtol, atol), inexact=inexact, unit=unit)
    result = compare_top_n(got, expected, top, **kw) if top is not None else compare_tables(got, expected, **kw)
    assert result.ok, f"{what}: the result differs: {result.describe()}"


def _family(t: pa.DataType) -> str:
    """A type's family across engines: DuckDB widens sums (HUGEINT, DECIMAL(38, s)) and
    averages decimals as DOUBLE where Spark keeps DECIMAL, so numbers are one family."""
    if pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_date(t):
        return "date"
    return str(t)


def assert_same_types(target: pa.Schema, spark_schema, duckdb_schema: pa.Schema, what: str) -> None:
    """The target's column types are Spark's types of the batch evaluation exactly (as Spark
    reads the Delta table: ``from_arrow_schema``), and DuckDB's in family (:func:`_family`)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from consistent_stream.delta.deltars import plain_arrow
    plain = plain_arrow(target.empty_table()).schema
    got = [(f.name, f.dataType) for f in from_arrow_schema(plain).fields]
    want = [(f.name, f.dataType) for f in spark_schema.fields]
    assert got == want, f"{what}: target types {got} != Spark's {want}"
    got_f = [(f.name, _family(f.type)) for f in plain]
    duck_f = [(f.name, _family(f.type)) for f in duckdb_schema]
    assert got_f == duck_f, f"{what}: target type families {got_f} != DuckDB's {duck_f}"


def latest_cut(job) -> dict:
    """The cut a run of ``job`` started now takes (the engine's rule over its inputs'
    newest positions; for a Delta source, checked against the table's own latest version)."""
    from consistent_stream.sources.dag import latest_cut as engine_latest_cut
    from consistent_stream.sources.formats import open_source
    cut = engine_latest_cut([open_source(s) for s in job.sources])
    if all(s.format == "delta" for s in job.sources):   # no upstream model to align with
        assert cut == {s.key: DeltaTable(s.location).version() for s in job.sources}, cut
    return cut


DUCKDB_TOL = {"rtol": 1e-9, "atol": 1e-6}
"""DuckDB's AVG over DECIMAL(p, s) returns a DOUBLE at full precision where Spark rounds to
scale s+4 (0.050081 vs 0.0500806..): compare with DuckDB to 1e-6 absolute."""


def assert_target_equals_batch_evaluation(spark, job, label: str = "", *, at_latest: bool = True,
                                         spark_rows: bool = True) -> int:
    """The central contract on the target's latest commit: it equals the model's SQL evaluated
    in batch over the sources at the recorded base cut (upstream models of a ``ref()`` chain
    recomputed from their SQL), in Spark and in DuckDB, with the same column types; and
    (``at_latest``, after a run that should have taken in every change) the recorded cut is
    the one a run started now would take, so an engine that stalls fails here. ``spark_rows``
    False: Spark's result is only analyzed (column types), not run, for a caller that compares
    its rows with ``verify_target`` anyway. Returns the target's rows."""
    from consistent_stream.compare import TopN
    from consistent_stream.delta import DeltaTableRef
    from consistent_stream.oracle import batch_evaluation, duckdb_result
    from consistent_stream.plan.topn import model_top_n
    from consistent_stream.verify import inexact_comparison
    from consistent_stream.runtime import BatchMeta
    from consistent_stream.sources import Cut
    target = DeltaTableRef(job.target_path)
    commit = target.commit_at(target.latest_version())
    meta = BatchMeta.from_commit(commit)
    assert meta is not None, f"{label}: the target's version {commit.version} was not written by consistent_stream"
    if at_latest:
        want = latest_cut(job)
        assert meta.cut == want, (f"{label}: the target's latest version {commit.version} is at cut {meta.cut}, "
                                  f"the sources are at {want}: changes were not taken in")
    cut = Cut(meta.base_cut)
    got = target.read_snapshot_arrow(commit.version)   # delta-rs' scan where the target has deletion vectors
    evaluated = batch_evaluation(spark, job.sql, job.sources, cut, chain=True, instant=meta.clock,
                                 upstream_instants=meta.upstream_clocks)
    spark_df = evaluated.frame
    inexact, unit, _ = inexact_comparison(spark_df.schema, evaluated.inexact)
    duck = duckdb_result(job.sql, job.sources, cut, chain=True, arrow=True, instant=meta.clock,
                         upstream_instants=meta.upstream_clocks)
    if duck.column_names != spark_df.columns and len(duck.column_names) == len(spark_df.columns):
        # an unaliased expression: DuckDB names it its own way (count_star() for Spark's count(1),
        # substring(x, CASE .. END, ..) as sqlglot wrote it), so its columns go by position
        duck = duck.rename_columns(spark_df.columns)
    assert_same_types(got.schema, spark_df.schema, duck.schema, label)
    top = model_top_n(job.sql)
    top = TopN(*top) if top is not None else None
    if spark_rows:
        assert_same_rows(got, spark_df.toArrow(), f"{label} vs Spark", inexact=tuple(inexact), unit=unit, top=top)
    assert_same_rows(got, duck, f"{label} vs DuckDB", inexact=tuple(inexact), unit=unit, top=top, **DUCKDB_TOL)
    return got.num_rows


def descendants(root: int) -> dict[int, str]:
    """pid -> command name of every live descendant of ``root`` (from /proc)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        names[int(entry)] = comm
        children.setdefault(int(rest[1]), []).append(int(entry))
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = names.get(pid, "?")
        todo += children.get(pid, [])
    return out


def dbt_watched(project: Path, env: dict, *args: str, target: str) -> tuple[int, str, set[str]]:
    """Run ``dbt <args> --target <target>`` in ``project`` as a process of its own (its own
    session: a fault point's SIGKILL of its process group stops only it), this virtualenv's.
    Returns its exit code, its output and the command names of every process it started."""
    dbt = str(Path(sys.executable).parent / "dbt")
    proc = subprocess.Popen([dbt, *args, "--target", target], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: set[str] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen.update(descendants(proc.pid).values())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out, _ = proc.communicate(timeout=900)
    finally:
        done.set()
        watcher.join()
    return proc.returncode, out, seen


def tpch_refresh(data: Path, round_: int) -> None:
    """One TPC-H refresh round of the sources under ``data`` (``consistent-stream-testing
    tpch-refresh``)."""
    cli = str(Path(sys.executable).parent / "consistent-stream-testing")
    subprocess.run([cli, "tpch-refresh", "--dir", str(data), "--round", str(round_)],
                   check=True, stdout=subprocess.DEVNULL)


def example_copy(tmp: Path, schema_prefix: str) -> tuple[Path, str, Path]:
    """A copy of the example project (``dbt_project.yml``, its models, data tests and
    profiles) at ``tmp/example`` whose profiles write to a fresh schema
    ``<schema_prefix>_<8 hex digits>`` instead of ``tpch_example``, with TPC-H at SF 0.01
    generated in its ``data/tpch`` (``orders`` without the Change Data Feed, as ``make demo``
    writes it); returns ``(project, schema, data directory)``."""
    import shutil
    import uuid

    from consistent_stream_testing.tpch.generate import generate
    project = tmp / "example"
    project.mkdir()
    for name in ("dbt_project.yml", "models", "macros", "tests", "profiles.yml"):
        src = EXAMPLE / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, project / name)
    schema = f"{schema_prefix}_{uuid.uuid4().hex[:8]}"
    profile = (project / "profiles.yml").read_text()
    assert "schema: tpch_example" in profile
    (project / "profiles.yml").write_text(profile.replace("schema: tpch_example", f"schema: {schema}"))
    data = project / "data" / "tpch"
    generate(0.01, data, without_cdf=["orders"])
    return project, schema, data


def example_env(project: Path, data: Path, **extra: str) -> dict[str, str]:
    """The environment of a dbt process over an :func:`example_copy`: this process's, with the
    project, profiles and TPC-H directories, no usage statistics, and none of the variables
    that would make the child something else than a user's ``dbt`` (a fault point, pyspark's
    submit arguments, Spark Connect's mode or remote); then ``extra``."""
    env = {**os.environ, "DBT_PROJECT_DIR": str(project), "DBT_PROFILES_DIR": str(project), "TPCH_DIR": str(data),
           "DBT_SEND_ANONYMOUS_USAGE_STATS": "false"}
    for k in ("CONSISTENT_STREAM_FAULT", "PYSPARK_SUBMIT_ARGS", "SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        env.pop(k, None)
    return {**env, **extra}
