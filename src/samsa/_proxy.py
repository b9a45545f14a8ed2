"""A fault-injecting TCP proxy for Kafka connections (tests only; 127.0.0.1 only).

Runs an asyncio server in a background thread and forwards each client connection to the
upstream broker. It reads the broker-to-client direction as Kafka frames so faults hit
whole responses:

* ``drop_response``: probability that a response is swallowed and the connection then
  reset: the broker acted on the request, the client never learns the outcome.
* ``reset_before``: probability that a request is swallowed and the connection reset before
  it reaches the broker.
* ``delay``: seconds added before forwarding each response.

Start the broker with ``advertised.listeners`` pointing at the proxy's port so that the
client's metadata keeps it on the proxy. Counters tell a test that faults really happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from dataclasses import dataclass


@dataclass
class FaultStats:
    connections: int = 0
    requests: int = 0
    responses: int = 0
    dropped_responses: int = 0
    dropped_requests: int = 0


class FaultProxy:
    def __init__(
        self,
        *,
        drop_response: float = 0.0,
        reset_before: float = 0.0,
        delay: float = 0.0,
        seed: int | None = None,
        grace_requests: int = 0,
    ) -> None:
        self.upstream: tuple[str, int] | None = None
        self.drop_response = drop_response
        self.reset_before = reset_before
        self.delay = delay
        self.grace_requests = grace_requests  # first N requests of a connection pass
        self.stats = FaultStats()
        self._random = random.Random(seed)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port: int = sock.getsockname()[1]
        self._sock = sock
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, upstream: tuple[str, int]) -> FaultProxy:
        self.upstream = upstream
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        fut.result(10)
        return self

    def set_faults(self, *, drop_response: float = 0.0, reset_before: float = 0.0) -> None:
        self.drop_response = drop_response
        self.reset_before = reset_before

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._handle, sock=self._sock)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        assert self.upstream is not None
        self.stats.connections += 1
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.close()
            return
        self._writers.update((cwriter, uwriter))
        fault = asyncio.Event()
        count = 0

        async def frames(reader: asyncio.StreamReader) -> bytes | None:
            try:
                head = await reader.readexactly(4)
                (size,) = struct.unpack(">i", head)
                return head + await reader.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return None

        async def upward() -> None:
            nonlocal count
            while not fault.is_set():
                frame = await frames(creader)
                if frame is None:
                    break
                count += 1
                self.stats.requests += 1
                if count > self.grace_requests and self._random.random() < self.reset_before:
                    self.stats.dropped_requests += 1
                    break
                uwriter.write(frame)
                await uwriter.drain()
            fault.set()

        async def downward() -> None:
            while not fault.is_set():
                frame = await frames(ureader)
                if frame is None:
                    break
                if self.delay:
                    await asyncio.sleep(self.delay)
                if count > self.grace_requests and self._random.random() < self.drop_response:
                    self.stats.dropped_responses += 1
                    break
                self.stats.responses += 1
                cwriter.write(frame)
                await cwriter.drain()
            fault.set()

        tasks = [asyncio.ensure_future(upward()), asyncio.ensure_future(downward())]
        await fault.wait()
        for t in tasks:
            t.cancel()
        for w in (cwriter, uwriter):
            with contextlib.suppress(Exception):
                w.transport.abort()  # RST rather than FIN: a reset, as a crash would look
            self._writers.discard(w)

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                with contextlib.suppress(Exception):
                    w.transport.abort()

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        self._sock.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
