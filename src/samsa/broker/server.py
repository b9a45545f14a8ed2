"""The only broker module that touches sockets: asyncio connections speaking Kafka.

Theory of operation
-------------------
A connection is a thin asyncio adapter, :class:`KafkaConnection`, over a sans-IO
:class:`~samsa.broker.connection.ConnectionCore` that keeps its state and limits (request
memory, back-pressure, SASL gating, response order; ``broker/connection.py``), with the
zero-copy :class:`~samsa.broker.writer.ZeroCopyWriter` (``broker/writer.py``) beside it. The
adapter passes the transport's events and the clock in, dispatches the frames the core lets
through, and writes what it hands back.

Each connection (an ``asyncio.BufferedProtocol``) has the transport read straight into the
buffers of a sans-IO :class:`FrameDecoder`: small frames, many at a time, into one read buffer
shared by all connections; a large frame into a buffer of its declared size, allocated once the
request memory pool granted it (as Kafka), so a frame arriving slowly is never copied as it
grows. Each complete frame is
routed by API key to a handler, which returns either the response body right away, or an
awaitable of it (a Produce waiting for its fsync round, a Fetch long-polling), or ``None``
when no response is due (Produce with acks=0). Kafka answers requests on one connection in
the order they came, so responses go into a per-connection queue and leave it from the
head only; everything ready after a turn of handling is written with one ``writelines``
call. Handlers run synchronously as frames are taken from the connection's backlog, so
appends of pipelined produce requests happen in request order, and their fsyncs can share a
round.

Fetch responses on plain sockets carry record bytes as pinned segment-file slices
(:class:`FileSlice`): once the transport has written everything before them, the connection's
writer writes such a response itself, the header with ``os.write`` and the slices with
``os.sendfile`` on a duplicate of the socket's descriptor, as Kafka's ``FileRecords.writeTo``
does (uvloop's ``loop.sendfile`` would copy through Python). Responses behind it wait; its
unsent bytes count against the per-connection limit below. TLS connections copy.

Bad input never reaches the data: a frame over ``socket.request.max.bytes``, a negative
size, an unknown API key, a version we do not serve (other than ApiVersions, which gets
error 35 with a v0 body as Kafka does) or a body that does not parse closes that
connection with a log line; other connections carry on.

Limits: what a client can make the broker hold
----------------------------------------------
- Request bytes, broker-wide (``queued.max.request.bytes``, :class:`RequestMemory`). Like
  Kafka's memory pool, a frame claims its declared size as soon as its 4-byte prefix is in;
  a connection whose next frame does not fit stops reading until enough is released (frames
  handled, responses of waiting requests sent). Frames bigger than a sixteenth of the pool
  may not take its last sixteenth, which stays for small requests: a few half-sent huge
  frames cannot stall every other client. Frames decoded but not yet handled, and those whose
  handler is still waiting (a Produce for its fsync), count too.
- Per connection, back-pressure per frame: at most ``MAX_PENDING_RESPONSES`` requests are in
  progress or answered-but-unsent, and at most ``MAX_QUEUED_RESPONSE_BYTES`` of responses wait
  to be sent (in the transport's buffer or behind a slower earlier response). At either
  limit the connection stops taking frames from its backlog and stops reading, as Kafka mutes
  a channel, until responses drain. One turn handles at most ``MAX_PENDING_RESPONSES``
  frames or ``TURN_S`` of work, then the connection yields to the others (``call_soon``): a
  client pipelining 100,000 requests delays the others by a turn, not by all of them.
- Before SASL authentication (SASL listeners): a frame is at most
  ``sasl.server.max.receive.size`` (Kafka's 512 KiB) and claims nothing of the pool; the
  connection must authenticate within ``sasl.server.authentication.timeout.ms`` (samsa's own);
  a listener takes at most ``sasl.max.connections.per.ip`` connections from one address
  (samsa's own); a failed authentication is answered, and the connection closed, only after
  ``connection.failed.authentication.delay.ms`` with reading stopped (Kafka's). Log lines carry
  at most a prefix of what a client sent.
- Time: a request whose first bytes arrived must be complete within
  ``socket.request.read.timeout.ms`` (samsa's own; time the broker itself paused reading
  does not count), and a connection with no traffic and no request in progress is closed
  after ``connections.max.idle.ms``. One sweep per tick checks every connection.
- Connections: ``max.connections`` and ``max.connections.per.ip``; a connection over either
  is closed as soon as it is accepted, with one log line per interval, not per connection.
  The server accepts by itself (a reader on the listening socket). At start the soft
  descriptor limit is raised to the hard one and split: segment files are held in a bounded
  cache (``log.max.open.files``, at most half), a reserve is kept, and connections get the
  rest; past that, accepting pauses (with a log line) and new connections wait in the listen
  backlog until one ends. Running out anyway (EMFILE/ENFILE) is likewise a log line and a
  short pause, not connections silently dropped as with uvloop's own accept.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import signal
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.broker.connection import (
    MAX_PENDING_RESPONSES,
    MAX_QUEUED_RESPONSE_BYTES,
    ConnectionCore,
    Pending,
    RequestMemory,
    release_pieces,
)
from samsa.broker.handlers import APIS, RequestContext, unsupported_api_versions_response
from samsa.broker.handlers._base import throttle
from samsa.broker.listeners import (
    ANONYMOUS,
    Listener,
    PrincipalMapper,
    enabled_mechanisms,
    listener_config,
    parse_listeners,
    server_context,
)
from samsa.broker.metrics import MAX_HTTP_REQUEST_BYTES, http_response, metrics_bind_host
from samsa.broker.oauthbearer import OAUTHBEARER, Jwks, validator_for
from samsa.broker.quotas import REQUEST, Muting
from samsa.broker.sasl import PlainUsers, SaslSession, clip, credentials_for
from samsa.broker.writer import ZeroCopyWriter
from samsa.log.segment import SEGMENT_FILES, FileSlice
from samsa.protocol.framing import (
    FrameDecoder,
    FrameError,
    parse_request_header,
    peek_request_header,
)
from samsa.protocol.messages import ApiKey, api_name, decode_request, is_flexible

log = logging.getLogger("samsa.server")

TURN_S = 0.002  # a connection's turn ends after the frame that passes this much time
LOG_INTERVAL_S = 10.0  # refused connections and accept errors: one log line per interval
ACCEPT_BACKLOG = 100
ACCEPT_RETRY_S = 0.1  # after EMFILE/ENFILE, accept again after this (or when one closes)
ACCEPTS_PER_WAKEUP = 64
# Descriptors kept for what is neither a connection nor a cached segment file: lazy imports,
# index and snapshot writes, flushes of evicted segments. At least this, or an eighth.
DESCRIPTOR_RESERVE_MIN = 16
METRICS_MAX_CONNECTIONS = 8  # concurrent scrapes; Prometheus makes one at a time
METRICS_READ_TIMEOUT_S = 10.0  # to send a request head, and to take the answer
# Not charged to request_percentage, as Kafka exempts them: a throttled client must still be
# able to learn versions and authenticate.
QUOTA_EXEMPT = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
# What one read may take when no large frame is being read: one buffer shared by every
# connection (each read is handled before the next begins), so idle connections hold none.
READ_BUFFER_BYTES = 1 << 18


class _Throttled:
    """A warning logged at most once per interval, with the count of those suppressed."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._next_at = 0.0
        self._suppressed = 0

    def __call__(self, now: float, msg: str, *args: object) -> None:
        if now < self._next_at:
            self._suppressed += 1
            return
        if self._suppressed:
            msg += " (%d more like this in the last %.0f s)"
            args = (*args, self._suppressed, self.interval_s)
        log.warning(msg, *args)
        self._suppressed = 0
        self._next_at = now + self.interval_s


