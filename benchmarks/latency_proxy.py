"""A TCP proxy on loopback that delays every byte by a fixed time in each direction: a far
away server (an S3 endpoint 10-30 ms away) in front of a near one, for the benchmarks.

    proxy = LatencyProxy("127.0.0.1", server_port, delay_s=0.010).start()
    ... point the clients at 127.0.0.1:proxy.port ...
    proxy.stop()

Each byte is forwarded ``delay_s`` after it arrived (a one-way latency: a request and its
response take at least ``2 x delay_s``), while the bytes behind it keep flowing: throughput is
not limited, only the round trip is, as on a long link. Runs an asyncio loop on a thread of
its own; counts the connections it accepted (``connections``).
"""
from __future__ import annotations

import asyncio
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
