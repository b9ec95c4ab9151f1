"""delta-spark in the session: the confs every entry point adds, a profile that already sets
them, the test session itself, and the error when the jars were never fetched."""
from __future__ import annotations

import os

import pytest

from consistent_stream import session
from consistent_stream.session import DELTA_CATALOG, DELTA_EXTENSION, SessionError, delta_confs


def test_a_session_built_by_the_project_reads_and_writes_delta(spark, tmp_path):
    assert DELTA_EXTENSION in spark.conf.get("spark.sql.extensions")
    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 1")
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [0, 2]
    assert spark.read.format("delta").option("versionAsOf", 0).load(path).count() == 3


def test_the_confs_added_to_a_bare_profile():
    confs = delta_confs({})
    assert confs["spark.sql.extensions"] == DELTA_EXTENSION
    assert confs["spark.sql.catalog.spark_catalog"] == DELTA_CATALOG
    assert "spark.jars" not in confs   # a local session: the driver's class path
    jars = confs["spark.driver.extraClassPath"].split(os.pathsep)
    assert "delta-spark" in jars[0] and all(j.endswith(".jar") for j in jars)
    assert any("hadoop-aws" in j for j in jars) and any("awssdk_s3-" in j for j in jars)
    assert any("spark-sql-kafka-0-10" in j for j in jars)
    # nothing Spark ships: delta-spark's dependencies name older Jackson, Parquet, Hadoop jars
    assert session.spark_ships(jars) == []
    cached = session.delta_jars() + session.s3a_jars() + session.kafka_jars()
    shipped = {os.path.basename(j) for j in session.spark_ships(cached)}
    assert {"com.fasterxml.jackson.core_jackson-databind-2.13.5.jar",
            "org.apache.hadoop_hadoop-client-runtime-3.4.2.jar"} <= shipped, shipped
    assert set(jars) | set(session.spark_ships(cached)) == set(cached)
    # the Kafka source's fetched records are not kept five minutes in the driver's heap
    assert confs["spark.kafka.consumer.fetchedData.cache.timeout"] == "10s"
    mine = {"spark.kafka.consumer.fetchedData.cache.timeout": "2m"}
    assert "spark.kafka.consumer.fetchedData.cache.timeout" not in delta_confs(mine)


def test_a_local_session_rebuilds_a_delta_snapshot_in_as_many_tasks_as_it_has_cores(spark):
    # delta-spark's default, 50 tasks, is 25 waves of tiny tasks on 2 cores for every table a
    # fresh process reads (docs/reference/profile.md, "What the adapter adds to a session")
    key = session.SNAPSHOT_PARTITIONS
    assert delta_confs({}, "local[3]")[key] == "3" and delta_confs({}, "local")[key] == "1"
    assert delta_confs({"spark.master": "local[4,2]"})[key] == "4"
    assert delta_confs({})[key] == str(os.cpu_count())   # pyspark's default master, local[*]
    assert key not in delta_confs({}, "spark://h:7077") and key not in delta_confs({key: "50"})
    assert spark.conf.get(key) == "2"   # the tests' session: local[2], nothing set by hand


def test_a_cluster_session_names_the_jars_for_its_executors_to_fetch():
    for master in ("spark://127.0.0.1:7077", "local-cluster[2,1,1024]"):
        confs = delta_confs({}, master)
        assert "spark.driver.extraClassPath" not in confs
        jars = confs["spark.jars"].split(",")
        assert "delta-spark" in jars[0] and session.spark_ships(jars) == []
    assert "spark.jars" in delta_confs({"spark.master": "spark://h:7077"})
    for master in (None, "local", "local[2]", "local[*]", "local[2,3]"):
        assert session.is_local(master), master


def test_a_local_session_copies_no_jar_into_its_files_directory(spark):
    # spark.jars would have the local executor copy each jar into SparkFiles' root at its
    # first task, a copy left in /tmp whenever the process is killed
    from pyspark import SparkFiles
    assert spark.range(3).count() == 3
    root = SparkFiles.getRootDirectory()
    assert [n for n in os.listdir(root) if n.endswith(".jar")] == [], root
    assert not spark.sparkContext.getConf().get("spark.jars", "")


