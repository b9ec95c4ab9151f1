"""Where a location lives, and how each engine reaches it.

A location (a source's ``meta.consistent_stream.location``, ``location_root``, the target, the
checkpoint, the warehouse, a capture's landing directory) is a local path or an S3 URI,
``s3://bucket/prefix`` (``s3a://`` is taken as the same objects; locations are kept in the
``s3://`` form). This module turns one into what each engine needs:

* delta-rs: ``storage_options`` (:func:`delta_storage_options`), with conditional puts on
  (``AWS_CONDITIONAL_PUT=etag``: a Delta commit is a put-if-absent of the next log entry, so
  two writers of one version cannot both win);
* Spark: Hadoop's ``fs.s3a.*`` settings (:func:`spark_hadoop_confs`), with ``s3://`` mapped to
  the S3A file system, so that Spark and delta-rs read the same URIs; set on the session's
  Hadoop configuration by :func:`apply_to_spark` (executors get it with each job);
* files that are not Delta tables: an obstore object store and key (:func:`object_store`,
  used by :mod:`consistent_stream.storage` and the writer lock's conditional puts) and a
  pyarrow file system (:func:`pyarrow_filesystem`, for Parquet footers and files read with
  pyarrow).

Settings (:class:`S3Settings`) are resolved once per process, on first need: from the Spark
session's ``spark.hadoop.fs.s3a.*`` confs when they carry keys (a dbt profile's
``server_side_parameters`` ``spark.hadoop.fs.s3a.access.key`` ..., see :func:`configure`),
else from the standard AWS chain that botocore implements: the environment
(``AWS_ACCESS_KEY_ID`` ..., ``AWS_PROFILE``), the shared credentials and config files and their
profiles (and, last, the instance or container metadata). The endpoint is
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` or the profile's ``endpoint_url``; a custom
endpoint implies path-style requests. Secrets are never printed: :class:`S3Settings` shows
only where they came from.

Requests: :data:`REQUESTS` counts the object-store requests the clients this package drives
itself make (obstore: :mod:`consistent_stream.storage`, the writer lock, :func:`check_reachable`),
by method and by what they touched, for each batch's metrics and each run's summary, so a user
on real S3 sees them; delta-rs (counted as the tables it opens), pyarrow's S3 file system and
S3A make theirs unseen.

Errors: :class:`ConfigError` for a location whose scheme no engine here reads (naming the
config key) or an S3 URI without a bucket; :class:`StorageError` from :func:`check_reachable`
for a bucket that does not exist, credentials that are refused or missing, or a store that
does not answer.
"""
from __future__ import annotations

import collections
import os
import posixpath
import threading
import time
from dataclasses import dataclass
from typing import Mapping

from .errors import ConfigError, StorageError

S3_SCHEMES = ("s3", "s3a")
SUPPORTED = "a local path, a file:// URI, or s3://bucket/prefix (s3a:// is read as s3://)"
DELTA_RS_OPEN = "delta-rs open"
"""The pseudo-method :data:`REQUESTS` counts a delta-rs open of a table on an object store as
(its requests are delta-rs' own, not counted)."""


def request_target(path: str) -> str:
    """What an object-store request touched, from its key: ``delta_log`` (a Delta log entry),
    ``lock`` (a writer lock), ``checkpoint_files`` (the model checkpoint's own files),
    ``data_files`` (Parquet data and change files), else ``other``."""
    if "/_delta_log/" in path or path.rstrip("/").endswith("/_delta_log"):
        return "delta_log"
    if path.endswith((".lock", ".lock.clock")):
        return "lock"
    if "/_consistent_stream/" in path:
        return "checkpoint_files"
    if path.endswith(".parquet"):
        return "data_files"
    return "other"


