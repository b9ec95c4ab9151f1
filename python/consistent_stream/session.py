"""The Spark session every entry point builds: delta-spark's jars, Delta's SQL extension and
its catalog, and Hadoop's S3A connector (hadoop-aws and the AWS SDK modules it uses), without
the user writing them.

delta-spark is two halves: a Python package (``delta``, from PyPI, installed with this one)
and its jars (``io.delta:delta-spark_<spark major.minor>_2.13:<same version>`` and what it
depends on, from Maven Central). The jars are resolved once, at install: ``make .venv`` runs
``python -m consistent_stream.session resolve``, which lets Spark's own Ivy resolver
(``spark.jars.packages``, what ``spark-submit --packages`` and delta-spark's
``configure_spark_with_delta_pip`` use) fetch them, and keeps the jar files in a cache
directory (:func:`jars_dir`) with a manifest. A session then loads them by path: no
resolution at start, and no network after set-up. A local session (``local``, ``local[N]``,
pyspark's default ``local[*]``) puts them on the driver's class path
(``spark.driver.extraClassPath``), where its executor, which runs in the same JVM, finds them;
``spark.jars`` would have that executor copy every jar into the session's ``userFiles``
directory under ``/tmp`` at its first task (114 MB, every start) and leave the copy behind when
the process is killed. A session on a cluster (``spark://...``) names them in ``spark.jars``,
from which its executors fetch them. Either way, jars Spark already ships (the same Maven
artifact in pyspark's ``jars/``, at whatever version; delta-spark's dependencies name older
Jackson, Parquet and Hadoop client jars) are left out: Spark's own copy is the one its
classes were built with, and the one its class loader found first anyway.

The S3A connector (``s3://`` and ``s3a://`` locations, :mod:`consistent_stream.location`) is
resolved the same way into its own directory (:func:`s3a_jars_dir`): ``org.apache.hadoop:
hadoop-aws`` at the version of the Hadoop client pyspark ships, with the AWS SDK v2 modules it
calls (``s3``, ``s3-transfer-manager``, ``sts``) at the SDK version that Hadoop release was
built against, in place of the SDK's 690 MB ``bundle`` jar, which hadoop-aws names.

Spark's Kafka source (``org.apache.spark:spark-sql-kafka-0-10_2.13`` at pyspark's version, with
the Kafka client it was built with), which ``format: kafka`` sources read through
(:mod:`consistent_stream.sources.kafka.log`), is resolved the same way into a third directory
(:func:`kafka_jars_dir`). Its records are fetched by a pool of Kafka consumers in the JVM that
runs the read's tasks (a local session's driver), which keeps the records of each consumer's last
poll for the next task that starts where it stopped; Spark keeps them five minutes, here ten
seconds (:data:`KAFKA_POOL_CONFS`): a run reads each offset range once, and a Debezium topic's
records (a few KB each, the schema in every one) held five minutes after a read are hundreds of
MB of a local driver's 1 GB heap while the run's next models build.

A local session's driver JVM also maps a class-data sharing archive (AppCDS, JDK 13+'s
dynamic archive, JEP 350) when one was built for this install (:func:`build_archive`, which
``make .venv`` runs after the jars): the classes a session, Delta, the Hive catalog, SQL and a
streaming query load, parsed and verified once, at install, and mapped at each start instead
of read from ~300 jars. The JVM checks the archive against its own build and class path and
starts without it, silently, when either differs (another JDK, a profile's jars before
ours); ``CONSISTENT_STREAM_CDS=off`` leaves it out. What it was built with is recorded beside
it, and a session's confs log a warning when this install no longer matches that record
(:func:`archive_staleness`).

Every session this project builds goes through :func:`delta_confs`: the command line's
(``cli.local_spark``), dbt's (the ``consistent_spark`` connection adds them to the profile's
``server_side_parameters`` before dbt-spark builds its session), the tests' and the
benchmarks'. A profile that already sets Delta's extension, catalog or jars keeps them.

Errors: :class:`SessionError` when the jars are not in the cache (with the command that puts
them there) or cannot be resolved.
"""
from __future__ import annotations

