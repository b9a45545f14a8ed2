"""One Kafka connection's state, sans-IO: bytes and completions in, frames to handle and
response bytes out.

Theory of operation
-------------------
:class:`ConnectionCore` is what ``broker/server.py``'s ``KafkaConnection`` decides with, kept
apart from the event loop, the transport and the handlers (as h11's ``Connection`` is apart
from its sockets): it never reads, writes, sleeps or reads a clock; the adapter passes the
time in and does what the core answers.

- In: bytes read (:meth:`~ConnectionCore.receive`, or the decoder's own buffer filled by the
  transport and :meth:`~ConnectionCore.receive_into`), the answer of a request that was
  waiting (:meth:`~ConnectionCore.complete`), the transport's own back-pressure
  (``writing_paused``, ``sending_bytes``) and SASL steps.
- Out: frames to handle, in order, while the connection is not blocked
  (:meth:`~ConnectionCore.take_frame`); framed responses in request order, whatever order
  they completed in (:meth:`~ConnectionCore.pop_response`); whether reading should pause
  or resume (:meth:`~ConnectionCore.update_reading`); why it must close
  (:meth:`~ConnectionCore.timeout`).

The limits it enforces (request memory, pending responses, unsent bytes, SASL before
authentication, read and idle timeouts) are described in ``broker/server.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from samsa.broker.sasl import SaslSession
from samsa.log.segment import FileSlice
from samsa.protocol.framing import (
    Frame,
    FrameBuffers,
    FrameDecoder,
    FrameError,
    frame_response,
    response_prefix,
)
from samsa.protocol.messages import ApiKey, api_name

MAX_PENDING_RESPONSES = 128  # requests in progress or unsent per connection; frames per turn
MAX_QUEUED_RESPONSE_BYTES = 1 << 20  # response bytes waiting to be sent per connection
KEPT_FRAME_BYTES = 32 << 20  # large frames' buffers kept for reuse without a pool limit

# Kafka's rule: before SASL authentication completes, only these are served.
PRE_AUTH_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


class RequestMemory:
    """``queued.max.request.bytes``: bytes of requests being read or waiting to be handled,
    broker-wide. Connections claim and release; those that could not claim wait here."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 0)  # 0: unbounded (Kafka's -1)
        self.reserve = self.limit // 16  # kept for frames no larger than this
        # Buffers of frames already answered, kept by their connections' decoders to read the
        # next large frame into: outside the pool (nothing waits on them), bounded apart.
        self.frames = FrameBuffers(self.reserve if self.limit else KEPT_FRAME_BYTES)
        self.used = 0
        self.peak = 0  # for tests and benchmarks
        self._waiters: dict[ConnectionCore, None] = {}

    def fits(self, held: int, need: int) -> bool:
        """May a connection holding ``held`` bytes for its partial frame hold ``need``?"""
        if not self.limit:
            return True
        others = self.used - held
        if others <= 0:
            return True  # alone, even a frame larger than the pool may be read
        cap = self.limit - self.reserve if need > self.reserve else self.limit
        return others + need <= cap

    def has_room(self) -> bool:
        return not self.limit or self.used < self.limit

    def change(self, delta: int) -> None:
        self.used += delta
        if delta > 0:
            if self.used > self.peak:
                self.peak = self.used
        elif self._waiters:
            self._wake()

    def wait(self, conn: ConnectionCore) -> None:
        self._waiters[conn] = None

    def forget(self, conn: ConnectionCore) -> None:
        self._waiters.pop(conn, None)

    def _wake(self) -> None:
        # First come, first served; a waiter that still does not fit keeps its place.
        for conn in list(self._waiters):
            if not self.has_room():
                return
            if conn.retry_memory():
                self._waiters.pop(conn, None)


@dataclass(slots=True)
class Pending:
    """A request in order: answered (``done``) or still waiting for its response."""

    correlation_id: int
    flexible_header: bool
    body: bytes | list[Any] | None = None  # list: pieces, bytes or FileSlice
    done: bool = False
    task: Any = None  # the adapter's handle on the awaited answer, cancelled if it is lost
    frame_bytes: int = 0  # request bytes held in the pool until the response is ready
    unsent: int = 0  # response bytes counted as waiting behind an unfinished response
    raw: bool = False  # a bare SASL token (after SaslHandshake v0): no response header


