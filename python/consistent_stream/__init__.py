"""dbt-consistent-stream: strongly consistent, incrementally maintained materialized views
on Delta Lake, computed by Spark (see DESIGN.md for the architecture)."""
import os as _os
import sys as _sys

# Spark's Python workers (which run our streaming source) must use this interpreter, the one
# with consistent_stream and its dependencies installed, not whatever python3 is on PATH.
_os.environ.setdefault("PYSPARK_PYTHON", _sys.executable)

__version__ = "0.1.0"