class ConnectionLimits:
    """What all connections of one server share: the request memory pool, the connection
    registry and counts per address, and the settings they enforce."""

    def __init__(self, config: BrokerConfig) -> None:
        self.memory = RequestMemory(config.queued_max_request_bytes)
        self.read_timeout_s = config.socket_request_read_timeout_ms / 1000
        self.idle_s = config.connections_max_idle_ms / 1000  # < 0: never
        self.failed_auth_delay_s = config.connection_failed_authentication_delay_ms / 1000
        self.max_connections = config.max_connections
        self.max_per_ip = config.max_connections_per_ip
        self.connections: set[KafkaConnection] = set()
        self.per_ip: dict[str, int] = {}
        self.accepted = 0  # counted at accept, released when the connection ends
        self.refused = 0
        self.on_release: list[Any] = []  # called when a connection ends (resumes accepting)
        self.read_buffer = bytearray(READ_BUFFER_BYTES)

    def admit(self, ip: str, endpoint: Endpoint | None = None) -> str | None:
        """Count a new connection from ``ip``, or say which limit refuses it."""
        if self.accepted >= self.max_connections:
            return f"max.connections ({self.max_connections}) reached"
        if self.per_ip.get(ip, 0) >= self.max_per_ip:
            return f"max.connections.per.ip ({self.max_per_ip}) reached for {ip}"
        if endpoint is not None and endpoint.max_per_ip:
            if endpoint.per_ip.get(ip, 0) >= endpoint.max_per_ip:
                return (
                    f"sasl.max.connections.per.ip ({endpoint.max_per_ip}) reached for {ip} "
                    f"on listener {endpoint.listener.name}"
                )
            _count(endpoint.per_ip, ip, 1)
        self.accepted += 1
        _count(self.per_ip, ip, 1)
        return None

    def release(self, ip: str, endpoint: Endpoint | None = None) -> None:
        self.accepted -= 1
        _count(self.per_ip, ip, -1)
        if endpoint is not None and endpoint.max_per_ip:
            _count(endpoint.per_ip, ip, -1)
        for callback in self.on_release:
            callback()


