"""A fault-injecting, Kafka-aware TCP proxy (``samsa proxy``; tests and ``samsa verify``).

Theory of operation
-------------------
The proxy listens on one address per upstream broker and forwards every accepted connection
to that broker. Both directions are read as Kafka frames (``int32 size`` + body), never as
raw bytes, so that every fault hits a whole request or response:

* ``drop_response_rate``: a response is swallowed after the broker executed the request and
  both connections are then reset. This is the lost acknowledgement: the broker wrote the
  batch (or committed the transaction), the client never learns it and must retry.
* ``reset_rate``: a request is swallowed and both connections reset before it reaches the
  broker; the client cannot tell this case from the previous one.
* ``delay_ms``: each frame is held for a random time in ``[0, delay_ms]`` before it is
  forwarded. A direction's frames stay in order (the forwarding task sleeps), as on TCP.

Two more modes break the broker on purpose, to show that a checker catches a broker that
lies (Produce only, acks other than 0):

* ``replay_rate``: the broker's answer to a Produce is replaced by an older answer to a
  Produce for the same partitions (its correlation id patched): the records are written,
  but the client is told the old offsets.
* ``fake_ack_rate``: a Produce is swallowed and answered with success at the offset the
  partition's next record would have had (as far as the proxy saw): acknowledged, never
  written. Only done when no other request of the connection awaits its answer, so that
  answers stay in order.

Resets abort the sockets (RST, not FIN), as a crashed peer or a middlebox would. The first
``grace_requests`` requests of each connection (the ApiVersions handshake) pass unharmed so
that every connection makes some progress however high the rates are; ``apis`` can restrict
the faults to some request types. All draws come from one ``random.Random(seed)``.

Requests are remembered per connection (api key, version, correlation id) so that each
response can be decoded. Metadata, FindCoordinator and DescribeCluster responses have their
broker addresses rewritten to proxy listeners: an address the proxy has not seen before gets
a new listener (on the same host as the first, an ephemeral port) forwarding to it, so every
connection a client makes stays behind the proxy whatever the broker advertises. An address
that is already one of the proxy's own listeners (a broker started with
``advertised.listeners`` pointing at the proxy) is left alone.

Produce requests are also parsed down to their record batch headers: a batch whose
(topic, partition, producer id, epoch, base sequence) was seen before is a retry, counted
in ``ProxyStats.produce_retries``, which tells a test that the retry paths really ran.

The proxy runs its own event loop in a daemon thread; :class:`FaultProxy` is a context
manager and everything it starts stops in :meth:`FaultProxy.stop`. Counters of what it did
are in :attr:`FaultProxy.stats`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import random
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from samsa.protocol.framing import (
    FrameError,
    frame_response,
    parse_request_header,
    peek_request_header,
    split_response,
)
from samsa.protocol.messages import (
    ApiKey,
    decode_request,
    decode_response,
    encode_response,
    is_flexible,
    make,
)
from samsa.testing._relay import SIZE, Relay, listening_socket, read_frame

log = logging.getLogger("samsa.proxy")

_REWRITTEN = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER})
# Record batch header: producer id at byte 43, epoch at 51, base sequence at 53.
_BATCH_IDS = struct.Struct(">qhi")
_BATCH_IDS_AT = 43
_LAST_DELTA_AT = 23  # lastOffsetDelta: records in the batch - 1


@dataclass
class Faults:
    """What the proxy does to traffic; rates are probabilities per frame."""

    drop_response_rate: float = 0.0
    reset_rate: float = 0.0
    delay_ms: float = 0.0
    grace_requests: int = 0
    apis: frozenset[int] | None = None  # None: every API is subject to faults
    replay_rate: float = 0.0  # Produce answers replaced by older ones (a lying broker)
    fake_ack_rate: float = 0.0  # Produces dropped but acknowledged (a lying broker)

    def validate(self) -> None:
        for name in ("drop_response_rate", "reset_rate", "replay_rate", "fake_ack_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {rate}")
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")
        if self.grace_requests < 0:
            raise ValueError(f"grace_requests must be >= 0, got {self.grace_requests}")


@dataclass
class ProxyStats:
    connections: int = 0
    requests: int = 0
    responses: int = 0
    dropped_responses: int = 0
    resets: int = 0
    delayed_frames: int = 0
    rewritten_responses: int = 0
    produce_retries: int = 0
    replayed_responses: int = 0
    faked_acks: int = 0
    upstream_failures: int = 0  # accepted connections whose broker could not be reached
    listeners: int = 0

    @property
    def faults(self) -> int:
        """Faults injected: lost responses, resets before the broker saw a request, and
        the lies (replayed answers, acknowledged drops)."""
        return self.dropped_responses + self.resets + self.replayed_responses + self.faked_acks

    def as_dict(self) -> dict[str, int]:
        d = dataclasses.asdict(self)
        d["faults"] = self.faults
        return d


@dataclass
class _Listener:
    upstream: tuple[str, int]
    sock: socket.socket
    server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])


@dataclass
class _Pending:
    api_key: int
    version: int
    correlation_id: int
    records: dict[tuple[str, int], int] | None = None  # Produce: records per partition


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    address: tuple[str, int]  # the broker's
    pending: collections.deque[_Pending] = field(default_factory=collections.deque)
    requests: int = 0


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a tuple; a clear ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


class FaultProxy(Relay):
    """Kafka-aware fault-injecting proxy; see the module docstring.

    ``upstream`` is the bootstrap broker (``(host, port)`` or ``"host:port"``), which may
    also be given to :meth:`start`. ``listen`` is the first listener's address; port 0 picks
    a free one, known as soon as the proxy is constructed (:attr:`port`, :attr:`address`).
    """

    def __init__(
        self,
        upstream: tuple[str, int] | str | None = None,
        *,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        faults: Faults | None = None,
        seed: int | None = None,
        track_produce: bool = True,
    ) -> None:
        super().__init__("samsa-proxy")
        self.faults = faults or Faults()
        self.faults.validate()
        self.stats = ProxyStats()
        self.track_produce = track_produce
        self._random = random.Random(seed)
        self._host = listen[0] if listen[0] not in ("", "0.0.0.0", "::") else "127.0.0.1"
        self._bind_host = listen[0]
        self._first = self._bind(listen[0], listen[1], None)
        self._listeners: dict[tuple[str, int], _Listener] = {}  # upstream -> listener
        self._own: set[tuple[str, int]] = {(self._host, self._first.port)}
        self._conns: set[_Conn] = set()
        self._seen_batches: set[tuple[str, int, int, int, int]] = set()
        # For the lying modes: the next offset of each partition as answers showed it, and
        # recent Produce answers by (version, partitions).
        self._next_offset: dict[tuple[str, int], int] = {}
        self._old_answers: dict[tuple[int, tuple[tuple[str, int], ...]], bytes] = {}
        if upstream is not None:
            self._set_upstream(upstream)

    # --- public API ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._first.port

    @property
    def address(self) -> str:
        """``host:port`` of the first listener: the bootstrap address for clients."""
        return f"{self._host}:{self.port}"

    @property
    def listeners(self) -> dict[str, str]:
        """Proxy address -> upstream address, for every listener."""
        return {
            f"{self._host}:{lst.port}": f"{lst.upstream[0]}:{lst.upstream[1]}"
            for lst in [self._first, *self._listeners.values()]
            if lst.upstream[1] >= 0
        }

    def start(self, upstream: tuple[str, int] | str | None = None) -> FaultProxy:
        if upstream is not None:
            self._set_upstream(upstream)
        if self._first.upstream[1] < 0:
            raise ValueError("the proxy needs an upstream broker address")
        self._start_serving(lambda: self._serve(self._first))
        return self

    def set_faults(
        self,
        *,
        drop_response_rate: float = 0.0,
        reset_rate: float = 0.0,
        delay_ms: float | None = None,
        replay_rate: float = 0.0,
        fake_ack_rate: float = 0.0,
    ) -> None:
        """Change the rates while running (all faults off when called without arguments)."""
        faults = dataclasses.replace(
            self.faults,
            drop_response_rate=drop_response_rate,
            reset_rate=reset_rate,
            delay_ms=self.faults.delay_ms if delay_ms is None else delay_ms,
            replay_rate=replay_rate,
            fake_ack_rate=fake_ack_rate,
        )
        faults.validate()
        self.faults = faults

    def reset_connections(self, upstream: tuple[str, int] | str | None = None) -> int:
        """Reset (RST) every open connection to broker ``upstream`` (to every broker when
        None), as a crashed broker or a middlebox would; returns how many. Clients must
        reconnect; the broker sees its peers vanish mid-conversation."""
        addr = parse_address(upstream) if isinstance(upstream, str) else upstream

        async def reset() -> int:
            hit = [c for c in self._conns if addr is None or c.address == addr]
            for c in hit:
                self._abort(c)
            self.stats.resets += len(hit)
            return len(hit)

        return self._call(reset())

    def __enter__(self) -> FaultProxy:
        return self

    # --- listeners -------------------------------------------------------------------------

    def _set_upstream(self, upstream: tuple[str, int] | str) -> None:
        addr = parse_address(upstream) if isinstance(upstream, str) else upstream
        self._first.upstream = addr
        self._listeners[addr] = self._first

    def _bind(self, host: str, port: int, upstream: tuple[str, int] | None) -> _Listener:
        sock = listening_socket(host, port)
        self.stats.listeners += 1
        return _Listener(upstream or ("", -1), sock)

    async def _serve(self, lst: _Listener) -> None:
        lst.server = await self._serve_socket(lst.sock, lambda r, w: self._handle(lst, r, w))

    async def _listener_for(self, upstream: tuple[str, int]) -> tuple[str, int]:
        """The proxy address clients must use to reach ``upstream``."""
        if upstream in self._own:
            return upstream  # already points at us
        lst = self._listeners.get(upstream)
        if lst is None:
            lst = self._bind(self._bind_host, 0, upstream)
            self._listeners[upstream] = lst
            self._own.add((self._host, lst.port))
            await self._serve(lst)
            log.info("proxy %s:%d -> %s:%d", self._host, lst.port, *upstream)
        return self._host, lst.port

    def _sockets(self) -> list[socket.socket]:
        return [lst.sock for lst in [self._first, *self._listeners.values()]]

    def _close(self) -> None:
        for lst in [self._first, *self._listeners.values()]:
            if lst.server is not None:
                lst.server.close()
        for c in list(self._conns):
            self._abort(c)

    # --- connections -----------------------------------------------------------------------

    def _faulty(self, conn: _Conn, api_key: int) -> bool:
        f = self.faults
        return conn.requests > f.grace_requests and (f.apis is None or api_key in f.apis)

    async def _delay(self) -> None:
        if self.faults.delay_ms > 0:
            self.stats.delayed_frames += 1
            await asyncio.sleep(self._random.uniform(0, self.faults.delay_ms) / 1000)

    def _abort(self, conn: _Conn) -> None:
        for w in (conn.client, conn.upstream):
            with contextlib.suppress(Exception):
                w.transport.abort()  # RST rather than FIN, as a crash would look
        self._conns.discard(conn)

    async def _handle(
        self, lst: _Listener, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
    ) -> None:
        self.stats.connections += 1
        try:
            ureader, uwriter = await asyncio.open_connection(*lst.upstream)
        except OSError:
            self.stats.upstream_failures += 1
            cwriter.transport.abort()
            return
        conn = _Conn(cwriter, uwriter, lst.upstream)
        self._conns.add(conn)
        tasks = [
            asyncio.ensure_future(self._upward(conn, creader)),
            asyncio.ensure_future(self._downward(conn, ureader)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            self._abort(conn)

    async def _upward(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        while True:
            frame = await read_frame(reader)
            if frame is None:
                return
            try:
                api_key, version, cid = peek_request_header(frame)
            except FrameError:
                return
            conn.requests += 1
            self.stats.requests += 1
            if self._faulty(conn, api_key) and self._random.random() < self.faults.reset_rate:
                self.stats.resets += 1
                return
            pending = _Pending(api_key, version, cid)
            if api_key == ApiKey.PRODUCE and (self.track_produce or self._lying()):
                req = self._track_produce(frame, version)
                if req is not None and req.acks != 0 and self._lying():
                    pending.records = _record_counts(req)
                    if (
                        not conn.pending
                        and self._faulty(conn, api_key)
                        and self._random.random() < self.faults.fake_ack_rate
                    ):
                        self.stats.faked_acks += 1
                        await self._delay()
                        conn.client.write(self._fake_ack(req, version, cid))
                        await conn.client.drain()
                        continue
            conn.pending.append(pending)
            await self._delay()
            conn.upstream.write(SIZE.pack(len(frame)) + frame)
            await conn.upstream.drain()

    async def _downward(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        while True:
            frame = await read_frame(reader)
            if frame is None:
                return
            req = _match(conn.pending, frame)
            if req is not None and req.api_key in _REWRITTEN:
                frame = await self._rewrite(req, frame)
            if req is not None and req.records is not None:
                frame = self._lie_about_produce(conn, req, frame)
            api_key = req.api_key if req is not None else -1
            if self._faulty(conn, api_key) and self._random.random() < (
                self.faults.drop_response_rate
            ):
                self.stats.dropped_responses += 1
                return
            await self._delay()
            self.stats.responses += 1
            conn.client.write(SIZE.pack(len(frame)) + frame)
            await conn.client.drain()

    def _lying(self) -> bool:
        return self.faults.replay_rate > 0 or self.faults.fake_ack_rate > 0

    def _fake_ack(self, req: Any, version: int, cid: int) -> bytes:
        """A whole frame answering ``req`` with success at each partition's next offset."""
        topics = []
        for topic in req.topic_data:
            parts = []
            for part in topic.partition_data:
                base = self._next_offset.get((_topic_key(topic), int(part.index)), 0)
                parts.append(
                    make(
                        ApiKey.PRODUCE,
                        version,
                        "PartitionProduceResponse",
                        index=part.index,
                        error_code=0,
                        base_offset=base,
                        log_append_time=None,  # -1 on the wire: CreateTime
                        log_start_offset=0,
                        record_errors=(),
                        error_message=None,
                    )
                )
            topics.append(
                make(
                    ApiKey.PRODUCE,
                    version,
                    "TopicProduceResponse",
                    name=getattr(topic, "name", None),
                    topic_id=getattr(topic, "topic_id", None),
                    partition_responses=tuple(parts),
                )
            )
        resp = make(ApiKey.PRODUCE, version, "ProduceResponse", responses=tuple(topics))
        body = encode_response(ApiKey.PRODUCE, version, resp)
        return frame_response(cid, body, is_flexible(ApiKey.PRODUCE, version))

    def _lie_about_produce(self, conn: _Conn, req: _Pending, frame: bytes) -> bytes:
        """Learn the partitions' next offsets from a Produce answer; maybe replay an old one."""
        assert req.records is not None
        try:
            _, offset = split_response(frame, is_flexible(ApiKey.PRODUCE, req.version))
            resp = decode_response(ApiKey.PRODUCE, req.version, frame, offset)
        except Exception:
            return frame
        for topic in resp.responses:
            for part in topic.partition_responses:
                tp = (_topic_key(topic), int(part.index))
                if int(part.error_code) == 0 and part.base_offset >= 0 and tp in req.records:
                    self._next_offset[tp] = int(part.base_offset) + req.records[tp]
        key = (req.version, tuple(sorted(req.records)))
        old = self._old_answers.get(key)
        self._old_answers[key] = frame
        if (
            old is not None
            and self._faulty(conn, ApiKey.PRODUCE)
            and self._random.random() < self.faults.replay_rate
        ):
            self.stats.replayed_responses += 1
            self._old_answers[key] = old  # keep the stale one: replay it again later
            return frame[:4] + old[4:]  # the current correlation id, the old answer
        return frame

    def _track_produce(self, frame: bytes, version: int) -> Any:
        try:
            flexible = is_flexible(ApiKey.PRODUCE, version)
            offset = _request_body_offset(frame, flexible)
            req = decode_request(ApiKey.PRODUCE, version, frame, offset)
        except Exception:  # not ours to judge: the broker answers malformed requests
            return None
        if not self.track_produce:
            return req
        for topic in req.topic_data:
            for part in topic.partition_data:
                records = part.records
                if not records or len(records) < _BATCH_IDS_AT + _BATCH_IDS.size:
                    continue
                pid, epoch, seq = _BATCH_IDS.unpack_from(records, _BATCH_IDS_AT)
                if pid < 0:
                    continue
                key = (_topic_key(topic), int(part.index), pid, epoch, seq)
                if key in self._seen_batches:
                    self.stats.produce_retries += 1
                else:
                    self._seen_batches.add(key)
        return req

    async def _rewrite(self, req: _Pending, frame: bytes) -> bytes:
        flexible = is_flexible(req.api_key, req.version)
        try:
            cid, offset = split_response(frame, flexible)
            resp = decode_response(req.api_key, req.version, frame, offset)
            resp = await self._rewrite_entity(req.api_key, resp)
            body = encode_response(req.api_key, req.version, resp)
        except Exception as exc:  # an undecodable response goes through as it came
            log.warning("cannot rewrite %s v%d response: %s", req.api_key, req.version, exc)
            return frame
        self.stats.rewritten_responses += 1
        return frame_response(cid, body, flexible)[4:]

    async def _rewrite_entity(self, api_key: int, resp: Any) -> Any:
        async def moved(host: str, port: int) -> tuple[str, int]:
            if not host or port < 0:
                return host, port  # no coordinator (an error response)
            return await self._listener_for((host, int(port)))

        if api_key in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
            brokers = []
            for b in resp.brokers:
                host, port = await moved(b.host, b.port)
                brokers.append(dataclasses.replace(b, host=host, port=port))
            return dataclasses.replace(resp, brokers=tuple(brokers))
        if hasattr(resp, "coordinators"):  # FindCoordinator v4+
            coords = []
            for c in resp.coordinators:
                host, port = await moved(c.host, c.port)
                coords.append(dataclasses.replace(c, host=host, port=port))
            return dataclasses.replace(resp, coordinators=tuple(coords))
        host, port = await moved(resp.host, resp.port)
        return dataclasses.replace(resp, host=host, port=port)


