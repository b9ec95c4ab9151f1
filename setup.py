"""dbt-consistent-stream: strongly consistent incremental materialized views for dbt on Spark.

Three things are installed from this repository:

* ``consistent_stream`` (from ``python/``): the engine.
* ``dbt.adapters.consistent_spark`` (from ``adapters/consistent_spark/``): the dbt adapter plugin.
* ``dbt.include.consistent_spark`` (the repository root's ``dbt_project.yml`` and ``macros/``):
  the dbt project that holds the ``consistent_stream`` materialization. Only those files are
  packaged from the root; ``build_py`` never copies ``setup.py`` itself.

What the tests, benchmarks and demos start and generate (an S3 server, Kafka, a local Spark
cluster, PostgreSQL, TPC-H and TPC-DS data) is another distribution, ``consistent-stream-testing``
(``testing/``, its own ``pyproject.toml``), never in this one's wheel.

``dbt``, ``dbt.adapters`` and ``dbt.include`` belong to dbt-core; this distribution adds no
``__init__.py`` to them.
"""

from setuptools import find_packages, setup

ENGINE_PACKAGES = find_packages("python")
SESSION = ["pyspark==4.2.0", "delta-spark==4.4.0", "dbt-spark[session]>=1.11,<1.12"]
KAFKA = ["confluent-kafka>=2.6,<3"]
PLOT = ["matplotlib>=3.8"]

setup(
    name="dbt-consistent-stream",
    version="0.1.0",
    description=(
        "A dbt plugin for Spark: incrementally maintained, strongly consistent "
        "materialized views in Delta tables"
    ),
    python_requires=">=3.11",
    packages=[*ENGINE_PACKAGES, "dbt.adapters.consistent_spark", "dbt.include.consistent_spark"],
    package_dir={
        "": "python",
        "dbt.adapters.consistent_spark": "adapters/consistent_spark",
        "dbt.include.consistent_spark": ".",
    },
    package_data={
        "dbt.include.consistent_spark": ["dbt_project.yml", "macros/*.sql", "macros/**/*.sql"],
    },
    include_package_data=False,
    # The Spark client is an extra, as dbt-spark's is: `[session]` (pyspark with its jars, a
    # classic session with a JVM in dbt's process) or `[connect]` (pyspark-client, pure Python:
    # dbt as a Spark Connect client, no JVM). One of them is needed; they are not installed
    # together (both are the `pyspark` package).
    install_requires=[
        "dbt-core>=1.10,<1.12",
        "dbt-spark>=1.11,<1.12",
        "deltalake>=1,<2",
        # object stores (consistent_stream.location): files that are not Delta tables and the
        # writer lock's conditional puts (obstore: the object_store crate delta-rs commits
        # through), and the standard AWS credential chain (botocore)
        "obstore>=0.12,<0.13",
        "botocore>=1.34",
        # SQL parsing and the local engine's translations to DuckDB (consistent_stream.exec.local);
        # `[c]`: sqlglot compiled by mypyc (sqlglotc, pinned to sqlglot's own version by the
        # extra): the same parser and generator, faster at translating delta queries
        "sqlglot[c]>=30.30",
        "pyarrow>=15",
        # Delta deletion vectors' bitmaps (consistent_stream.delta.deletion_vectors)
        "pyroaring>=1.0,<2",
        "pandas<3",
        "duckdb>=1.1",
        # capture postgres (consistent_stream.capture.postgres: wal2json logical replication)
        "psycopg2-binary>=2.9,<3",
        "orjson>=3.9",
        # the status table of `consistent-stream status`
        "rich>=13",
    ],
    extras_require={
        # delta-spark 4.4 supports pyspark up to 4.2.0; its jars (io.delta:delta-spark_4.2_2.13:4.4.0,
        # the newest Maven Central serves for Spark 4.2) are fetched at install by
        # `python -m consistent_stream.session resolve` (make .venv)
        "session": SESSION,
        # the pure-Python Spark Connect client (grpcio, ...; no jars, no py4j)
        "connect": ["pyspark-client==4.2.0"],
        # Kafka clients (librdkafka): `format: kafka` sources' partition metadata and watermarks
        "kafka": KAFKA,
        # `consistent-stream plot` (a PNG of a model's freshness and batch times)
        "plot": PLOT,
        # the documentation site (make docs): mkdocs with the Material theme, pages generated from
        # the code and benchmarks/results at build time
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocs-gen-files>=0.5,<1"],
        # the tests run classic sessions and Connect clients (pyspark's own connect extra), Kafka
        # sources and plots; their servers and data come from consistent-stream-testing (testing/);
        # ruff is the linter of make lint (ruff.toml)
        "test": [*SESSION, *KAFKA, *PLOT, "pyspark[connect]==4.2.0", "pytest", "pytest-xdist", "hypothesis",
                 "dbt-tests-adapter==1.20.0", "ruff>=0.6"],
    },
    entry_points={"console_scripts": ["consistent-stream = consistent_stream.cli:main"]},
    zip_safe=False,
)