class RequestCounter:
    """Object-store requests counted by the client that makes them: ``(method, what)`` ->
    requests (``method``: GET, PUT, LIST, HEAD, DELETE, COPY, or :data:`DELTA_RS_OPEN`;
    ``what``: :func:`request_target`). Thread-safe; :meth:`since` gives the requests after a
    :meth:`snapshot`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()

    def add(self, method: str, path: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(method, request_target(path))] += n

    def snapshot(self) -> collections.Counter:
        with self._lock:
            return collections.Counter(self._counts)

    def since(self, before: collections.Counter) -> dict:
        """``{"total", "by_method", "by_what", "delta_rs_opens"}`` of the requests counted
        since ``before`` (a :meth:`snapshot`); delta-rs opens are not in the total."""
        now = self.snapshot()
        now.subtract(before)
        by_method: collections.Counter = collections.Counter()
        by_what: collections.Counter = collections.Counter()
        opens = 0
        for (method, what), n in now.items():
            if n <= 0:
                continue
            if method == DELTA_RS_OPEN:
                opens += n
                continue
            by_method[method] += n
            by_what[what] += n
        return {"total": sum(by_method.values()), "by_method": dict(sorted(by_method.items())),
                "by_what": dict(sorted(by_what.items())), "delta_rs_opens": opens}


REQUESTS = RequestCounter()
"""This process's object-store requests (:class:`RequestCounter`)."""


def scheme(path: str) -> str:
    """The URI scheme of ``path`` in lower case ('' for a local path)."""
    head, sep, _ = str(path).partition("://")
    return head.lower() if sep else ""


def is_remote(path: str) -> bool:
    """Whether ``path`` is an object store URI (``s3://``, ``s3a://``)."""
    return scheme(path) in S3_SCHEMES


def normalize(path: str, base: str | None = None, *, key: str = "location") -> str:
    """``path`` in the form every module keeps: an S3 URI as ``s3://bucket/key`` (``s3a``
    renamed, ``.``/``..``/doubled slashes resolved, no trailing slash); a ``file://`` URI or a
    local path as an absolute normalized path (a relative one joined to ``base``, default the
    working directory). Raises ConfigError naming ``key`` for a scheme no engine here reads
    (``gs://``, ``abfss://``, ``hdfs://`` ...) or an S3 URI without a bucket."""
    path = str(path)
    s = scheme(path)
    if s in S3_SCHEMES:
        rest = path.split("://", 1)[1]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ConfigError(f"{key} {path!r} names no bucket: write s3://<bucket>/<prefix>")
        prefix = posixpath.normpath("/" + prefix).lstrip("/") if prefix.strip("/") else ""
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    if s == "file":
        path = path[len("file://"):] or "/"
    elif s:
        raise ConfigError(f"{key} {path!r}: scheme {s}:// is not supported; give {SUPPORTED}")
    if not os.path.isabs(path):
        path = os.path.join(base or os.getcwd(), path)
    return os.path.normpath(path)


def join(path: str, *parts: str) -> str:
    """``path`` joined with ``parts`` ('/'-separated for URIs, as ``os.path.join`` locally)."""
    return posixpath.join(path, *parts) if is_remote(path) else os.path.join(path, *parts)


def parent(path: str) -> str:
    """The directory holding ``path`` (the bucket's root for a top-level key)."""
    if is_remote(path):
        bucket, key = split(path)
        return f"s3://{bucket}/{posixpath.dirname(key)}".rstrip("/")
    return os.path.dirname(path)


def split(uri: str) -> tuple[str, str]:
    """``(bucket, key)`` of an S3 URI (key without leading or trailing slash)."""
    rest = str(uri).split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    return bucket, key.strip("/")


@dataclass(frozen=True, repr=False)
class S3Settings:
    """How this process reaches S3: ``endpoint`` (URL, None for AWS itself), ``region``,
    credentials (``access_key``, ``secret_key``, ``session_token``; None: anonymous),
    ``path_style`` requests, and ``origin`` (where the credentials came from, for messages).
    Its repr names no secret."""
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    path_style: bool = False
    origin: str = "none"

    def __repr__(self) -> str:
        return (f"S3Settings(endpoint={self.endpoint!r}, region={self.region!r}, path_style={self.path_style}, "
                f"credentials from {self.origin})")

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.lower().startswith("http://"))


