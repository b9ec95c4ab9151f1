"""The Spark session every entry point builds: delta-spark's jars, Delta's SQL extension and
its catalog, without the user writing them.

delta-spark is two halves: a Python package (``delta``, from PyPI, installed with this one)
and its jars (``io.delta:delta-spark_<spark major.minor>_2.13:<same version>`` and what it
depends on, from Maven Central). The jars are resolved once, at install: ``make .venv`` runs
``python -m consistent_stream.session resolve``, which lets Spark's own Ivy resolver
(``spark.jars.packages``, what ``spark-submit --packages`` and delta-spark's
``configure_spark_with_delta_pip`` use) fetch them, and keeps the jar files in a cache
directory (:func:`jars_dir`) with a manifest. A session then loads them by path
(``spark.jars``): no resolution at start, and no network after set-up.

Every session this project builds goes through :func:`delta_confs`: the command line's
(``cli.local_spark``), dbt's (the ``consistent_spark`` connection adds them to the profile's
``server_side_parameters`` before dbt-spark builds its session), the tests' and the
benchmarks'. A profile that already sets Delta's extension, catalog or jars keeps them.

Errors: :class:`SessionError` when the jars are not in the cache (with the command that puts
them there) or cannot be resolved.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Mapping

from .errors import ConsistentStreamError

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
MANIFEST = "jars.txt"
SCALA = "2.13"


class SessionError(ConsistentStreamError):
    """delta-spark's jars are missing from the cache or could not be resolved."""


def delta_coordinate() -> str:
    """The Maven coordinate of the delta-spark jar matching the installed Python package and
    pyspark (``io.delta:delta-spark_4.2_2.13:4.4.0``), as ``configure_spark_with_delta_pip``
    names it. Raises SessionError when delta-spark's Python package is not installed."""
    import pyspark
    try:
        delta_version = version("delta-spark")
    except PackageNotFoundError as e:
        raise SessionError("the Python package delta-spark is not installed: pip install the project "
                           "(make .venv)") from e
    spark_mm = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_mm}_{SCALA}:{delta_version}"


def jars_dir() -> Path:
    """Where the jars of :func:`delta_coordinate` are kept: ``$CONSISTENT_STREAM_JARS``, else
    ``<the interpreter's prefix>/share/consistent-stream/jars`` (inside the virtualenv), in a
    subdirectory named after the coordinate, so another version never mixes with it."""
    root = os.environ.get("CONSISTENT_STREAM_JARS") or os.path.join(sys.prefix, "share", "consistent-stream", "jars")
    return Path(root) / delta_coordinate().replace(":", "_")


def delta_jars() -> list[str]:
    """Paths of the cached jars (delta-spark first). Raises SessionError when the cache is
    missing or incomplete, naming the directory and the command that fills it."""
    jars = _cached(jars_dir())
    if jars is None:
        raise SessionError(
            f"delta-spark's jars are not installed in {jars_dir()}: run "
            f"`{sys.executable} -m consistent_stream.session resolve` once with Maven Central reachable "
            f"(`make .venv` does), or set CONSISTENT_STREAM_JARS to a directory where it was run")
    return jars


def _cached(d: Path) -> list[str] | None:
    """The jars the manifest in ``d`` lists, or None when it or one of them is missing."""
    manifest = d / MANIFEST
    names = manifest.read_text().split() if manifest.is_file() else []
    if not names or not all((d / n).is_file() for n in names):
        return None
    return [str(d / n) for n in names]


def has_delta(confs: Mapping[str, str]) -> bool:
    """Whether ``confs`` (a profile's or a session's) already bring delta-spark's jars."""
    return ("io.delta:" in confs.get("spark.jars.packages", "")
            or any("delta-spark" in os.path.basename(j) for j in confs.get("spark.jars", "").split(",")))


def delta_confs(existing: Mapping[str, str] | None = None) -> dict[str, str]:
    """The session confs (name -> value) to add to ``existing`` (the confs a profile or
    caller already sets) so that the session has Delta: ``spark.jars`` with the cached jars
    (unless ``existing`` brings delta-spark's jars itself), Delta's SQL extension appended to
    ``spark.sql.extensions``, and ``spark.sql.catalog.spark_catalog`` = DeltaCatalog unless set.
    Values in ``existing`` that need no change are not repeated. Raises SessionError
    (:func:`delta_jars`)."""
    existing = dict(existing or {})
    out: dict[str, str] = {}
    if not has_delta(existing):
        jars = [j for j in existing.get("spark.jars", "").split(",") if j]
        out["spark.jars"] = ",".join(jars + delta_jars())
    extensions = [e.strip() for e in existing.get("spark.sql.extensions", "").split(",") if e.strip()]
    if DELTA_EXTENSION not in extensions:
        out["spark.sql.extensions"] = ",".join(extensions + [DELTA_EXTENSION])
    if "spark.sql.catalog.spark_catalog" not in existing:
        out["spark.sql.catalog.spark_catalog"] = DELTA_CATALOG
    return out


def with_delta(builder, existing: Mapping[str, str] | None = None):
    """``builder`` (a ``SparkSession.Builder``) with :func:`delta_confs` set on it."""
    for k, v in delta_confs(existing).items():
        builder = builder.config(k, v)
    return builder


_RESOLVER = """
import sys
from pyspark.sql import SparkSession
s = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
     .config("spark.jars.packages", sys.argv[1]).config("spark.jars.ivy", sys.argv[2]).getOrCreate())
print("\\n".join(j for j in s.sparkContext.getConf().get("spark.jars").split(",")))
s.stop()
"""


def resolve(target: Path | None = None) -> list[str]:
    """Fetch :func:`delta_coordinate` and its dependencies with Spark's Ivy resolver (Maven
    Central) and keep the jars in ``target`` (default :func:`jars_dir`) with a manifest, in
    the order Spark resolved them. Does nothing when the manifest's jars are all there.
    Returns the jar paths. Raises SessionError with Spark's output when resolution fails."""
    target = Path(target) if target else jars_dir()
    cached = _cached(target)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="consistent-stream-ivy-") as ivy:
        p = subprocess.run([sys.executable, "-c", _RESOLVER, delta_coordinate(), ivy],
                           capture_output=True, text=True)
        jars = [line.strip().removeprefix("file://") for line in p.stdout.splitlines()
                if line.strip().endswith(".jar")]
        if p.returncode != 0 or not jars:
            raise SessionError(f"could not resolve {delta_coordinate()} from Maven Central:\n{p.stderr[-3000:]}")
        tmp = Path(str(target) + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for j in jars:
            shutil.copy2(j, tmp / os.path.basename(j))
        (tmp / MANIFEST).write_text("\n".join(os.path.basename(j) for j in jars) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return [str(target / os.path.basename(j)) for j in jars]


def _main(argv: list[str]) -> int:
    if argv[:1] != ["resolve"]:
        print("usage: python -m consistent_stream.session resolve", file=sys.stderr)
        return 2
    try:
        jars = resolve()
    except SessionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"delta-spark's jars: {len(jars)} in {jars_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
