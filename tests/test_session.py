"""delta-spark in the session: the confs every entry point adds, a profile that already sets
them, the test session itself, and the error when the jars were never fetched."""
from __future__ import annotations

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
    jars = confs["spark.jars"].split(",")
    assert "delta-spark" in jars[0] and all(j.endswith(".jar") for j in jars)
    assert any("hadoop-aws" in j for j in jars) and any("awssdk_s3-" in j for j in jars)
    assert any("spark-sql-kafka-0-10" in j for j in jars)


def test_a_profile_that_sets_delta_itself_keeps_its_settings():
    mine = {"spark.jars.packages": "io.delta:delta-spark_4.2_2.13:4.4.0",
            "spark.sql.extensions": f"org.example.Other,{DELTA_EXTENSION}",
            "spark.sql.catalog.spark_catalog": DELTA_CATALOG}
    added = delta_confs(mine)   # only the S3A connector and Kafka source, which the profile does not bring
    assert list(added) == ["spark.jars"] and "hadoop-aws" in added["spark.jars"].split(",")[0]
    assert "delta-spark" not in added["spark.jars"]
    assert any("spark-sql-kafka" in j for j in added["spark.jars"].split(","))
    mine["spark.jars.packages"] += ",org.apache.hadoop:hadoop-aws:3.5.0,org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert delta_confs(mine) == {}
    other = {"spark.sql.extensions": "org.example.Other", "spark.jars": "/opt/x.jar"}
    confs = delta_confs(other)
    assert confs["spark.sql.extensions"] == f"org.example.Other,{DELTA_EXTENSION}"
    assert confs["spark.jars"].startswith("/opt/x.jar,")


def test_missing_jars_name_the_directory_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CONSISTENT_STREAM_JARS", str(tmp_path / "nowhere"))
    with pytest.raises(SessionError) as e:
        delta_confs({})
    msg = str(e.value)
    assert str(tmp_path / "nowhere") in msg and "-m consistent_stream.session resolve" in msg, msg
    assert session.jars_dir().parent == tmp_path / "nowhere"