_lock = threading.Lock()
_settings: S3Settings | None = None
_stores: dict[str, object] = {}   # bucket -> obstore S3Store, and PYARROW -> the pyarrow S3FileSystem
_reached: dict[str, float] = {}   # bucket -> when check_reachable last found it answering (time.monotonic)
REACHED_FOR_S = 300.0
"""How long a bucket that answered :func:`check_reachable` is taken as reachable without asking
again (seconds): the models of one ``dbt run`` check each bucket once, not once a model."""
PYARROW = "//pyarrow"   # not a bucket name (buckets have no '/')

# Hadoop S3A settings -> S3Settings fields (a profile that configures S3A for Spark configures us)
_S3A_KEYS = {"fs.s3a.endpoint": "endpoint", "fs.s3a.endpoint.region": "region",
             "fs.s3a.access.key": "access_key", "fs.s3a.secret.key": "secret_key",
             "fs.s3a.session.token": "session_token", "fs.s3a.path.style.access": "path_style"}


def configure(hadoop_confs: Mapping[str, str]) -> S3Settings | None:
    """Take the settings from Spark's S3A settings (``fs.s3a.*`` names, with or without the
    ``spark.hadoop.`` prefix: a dbt profile's ``server_side_parameters`` or the session's
    Hadoop configuration) when they carry an access key; returns them, or None (the AWS chain
    stays in force). The process's stores are re-opened with them."""
    global _settings
    conf = {k.removeprefix("spark.hadoop."): v for k, v in hadoop_confs.items() if v is not None}
    if not conf.get("fs.s3a.access.key"):
        return None
    fields = {f: conf[k] for k, f in _S3A_KEYS.items() if conf.get(k)}
    endpoint = fields.get("endpoint")
    if endpoint and "://" not in endpoint:
        secure = str(conf.get("fs.s3a.connection.ssl.enabled", "true")).lower() != "false"
        endpoint = ("https://" if secure else "http://") + endpoint
    s = S3Settings(endpoint=endpoint, region=fields.get("region") or "us-east-1",
                   access_key=fields.get("access_key"), secret_key=fields.get("secret_key"),
                   session_token=fields.get("session_token"),
                   path_style=str(fields.get("path_style", bool(endpoint))).lower() == "true",
                   origin="the Spark session's fs.s3a settings")
    with _lock:
        if s != _settings:
            _settings = s
            _stores.clear()
            _reached.clear()
    return s


def settings() -> S3Settings:
    """The process's S3 settings (:func:`configure`'s, else the AWS chain's, resolved once)."""
    global _settings
    with _lock:
        if _settings is None:
            _settings = _from_aws_chain()
        return _settings


def reset() -> None:
    """Forget the resolved settings and open stores (the next use resolves them again)."""
    global _settings
    with _lock:
        _settings = None
        _stores.clear()
        _reached.clear()


def _from_aws_chain() -> S3Settings:
    import botocore.session
    session = botocore.session.Session()
    scoped = {}
    try:
        scoped = session.get_scoped_config()
    except Exception:   # a named profile that does not exist: credentials below say so
        pass
    endpoint = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                or (scoped.get("s3") or {}).get("endpoint_url") or scoped.get("endpoint_url"))
    region = session.get_config_variable("region") or "us-east-1"
    creds = session.get_credentials()
    frozen = creds.get_frozen_credentials() if creds is not None else None
    style = str((scoped.get("s3") or {}).get("addressing_style", "")).lower()
    return S3Settings(endpoint=endpoint, region=region,
                      access_key=frozen.access_key if frozen else None,
                      secret_key=frozen.secret_key if frozen else None,
                      session_token=frozen.token if frozen else None,
                      path_style=style == "path" or (bool(endpoint) and style != "virtual"),
                      origin=(f"the AWS chain ({creds.method})" if creds is not None
                              else "nowhere (no credentials found)"))


