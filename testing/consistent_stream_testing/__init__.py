"""What the tests, benchmarks and demos of dbt-consistent-stream start and generate, kept out of
the product's wheel (``consistent-stream-testing``, installed from ``testing/``):

* :mod:`.s3server`: a real S3 API server on loopback (s3proxy);
* :mod:`.kafka_stack`: a Kafka broker, Kafka Connect and Debezium's PostgreSQL connector;
* :mod:`.cluster`: a local standalone Spark cluster from pyspark's distribution;
* :mod:`.localpg`: a throwaway PostgreSQL 15;
* :mod:`.jvm`: what their launchers share (a jar from Maven Central, a detached daemon, its
  state file and its stop);
* :mod:`.tpch` and :mod:`.tpcds`: TPC-H and TPC-DS data and refresh rounds;
* :mod:`.apart`: a source's writer called in a process of its own, as a user's is.

``consistent-stream-testing`` (:mod:`.cli`) runs ``tpch-generate``, ``tpch-refresh`` and
``cluster start|stop|status|tasks``; ``python -m consistent_stream_testing.s3server`` and
``python -m consistent_stream_testing.kafka_stack`` install their jars (``make .venv``) and
start and stop their services.

The engine (``consistent_stream``) never imports this package.
"""