import json
import os
import re
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
AWS_SDK = {"3.5.0": "2.35.4", "3.4.2": "2.29.52", "3.4.1": "2.24.6"}
"""The AWS SDK v2 version each Hadoop release's hadoop-aws was built against (its
``hadoop-project`` POM, ``aws-java-sdk-v2.version``)."""
AWS_SDK_MODULES = ("s3", "s3-transfer-manager", "sts")

KAFKA_POOL_CONFS = {"spark.kafka.consumer.fetchedData.cache.timeout": "10s",
                    "spark.kafka.consumer.fetchedData.cache.evictorThreadRunInterval": "5s"}
"""How long Spark's Kafka source keeps the records a consumer fetched past a task's end offset
(default five minutes, evicted each minute), so that the next task that starts there need not
poll: ten seconds, evicted every five. A run reads an offset range once, so a batch of a
continuous model started within ten seconds is the only reader that could use them."""


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


def hadoop_version() -> str:
    """The version of the Hadoop client jars pyspark ships (``hadoop-client-api-<v>.jar``)."""
    import pyspark
    for name in os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars")):
        if name.startswith("hadoop-client-api-") and name.endswith(".jar"):
            return name[len("hadoop-client-api-"):-len(".jar")]
    raise SessionError("pyspark's jars hold no hadoop-client-api jar: reinstall pyspark")


def s3a_coordinates() -> list[str]:
    """Maven coordinates of the S3A connector for pyspark's Hadoop: hadoop-aws and the AWS SDK
    modules it calls. Raises SessionError for a Hadoop version whose SDK version is not known
    here."""
    hadoop = hadoop_version()
    sdk = AWS_SDK.get(hadoop)
    if sdk is None:
        raise SessionError(f"pyspark ships Hadoop {hadoop}, whose AWS SDK version this package does not know: "
                           f"add it to consistent_stream.session.AWS_SDK (its hadoop-project POM's "
                           f"aws-java-sdk-v2.version)")
    return [f"org.apache.hadoop:hadoop-aws:{hadoop}"] + [f"software.amazon.awssdk:{m}:{sdk}" for m in AWS_SDK_MODULES]


def kafka_coordinate() -> str:
    """The Maven coordinate of Spark's Kafka source matching pyspark
    (``org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0``)."""
    import pyspark
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{pyspark.__version__}"


def jars_root() -> Path:
    """``$CONSISTENT_STREAM_JARS``, else ``<the interpreter's prefix>/share/consistent-stream/jars``
    (inside the virtualenv): the root of every jar cache of this package."""
    return Path(os.environ.get("CONSISTENT_STREAM_JARS") or os.path.join(sys.prefix, "share", "consistent-stream",
                                                                         "jars"))


def jars_dir() -> Path:
    """Where the jars of :func:`delta_coordinate` are kept: under :func:`jars_root`, in a
    subdirectory named after the coordinate, so another version never mixes with it."""
    return jars_root() / delta_coordinate().replace(":", "_")


def s3a_jars_dir() -> Path:
    """Where the S3A connector's jars are kept (:func:`s3a_coordinates`), beside delta-spark's."""
    return jars_root() / s3a_coordinates()[0].replace(":", "_")


def kafka_jars_dir() -> Path:
    """Where Spark's Kafka source's jars are kept (:func:`kafka_coordinate`)."""
    return jars_root() / kafka_coordinate().replace(":", "_")


def delta_jars() -> list[str]:
    """Paths of the cached jars (delta-spark first). Raises SessionError when the cache is
    missing or incomplete, naming the directory and the command that fills it."""
    return _installed(jars_dir(), "delta-spark's jars")


def s3a_jars() -> list[str]:
    """Paths of the cached S3A connector jars (hadoop-aws first). Raises SessionError as
    :func:`delta_jars` does."""
    return _installed(s3a_jars_dir(), "the S3A connector's jars (hadoop-aws)")


def kafka_jars() -> list[str]:
    """Paths of the cached jars of Spark's Kafka source. Raises SessionError as
    :func:`delta_jars` does."""
    return _installed(kafka_jars_dir(), "Spark's Kafka source jars (spark-sql-kafka-0-10)")


