"""A real S3 API server on loopback, for the tests, the benchmarks and the demos: s3proxy
(``org.gaul:s3proxy``, Apache 2.0, from Maven Central) over its file-system blob store.

    python -m consistent_stream_testing.s3server install        # make .venv runs it: the jar, once
    python -m consistent_stream_testing.s3server start --dir D  # prints the endpoint and credentials as
                                                        # shell exports (AWS_ENDPOINT_URL ...)
    python -m consistent_stream_testing.s3server stop --dir D

s3proxy answers the S3 REST API (SigV2/SigV4, ListObjectsV2, multipart uploads, and the
conditional writes Delta commits and the writer lock rely on: ``If-None-Match: *`` and
``If-Match: <etag>`` on PUT, answered 412 when they do not hold). Its objects are files under
``<dir>/data/<bucket>/``; the server is a separate JVM process, so a test's kill -9 of a run
never takes the store down with it. With ``request_log``, every request is logged (s3proxy's
debug level) and :meth:`S3Server.requests` counts them by kind (GET, PUT, LIST, HEAD,
DELETE, POST).

The jar (the ``jar-with-dependencies`` build, 55 MB) is kept beside delta-spark's jars
(:func:`consistent_stream.session.jars_root`), checked against Maven Central's SHA-1.

Errors: :class:`S3ServerError` when the jar is missing (with the command that installs it),
cannot be fetched, or the server does not start (with its log).
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from consistent_stream import session
from consistent_stream.daemons import free_port, process_alive
from consistent_stream.errors import ConsistentStreamError

from . import jvm
from .jvm import MAVEN

VERSION = "4.1.0"
JAR = f"s3proxy-{VERSION}-jar-with-dependencies.jar"
HOST = "127.0.0.1"
STATE_FILE = "s3server.json"


class S3ServerError(ConsistentStreamError):
    """s3proxy's jar is missing or the server could not be started or stopped."""


def jar_path() -> Path:
    """Where the s3proxy jar is kept (under the project's jar cache)."""
    return session.jars_root() / f"org.gaul_s3proxy_{VERSION}" / JAR


def install() -> Path:
    """Fetch the jar from Maven Central (checked against its ``.sha1``) unless it is there."""
    path = jar_path()
    if path.is_file():
        return path
    return jvm.fetch_maven_jar(f"{MAVEN}/org/gaul/s3proxy/{VERSION}/{JAR}", path, S3ServerError)


@dataclass
class S3Server:
    """One running s3proxy: its ``endpoint`` URL, the credentials it accepts, its pid and its
    directory (``data/`` the objects, ``s3proxy.log`` its log)."""
    directory: str
    endpoint: str
    access_key: str
    secret_key: str
    pid: int
    host: str = HOST

    def env(self) -> dict[str, str]:
        """The environment a client needs (the standard AWS variables)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1"}

    @property
    def log_path(self) -> Path:
        return Path(self.directory) / "s3proxy.log"

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (S3's CreateBucket; nothing when it exists)."""
        import pyarrow.fs as pafs
        fs = pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region="us-east-1",
                               endpoint_override=self.endpoint, allow_bucket_creation=True)
        fs.create_dir(name)

    def log_offset(self) -> int:
        """The log's current size: :meth:`requests` counts from such an offset."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def request_log(self, since: int = 0) -> list[tuple[str, str]]:
        """The requests served since log offset ``since`` (needs ``request_log``), in order:
        ``(HTTP method, bucket/key?query)`` as the client sent it (URL-encoded)."""
        with open(self.log_path, "rb") as f:
            f.seek(since)
            return _REQUEST.findall(f.read().decode(errors="replace"))

    def requests(self, since: int = 0) -> Counter:
        """Requests served since log offset ``since`` (needs ``request_log``), by kind: LIST
        (a GET of a bucket with a listing query), GET, HEAD, PUT, POST, DELETE."""
        out = Counter()
        for method, url in self.request_log(since):
            path, _, query = url.partition("?")
            parts = path.split("/", 1)
            if method == "GET" and (len(parts) == 1 or not parts[1] or "list-type" in query or "prefix=" in query):
                out["LIST"] += 1
            else:
                out[method] += 1
        return out

    def alive(self) -> bool:
        return process_alive(self.pid)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL); its data stays in ``directory``."""
        jvm.terminate(self.pid, timeout_s)
        Path(self.directory, STATE_FILE).unlink(missing_ok=True)