def _count(counts: dict[str, int], ip: str, delta: int) -> None:
    left = counts.get(ip, 0) + delta
    if left > 0:
        counts[ip] = left
    else:
        counts.pop(ip, None)


@dataclass(slots=True)
class Endpoint:
    """One listener as its connections see it: its protocol, the address given to its
    clients, its TLS context, and how its clients are authenticated."""

    listener: Listener
    advertised: tuple[str, int] | None = None  # set once the port is bound
    ssl_context: ssl.SSLContext | None = None
    mapper: PrincipalMapper | None = None  # SSL listeners: certificate -> principal
    new_session: Callable[[], SaslSession] | None = None  # SASL listeners
    jwks: Jwks | None = None  # OAUTHBEARER's key set, refreshed while the listener runs
    sockets: list[socket.socket] = field(default_factory=list)
    # SASL listeners: the largest frame before authentication, the time to authenticate in,
    # and connections per client address (with their counts).
    max_receive: int = 0
    auth_timeout_s: float = 0.0
    max_per_ip: int = 0  # 0: no limit of the listener's own
    per_ip: dict[str, int] = field(default_factory=dict)


class KafkaConnection(asyncio.BufferedProtocol):
    """The asyncio side of one connection: the transport's events go into its sans-IO
    :class:`ConnectionCore`, the frames it lets through are dispatched to the handlers, and
    the responses it hands back are written by the transport, or by the
    :class:`ZeroCopyWriter` on a duplicate of the socket's descriptor."""

    # Send Fetch record bytes from segment files with os.sendfile where the transport is a
    # plain socket (not TLS); False: always copy (tests compare the two).
    sendfile_enabled = hasattr(os, "sendfile")

    def __init__(
        self,
        broker: Broker,
        limits: ConnectionLimits | None = None,
        ip: str | None = None,
        endpoint: Endpoint | None = None,
    ) -> None:
        self.broker = broker
        self.endpoint = endpoint
        self.limits = limits if limits is not None else ConnectionLimits(broker.config)
        self.ip = ip  # set when the server counted this connection against the limits
        decoder = FrameDecoder(
            broker.config.socket_request_max_bytes,
            self.limits.read_buffer,
            buffers=self.limits.memory.frames,
        )
        self.core = ConnectionCore(decoder, self.limits.memory, self._update_reading, 0.0)
        # A response with FileSlice pieces is written by the writer, with our own syscalls on
        # _out_fd, once the transport's buffer is empty; later responses wait behind it.
        self.writer = ZeroCopyWriter()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.tls = False  # a TLS transport: response bytes must go through it (no sendfile)
        self.principal = ANONYMOUS
        self.software = ("", "")  # ApiVersions v3+ (KIP-511): the client's name and version
        self._scheduled = False  # a call_soon(_process) is pending
        self._out_fd = -1
        self._writer_added = False
        self.muting = Muting()  # the throttle owed to client quotas (broker/quotas.py)
        self._unmute: asyncio.TimerHandle | None = None

    @property
    def closed(self) -> bool:
        return self.core.closed

    @property
    def zero_copy(self) -> bool:
        """Can responses be sent from files? Asked per use: TLS may be set up later."""
        transport = self.transport
        return (
            self.sendfile_enabled
            and not self.tls
            and transport is not None
            and transport.get_extra_info("sslcontext") is None
            and transport.get_extra_info("socket") is not None
        )

    # -- connection lifecycle ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.core.last_active = now = time.monotonic()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.transport.set_write_buffer_limits(high=MAX_QUEUED_RESPONSE_BYTES)
        self.limits.connections.add(self)
        ssl_object = transport.get_extra_info("ssl_object")
        self.tls = ssl_object is not None
        endpoint = self.endpoint
        if endpoint is None:
            return
        if endpoint.new_session is not None:
            self.core.require_sasl(
                endpoint.new_session(), endpoint.max_receive, endpoint.auth_timeout_s, now
            )
        elif endpoint.mapper is not None and ssl_object is not None:
            try:
                self.principal = endpoint.mapper.principal(ssl_object.getpeercert())
            except ValueError as exc:
                self.close(str(exc))

    def connection_lost(self, exc: Exception | None) -> None:
        # Nobody will read these responses: stop long polls and the like now.
        for entry in self.core.drop():
            if entry.task is not None and not entry.task.done():
                entry.task.cancel()
        self.core.close()
        self._stop_sending()
        if self._unmute is not None:
            self._unmute.cancel()
        self.limits.connections.discard(self)
        if self.ip is not None:
            self.limits.release(self.ip, self.endpoint)
            self.ip = None
        self.broker.connection_closed(self.peer)  # share sessions it opened close

    def _authenticated(self, principal: str) -> None:
        if self.principal != principal:
            self.principal = principal
            log.debug("%s authenticated as %s", self.peer, clip(principal))
        self.core.authenticated()

    def close(self, reason: str) -> None:
        self._abort(reason, logging.WARNING)

    def _abort(self, reason: str, level: int, *, graceful: bool = False) -> None:
        if not self.core.closed:
            log.log(level, "closing connection from %s: %s", self.peer, clip(reason, 1024))
            self.core.close()
            if self.transport is not None:
                # graceful: what was written (a last response) is sent first, but a client
                # that does not read cannot keep the connection: cut after the read timeout.
                if graceful:
                    self.transport.close()
                    asyncio.get_running_loop().call_later(
                        self.limits.read_timeout_s, self.transport.abort
                    )
                else:
                    self.transport.abort()
            self._stop_sending()

    def pause_writing(self) -> None:
        self.core.writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.core.writing_paused = False
        self.core.last_active = time.monotonic()
        self._continue()

    # -- reading ------------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        # The transport reads straight into the decoder: small frames into the shared read
        # buffer, a large one into a buffer of its declared size once the pool granted it
        # (reading stays paused until then), so a half-sent frame is never copied as it grows.
        return self.core.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self._read(self.core.receive_into, nbytes)

    def data_received(self, data: bytes) -> None:
        """Bytes already read (the tests' transports): as if read into our buffers."""
        self._read(self.core.receive, data)

    def _read(self, receive: Callable[[Any, float], None], arg: Any) -> None:
        if self.core.closed:
            return
        try:
            receive(arg, time.monotonic())
        except FrameError as exc:
            self.close(str(exc))
            return
        self._process()

    # -- handling -----------------------------------------------------------------------------

    def _process(self) -> None:
        """Handle frames from the backlog: at most one turn's worth, and only while the
        connection is not blocked; what is left waits for the next turn or for a drain."""
        self._scheduled = False
        core = self.core
        handled = 0
        released = 0
        turn_ends = time.perf_counter() + TURN_S
        while handled < MAX_PENDING_RESPONSES and core.has_work:
            if handled and time.perf_counter() > turn_ends:
                break
            frame = core.take_frame()
            handled += 1
            try:
                held = self._handle(frame)
            except FrameError as exc:
                self.close(str(exc))
                return
            except Exception:
                log.exception("handler failed; closing connection from %s", self.peer)
                self.close("internal error")
                return
            if core.closed:
                return
            if self.muting.owed_ms:
                self._mute()
            if not held:
                released += len(frame)
        core.end_turn(handled, released)
        self._write_ready()
        if core.has_work and not self._scheduled:
            # A turn's worth done: let the other connections have theirs first.
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._process)
        self._update_reading()

    def _continue(self) -> None:
        """Responses drained or room freed: resume handling and reading if no longer held."""
        if self.core.closed:
            return
        if self.core.has_work and not self._scheduled:
            self._process()
        else:
            self._update_reading()

    def drain(self) -> None:
        """Stop reading for good; requests already read are still answered."""
        self.core.draining = True
        self._update_reading()

    @property
    def quiet(self) -> bool:
        """Nothing read is left unanswered and every answer has left the process."""
        return self.core.closed or (
            self.core.idle
            and not self.writer.busy
            and (self.transport is None or self.transport.get_write_buffer_size() == 0)
        )

    def _update_reading(self) -> None:
        if self.transport is None or self.core.closed:
            return
        pause = self.core.update_reading(time.monotonic())
        if pause:
            self.transport.pause_reading()
        elif pause is not None:
            self.transport.resume_reading()

    def _handle(self, frame: bytes) -> bool:
        """Dispatch one request to its handler; True if its frame stays held until its
        response is ready."""
        core = self.core
        session = core.session
        if session is not None and session.awaits_raw_token:
            self._raw_sasl_token(session, frame)
            return False
        api_key, version, correlation_id = peek_request_header(frame)
        api = APIS.get(api_key)
        if api is None:
            raise FrameError(f"unknown API key {api_key}")
        if not api.min_version <= version <= api.max_version:
            if api_key == ApiKey.API_VERSIONS:
                # Kafka answers with a v0 body and header, listing what it does serve.
                core.respond(correlation_id, False, unsupported_api_versions_response())
                return False
            raise FrameError(
                f"{api_name(api_key)} v{version} is not supported "
                f"(supported: v{api.min_version}-v{api.max_version})"
            )
        if session is not None:
            core.gate(api_key, time.monotonic())
        flexible = is_flexible(api_key, version)
        header = parse_request_header(frame, flexible)
        request = decode_request(api_key, version, frame, header.body_offset)
        if api_key == ApiKey.API_VERSIONS and version >= 3:
            self.software = (request.client_software_name, request.client_software_version)
        endpoint = self.endpoint
        ctx = RequestContext(
            header=header,
            version=version,
            peer=self.peer,
            principal=self.principal,
            advertised=endpoint.advertised if endpoint is not None else None,
            session=session,
            zero_copy=api_key == ApiKey.FETCH and self.zero_copy,
            software=self.software,
            size=len(frame),
            muting=self.muting,
        )
        started = time.perf_counter()
        result = self.broker.metrics.timed(api_key, started, api.handler(self.broker, ctx, request))
        if REQUEST in self.broker.quotas.keys and api_key not in QUOTA_EXEMPT:
            # request_percentage: handler time as a percentage of one thread (Kafka's unit).
            throttle(self.broker, ctx, REQUEST, (time.perf_counter() - started) * 100)
        if session is not None and api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            self._after_sasl(session, correlation_id, flexible, result)
            return False
        if result is None:
            return False  # e.g. Produce with acks=0: Kafka sends nothing back
        # ApiVersions responses always use header v0, whatever the request version.
        flexible_header = flexible and api_key != ApiKey.API_VERSIONS
        if isinstance(result, bytes | list):
            core.respond(correlation_id, flexible_header, result)
            return False
        entry = core.expect(correlation_id, flexible_header, len(frame))
        entry.task = future = asyncio.ensure_future(result)
        future.add_done_callback(lambda f, e=entry: self._on_done(e, f))
        return True

    def _after_sasl(
        self, session: SaslSession, correlation_id: int, flexible: bool, result: Any
    ) -> None:
        """A SASL step's answer goes out; a failed one is the connection's last."""
        assert isinstance(result, bytes)
        self.core.respond(correlation_id, flexible, result)
        if session.failed is not None:
            self._fail_authentication(session.failed)
        elif session.principal is not None:
            self._authenticated(session.principal)

    def _fail_authentication(self, reason: str) -> None:
        """Kafka's connection.failed.authentication.delay.ms: the answer (if any) and the
        close wait that long, the connection muted meanwhile, so that wrong passwords cannot
        be tried at the speed of the network."""
        delay = self.limits.failed_auth_delay_s
        if delay <= 0:
            self._write_ready()
            self._abort(reason, logging.WARNING, graceful=True)
            return
        self.core.failing = reason
        self._update_reading()
        asyncio.get_running_loop().call_later(delay, self._failed_authentication)

    def _failed_authentication(self) -> None:
        reason, self.core.failing = self.core.failing, None
        if self.core.closed or reason is None:
            return
        self._write_ready()
        self._abort(reason, logging.WARNING, graceful=True)

    def _raw_sasl_token(self, session: SaslSession, token: bytes) -> None:
        """A SASL token after SaslHandshake v0: the answer is a bare size-prefixed token
        (empty included, as Kafka); a failure closes the connection with no answer, as v0
        has no way to carry an error."""
        error, _, reply = session.authenticate(token)
        if error:
            self._fail_authentication(session.failed or "SASL authentication failed")
            return
        self.core.respond_raw(reply)
        if session.principal is not None:
            self._authenticated(session.principal)

    def _on_done(self, entry: Pending, future: asyncio.Future[Any]) -> None:
        if self.core.closed:
            if not future.cancelled() and future.exception() is None:
                body = future.result()
                if isinstance(body, list):
                    release_pieces(body)
            return
        if future.cancelled():
            self.close("request cancelled")
            return
        exc = future.exception()
        if exc is not None:
            log.error("request failed", exc_info=exc)
            self.close("internal error")
            return
        self.core.complete(entry, future.result())
        self._write_ready()
        if self.muting.owed_ms:
            self._mute()
        self._continue()

    def _mute(self) -> None:
        """KIP-219: the throttled response goes at once; then nothing more is read or handled
        from this client until its throttle time has passed."""
        ms = self.muting.take()
        core = self.core
        if core.muted and self._unmute is not None:
            if self._unmute.when() >= asyncio.get_running_loop().time() + ms / 1000:
                return  # already muted for longer
            self._unmute.cancel()
        core.muted = True
        self._unmute = asyncio.get_running_loop().call_later(ms / 1000, self._unmuted)
        self._update_reading()

    def _unmuted(self) -> None:
        self._unmute = None
        self.core.muted = False
        self._continue()

    # -- writing ------------------------------------------------------------------------------

    def _write_ready(self) -> None:
        """Write the responses ready in request order: with one ``writelines``, up to one
        with file slices on a plain socket, which the zero-copy writer sends on its own."""
        core = self.core
        if (
            core.closed
            or self.transport is None
            or self.writer.busy
            or core.failing is not None  # held for the failed-authentication delay
        ):
            return
        out: list[bytes] = []
        while (pieces := core.pop_response()) is not None:
            if len(pieces) < 2 or not any(isinstance(p, FileSlice) for p in pieces):
                out.extend(pieces)
                continue
            if not self.zero_copy:
                out.extend(p.read() if isinstance(p, FileSlice) else p for p in pieces)
                release_pieces(pieces)
                continue
            if out:
                self.transport.writelines(out)
                out = []
            self.writer.start(pieces)
            core.sending_bytes = self.writer.unsent
            if not self._send_some():
                return  # the rest when the socket is writable (_on_writable)
        if out:
            self.transport.writelines(out)
            core.last_active = time.monotonic()

    def _on_writable(self) -> None:
        if self._send_some():
            self._write_ready()
            self._continue()

    def _send_some(self) -> bool:
        """Let the writer go on with its response, once the transport has written all it
        buffered (so the bytes leave in order); True once all is written, else wait for the
        socket to be writable."""
        writer = self.writer
        transport = self.transport
        if not writer.busy or self.core.closed or transport is None:
            return False
        if transport.get_write_buffer_size():
            self._wait_writable()  # the transport drains first
            return False
        if self._out_fd < 0:
            self._out_fd = os.dup(transport.get_extra_info("socket").fileno())
        try:
            done = writer.send(self._out_fd)
        except OSError as exc:
            self._abort(f"sending a response failed: {exc}", logging.INFO)
            return False
        self.core.sending_bytes = writer.unsent
        self.core.last_active = time.monotonic()
        if not done:
            self._wait_writable()
            return False
        if self._writer_added:
            self._writer_added = False
            asyncio.get_running_loop().remove_writer(self._out_fd)
        return True

    def _wait_writable(self) -> None:
        if not self._writer_added:
            if self._out_fd < 0 and self.transport is not None:
                self._out_fd = os.dup(self.transport.get_extra_info("socket").fileno())
            asyncio.get_running_loop().add_writer(self._out_fd, self._on_writable)
            self._writer_added = True

    def _stop_sending(self) -> None:
        """The connection is gone: unpin what was not sent, close our descriptor."""
        self.writer.stop()
        self.core.sending_bytes = 0
        fd, self._out_fd = self._out_fd, -1
        if fd >= 0:
            if self._writer_added:
                self._writer_added = False
                asyncio.get_running_loop().remove_writer(fd)
            os.close(fd)

    # -- timeouts -----------------------------------------------------------------------------

    def check_timeouts(self, now: float) -> None:
        """Close the connection if it is not authenticated in time, its partial request is
        overdue, or it has been idle."""
        limits = self.limits
        why = self.core.timeout(now, limits.read_timeout_s, limits.idle_s)
        if why is None:
            return
        reason, routine = why
        if routine:
            self._abort(reason, logging.INFO)
        else:
            self.close(reason)