def _installed(d: Path, what: str) -> list[str]:
    jars = _cached(d)
    if jars is None:
        raise SessionError(
            f"{what} are not installed in {d}: run "
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


def _brings(confs: Mapping[str, str], package: str, jar: str) -> bool:
    """Whether ``confs`` name a Maven coordinate holding ``package`` in ``spark.jars.packages``,
    or a jar whose file name holds ``jar`` in ``spark.jars`` or the driver's class path."""
    paths = (confs.get("spark.jars", "").split(",")
             + confs.get("spark.driver.extraClassPath", "").split(os.pathsep))
    return package in confs.get("spark.jars.packages", "") or any(jar in os.path.basename(j) for j in paths)


def has_delta(confs: Mapping[str, str]) -> bool:
    """Whether ``confs`` (a profile's or a session's) already bring delta-spark's jars."""
    return _brings(confs, "io.delta:", "delta-spark")


def has_s3a(confs: Mapping[str, str]) -> bool:
    """Whether ``confs`` already bring hadoop-aws."""
    return _brings(confs, "hadoop-aws", "hadoop-aws")


def has_kafka(confs: Mapping[str, str]) -> bool:
    """Whether ``confs`` already bring Spark's Kafka source."""
    return _brings(confs, "spark-sql-kafka", "spark-sql-kafka")


def is_local(master: str | None) -> bool:
    """Whether a session on ``master`` runs its executor in the driver's JVM: ``local``,
    ``local[N]``, ``local[*]``, ``local[N,F]``, or None (pyspark's default, ``local[*]``).
    ``local-cluster[...]`` and cluster URLs are not."""
    return not master or master == "local" or master.startswith("local[")


def local_cores(master: str | None) -> int:
    """How many tasks a local session on ``master`` (:func:`is_local`) runs at once: N of
    ``local[N]`` or ``local[N,F]``, this machine's CPUs for ``local[*]`` or None, 1 for ``local``."""
    if master == "local":
        return 1
    m = re.match(r"local\[(\d+)", master or "")
    return int(m.group(1)) if m else (os.cpu_count() or 1)


def spark_home() -> Path:
    """pyspark's distribution (``bin/spark-class``, ``bin/spark-submit``, ``jars/``): what a
    warm session's server (:mod:`consistent_stream.warm_session`) and a local standalone
    cluster run."""
    import pyspark
    return Path(pyspark.__file__).resolve().parent


def driver_conf(master_url: str) -> dict[str, str]:
    """Spark confs of a driver on this machine joining the standalone cluster at
    ``master_url``: bound to ``$SPARK_LOCAL_IP`` (an address the executors reach; 127.0.0.1
    when unset, and then set in this process's environment, which the driver's JVM reads when
    it starts: call it before the session), no web UI."""
    host = os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return {"spark.master": master_url, "spark.driver.host": host, "spark.driver.bindAddress": host,
            "spark.ui.enabled": "false"}


SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
"""delta-spark rebuilds a table's state (the files of a version) in this many tasks when it first
reads a version: 50 by default, sized for a cluster. A local session runs them a few at a time
(a 2-core machine: 25 waves of tiny tasks for every table a fresh process reads, see
docs/reference/profile.md); :func:`delta_confs` sets it to the session's cores (one wave). The price:
each task replays a larger share of the log at once (a table of a million files would hold half
its file list per task on 2 cores)."""


# artifacts Spark ships under another name: jcl-over-slf4j holds commons-logging's API
SHIPPED_AS = {"commons-logging": "jcl-over-slf4j"}


def _artifact(jar_name: str) -> str:
    """The Maven artifact id of a jar file name: ``<group>_<artifact>-<version>.jar`` (Ivy's
    names, in this cache) or ``<artifact>-<version>.jar`` (pyspark's ``jars/``)."""
    stem = jar_name.removesuffix(".jar")
    if "_" in stem and "." in stem.split("_", 1)[0]:
        stem = stem.split("_", 1)[1]
    # the version starts at the first "-<digit>" with no "_" after it (``kafka-0-10_2.13-4.2.0``)
    for m in re.finditer(r"-\d", stem):
        if "_" not in stem[m.start():]:
            return stem[:m.start()]
    return stem


def spark_ships(jars: list[str]) -> list[str]:
    """Those of ``jars`` (paths) whose artifact pyspark's own ``jars/`` directory holds (at any
    version), or holds under another name (:data:`SHIPPED_AS`)."""
    import pyspark

    shipped = {_artifact(n) for n in os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))}
    return [j for j in jars if _artifact(os.path.basename(j)) in shipped
            or SHIPPED_AS.get(_artifact(os.path.basename(j))) in shipped]