def test_a_profile_that_sets_delta_itself_keeps_its_settings():
    mine = {"spark.jars.packages": "io.delta:delta-spark_4.2_2.13:4.4.0",
            "spark.sql.extensions": f"org.example.Other,{DELTA_EXTENSION}",
            "spark.sql.catalog.spark_catalog": DELTA_CATALOG}
    added = delta_confs(mine)   # only the S3A connector and Kafka source, which the profile does not bring
    cp = added["spark.driver.extraClassPath"].split(os.pathsep)
    assert set(added) - {"spark.driver.extraJavaOptions", session.SNAPSHOT_PARTITIONS, *session.KAFKA_POOL_CONFS} \
        == {"spark.driver.extraClassPath"}
    assert "hadoop-aws" in cp[0]
    assert not any("delta-spark" in j for j in cp)
    assert any("spark-sql-kafka" in j for j in cp)
    mine["spark.jars.packages"] += (",org.apache.hadoop:hadoop-aws:3.5.0"
                                    ",org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0")
    # the archive's options, when built, and the session's tuning
    assert set(delta_confs(mine)) <= {"spark.driver.extraJavaOptions", session.SNAPSHOT_PARTITIONS,
                                      *session.KAFKA_POOL_CONFS}
    other = {"spark.sql.extensions": "org.example.Other", "spark.driver.extraClassPath": "/opt/x.jar"}
    confs = delta_confs(other)
    assert confs["spark.sql.extensions"] == f"org.example.Other,{DELTA_EXTENSION}"
    assert confs["spark.driver.extraClassPath"].startswith("/opt/x.jar" + os.pathsep)
    on_cluster = delta_confs({"spark.master": "spark://h:7077", "spark.jars": "/opt/x.jar"})
    assert on_cluster["spark.jars"].startswith("/opt/x.jar,")
    # a profile's own delta-spark on the driver's class path counts as delta-spark's jars
    own = {"spark.driver.extraClassPath": "/opt/a.jar" + os.pathsep + "/opt/io.delta_delta-spark_4.2_2.13-4.4.0.jar"}
    assert session.has_delta(own) and not session.has_s3a(own)
    assert not any("delta-spark" in j for j in delta_confs(own)["spark.driver.extraClassPath"].split(os.pathsep)[2:])


def test_missing_jars_name_the_directory_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CONSISTENT_STREAM_JARS", str(tmp_path / "nowhere"))
    with pytest.raises(SessionError) as e:
        delta_confs({})
    msg = str(e.value)
    assert str(tmp_path / "nowhere") in msg and "-m consistent_stream.session resolve" in msg, msg
    assert session.jars_dir().parent == tmp_path / "nowhere"


_LOADS = """
import sys
from pyspark.sql import SparkSession
from consistent_stream.session import with_delta
profile = {"spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=" + sys.argv[1]}
b = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
for k, v in profile.items():
    b = b.config(k, v)
b = with_delta(b, profile)
s = b.getOrCreate()
s.range(3).write.format("delta").save(sys.argv[2])
print(s.sparkContext.getConf().get("spark.driver.extraJavaOptions"))
s.stop()
"""