def _match(pending: collections.deque[_Pending], frame: bytes) -> _Pending | None:
    """The request a response answers. Responses come in request order; requests that get
    no response (Produce with acks=0) are skipped over by correlation id."""
    if len(frame) < 4:
        return None
    (cid,) = struct.unpack_from(">i", frame, 0)
    if not any(p.correlation_id == cid for p in pending):
        return None
    while pending:
        p = pending.popleft()
        if p.correlation_id == cid:
            return p
    return None


def _topic_key(topic: Any) -> str:
    """A Produce request topic's name (v13 names it by id, KIP-516: the id's text)."""
    name = getattr(topic, "name", None)
    return str(name) if name is not None else str(topic.topic_id)


def _record_counts(req: Any) -> dict[tuple[str, int], int]:
    """Records per partition of a Produce request (one batch each: lastOffsetDelta + 1)."""
    out: dict[tuple[str, int], int] = {}
    for topic in req.topic_data:
        for part in topic.partition_data:
            records = part.records
            if records and len(records) >= _LAST_DELTA_AT + 4:
                (delta,) = struct.unpack_from(">i", records, _LAST_DELTA_AT)
                out[(_topic_key(topic), int(part.index))] = delta + 1
    return out


def _request_body_offset(frame: bytes, flexible: bool) -> int:
    return parse_request_header(frame, flexible).body_offset


def format_stats(stats: ProxyStats, keys: Iterable[str] | None = None) -> str:
    d = stats.as_dict()
    return " ".join(f"{k}={d[k]}" for k in (keys or d))