def release_pieces(pieces: Any) -> None:
    for piece in pieces:
        if isinstance(piece, FileSlice):
            piece.release()


def _body_size(body: bytes | list[Any] | None) -> int:
    if body is None:
        return 0
    if isinstance(body, list):
        return sum(len(b) for b in body)
    return len(body)


class ConnectionCore:
    """Request memory claims, back-pressure, SASL gating and response order of one
    connection. ``on_memory`` is called when the pool granted a frame this connection was
    waiting for (the adapter resumes reading)."""

    def __init__(
        self,
        decoder: FrameDecoder,
        memory: RequestMemory,
        on_memory: Callable[[], None],
        now: float,
    ) -> None:
        self.decoder = decoder
        self.memory = memory
        self._on_memory = on_memory
        self.max_request_bytes = decoder.max_frame_size  # socket.request.max.bytes
        self.queue: deque[Pending] = deque()  # requests in order, answered or not
        self.backlog: deque[Frame] = deque()  # frames decoded, not yet handled
        self.closed = False
        self.draining = False  # the server is stopping: answer what was read, read no more
        self.handled = 0  # frames handled, for tests
        # The transport's side of back-pressure, kept up to date by the adapter.
        self.writing_paused = False
        self.sending_bytes = 0  # of a response the zero-copy writer has not finished
        self.reading_paused = False
        self.last_active = now
        self.frame_since: float | None = None  # when the partial frame started, if reading
        self._unsent_bytes = 0  # done responses queued behind an unfinished one
        # Request memory: frames draw on queued.max.request.bytes; not before SASL
        # authentication, when they are bounded by sasl.server.max.receive.size instead (as
        # Kafka's authenticator reads them outside its memory pool).
        self._pooled = True
        self._join_pool = False
        self.waiting_memory = False
        self._granted = False  # the partial frame's declared size is claimed
        self._partial_claim = 0  # pool bytes claimed for the partial frame
        self._held = 0  # pool bytes held in all: partial + backlog + waiting requests
        # SASL listeners: the session, the deadline to authenticate by, and a failed
        # authentication waiting out its delay (nothing more is served or sent meanwhile).
        self.session: SaslSession | None = None
        self.auth_deadline: float | None = None
        self.auth_timeout_s = 0.0
        self.failing: str | None = None
        # Client quotas (KIP-219): a throttled client's channel is muted, after its response,
        # until its throttle time has passed: nothing more is read or handled meanwhile.
        self.muted = False

    # -- SASL ---------------------------------------------------------------------------------

    def require_sasl(
        self, session: SaslSession, max_receive: int, timeout_s: float, now: float
    ) -> None:
        """A SASL listener's connection: small frames outside the pool until authenticated."""
        self.session = session
        self._pooled = False
        self.decoder.max_frame_size = max_receive
        self.decoder.limit_name = "sasl.server.max.receive.size"
        self.auth_timeout_s = timeout_s
        self.auth_deadline = now + timeout_s

    def authenticated(self) -> None:
        self.auth_deadline = None
        if not self._pooled:
            # From now on requests may be as large as any client's, and are the pool's (from
            # the end of this turn: the frame being handled was not the pool's).
            self._join_pool = True
            self.decoder.max_frame_size = self.max_request_bytes
            self.decoder.limit_name = "socket.request.max.bytes"

    def gate(self, api_key: int, now: float) -> None:
        """Before SASL authentication only the SASL APIs and ApiVersions are served; during a
        re-authentication only its SaslAuthenticate steps (as Kafka's SaslServerAuthenticator);
        after the session expired, only a SaslHandshake that begins one (as Kafka's
        SocketServer). Anything else closes the connection."""
        session = self.session
        if session is None:
            return
        if not session.authenticated:
            if api_key in PRE_AUTH_APIS:
                return
            raise FrameError(f"{api_name(api_key)} before SASL authentication")
        if session.renewing:
            if api_key == ApiKey.SASL_AUTHENTICATE:
                return
            raise FrameError(f"{api_name(api_key)} during SASL re-authentication")
        if not session.expired(now):
            return
        if api_key == ApiKey.SASL_HANDSHAKE and session.may_renew(now):
            return
        raise FrameError(
            f"{api_name(api_key)} after the SASL session expired "
            "(connections.max.reauth.ms) without re-authentication"
        )

    # -- reading ------------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> None:
        """Bytes read by someone else (raises FrameError on bad framing)."""
        self._received(self.decoder.feed(data), now)

    def receive_into(self, nbytes: int, now: float) -> None:
        """``nbytes`` read into the decoder's own buffer (``decoder.get_buffer``)."""
        self._received(self.decoder.buffer_updated(nbytes), now)

    def _received(self, frames: list[Frame], now: float) -> None:
        self.last_active = now
        if frames:
            # The claimed partial frame (if any) is complete: its claim moves to the backlog.
            self._granted = False
            self.frame_since = None
            size = -self._partial_claim
            self._partial_claim = 0
            for frame in frames:
                size += len(frame)
            self.backlog.extend(frames)
            self._hold(size)
        if self.decoder.buffered:
            if self.frame_since is None:
                self.frame_since = now
        else:
            self.frame_since = None
        self._claim_partial()

    def _hold(self, delta: int) -> None:
        """Request bytes this connection holds changed; the pool counts them once pooled."""
        self._held += delta
        if self._pooled:
            self.memory.change(delta)

    def _claim_partial(self) -> None:
        """Claim pool bytes for the incomplete frame: its declared size once known (as Kafka
        allocates the whole buffer), else what is buffered. Without the room, wait. Nothing is
        claimed before SASL authentication, when frames are small (sasl.server.max.receive.size).
        """
        if not self._pooled:
            return
        decoder = self.decoder
        size = decoder.pending_frame_size
        memory = self.memory
        if size is None or self._granted:
            need = decoder.buffered if size is None else self._partial_claim
            ok = size is not None or memory.has_room()
        else:
            need = size + 4
            ok = memory.fits(self._partial_claim, need)
            if ok:
                self._granted = True
            else:
                need = decoder.buffered
        delta = need - self._partial_claim
        if delta:
            self._partial_claim = need
            self._hold(delta)
        if ok != (not self.waiting_memory):
            self.waiting_memory = not ok
            if ok:
                memory.forget(self)
            else:
                memory.wait(self)

    def retry_memory(self) -> bool:
        """Called by the pool when bytes were released; True once this connection fits."""
        if self.closed:
            return True
        self._claim_partial()
        if self.waiting_memory:
            return False
        self._on_memory()
        return True

    def update_reading(self, now: float) -> bool | None:
        """Should the transport pause reading (True), resume it (False), or neither (None)?"""
        should_pause = self.draining or bool(self.backlog) or self.waiting_memory or self.blocked
        if should_pause and not self.reading_paused:
            self.reading_paused = True
            self.frame_since = None  # our pause: the client is not the one holding it up
            return True
        if not should_pause and self.reading_paused:
            self.reading_paused = False
            if self.decoder.buffered:
                self.frame_since = now
            return False
        return None

    # -- handling -----------------------------------------------------------------------------

    @property
    def blocked(self) -> bool:
        """Back-pressure: too many responses in progress or too many bytes unsent; a failed
        authentication waiting out its delay, after which nothing more is served; or a
        throttled client's mute."""
        if (
            self.writing_paused
            or len(self.queue) >= MAX_PENDING_RESPONSES
            or self.failing is not None
            or self.muted
        ):
            return True
        return self._unsent_bytes + self.sending_bytes >= MAX_QUEUED_RESPONSE_BYTES

    @property
    def has_work(self) -> bool:
        """Frames wait and the connection may take them."""
        return bool(self.backlog) and not self.blocked

    def take_frame(self) -> Frame:
        """The next frame: a large one is a read-only view of the buffer it was read into,
        except a bare SASL token (after SaslHandshake v0), which the mechanisms parse as
        bytes."""
        frame = self.backlog.popleft()
        session = self.session
        if session is not None and session.awaits_raw_token and not isinstance(frame, bytes):
            return bytes(frame)
        return frame

    def end_turn(self, handled: int, released: int) -> None:
        """``handled`` frames were handled, of which ``released`` bytes are no longer held."""
        self.handled += handled
        if released:
            self._hold(-released)
        if self._join_pool:
            self._join_pool, self._pooled = False, True
            if self._held:
                self.memory.change(self._held)

    def respond(self, correlation_id: int, flexible_header: bool, body: bytes | list[Any]) -> None:
        """An answer ready at once, queued behind those before it."""
        entry = Pending(correlation_id, flexible_header, body, True)
        if self.queue:  # behind another response: count what waits
            entry.unsent = _body_size(body)
            self._unsent_bytes += entry.unsent
        self.queue.append(entry)

    def respond_raw(self, token: bytes) -> None:
        """A bare size-prefixed SASL token (after SaslHandshake v0)."""
        entry = Pending(-1, False, token, True, raw=True)
        if self.queue:
            entry.unsent = len(token)
            self._unsent_bytes += entry.unsent
        self.queue.append(entry)

    def expect(self, correlation_id: int, flexible_header: bool, frame_bytes: int) -> Pending:
        """A request whose answer comes later; its frame stays held until then."""
        entry = Pending(correlation_id, flexible_header, frame_bytes=frame_bytes)
        self.queue.append(entry)
        return entry

    def complete(self, entry: Pending, body: bytes | list[Any] | None) -> None:
        """The answer of an expected request; it leaves after those before it."""
        entry.body = body
        entry.done = True
        if entry is not self.queue[0]:
            entry.unsent = _body_size(body)
            self._unsent_bytes += entry.unsent
        if entry.frame_bytes:
            self._hold(-entry.frame_bytes)
            entry.frame_bytes = 0

    def pop_response(self) -> list[Any] | None:
        """The next response in request order, framed (bytes, and FileSlice pieces of a
        Fetch), or None if the oldest is not answered yet. Empty: no response is due."""
        queue = self.queue
        if not queue or not queue[0].done:
            return None
        entry = queue.popleft()
        self._unsent_bytes -= entry.unsent
        body = entry.body
        if isinstance(body, list):
            size = sum(len(b) for b in body)
            return [response_prefix(entry.correlation_id, size, entry.flexible_header), *body]
        if entry.raw:
            assert isinstance(body, bytes)
            return [len(body).to_bytes(4, "big") + body]
        if body is None:
            return []
        return [frame_response(entry.correlation_id, body, entry.flexible_header)]

    # -- ending -------------------------------------------------------------------------------

    def close(self) -> None:
        """Nothing more is read or handled; the pool gets back what this connection held."""
        self.closed = True
        self.memory.forget(self)
        self.decoder.release()
        self._partial_claim = 0
        self._hold(-self._held)

    def drop(self) -> list[Pending]:
        """The connection is gone: forget every request and frame; those returned may still
        be running (the adapter cancels them)."""
        dropped = list(self.queue)
        for entry in dropped:
            if isinstance(entry.body, list):
                release_pieces(entry.body)
        self.queue.clear()
        self.backlog.clear()
        return dropped

    @property
    def idle(self) -> bool:
        return not self.queue and not self.backlog

    def timeout(self, now: float, read_timeout_s: float, idle_s: float) -> tuple[str, bool] | None:
        """Why the connection must close now (and whether that is routine), if it must: not
        authenticated in time, a partial request overdue, or idle (``idle_s`` < 0: never)."""
        if self.closed:
            return None
        deadline = self.auth_deadline
        if deadline is not None and now > deadline:
            return (
                f"not authenticated within {self.auth_timeout_s * 1000:.0f} ms "
                "(sasl.server.authentication.timeout.ms)",
                False,
            )
        since = self.frame_since
        if since is not None and now - since > read_timeout_s:
            size = self.decoder.pending_frame_size
            return (
                f"request not complete after {read_timeout_s * 1000:.0f} ms "
                f"(socket.request.read.timeout.ms): {self.decoder.buffered} of "
                f"{'?' if size is None else size + 4} bytes received",
                False,
            )
        if (
            idle_s >= 0
            and now - self.last_active > idle_s
            and not self.queue
            and not self.decoder.buffered
        ):
            return f"idle for more than {idle_s * 1000:.0f} ms (connections.max.idle.ms)", True
        return None


__all__ = [
    "MAX_PENDING_RESPONSES",
    "MAX_QUEUED_RESPONSE_BYTES",
    "PRE_AUTH_APIS",
    "ConnectionCore",
    "Pending",
    "RequestMemory",
    "release_pieces",
]
