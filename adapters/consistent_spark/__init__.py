"""dbt adapter plugin ``consistent_spark``: dbt-spark plus the ``consistent_stream`` materialization."""

from pathlib import Path

from dbt.adapters.base import AdapterPlugin

from dbt.adapters.consistent_spark.connections import (  # noqa: F401
    ConsistentSparkConnectionManager,
    ConsistentSparkCredentials,
)
from dbt.adapters.consistent_spark.impl import ConsistentSparkAdapter

PROJECT_NAME = "consistent_spark"


def _include_path() -> str:
    """The directory holding this plugin's ``dbt_project.yml`` and ``macros/``.

    Installed from a wheel, that is the package ``dbt/include/consistent_spark/`` next to
    ``dbt/adapters/``. In an editable install it is the source tree's root, two levels above
    ``adapters/consistent_spark/``.
    """
    here = Path(__file__).resolve().parent
    for candidate in (here.parent.parent / "include" / PROJECT_NAME, here.parent.parent):
        if (candidate / "dbt_project.yml").is_file() and (candidate / "macros").is_dir():
            return str(candidate)
    raise RuntimeError(f"dbt-consistent-stream: no dbt_project.yml with macros/ found near {here}")


Plugin = AdapterPlugin(
    adapter=ConsistentSparkAdapter,  # type: ignore[arg-type]
    credentials=ConsistentSparkCredentials,
    include_path=_include_path(),
    dependencies=["spark"],
    # Named explicitly: dbt's default, "dbt_" + the include directory's name, would be
    # "dbt_<checkout directory>" in an editable install.
    project_name=PROJECT_NAME,
)