def delta_storage_options(path: str) -> dict[str, str] | None:
    """delta-rs' ``storage_options`` for the table at ``path`` (None for a local path).
    Commits use conditional puts (``AWS_CONDITIONAL_PUT``, default ``etag``: ``If-None-Match:
    *`` for the next log entry; a value in the environment is passed on instead)."""
    if not is_remote(path):
        return None
    s = settings()
    out = {"AWS_REGION": s.region,
           "AWS_CONDITIONAL_PUT": os.environ.get("AWS_CONDITIONAL_PUT", "etag")}
    if s.endpoint:
        out["AWS_ENDPOINT_URL"] = s.endpoint
        out["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false" if s.path_style else "true"
    if s.allow_http:
        out["AWS_ALLOW_HTTP"] = "true"
    if s.access_key:
        out["AWS_ACCESS_KEY_ID"] = s.access_key
        out["AWS_SECRET_ACCESS_KEY"] = s.secret_key or ""
        if s.session_token:
            out["AWS_SESSION_TOKEN"] = s.session_token
    else:
        out["AWS_SKIP_SIGNATURE"] = "true"
    return out


def spark_hadoop_confs() -> dict[str, str]:
    """Hadoop settings (names without ``spark.hadoop.``) that let Spark read and write the
    same objects: S3A for both ``s3://`` and ``s3a://``, endpoint, region, path style and the
    credentials of :func:`settings`."""
    s = settings()
    out = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
           "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
           "fs.s3a.endpoint.region": s.region,
           "fs.s3a.path.style.access": "true" if s.path_style else "false"}
    if s.endpoint:
        out["fs.s3a.endpoint"] = s.endpoint
        out["fs.s3a.connection.ssl.enabled"] = "false" if s.allow_http else "true"
    if s.access_key:
        out["fs.s3a.access.key"] = s.access_key
        out["fs.s3a.secret.key"] = s.secret_key or ""
        if s.session_token:
            out["fs.s3a.session.token"] = s.session_token
            out["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            out["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    else:
        out["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
    return out


def apply_to_spark(spark, paths) -> None:
    """When one of ``paths`` is on S3: take the session's own ``spark.hadoop.fs.s3a.*``
    confs if they set keys (:func:`configure`; a profile's ``server_side_parameters``), and
    set :func:`spark_hadoop_confs` on its Hadoop configuration (the driver's file systems,
    and every job's tasks on the executors). Nothing for local paths only.

    (The session's Hadoop configuration itself is not read: Spark copies ``AWS_*``
    environment variables into it and Hadoop's defaults fill the rest, so it cannot tell
    what the user set.) Over Spark Connect nothing is set or read: see the comment below."""
    if not any(is_remote(p) for p in paths if p):
        return
    from .connect import is_connect
    if is_connect(spark):
        # Spark Connect: the server's Hadoop configuration is the server's own (cluster start
        # --connect-conf), and its secrets are not the client's to read (the server redacts
        # them); the client's own clients take the store's settings from its environment
        return
    sc = spark.sparkContext
    # (the keys one by one: SparkContext.getConf() copies every setting, a tenth of a second)
    configure({k: spark.conf.get("spark.hadoop." + k, None) for k in (*_S3A_KEYS, "fs.s3a.connection.ssl.enabled")})
    wanted = spark_hadoop_confs()
    if _APPLIED.get(id(sc)) == (sc.applicationId, wanted):
        return   # this session's Hadoop configuration has them (set by an earlier run of this process)
    hconf = sc._jsc.hadoopConfiguration()
    for k, v in wanted.items():
        if hconf.get(k) != v:
            hconf.set(k, v)
    _APPLIED[id(sc)] = (sc.applicationId, wanted)


_APPLIED: dict[int, tuple[str, dict]] = {}
"""SparkContext id -> (its application id, the confs :func:`apply_to_spark` last set on it)."""


def object_store(path: str):
    """``(store, key)``: an obstore ``S3Store`` for the bucket of S3 URI ``path`` (one per
    bucket per process) and the object key of ``path`` in it."""
    from obstore.store import S3Store
    bucket, key = split(path)
    s = settings()
    with _lock:
        store = _stores.get(bucket)
        if store is None:
            kwargs = {"region": s.region, "conditional_put": "etag",
                      "virtual_hosted_style_request": not s.path_style}
            if s.endpoint:
                kwargs["endpoint"] = s.endpoint
            if s.access_key:
                kwargs.update(access_key_id=s.access_key, secret_access_key=s.secret_key or "")
                if s.session_token:
                    kwargs["session_token"] = s.session_token
            else:
                kwargs["skip_signature"] = True
            store = S3Store(bucket, client_options={"allow_http": s.allow_http}, **kwargs)
            _stores[bucket] = store
    return store, key


def pyarrow_filesystem(path: str):
    """``(filesystem, path inside it)`` for pyarrow readers: the local file system and
    ``path``, or an ``S3FileSystem`` with :func:`settings` and ``bucket/key``."""
    import pyarrow.fs as pafs
    if not is_remote(path):
        return pafs.LocalFileSystem(), path[len("file://"):] if scheme(path) == "file" else path
    s = settings()
    with _lock:
        fs = _stores.get(PYARROW)   # one per process, as the obstore stores (re-made with the settings)
        if fs is None:
            kwargs = {"region": s.region, "force_virtual_addressing": not s.path_style}
            if s.endpoint:
                kwargs["endpoint_override"] = s.endpoint
                kwargs["scheme"] = "http" if s.allow_http else "https"
            if s.access_key:
                kwargs.update(access_key=s.access_key, secret_key=s.secret_key or "", session_token=s.session_token)
            else:
                kwargs["anonymous"] = True
            fs = _stores[PYARROW] = pafs.S3FileSystem(**kwargs)
    bucket, key = split(path)
    return fs, f"{bucket}/{key}"


def check_reachable(path: str, key: str = "location") -> None:
    """Raise StorageError, naming ``key``, ``path`` and what to do, when the bucket of S3 URI
    ``path`` does not exist, the credentials are missing or refused, or the store does not
    answer (one LIST request; none when the bucket answered with the same settings in the last
    :data:`REACHED_FOR_S` seconds). Nothing for a local path."""
    if not is_remote(path):
        return
    import obstore
    store, prefix = object_store(path)
    bucket = split(path)[0]
    with _lock:
        answered = _reached.get(bucket)
    if answered is not None and time.monotonic() - answered < REACHED_FOR_S:
        return
    try:
        REQUESTS.add("LIST", path)
        next(iter(obstore.list(store, prefix or None, chunk_size=1)), None)
        with _lock:
            _reached[bucket] = time.monotonic()
    except Exception as e:
        text = str(e)
        s = settings()
        if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
            what = f"bucket {split(path)[0]!r} does not exist at {s.endpoint or 'AWS S3'}: create it, or fix the URI"
        elif any(w in text for w in ("403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied")):
            what = (f"the store refused the credentials from {s.origin}: check AWS_ACCESS_KEY_ID / "
                    f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the profile's fs.s3a keys")
        else:
            what = f"the store at {s.endpoint or 'AWS S3'} did not answer as expected ({type(e).__name__})"
        raise StorageError(f"{key} {path}: {what}") from None


def fs_path(path: str) -> str:
    """A location as Spark writes or shows it, as :mod:`.storage` takes it: a local ``file:``
    URI as a path (``file:///x``, as delta-rs writes it, and ``file:/x``, as Spark's catalog
    shows a location, give ``/x``), ``s3a://b/k`` as ``s3://b/k``; other paths unchanged."""
    if path.startswith("file:"):
        return "/" + path[len("file:"):].lstrip("/")
    if path.startswith("s3a://"):
        return "s3://" + path[len("s3a://"):]
    return path