def delta_confs(existing: Mapping[str, str] | None = None, master: str | None = None) -> dict[str, str]:
    """The session confs (name -> value) to add to ``existing`` (the confs a profile or
    caller already sets) so that a session on ``master`` (default: ``existing``'s
    ``spark.master``, else pyspark's ``local[*]``) has Delta, S3A and Kafka: the cached jars of
    each (unless ``existing`` brings delta-spark's, hadoop-aws' or spark-sql-kafka's jars
    itself; less those Spark ships, :func:`spark_ships`) appended to
    ``spark.driver.extraClassPath`` for a local master (:func:`is_local`), to ``spark.jars``
    otherwise; Delta's SQL extension appended to ``spark.sql.extensions``; and
    ``spark.sql.catalog.spark_catalog`` = DeltaCatalog unless set; and, for a local master,
    the class-data sharing archive (:func:`archive_path`, when built and not turned off)
    appended to ``spark.driver.extraJavaOptions``, and delta-spark's snapshot partitions set to
    its cores (:data:`SNAPSHOT_PARTITIONS`, unless set); and the Kafka source's record pool's
    timeouts (:data:`KAFKA_POOL_CONFS`) unless set. Values in ``existing`` that need no change
    are not repeated: set what this returns after ``existing``. Raises SessionError
    (:func:`delta_jars`)."""
    existing = dict(existing or {})
    out: dict[str, str] = {}
    add = (([] if has_delta(existing) else delta_jars()) + ([] if has_s3a(existing) else s3a_jars())
           + ([] if has_kafka(existing) else kafka_jars()))
    shipped = set(spark_ships(add))
    add = [j for j in add if j not in shipped]
    master = master or existing.get("spark.master")
    local = is_local(master)
    if add:
        key, sep = ("spark.driver.extraClassPath", os.pathsep) if local else ("spark.jars", ",")
        jars = [j for j in existing.get(key, "").split(sep) if j]
        out[key] = sep.join(jars + add)
    options = _archive_option(existing) if local else None
    if options:
        out["spark.driver.extraJavaOptions"] = options
    if local and SNAPSHOT_PARTITIONS not in existing:
        out[SNAPSHOT_PARTITIONS] = str(local_cores(master))
    extensions = [e.strip() for e in existing.get("spark.sql.extensions", "").split(",") if e.strip()]
    if DELTA_EXTENSION not in extensions:
        out["spark.sql.extensions"] = ",".join(extensions + [DELTA_EXTENSION])
    if "spark.sql.catalog.spark_catalog" not in existing:
        out["spark.sql.catalog.spark_catalog"] = DELTA_CATALOG
    out.update({k: v for k, v in KAFKA_POOL_CONFS.items() if k not in existing})
    return out


def with_delta(builder, existing: Mapping[str, str] | None = None, master: str | None = None):
    """``builder`` (a ``SparkSession.Builder``) with :func:`delta_confs` set on it, and its
    master set to ``master`` when given (the confs depend on it: one value for both)."""
    if master:
        builder = builder.master(master)
    for k, v in delta_confs(existing, master).items():
        builder = builder.config(k, v)
    return builder


_RESOLVER = """
import sys
from pyspark.sql import SparkSession
s = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
     .config("spark.jars.packages", sys.argv[1]).config("spark.jars.ivy", sys.argv[2])
     .config("spark.jars.excludes", sys.argv[3]).getOrCreate())
print("\\n".join(j for j in s.sparkContext.getConf().get("spark.jars").split(",")))
s.stop()
"""