def test_a_local_session_maps_the_class_data_sharing_archive_make_built(tmp_path):
    import subprocess
    import sys
    archive = session.archive_path()
    assert archive.is_file(), f"make .venv builds {archive} (python -m consistent_stream.session archive)"
    confs = delta_confs({"spark.driver.extraJavaOptions": "-Dx=1"})
    assert confs["spark.driver.extraJavaOptions"].startswith(f"-Dx=1 -XX:SharedArchiveFile={archive} ")
    assert "spark.driver.extraJavaOptions" not in delta_confs({}, "spark://h:7077")
    log = tmp_path / "classes.log"
    p = subprocess.run([sys.executable, "-c", _LOADS, str(log), str(tmp_path / "t")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    loads = log.read_text().splitlines()
    # a Delta class the session loads at its start, and one its first write loads
    for cls in ("io.delta.sql.DeltaSparkSessionExtension ", "org.apache.spark.sql.delta.OptimisticTransaction "):
        line = next(line for line in loads if cls in line)
        assert "shared objects file (top)" in line, line
    p = subprocess.run([sys.executable, "-c", _LOADS, str(tmp_path / "off.log"), str(tmp_path / "u")],
                       capture_output=True, text=True, env={**os.environ, "CONSISTENT_STREAM_CDS": "off"})
    assert p.returncode == 0 and "SharedArchiveFile" not in p.stdout, p.stdout + p.stderr[-3000:]
    assert not any("shared objects file (top)" in line for line in (tmp_path / "off.log").read_text().splitlines())
    # what make built it with is this install: no staleness (the JVM mapped it above)
    assert session.archive_staleness() is None, session.archive_staleness()


def test_a_stale_archive_is_named_with_its_cause_and_the_command_that_rebuilds_it(tmp_path, monkeypatch, caplog):
    """The JVM starts without an archive whose JDK or class path jars changed, silently (its
    messages are off): the project compares the record make wrote beside the archive with this
    install, and a session's confs log a warning once, with the command."""
    import json
    import logging
    archive = tmp_path / "spark-driver.jsa"
    monkeypatch.setattr(session, "archive_path", lambda: archive)
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"x" * 10)
    assert "there is no archive" in session.archive_staleness()
    archive.write_bytes(b"jsa")
    assert "no record of what" in session.archive_staleness()
    home = session._java_home()
    libjvm = session._file_id(session._libjvm(home))
    record = {"java_home": home, "vm_version": "17", "libjvm": libjvm,
              "entries": [[str(jar), session._file_id(str(jar))]]}
    (tmp_path / "spark-driver.jsa.json").write_text(json.dumps(record))
    assert session.archive_staleness() is None
    jar.write_bytes(b"y" * 11)   # pyspark or a jar upgraded in place
    assert session.archive_staleness() == f"{jar}, on the class path it was built with, changed"
    with caplog.at_level(logging.WARNING, logger="consistent_stream"):
        for _ in range(2):
            confs = delta_confs({})
    assert f"-XX:SharedArchiveFile={archive}" in confs["spark.driver.extraJavaOptions"]
    # our logger's own records (dbt's adapter, once loaded in this process, forwards them as copies)
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "consistent_stream" and "class-data sharing archive" in r.getMessage()]
    assert len(warnings) == 1 and "python -m consistent_stream.session archive" in warnings[0], warnings
    jar.unlink()
    assert session.archive_staleness().endswith("is gone")
    other = tmp_path / "another-jdk"   # JAVA_HOME, which Spark's launcher runs, is another JDK
    monkeypatch.setenv("JAVA_HOME", str(other))
    assert session.archive_staleness() == f"it was built with the JDK at {home}, and sessions run the one at {other}"


_PROFILE = """
import json, sys
from dbt.adapters.consistent_spark.connections import _start_session
from pyspark.sql import SparkSession
_start_session({"spark.master": "local[1]", "spark.ui.enabled": "false",
                "spark.sql.warehouse.dir": sys.argv[1] + "/warehouse",
                "spark.hadoop.javax.jdo.option.ConnectionURL":
                    "jdbc:derby:;databaseName=" + sys.argv[1] + "/metastore_db;create=true",
                "spark.sql.extensions": "org.example.NotThere",
                "spark.driver.extraJavaOptions": "-Dcs.profile.option=kept"})
s = SparkSession.getActiveSession()
s.range(3).write.format("delta").save(sys.argv[1] + "/t")
s.sql(f"DELETE FROM delta.`{sys.argv[1]}/t` WHERE id = 1")   # needs Delta's SQL extension
print(json.dumps({"extensions": s.conf.get("spark.sql.extensions"),
                  "java_options": s.sparkContext.getConf().get("spark.driver.extraJavaOptions"),
                  "property": s.sparkContext._jvm.java.lang.System.getProperty("cs.profile.option"),
                  "rows": s.read.format("delta").load(sys.argv[1] + "/t").count()}))
"""


def test_a_dbt_profile_with_its_own_extensions_and_java_options_keeps_them_and_gets_deltas(tmp_path):
    # the adapter used to set the profile's values after delta-spark's merged ones, so a
    # profile's spark.sql.extensions replaced Delta's extension
    import json
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", _PROFILE, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])
    assert out["extensions"] == f"org.example.NotThere,{DELTA_EXTENSION}", out
    assert out["property"] == "kept" and out["rows"] == 2, out
    assert "-Dcs.profile.option=kept -XX:SharedArchiveFile=" in out["java_options"], out
