# make test: the test suite; make demo: the example project end to end on TPC-H SF 0.1.
# make test also installs PostgreSQL 15 + wal2json from Debian packages when missing
# (scripts/ensure_postgres.sh) for the CDC tests.
# Both set up .venv at the repository root first (re-installed when setup.py changes), with
# delta-spark's and the S3A connector's jars resolved from Maven Central into
# .venv/share/consistent-stream/jars (and s3proxy's, the S3 API server the tests and the S3
# demos start on loopback), and the Spark driver's class-data sharing archive built beside
# them (about two minutes): after that, nothing needs the network.

PYTHON := .venv/bin/python
STAMP := .venv/installed.stamp

.PHONY: .venv .venv-connect bytecode lint test docs demo demo-cluster demo-cluster-s3 demo-kafka demo-connect

.venv: $(STAMP)

# The package's own modules compiled to bytecode (installed wheels are compiled by pip; an
# editable install's sources are not): a process started where PYTHONDONTWRITEBYTECODE is set
# (CI images, containers) otherwise compiles them all again at every import, in every `dbt run`
# and every process a test starts. Only sources newer than their bytecode are compiled again.
bytecode: .venv
	$(PYTHON) -m compileall -q -j 0 python adapters testing

# The product (with the extras the tests use) and, beside it, consistent-stream-testing
# (testing/: the S3 server, the Kafka stack, the local cluster, TPC-H and TPC-DS data), which
# the product's wheel does not hold.
$(STAMP): setup.py testing/pyproject.toml
	test -x $(PYTHON) || python3 -m venv .venv
	$(PYTHON) -m pip install -e '.[session,test,plot,kafka]' -e testing
	$(MAKE) --no-print-directory -j2 --output-sync=target session-jars test-jars
	touch $@

# The jars, in two lanes side by side: the session's (delta-spark, S3A, Spark's Kafka source)
# and then the driver's class-data sharing archive over them; s3proxy's and the Kafka stack's.
# Each resolver and the archive's trainer is a JVM that keeps about one core busy, so two lanes
# fill a 2-core machine (more at once only contend). Part of $(STAMP), not meant to be run alone.
.PHONY: session-jars test-jars
session-jars:
	$(PYTHON) -m consistent_stream.session resolve
	$(PYTHON) -m consistent_stream.session archive

test-jars:
	$(PYTHON) -m consistent_stream_testing.s3server install
	$(PYTHON) -m consistent_stream_testing.kafka_stack install

# A second virtualenv for dbt as a Spark Connect client: the package with pyspark-client only
# (no jars, no JVM), for make demo-connect; with consistent-stream-testing, whose
# tpch-generate / tpch-refresh scripts/demo.sh runs from it.
CONNECT_PYTHON := .venv-connect/bin/python
CONNECT_STAMP := .venv-connect/installed.stamp

.venv-connect: $(CONNECT_STAMP)

$(CONNECT_STAMP): setup.py testing/pyproject.toml
	test -x $(CONNECT_PYTHON) || python3 -m venv .venv-connect
	$(CONNECT_PYTHON) -m pip install -e '.[connect]' -e testing
	touch $@

# ruff (ruff.toml: pycodestyle, pyflakes and bugbear, lines up to 120 columns) over the whole
# repository; CI runs it before the docs and the tests.
lint: .venv
	$(PYTHON) -m ruff check .

# Two pytest workers (pytest-xdist), each test file on one of them: each worker has its own
# SparkSession (and PostgreSQL server when its files need one); the 2-core machine's idle time
# (JVM starts, dbt's parsing, waits on subprocesses) goes to the other worker.
test: bytecode
	scripts/ensure_postgres.sh
	$(PYTHON) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 tests

# The documentation site into site/ (mkdocs build --strict: a warning, a page not in the nav or a
# broken link fails it). Its reference pages are generated from the package's code and its
# benchmark pages from benchmarks/results at build time (docs/gen/), so it builds in .venv, with
# the docs extra (mkdocs, Material, gen-files) installed beside the product once.
DOCS_STAMP := .venv/docs.stamp

$(DOCS_STAMP): $(STAMP) setup.py
	$(PYTHON) -m pip install -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP)
	$(PYTHON) -m mkdocs build --strict -d site

demo: bytecode
	scripts/demo.sh

# The same demo with dbt's Spark session on a local standalone cluster (1 master, 2 workers on
# 127.0.0.1, from pyspark's distribution), stopped at the end.
demo-cluster: bytecode
	scripts/demo_cluster.sh

# The same demo on a cluster whose nodes share nothing but an S3 server (s3proxy): master and
# workers each in a network namespace of their own, run as an account that cannot read the
# driver's files; sources, targets, checkpoints and the warehouse on S3. Root only.
demo-cluster-s3: bytecode
	scripts/demo_cluster_s3.sh

# Debezium on Kafka: PostgreSQL running pgbench, Debezium's connector on Kafka Connect, a KRaft
# broker (all on loopback, started by consistent_stream_testing.kafka_stack), two models over the
# topics cut at whole upstream transactions; Kafka Connect is SIGKILLed mid-run; ends with
# verify and PostgreSQL's own answers.
demo-kafka: bytecode
	scripts/demo_kafka.sh

# The same demo with dbt as a Spark Connect client (.venv-connect: pyspark-client, no JVM) of a
# cluster whose nodes (master and Connect server, two workers) each have a network namespace
# and share nothing but an S3 server with the client. Root only.
demo-connect: bytecode .venv-connect
	scripts/demo_connect.sh