# the SDK's bundle (hadoop-aws names it) is replaced by AWS_SDK_MODULES; Spark ships netty
S3A_EXCLUDES = ("software.amazon.awssdk:bundle", "io.netty:netty-codec-http", "io.netty:netty-codec-http2",
                "io.netty:netty-codec", "io.netty:netty-transport", "io.netty:netty-common", "io.netty:netty-buffer",
                "io.netty:netty-handler", "io.netty:netty-resolver", "io.netty:netty-transport-classes-epoll",
                "io.netty:netty-transport-native-unix-common", "org.slf4j:slf4j-api", "commons-codec:commons-codec",
                "commons-logging:commons-logging")


# Spark ships these (and hadoop-client-runtime); a second copy on the class path would conflict
KAFKA_EXCLUDES = ("org.slf4j:slf4j-api", "org.apache.hadoop:hadoop-client-runtime",
                  "org.apache.hadoop:hadoop-client-api", "com.google.code.findbugs:jsr305",
                  "org.xerial.snappy:snappy-java", "org.lz4:lz4-java",
                  "com.github.luben:zstd-jni", "at.yawk.lz4:lz4-java",
                  "org.scala-lang.modules:scala-parallel-collections_2.13")


def resolve(target: Path | None = None, coordinates: list[str] | None = None,
            excludes: tuple[str, ...] = ()) -> list[str]:
    """Fetch ``coordinates`` (default :func:`delta_coordinate`) and their dependencies, less
    ``excludes`` (``group:artifact``), with Spark's Ivy resolver (Maven Central) and keep the
    jars in ``target`` (default :func:`jars_dir`) with a manifest, in the order Spark resolved
    them. Does nothing when the manifest's jars are all there. Returns the jar paths. Raises
    SessionError with Spark's output when resolution fails."""
    target = Path(target) if target else jars_dir()
    coordinates = coordinates or [delta_coordinate()]
    cached = _cached(target)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="consistent-stream-ivy-") as ivy:
        p = subprocess.run([sys.executable, "-c", _RESOLVER, ",".join(coordinates), ivy, ",".join(excludes)],
                           capture_output=True, text=True)
        jars = [line.strip().removeprefix("file://") for line in p.stdout.splitlines()
                if line.strip().endswith(".jar")]
        if p.returncode != 0 or not jars:
            raise SessionError(f"could not resolve {', '.join(coordinates)} from Maven Central:\n{p.stderr[-3000:]}")
        tmp = Path(str(target) + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for j in jars:
            shutil.copy2(j, tmp / os.path.basename(j))
        (tmp / MANIFEST).write_text("\n".join(os.path.basename(j) for j in jars) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return [str(target / os.path.basename(j)) for j in jars]


CDS_QUIET = "-Xlog:cds=off,cds+dynamic=off"
"""The JVM's class-data sharing messages off: an archive that does not match (another JDK, another
class path) is a start without it, not a warning on dbt's output."""


def archive_path() -> Path:
    """The driver JVM's class-data sharing archive, beside the jars: ``<jars_root>/spark-driver.jsa``."""
    return jars_root() / "spark-driver.jsa"


def _archive_record(archive: Path) -> Path:
    """What ``archive`` was built with (JSON beside it): the JVM's ``java.home`` and
    ``java.vm.version``, and each class path entry with its size and modification time."""
    return archive.with_name(archive.name + ".json")


def _java_home() -> str | None:
    """The Java installation a local session's driver will run: ``$JAVA_HOME``, else the
    ``java`` on ``PATH`` (what Spark's launcher, ``spark-class``, picks), resolved; None when
    there is none."""
    if os.environ.get("JAVA_HOME"):
        return os.path.realpath(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return os.path.dirname(os.path.dirname(os.path.realpath(java))) if java else None


def _libjvm(java_home: str) -> str:
    """The JVM library of the Java installation at ``java_home`` (what its build is)."""
    return os.path.join(java_home, "lib", "server", "libjvm.so")


def _file_id(path: str) -> list | None:
    """A class path entry as the JVM checks it against an archive: [size in bytes,
    modification time in ns] of a file; None for a directory or a missing path."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return None if os.path.isdir(path) else [st.st_size, st.st_mtime_ns]


def archive_staleness(archive: Path | None = None) -> str | None:
    """Why a local session's driver would start without the class-data sharing archive
    ``archive`` (default :func:`archive_path`), as the JVM decides it (JDK 17: another JVM
    build, or a jar of the class path it was built with changed in size or modification time,
    or gone), or None when it matches this install. Only what this install controls is
    compared (a profile's own jars ahead of ours are the profile's choice). An archive with no
    record of what it was built with (:func:`_archive_record`) is stale: its match is unknown."""
    archive = Path(archive) if archive else archive_path()
    if not archive.is_file():
        return f"there is no archive at {archive}"
    try:
        built = json.loads(_archive_record(archive).read_text())
    except (OSError, ValueError):
        return f"there is no record of what {archive} was built with ({_archive_record(archive)})"
    home = _java_home()
    if home is None or os.path.realpath(built["java_home"]) != home:
        return f"it was built with the JDK at {built['java_home']}, and sessions run the one at {home}"
    if built.get("libjvm") and _file_id(_libjvm(home)) != built["libjvm"]:
        return f"the JDK at {home} changed since it was built (its {_libjvm(home)})"
    for path, ident in built["entries"]:
        if _file_id(path) != ident:
            how = "changed" if os.path.exists(path) else "is gone"
            return f"{path}, on the class path it was built with, {how}"
    return None


_warned_stale: set[str] = set()


def _archive_option(existing: Mapping[str, str]) -> str | None:
    """The Java options that map the class-data sharing archive into a local session's driver,
    or None: turned off (``CONSISTENT_STREAM_CDS=off``), no archive, or the options in
    ``existing`` already name one. A stale archive (:func:`archive_staleness`) is still named
    (the JVM starts without it, silently) and logged once per process as a warning with the
    command that rebuilds it."""
    archive = archive_path()
    if os.environ.get("CONSISTENT_STREAM_CDS", "").lower() == "off" or not archive.is_file():
        return None
    options = existing.get("spark.driver.extraJavaOptions", "")
    if "SharedArchiveFile" in options or "ArchiveClassesAtExit" in options:
        return None
    stale = archive_staleness(archive) if str(archive) not in _warned_stale else None
    if stale:
        _warned_stale.add(str(archive))
        import logging
        logging.getLogger("consistent_stream").warning(
            "the Spark driver's class-data sharing archive does not match this install (%s): sessions start "
            "without it, a few seconds slower. Rebuild it: python -m consistent_stream.session archive", stale)
    return (f"{options} " if options else "") + f"-XX:SharedArchiveFile={archive} {CDS_QUIET}"


_TRAINER = """
import os, sys, tempfile
from pyspark.sql import SparkSession
from consistent_stream.session import CDS_QUIET, delta_confs
d = tempfile.mkdtemp(prefix="consistent-stream-cds-")
b = (SparkSession.builder.master("local[2]").enableHiveSupport().config("spark.ui.enabled", "false")
     .config("spark.sql.warehouse.dir", d + "/warehouse")
     .config("spark.hadoop.javax.jdo.option.ConnectionURL", f"jdbc:derby:;databaseName={d}/metastore_db;create=true"))
for k, v in delta_confs({}, "local[2]").items():
    b = b.config(k, v)
b = b.config("spark.driver.extraJavaOptions",
             f"-Dderby.stream.error.file={d}/derby.log -XX:ArchiveClassesAtExit={sys.argv[1]} {CDS_QUIET}")
s = b.getOrCreate()
s.sql("SHOW DATABASES").collect()
t = d + "/t"
s.range(100).selectExpr("id", "id % 7 AS k", "CAST(id AS DECIMAL(12,2)) AS x").write.format("delta") \
    .option("delta.enableChangeDataFeed", "true").save(t)
s.sql(f"CREATE TABLE cds_t USING delta LOCATION '{t}'")
s.sql(f"MERGE INTO delta.`{t}` a USING (SELECT 1 AS id, 2 AS k) b ON a.id = b.id "
      "WHEN MATCHED THEN UPDATE SET k = b.k WHEN NOT MATCHED THEN INSERT (id, k) VALUES (b.id, b.k)")
s.sql(f"DELETE FROM delta.`{t}` WHERE id = 3")
s.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(t).count()
s.sql(f"SELECT a.k, count(*), sum(b.x) FROM delta.`{t}` a JOIN delta.`{t}` b ON a.id = b.id GROUP BY a.k").toArrow()
s.createDataFrame(s.range(10).toPandas()).count()
q = (s.readStream.format("delta").load(t).writeStream.trigger(availableNow=True)
     .option("checkpointLocation", d + "/cp").foreachBatch(lambda df, i: df.count()).start())
q.awaitTermination()
s.sql("DESCRIBE HISTORY cds_t").collect()
props = s._jvm.java.lang.System
built_with = {"java_home": props.getProperty("java.home"), "vm_version": props.getProperty("java.vm.version"),
              "class_path": props.getProperty("java.class.path").split(os.pathsep)}
s.stop()
import json, shutil
with open(sys.argv[2], "w") as f:
    json.dump(built_with, f)
shutil.rmtree(d, ignore_errors=True)
"""


def build_archive(target: Path | None = None) -> Path | None:
    """Build the driver JVM's class-data sharing archive at ``target`` (default
    :func:`archive_path`): a local session as :func:`delta_confs` builds it, with Hive's catalog
    on a throw-away Derby metastore, runs what a run does (SQL, a Delta write, MERGE, DELETE,
    a change-feed read, a join, Arrow both ways, a streaming query's batch) with
    ``-XX:ArchiveClassesAtExit``; the JVM writes the classes it loaded when it exits (about two
    minutes in all on a 2-core machine), and writes what it was built with beside it
    (:func:`_archive_record`, read by :func:`archive_staleness`). Returns the archive's path,
    or None when this JVM cannot build one (a JDK before 13, no base archive): sessions then
    start without it. An archive already there is replaced only when the new one is complete
    (a kill between the two leaves the old record: a warning to rebuild, not a silent miss)."""
    target = Path(target) if target else archive_path()
    tmp = target.with_name(target.name + ".tmp")
    record = _archive_record(tmp)
    tmp.unlink(missing_ok=True)
    env = {**os.environ, "CONSISTENT_STREAM_CDS": "off"}
    p = subprocess.run([sys.executable, "-c", _TRAINER, str(tmp), str(record)], capture_output=True, text=True,
                       env=env)
    if p.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0 or not record.is_file():
        tmp.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        print(f"warning: the class-data sharing archive was not built (sessions start without it):\n"
              f"{(p.stderr or p.stdout)[-2000:]}", file=sys.stderr)
        return None
    built = json.loads(record.read_text())
    built["libjvm"] = _file_id(_libjvm(os.path.realpath(built["java_home"])))
    built["entries"] = [[e, ident] for e in built.pop("class_path") if e and (ident := _file_id(e)) is not None]
    tmp.rename(target)
    _archive_record(target).write_text(json.dumps(built, indent=1) + "\n")
    record.unlink()
    return target


def _main(argv: list[str]) -> int:
    if argv == ["archive", "--check"]:
        stale = archive_staleness()
        print(f"the driver's class-data sharing archive {archive_path()}: "
              + (f"not used: {stale}. Rebuild it: python -m consistent_stream.session archive" if stale
                 else "matches this install"))
        return 1 if stale else 0
    if argv[:1] == ["archive"]:
        built = build_archive()
        print(f"the driver's class-data sharing archive: {built or 'not built'}")
        return 0
    if argv[:1] != ["resolve"]:
        print("usage: python -m consistent_stream.session resolve|archive [--check]", file=sys.stderr)
        return 2
    try:
        jars = resolve()
        s3a = resolve(s3a_jars_dir(), s3a_coordinates(), S3A_EXCLUDES)
        kafka = resolve(kafka_jars_dir(), [kafka_coordinate()], KAFKA_EXCLUDES)
    except SessionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"delta-spark's jars: {len(jars)} in {jars_dir()}")
    print(f"the S3A connector's jars: {len(s3a)} in {s3a_jars_dir()}")
    print(f"Spark's Kafka source jars: {len(kafka)} in {kafka_jars_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
