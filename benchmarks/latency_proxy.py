"""A TCP proxy on loopback that delays every byte by a fixed time in each direction: a far
away server (an S3 endpoint 10-30 ms away) in front of a near one, for the benchmarks.

    proxy = ProxyProcess("127.0.0.1", server_port, delay_s=0.010).start()
    ... point the clients at 127.0.0.1:proxy.port ...
    proxy.stop()

    python benchmarks/latency_proxy.py --upstream 127.0.0.1:9000 --delay-ms 10   # prints its port

Each byte is forwarded ``delay_s`` after it arrived (a one-way latency: a request and its
response take at least ``2 x delay_s``), while the bytes behind it keep flowing: throughput is
not limited, only the round trip is, as on a long link. :class:`LatencyProxy` runs an asyncio
loop on a thread; :class:`ProxyProcess` runs it in a process of its own, which is what a
benchmark wants: a client library that blocks on the network while holding Python's GIL
(delta-rs' ``history()`` does) would otherwise stall a proxy thread in the same process, and
with it its own request (seen as a 180 s timeout).
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
import time


class LatencyProxy:
    """Forward ``host:port`` (this side, ``port`` 0: a free one) to ``upstream_host:upstream_port``
    with ``delay_s`` seconds each way."""

    def __init__(self, upstream_host: str, upstream_port: int, delay_s: float, host: str = "127.0.0.1",
                 port: int = 0):
        self.upstream = (upstream_host, upstream_port)
        self.delay_s, self.host, self.port = delay_s, host, port
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "LatencyProxy":
        self._thread = threading.Thread(target=self._run, name="latency-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the latency proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, self.host, self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            tasks = asyncio.all_tasks(self._loop)
            for t in tasks:
                t.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer),
                                 return_exceptions=True)
        except (OSError, asyncio.CancelledError):   # upstream refused, or the proxy stops
            writer.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy ``src`` to ``dst``, each chunk written ``delay_s`` after it was read."""
        queue: asyncio.Queue = asyncio.Queue()

        async def delayed_writes() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    break
                dst.write(data)
                await dst.drain()
            try:
                dst.close()
            except Exception:
                pass

        writer = asyncio.ensure_future(delayed_writes())
        try:
            while True:
                data = await src.read(1 << 16)
                queue.put_nowait((time.monotonic() + self.delay_s, data or None))
                if not data:
                    break
        except (ConnectionError, OSError):
            queue.put_nowait((time.monotonic(), None))
        await writer


class ProxyProcess:
    """A :class:`LatencyProxy` in a child process (see the module docstring); ``port`` once
    started. Raises RuntimeError when it does not start within 30 s."""

    def __init__(self, upstream_host: str, upstream_port: int, delay_s: float):
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = delay_s
        self.port: int | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> "ProxyProcess":
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--upstream", f"{self.upstream[0]}:{self.upstream[1]}",
             "--delay-ms", str(self.delay_s * 1000.0)], stdout=subprocess.PIPE, text=True)
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the latency proxy did not start (it printed {line!r})")
        self.port = int(line)
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="host:port of the server behind the proxy")
    ap.add_argument("--delay-ms", type=float, required=True, help="delay each direction by this many ms")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one, printed)")
    args = ap.parse_args(argv)
    host, port = args.upstream.rsplit(":", 1)
    proxy = LatencyProxy(host, int(port), args.delay_ms / 1000.0, port=args.port).start()
    print(proxy.port, flush=True)
    try:
        proxy._thread.join()
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