_REQUEST = re.compile(r"request: .*?\{(GET|PUT|HEAD|POST|DELETE)@\w+ https?://[^/\s]+/(\S*) HTTP/")


def start(directory: str | Path, *, port: int | None = None, host: str = HOST, buckets: tuple[str, ...] = (),
          request_log: bool = False, timeout_s: float = 60.0) -> S3Server:
    """Start s3proxy serving ``directory/data`` on ``host:port`` (a free loopback port by
    default) with fresh random credentials, create ``buckets``, and wait until it answers.
    Raises S3ServerError (jar missing, server exited or silent; with its log's tail)."""
    jar = jar_path()
    if not jar.is_file():
        raise S3ServerError(f"s3proxy's jar is not installed at {jar}: run `{sys.executable} -m "
                            f"consistent_stream_testing.s3server install` once with Maven Central reachable "
                            f"(make .venv does)")
    d = Path(directory)
    (d / "data").mkdir(parents=True, exist_ok=True)
    port = port or free_port(HOST)
    server = S3Server(directory=str(d), endpoint=f"http://{host}:{port}", access_key="AK" + secrets.token_hex(8),
                      secret_key=secrets.token_hex(20), pid=0, host=host)
    props = d / "s3proxy.conf"
    props.write_text("\n".join([
        f"s3proxy.endpoint=http://{host}:{port}", "s3proxy.authorization=aws-v2-or-v4",
        f"s3proxy.identity={server.access_key}", f"s3proxy.credential={server.secret_key}",
        "jclouds.provider=filesystem", f"jclouds.filesystem.basedir={d / 'data'}", ""]))
    props.chmod(0o600)
    env = {**os.environ, "LOG_LEVEL": "debug" if request_log else "warn", "JETTY_LOG_LEVEL": "warn"}
    p = jvm.spawn(["java", "-Xmx512m", "-jar", str(jar), "--properties", str(props)], server.log_path, env=env)
    server.pid = p.pid
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if p.poll() is not None:
            raise S3ServerError(f"s3proxy exited with {p.returncode}; its log {server.log_path}:\n"
                                f"{jvm.tail(server.log_path, 2000)}")
        if jvm.port_open(host, port):
            break
        time.sleep(0.2)
    else:
        server.stop()
        raise S3ServerError(f"s3proxy did not listen on {host}:{port} within {timeout_s:.0f} s; log {server.log_path}")
    for b in buckets:
        server.create_bucket(b)
    jvm.write_state(d / STATE_FILE, asdict(server))
    return server


def load(directory: str | Path) -> S3Server | None:
    """The server started in ``directory`` (None when there is none)."""
    state = jvm.read_state(Path(directory, STATE_FILE))
    try:
        return S3Server(**state) if state is not None else None
    except TypeError:
        return None


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m consistent_stream_testing.s3server")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install")
    st = sub.add_parser("start")
    st.add_argument("--dir", required=True)
    st.add_argument("--port", type=int)
    st.add_argument("--host", default=HOST)
    st.add_argument("--bucket", action="append", default=[])
    st.add_argument("--request-log", action="store_true")
    sp = sub.add_parser("stop")
    sp.add_argument("--dir", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "install":
            print(f"s3proxy: {install()}")
        elif args.cmd == "start":
            s = start(args.dir, port=args.port, host=args.host, buckets=tuple(args.bucket),
                      request_log=args.request_log)
            for k, v in s.env().items():
                print(f"export {k}={v}")
        else:
            s = load(args.dir)
            if s:
                s.stop()
    except S3ServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
