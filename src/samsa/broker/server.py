"""The only broker module that touches sockets: asyncio connections speaking Kafka.

Theory of operation
-------------------
Each connection feeds bytes into a sans-IO :class:`FrameDecoder`. Each complete frame is
routed by API key to a handler, which returns either the response body right away, or an
awaitable of it (a Produce waiting for its fsync round, a Fetch long-polling), or ``None``
when no response is due (Produce with acks=0). Kafka answers requests on one connection in
the order they came, so responses go into a per-connection queue and leave it from the
head only; everything ready after one ``data_received`` is written with one
``writelines`` call. Handlers run synchronously as frames arrive, so appends of pipelined
produce requests happen in request order, and their fsyncs can share a round.

Bad input never reaches the data: a frame over ``socket.request.max.bytes``, a negative
size, an unknown API key, a version we do not serve (other than ApiVersions, which gets
error 35 with a v0 body as Kafka does) or a body that does not parse closes that
connection with a log line; other connections carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import deque
from dataclasses import dataclass
from typing import Any

from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.broker.handlers import APIS, RequestContext, unsupported_api_versions_response
from samsa.protocol.framing import (
    FrameDecoder,
    FrameError,
    frame_response,
    parse_request_header,
    peek_request_header,
    response_prefix,
)
from samsa.protocol.messages import ApiKey, api_name, decode_request, is_flexible

log = logging.getLogger("samsa.server")

MAX_PENDING_RESPONSES = 128


@dataclass(slots=True)
class _Pending:
    correlation_id: int
    flexible_header: bool
    body: bytes | list[bytes] | None = None
    done: bool = False
    task: asyncio.Future[Any] | None = None


class KafkaConnection(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.decoder = FrameDecoder(broker.config.socket_request_max_bytes)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.queue: deque[_Pending] = deque()
        self.closed = False
        self._reading_paused = False
        self._writing_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # Nobody will read these responses: stop long polls and the like now.
        for entry in self.queue:
            if entry.task is not None and not entry.task.done():
                entry.task.cancel()
        self.queue.clear()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self.closed:
            return
        should_pause = self._writing_paused or len(self.queue) >= MAX_PENDING_RESPONSES
        if should_pause and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False

    def close(self, reason: str) -> None:
        if not self.closed:
            log.warning("closing connection from %s: %s", self.peer, reason)
            self.closed = True
            if self.transport is not None:
                self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            self.close(str(exc))
            return
        for frame in frames:
            try:
                self._handle(frame)
            except FrameError as exc:
                self.close(str(exc))
                return
            except Exception:
                log.exception("handler failed; closing connection from %s", self.peer)
                self.close("internal error")
                return
            if self.closed:
                return
        self._write_ready()
        self._update_reading()

    def _handle(self, frame: bytes) -> None:
        api_key, version, correlation_id = peek_request_header(frame)
        api = APIS.get(api_key)
        if api is None:
            raise FrameError(f"unknown API key {api_key}")
        if not api.min_version <= version <= api.max_version:
            if api_key == ApiKey.API_VERSIONS:
                # Kafka answers with a v0 body and header, listing what it does serve.
                self._enqueue(correlation_id, False, unsupported_api_versions_response())
                return
            raise FrameError(
                f"{api_name(api_key)} v{version} is not supported "
                f"(supported: v{api.min_version}-v{api.max_version})"
            )
        flexible = is_flexible(api_key, version)
        header = parse_request_header(frame, flexible)
        request = decode_request(api_key, version, frame, header.body_offset)
        ctx = RequestContext(header=header, version=version, peer=self.peer)
        result = api.handler(self.broker, ctx, request)
        if result is None:
            return  # e.g. Produce with acks=0: Kafka sends nothing back
        # ApiVersions responses always use header v0, whatever the request version.
        flexible_header = flexible and api_key != ApiKey.API_VERSIONS
        if isinstance(result, bytes | list):
            self._enqueue(correlation_id, flexible_header, result)
        else:
            entry = _Pending(correlation_id, flexible_header)
            self.queue.append(entry)
            entry.task = future = asyncio.ensure_future(result)
            future.add_done_callback(lambda f, e=entry: self._on_done(e, f))

    def _enqueue(
        self, correlation_id: int, flexible_header: bool, body: bytes | list[bytes]
    ) -> None:
        self.queue.append(_Pending(correlation_id, flexible_header, body, True))

    def _on_done(self, entry: _Pending, future: asyncio.Future[Any]) -> None:
        if self.closed:
            return
        if future.cancelled():
            self.close("request cancelled")
            return
        exc = future.exception()
        if exc is not None:
            log.error("request failed", exc_info=exc)
            self.close("internal error")
            return
        entry.body = future.result()
        entry.done = True
        self._write_ready()
        self._update_reading()

    def _write_ready(self) -> None:
        if self.closed or self.transport is None:
            return
        out: list[bytes] = []
        queue = self.queue
        while queue and queue[0].done:
            entry = queue.popleft()
            body = entry.body
            if isinstance(body, list):
                size = sum(len(b) for b in body)
                out.append(response_prefix(entry.correlation_id, size, entry.flexible_header))
                out.extend(body)
            elif body is not None:
                out.append(frame_response(entry.correlation_id, body, entry.flexible_header))
        if out:
            self.transport.writelines(out)


class BrokerServer:
    """A broker listening on a socket; ``start``/``stop`` for embedding and tests."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker = Broker(config)
        self._server: asyncio.base_events.Server | None = None
        self.port: int = config.port

    async def start(self) -> None:
        self.broker.start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: KafkaConnection(self.broker),
            self.config.host,
            self.config.port,
            reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        if self.config.port == 0:
            # An ephemeral port: advertise the one we got.
            self.broker.config = self.config = self.config.with_overrides(
                port=self.port, advertised_port=self.config.advertised_port or self.port
            )
        self.broker.start_background_tasks()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)
        self.broker.close()


async def serve(config: BrokerConfig) -> None:
    server = BrokerServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The data directory went offline (a failed fsync): stop, as Kafka halts when its last
    # log directory fails; Broker.close then raises ShutdownError (exit status 1).
    server.broker.offline_listeners.append(lambda _reason: stop.set())
    host, port = server.broker.config.advertised
    log.info(
        "samsa broker ready on %s:%d (advertised %s:%d, data dir %s, cluster %s)",
        config.host,
        server.port,
        host,
        port,
        config.data_dir,
        server.broker.cluster_id,
    )
    await stop.wait()
    log.info("shutting down")
    await server.stop()


def run(config: BrokerConfig) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))


__all__ = ["BrokerServer", "KafkaConnection", "run", "serve"]
