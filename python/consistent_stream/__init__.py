"""dbt-consistent-stream: strongly consistent, incrementally maintained materialized views
on Delta Lake, computed by Spark (docs/concepts/how-it-works.md
describes the architecture)."""
import importlib.util as _importlib_util
import os as _os
import sys as _sys

if _importlib_util.find_spec("pyspark") is None:
    raise ImportError("dbt-consistent-stream needs a Spark client, installed as an extra: "
                      "pip install 'dbt-consistent-stream[session]' (pyspark: a classic session with a JVM "
                      "in dbt's process) or 'dbt-consistent-stream[connect]' (pyspark-client: dbt as a Spark "
                      "Connect client, no JVM)")

# Spark's Python workers (which run our streaming source) must use this interpreter, the one
# with consistent_stream and its dependencies installed, not whatever python3 is on PATH.
_os.environ.setdefault("PYSPARK_PYTHON", _sys.executable)

__version__ = "0.1.0"