def raise_descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the file descriptor limit from %d to %d: %s", soft, hard, exc)
    return soft


class BrokerServer:
    """A broker listening on a socket; ``start``/``stop`` for embedding and tests."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.endpoints: list[Endpoint] = _endpoints(config)  # bad TLS files fail here, first
        self.broker = Broker(config)
        self.limits = ConnectionLimits(config)
        self.limits.on_release.append(self._resume_accepting)
        self.port: int = config.port
        self.descriptor_limit = 0
        self.connection_budget = 0  # connections the descriptor limit leaves room for
        self._sockets: list[socket.socket] = []
        self._listening: dict[int, Endpoint] = {}  # listening socket's fd -> its listener
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accept_paused = False
        self._retry_handle: asyncio.TimerHandle | None = None
        self._setups: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._refused_log = _Throttled()
        self._accept_error_log = _Throttled()
        self._budget_log = _Throttled()
        self._metrics: _MetricsServer | None = None

    async def start(self) -> None:
        self.descriptor_limit = limit = raise_descriptor_limit()
        # Half the descriptors at most for segment files, a reserve, the rest for connections.
        open_files = min(self.config.log_max_open_files, max(1, limit // 2))
        SEGMENT_FILES.resize(open_files)
        reserve = max(DESCRIPTOR_RESERVE_MIN, limit // 8)
        self.connection_budget = max(1, limit - open_files - reserve)
        log.info(
            "file descriptor limit %d: up to %d segment files and %d connections",
            limit,
            open_files,
            self.connection_budget,
        )
        self.broker.open()  # the coordinators replay in the background (start_background_tasks)
        self._loop = loop = asyncio.get_running_loop()
        for endpoint in self.endpoints:
            if endpoint.jwks is not None:
                await endpoint.jwks.start()
        try:
            for endpoint in self.endpoints:
                lst = endpoint.listener
                endpoint.sockets = await _listen(loop, lst.host, lst.port)
                self._sockets += endpoint.sockets
                for sock in endpoint.sockets:
                    self._listening[sock.fileno()] = endpoint
                endpoint.advertised = lst.advertised(endpoint.sockets[0].getsockname()[1])
        except BaseException:
            for sock in self._sockets:
                sock.close()
            raise
        for sock in self._sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)
        self.port = self._sockets[0].getsockname()[1]
        for endpoint in self.endpoints:
            lst = endpoint.listener
            log.info(
                "listener %s (%s) on %s:%d, advertised as %s:%d",
                lst.name,
                lst.protocol,
                lst.host,
                endpoint.sockets[0].getsockname()[1],
                *(endpoint.advertised or ("?", 0)),
            )
        if self.config.port == 0:
            # An ephemeral port: advertise the one we got.
            self.broker.config = self.config = self.config.with_overrides(
                port=self.port, advertised_port=self.config.advertised_port or self.port
            )
        self._sweeper = loop.create_task(self._sweep())
        if self.config.metrics_port is not None:
            self._metrics = await _MetricsServer.start(self.broker, self.config)
        self.broker.start_background_tasks()

    # -- accepting ----------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        loop = self._loop
        assert loop is not None
        for _ in range(ACCEPTS_PER_WAKEUP):
            if self.limits.accepted >= self.connection_budget:
                self._budget_log(
                    time.monotonic(),
                    "not accepting connections: %d are open, all that the file descriptor "
                    "limit (%d) leaves room for; new ones wait in the listen backlog",
                    self.limits.accepted,
                    self.descriptor_limit,
                )
                self._pause_accepting(retry=False)  # until a connection ends
                return
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._accept_error_log(
                        time.monotonic(),
                        "cannot accept connections: %s (file descriptor limit %d, %d "
                        "connections); new ones wait in the listen backlog",
                        exc.strerror or exc,
                        self.descriptor_limit,
                        self.limits.accepted,
                    )
                    self._pause_accepting(retry=True)
                    return
                raise
            ip = str(addr[0]) if isinstance(addr, tuple) else "?"
            endpoint = self._listening.get(listener.fileno())
            refusal = self._connection_quota(ip) or self.limits.admit(ip, endpoint)
            if refusal is not None:
                self.limits.refused += 1
                self._refused_log(time.monotonic(), "refusing connection from %s: %s", ip, refusal)
                sock.close()
                continue
            task = loop.create_task(self._setup(sock, ip, endpoint))
            self._setups.add(task)
            task.add_done_callback(self._setups.discard)

    def _connection_quota(self, ip: str) -> str | None:
        """``connection_creation_rate`` of the address (client quotas): why a new connection
        from it is refused, if it is over."""
        quotas = self.broker.quotas
        charge = quotas.connection_quota(ip)
        if charge is None or not quotas.record(charge, 1, time.monotonic()):
            return None
        return f"connection_creation_rate ({charge.bound:g}/s) exceeded for {ip}"

    async def _setup(self, sock: socket.socket, ip: str, endpoint: Endpoint | None) -> None:
        loop = self._loop
        assert loop is not None
        ssl_context = endpoint.ssl_context if endpoint is not None else None
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # A TLS handshake is bounded like a request: socket.request.read.timeout.ms.
            await loop.connect_accepted_socket(
                lambda: KafkaConnection(self.broker, self.limits, ip, endpoint),
                sock,
                ssl=ssl_context,
                ssl_handshake_timeout=self.limits.read_timeout_s if ssl_context else None,
            )
        except Exception as exc:  # the client went away during setup
            log.info("connection from %s failed during setup: %s", ip, exc)
            sock.close()
            self.limits.release(ip, endpoint)

    def _pause_accepting(self, *, retry: bool) -> None:
        loop = self._loop
        if self._accept_paused or loop is None:
            return
        self._accept_paused = True
        for sock in self._sockets:
            loop.remove_reader(sock.fileno())
        if retry:
            self._retry_handle = loop.call_later(ACCEPT_RETRY_S, self._resume_accepting)

    def _resume_accepting(self) -> None:
        loop = self._loop
        if not self._accept_paused or loop is None:
            return
        self._accept_paused = False
        if self._retry_handle is not None:
            self._retry_handle.cancel()
            self._retry_handle = None
        for sock in self._sockets:
            if sock.fileno() >= 0:
                loop.add_reader(sock.fileno(), self._accept, sock)

    # -- timeouts -----------------------------------------------------------------------------

    async def _sweep(self) -> None:
        limits = self.limits
        spans = [limits.read_timeout_s] + ([limits.idle_s] if limits.idle_s >= 0 else [])
        spans += [e.auth_timeout_s for e in self.endpoints if e.new_session is not None]
        tick = min(1.0, max(0.01, min(spans) / 4))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for conn in list(limits.connections):
                conn.check_timeouts(now)

    async def stop(self, drain_timeout: float = 2.0) -> None:
        """Stop accepting, answer the requests already read (for up to ``drain_timeout``
        seconds, so a client gets its answer, e.g. KAFKA_STORAGE_ERROR when a failed fsync
        stops the broker, rather than a reset), then close every connection and the broker."""
        loop = self._loop
        if self._retry_handle is not None:
            self._retry_handle.cancel()
        for sock in self._sockets:
            if loop is not None and not self._accept_paused:
                loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets = []
        self._listening.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for endpoint in self.endpoints:
            if endpoint.jwks is not None:
                endpoint.jwks.close()
        if self._metrics is not None:
            await self._metrics.stop()
        for task in list(self._setups):
            task.cancel()
        conns = list(self.limits.connections)
        for conn in conns:
            conn.drain()
        deadline = time.monotonic() + drain_timeout
        while not all(c.quiet for c in conns) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in conns:
            if conn.transport is not None:
                conn.transport.abort()
        await asyncio.sleep(0)  # let the aborts run connection_lost
        self.broker.close()


class _MetricsServer:
    """``GET /metrics`` over HTTP on ``metrics.host:metrics.port`` (broker/metrics.py builds
    the answers). Bounded like the Kafka listeners: at most ``METRICS_MAX_CONNECTIONS`` at
    once (others are closed at once), a request head of at most
    ``MAX_HTTP_REQUEST_BYTES``, read within ``METRICS_READ_TIMEOUT_S``; one answer per
    connection."""

    def __init__(self, broker: Broker, server: asyncio.Server) -> None:
        self.broker = broker
        self.server = server
        self.port: int = server.sockets[0].getsockname()[1]
        self.active: set[asyncio.Task[Any]] = set()

    @classmethod
    async def start(cls, broker: Broker, config: BrokerConfig) -> _MetricsServer:
        host = metrics_bind_host(config)
        holder: list[_MetricsServer] = []

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await holder[0]._serve(reader, writer)

        server = await asyncio.start_server(
            on_connection, host, config.metrics_port, limit=MAX_HTTP_REQUEST_BYTES
        )
        holder.append(cls(broker, server))
        log.info("metrics on http://%s:%d/metrics", host, holder[0].port)
        return holder[0]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self.active) >= METRICS_MAX_CONNECTIONS:
            writer.close()
            return
        self.active.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), METRICS_READ_TIMEOUT_S)
            writer.write(http_response(head, self.broker.metrics.exposition))
            await asyncio.wait_for(writer.drain(), METRICS_READ_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            writer.write(http_response(b"", self.broker.metrics.exposition))  # 400
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # the client is gone or too slow: nothing to answer
        finally:
            self.active.discard(task)
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        for task in list(self.active):
            task.cancel()
        await self.server.wait_closed()


def _endpoints(config: BrokerConfig) -> list[Endpoint]:
    """The configured listeners with what their connections need (TLS contexts, SASL), each
    from its own settings (``listener.name.<listener>.*`` over the global ones)."""
    scram = credentials_for(config.data_dir)
    endpoints = []
    for lst in parse_listeners(config):
        own = listener_config(config, lst.name)
        endpoint = Endpoint(lst)
        if lst.protocol == "SSL":
            endpoint.ssl_context = server_context(own, client_auth=True)
            endpoint.mapper = PrincipalMapper(own.ssl_principal_mapping_rules)
        elif lst.protocol == "SASL_SSL":  # KIP-684: SASL authenticates, not certificates
            endpoint.ssl_context = server_context(own, client_auth=False)
        if lst.sasl:
            mechanisms = enabled_mechanisms(own)
            oauth = validator_for(own) if OAUTHBEARER in mechanisms else None
            endpoint.jwks = getattr(oauth, "jwks", None)
            endpoint.new_session = partial(
                SaslSession,
                mechanisms,
                scram,
                PlainUsers(own.sasl_plain_users_file),
                own.connections_max_reauth_ms,
                oauth=oauth,
            )
            endpoint.max_receive = own.sasl_server_max_receive_size
            endpoint.auth_timeout_s = own.sasl_server_authentication_timeout_ms / 1000
            endpoint.max_per_ip = own.sasl_max_connections_per_ip
        endpoints.append(endpoint)
    return endpoints


async def _listen(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to (as ``create_server``)."""
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _name, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port:  # 0 picks a port for the first address; the others get the same one
                addr = (addr[0], port, *addr[2:])
            sock.bind(addr)
            port = sock.getsockname()[1]
            sock.listen(ACCEPT_BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


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
    host, port = server.endpoints[0].advertised or server.broker.config.advertised
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


__all__ = [
    "MAX_PENDING_RESPONSES",
    "MAX_QUEUED_RESPONSE_BYTES",
    "BrokerServer",
    "ConnectionLimits",
    "Endpoint",
    "KafkaConnection",
    "RequestMemory",
    "run",
    "serve",
]
