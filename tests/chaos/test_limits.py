"""Every resource a client can make the broker hold is bounded (issue 10 §3), seen from
outside: real broker processes, raw sockets on 127.0.0.1.

- a request whose first bytes arrived must complete in socket.request.read.timeout.ms;
- connections idle for connections.max.idle.ms are closed (not while a request waits);
- max.connections and max.connections.per.ip close new connections, one log line per interval;
- running out of file descriptors is a log line, and pending connections are served later;
- the soft descriptor limit is raised to the hard one; partitions need no descriptor each;
- a client pipelining Metadata requests without reading does not stall the others.
"""

from __future__ import annotations

import resource
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.framing import frame_request
from samsa.protocol.messages import ApiKey, encode_request, make_request
from samsa.protocol.records import NewRecord, build_batch, iter_batches
from samsa.testing import create_topic, fetch_request, produce_request

API_VERSIONS_V0 = frame_request(ApiKey.API_VERSIONS, 0, 7, "t", b"", False)


def _nofile(soft: int, hard: int) -> Callable[[], None]:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return set_limit


def _api_versions_ok(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Send ApiVersions v0 on a raw socket; True if the whole answer comes back."""
    sock.settimeout(timeout)

    def read(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionResetError("closed")
            data += chunk
        return data

    try:
        sock.sendall(API_VERSIONS_V0)
        (size,) = struct.unpack(">i", read(4))
        return struct.unpack(">i", read(size)[:4])[0] == 7
    except OSError:
        return False


def _closed_at_once(sock: socket.socket, timeout: float = 2.0) -> bool:
    """Send ApiVersions v0; True only if the broker closes the connection without a byte of
    answer within ``timeout`` (an answer, or silence, is False)."""
    sock.settimeout(timeout)
    try:
        sock.sendall(API_VERSIONS_V0)
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def _connect(port: int, source: str | None = None) -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", port), timeout=10, source_address=(source, 0) if source else None
    )


def test_half_sent_request_is_closed_after_the_read_timeout(broker_factory) -> None:  # type: ignore[no-untyped-def]
    b = broker_factory(overrides={"socket.request.read.timeout.ms": "500"}).start()
    # A request sent in pieces that completes in time is answered.
    with _connect(b.port) as s:
        for i in range(0, len(API_VERSIONS_V0), 4):
            s.sendall(API_VERSIONS_V0[i : i + 4])
            time.sleep(0.03)
        assert _api_versions_ok(s)  # (and the second one too)
    seen = len(b.log)
    with BlockingConnection("127.0.0.1", b.port) as c:
        c.send_bytes(API_VERSIONS_V0[:10])  # then nothing
        start = time.monotonic()
        assert c.is_closed_by_peer(timeout=5)
        assert 0.4 < time.monotonic() - start < 3
    line = b.wait_for_log("socket.request.read.timeout.ms", after=seen)
    assert line is not None and f"10 of {len(API_VERSIONS_V0)} bytes received" in line


def test_idle_connections_are_closed_but_not_while_a_request_waits(broker_factory) -> None:  # type: ignore[no-untyped-def]
    b = broker_factory(overrides={"connections.max.idle.ms": "500"}).start()
    with BlockingConnection("127.0.0.1", b.port) as c:
        assert create_topic(c, "quiet") == 0
        # A long poll three times the idle time: the connection waits for its response.
        start = time.monotonic()
        resp = c.request(ApiKey.FETCH, 12, fetch_request({("quiet", 0): 0}, max_wait_ms=1500))
        assert time.monotonic() - start >= 1.4
        assert int(resp.responses[0].partitions[0].error_code) == 0
        start = time.monotonic()
        assert c.is_closed_by_peer(timeout=5)  # then silence: closed
        assert 0.4 < time.monotonic() - start < 3
    assert b.wait_for_log("connections.max.idle.ms") is not None


def test_max_connections_refuses_new_ones_with_one_log_line(broker_factory) -> None:  # type: ignore[no-untyped-def]
    b = broker_factory(overrides={"max.connections": "3"}).start()
    good = [_connect(b.port) for _ in range(3)]
    try:
        assert all(_api_versions_ok(s) for s in good)
        for _ in range(20):
            with _connect(b.port) as s:
                assert _closed_at_once(s)
        refusals = [line for line in b.log if "refusing connection" in line]
        assert len(refusals) == 1 and "max.connections (3) reached" in refusals[0]
        good.pop().close()  # a slot frees: a new connection is served again
        deadline = time.monotonic() + 10
        while True:
            with _connect(b.port) as s:
                if _api_versions_ok(s, timeout=5):
                    break
            assert time.monotonic() < deadline
        assert all(_api_versions_ok(s) for s in good)
    finally:
        for s in good:
            s.close()


def test_max_connections_per_ip(broker_factory) -> None:  # type: ignore[no-untyped-def]
    b = broker_factory(overrides={"max.connections.per.ip": "2"}).start()
    mine = [_connect(b.port) for _ in range(2)]
    try:
        assert all(_api_versions_ok(s) for s in mine)
        with _connect(b.port) as s:
            assert _closed_at_once(s)
        line = b.wait_for_log("max.connections.per.ip (2) reached for 127.0.0.1")
        assert line is not None
        # Another address (all of 127/8 is loopback) has its own allowance.
        other = [_connect(b.port, source="127.0.0.2") for _ in range(2)]
        try:
            assert all(_api_versions_ok(s) for s in other)
        finally:
            for s in other:
                s.close()
    finally:
        for s in mine:
            s.close()


def test_connections_past_the_descriptor_budget_wait_and_are_served(broker_factory) -> None:  # type: ignore[no-untyped-def]
    b = broker_factory()
    b.preexec_fn = _nofile(64, 64)  # 32 for segment files, 16 in reserve: 16 connections
    b.start()
    # 90 connections: the broker accepts its 16, the rest wait in the listen backlog (uvloop's
    # own accept would take descriptors until EMFILE, then close pending ones unseen, and
    # requests needing a file, even a lazy import, would fail).
    socks = [_connect(b.port) for _ in range(90)]
    try:
        line = b.wait_for_log("not accepting connections: 16 are open", timeout=10)
        assert line is not None and "file descriptor limit (64)" in line
        assert all(_api_versions_ok(s) for s in socks[:16])
        for s in socks[:45]:
            s.close()
        for start in range(45, 90, 16):  # 16 at a time: each batch served, then closed
            batch = socks[start : start + 16]
            assert all(_api_versions_ok(s) for s in batch)
            for s in batch:
                s.close()
        assert sum("not accepting connections" in line for line in b.log) <= 2
        assert not b.log_contains("internal error")
    finally:
        for s in socks:
            s.close()


def test_soft_descriptor_limit_is_raised_to_the_hard_one(broker_factory) -> None:  # type: ignore[no-untyped-def]
    b = broker_factory()
    b.preexec_fn = _nofile(256, 4096)
    b.start()
    assert b.proc is not None
    limits = Path(f"/proc/{b.proc.pid}/limits").read_text()
    row = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    assert row.split()[3:5] == ["4096", "4096"]
    assert b.log_contains("limit 4096: up to 2048 segment files and 1536 connections")


def _produce_everywhere(c: BlockingConnection, topic: str, n: int, value: bytes) -> None:
    batch = build_batch([NewRecord(value, timestamp=int(time.time() * 1000))])
    req = produce_request({(topic, i): batch for i in range(n)}, acks=1)
    resp = c.request(ApiKey.PRODUCE, 9, req)
    codes = [int(p.error_code) for t in resp.responses for p in t.partition_responses]
    assert codes == [0] * n


def test_partitions_need_no_descriptor_each(broker_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Scaled from 10,000 partitions under a limit of 1,024 (checked by hand: see the
    # benchmarks README): 500 partitions under 50 descriptors, through a restart.
    parts = 500
    b = broker_factory(tmp_path / "many")
    b.preexec_fn = _nofile(50, 50)
    b.start()
    with BlockingConnection("127.0.0.1", b.port, timeout=120) as c:
        assert create_topic(c, "many", parts) == 0
        _produce_everywhere(c, "many", parts, b"one")
    # A clean stop fsyncs every partition's files in turn (seconds on a loaded machine).
    assert b.stop(timeout=120) == 0
    b.start()
    with BlockingConnection("127.0.0.1", b.port, timeout=120) as c:
        _produce_everywhere(c, "many", parts, b"two")
        resp = c.request(
            ApiKey.FETCH,
            12,
            fetch_request({("many", i): 0 for i in range(parts)}, max_bytes=1 << 30),
        )
    partitions = [p for t in resp.responses for p in t.partitions]
    assert len(partitions) == parts
    for p in partitions:
        assert int(p.error_code) == 0 and int(p.high_watermark) == 2
        assert len(list(iter_batches(p.records))) == 2
    assert not b.log_contains("Too many open files")
    b.kill()  # a clean shutdown of 500 partitions is seconds of fsyncs, and checked above


def test_a_pipelining_client_that_does_not_read_stalls_no_one(broker_factory) -> None:  # type: ignore[no-untyped-def]
    b = broker_factory().start()
    with BlockingConnection("127.0.0.1", b.port) as c:
        assert create_topic(c, "wide", 100) == 0
    request = encode_request(
        ApiKey.METADATA, 1, make_request(ApiKey.METADATA, 1, "MetadataRequest", topics=None)
    )
    frames = memoryview(frame_request(ApiKey.METADATA, 1, 1, "f", request, False) * 100_000)
    flood = _connect(b.port)
    flood.setblocking(False)
    stop = threading.Event()

    def pump() -> None:  # sends what the broker takes, never reads
        sent = 0
        while sent < len(frames) and not stop.is_set():
            try:
                sent += flood.send(frames[sent : sent + (1 << 20)])
            except BlockingIOError:
                time.sleep(0.01)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)
        worst = 0.0
        with BlockingConnection("127.0.0.1", b.port) as c:
            for _ in range(10):
                start = time.monotonic()
                try:
                    c.request(ApiKey.API_VERSIONS, 0, make_request(
                        ApiKey.API_VERSIONS, 0, "ApiVersionsRequest"))  # fmt: skip
                except ConnectionClosed:
                    raise AssertionError("the broker closed a well-behaved client") from None
                worst = max(worst, time.monotonic() - start)
                time.sleep(0.05)
        # Before the limits: up to the whole flood's work (seconds); now about one turn.
        assert worst < 1.0, worst
    finally:
        stop.set()
        thread.join(10)
        flood.close()


def test_a_stopping_broker_answers_what_it_has_read(broker) -> None:  # type: ignore[no-untyped-def]
    # SIGTERM while a long-poll Fetch waits: the client gets its (empty) answer, not a reset;
    # a Produce sent (on another open connection) after the stop began is not read: never
    # answered, and not in the log when the broker comes back.
    with (
        BlockingConnection("127.0.0.1", broker.port, timeout=10) as c,
        BlockingConnection("127.0.0.1", broker.port, timeout=10) as late,
    ):
        assert create_topic(c, "quiet") == 0
        cid = c.send(ApiKey.FETCH, 12, fetch_request({("quiet", 0): 0}, max_wait_ms=1000))
        time.sleep(0.3)  # read by the broker, waiting for data
        broker.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # the stop began: the broker drains, reading no more
        batch = build_batch([NewRecord(b"late", timestamp=int(time.time() * 1000))])
        late_cid = late.send(ApiKey.PRODUCE, 9, produce_request({("quiet", 0): batch}, acks=1))
        resp = c.receive(ApiKey.FETCH, 12, cid)
        part = resp.responses[0].partitions[0]
        assert (int(part.error_code), part.high_watermark) == (0, 0)
        try:
            late.receive(ApiKey.PRODUCE, 9, late_cid)
            raise AssertionError("a Produce sent after the stop began was answered")
        except (ConnectionClosed, ConnectionResetError):
            pass  # closed unanswered (a timeout would raise)
    assert broker.proc.wait(20) == 0
    broker.start()
    with BlockingConnection("127.0.0.1", broker.port, timeout=10) as c:
        resp = c.request(ApiKey.FETCH, 12, fetch_request({("quiet", 0): 0}))
    assert int(resp.responses[0].partitions[0].high_watermark) == 0
