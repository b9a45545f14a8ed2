"""Fetch responses sent from segment files (os.sendfile) are byte for byte the copied ones,
from several segments and with the segments evicted and closed while the send is under way;
pinned descriptors are released whatever happens to the connection."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from _certs import make_pki
from samsa.broker.config import BrokerConfig
from samsa.broker.handlers import fetch as fetch_handler
from samsa.broker.server import MAX_QUEUED_RESPONSE_BYTES, BrokerServer, KafkaConnection
from samsa.log.log import Log, LogConfig, release_chunks
from samsa.log.segment import SEGMENT_FILES, FileSlice
from samsa.protocol.framing import frame_request
from samsa.protocol.messages import ApiKey, encode_request
from samsa.protocol.records import NewRecord, build_batch, validate_produce_batch
from samsa.testing import fetch_request

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
# A Fetch reads one segment of a partition, as Kafka's: segments of 2 MiB make answers longer
# than MAX_QUEUED_RESPONSE_BYTES.
SEGMENT_BYTES = 2 * 1024 * 1024
BIG_BATCHES = 35  # ~100 KB each: ~3.5 MB, two segments


def _batch(records: int, value_size: int, tag: int) -> bytes:
    value = bytes([tag % 251]) * value_size
    return build_batch([NewRecord(value=value + b"%d" % i, timestamp=1) for i in range(records)])


def _run(
    tmp_path: Path,
    loop: str,
    body: Callable[[BrokerServer], Awaitable[None]],
    properties: dict[str, str] | None = None,
    **settings: Any,
) -> None:
    capacity = SEGMENT_FILES.capacity

    async def main() -> None:
        config = BrokerConfig(data_dir=tmp_path / "data", port=0, host="127.0.0.1",
                              log_segment_bytes=SEGMENT_BYTES, **settings)  # fmt: skip
        if properties:
            config = config.with_properties(properties).with_overrides(port=0).validate()
        server = BrokerServer(config)
        await server.start()
        try:
            broker = server.broker
            broker.create_topic("t", 2)
            big = broker.topics.get_partition("t", 0)
            small = broker.topics.get_partition("t", 1)
            assert big is not None and small is not None
            for i in range(BIG_BATCHES):  # batches past ZERO_COPY_MIN: sent from the file
                appended = broker.append(big, validate_produce_batch(_batch(50, 2000, i)))
                if isinstance(appended, asyncio.Future):  # checked in a worker thread
                    await appended
            for i in range(5):  # small batches: copied
                appended = broker.append(small, validate_produce_batch(_batch(3, 10, i)))
                if isinstance(appended, asyncio.Future):  # the loop's turn had no time left
                    await appended
            assert len(big.log._segments) >= 2
            await asyncio.wait_for(body(server), 60)
        finally:
            await server.stop()

    try:
        with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            runner.run(main())
    finally:
        SEGMENT_FILES.resize(capacity)


def _fetch_frame(
    offsets: dict[int, int], correlation_id: int = 7, partition_max_bytes: int = 10 << 20
) -> bytes:
    req = fetch_request({("t", p): o for p, o in offsets.items()}, max_wait_ms=0,
                        partition_max_bytes=partition_max_bytes)  # fmt: skip
    return frame_request(ApiKey.FETCH, 12, correlation_id, "t",
                         encode_request(ApiKey.FETCH, 12, req), True)  # fmt: skip


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that reads nothing until ``writer.transport.resume_reading()``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A small receive buffer: the broker's sendfile fills the socket and must wait.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 24)
    writer.transport.pause_reading()  # type: ignore[attr-defined]
    return reader, writer


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _server_conn(server: BrokerServer) -> KafkaConnection:
    (conn,) = server.limits.connections
    assert conn.transport is not None
    # Small kernel buffers on the broker's side too: the send stops early and stays stuck.
    conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return conn


async def _until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def _pins(server: BrokerServer) -> list[tuple[int, int]]:
    parts = [server.broker.topics.get_partition("t", p) for p in (0, 1)]
    return [(s._pins, len(s._orphan_fds)) for p in parts if p for s in p.log._segments]


@pytest.mark.parametrize("loop", list(LOOPS))
def test_sendfile_response_equals_the_copied_one(
    tmp_path: Path, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(server: BrokerServer) -> None:
        frames = [_fetch_frame({0: 0, 1: 0}), _fetch_frame({0: 1234, 1: 7}, 8)]
        reader, writer = await _connect(server.port)
        conn = _server_conn(server)
        assert conn.zero_copy
        writer.write(frames[0])
        # The response is stuck mid-way in sendfile: the client reads nothing yet.
        await _until(lambda: conn.writer.busy, "a response being sent")
        assert conn.writer.unsent > MAX_QUEUED_RESPONSE_BYTES  # counted until written
        assert conn.core.blocked
        pinned = any(isinstance(p, FileSlice) for p in conn.writer.pieces or ())
        assert pinned
        # Evict every segment file from the cache and close the rest as a deletion does:
        # pinned descriptors stay open until their slice is sent.
        SEGMENT_FILES.resize(1)
        for p in (0, 1):
            part = server.broker.topics.get_partition("t", p)
            assert part is not None
            for seg in part.log._segments:
                SEGMENT_FILES.close(seg)
        assert any(orphans for _, orphans in _pins(server))
        writer.transport.resume_reading()  # type: ignore[attr-defined]
        sent = [await _read_frame(reader)]
        writer.write(frames[1])
        sent.append(await _read_frame(reader))
        writer.close()
        assert _pins(server) == [(0, 0)] * len(_pins(server))

        monkeypatch.setattr(KafkaConnection, "sendfile_enabled", False)
        reader, writer = await _connect(server.port)
        await _until(lambda: len(server.limits.connections) == 1, "the old connection gone")
        assert not _server_conn(server).zero_copy
        writer.transport.resume_reading()  # type: ignore[attr-defined]
        copied = []
        for frame in frames:
            writer.write(frame)
            copied.append(await _read_frame(reader))
        writer.close()
        assert [len(f) for f in sent] == [len(f) for f in copied]
        assert sent == copied
        assert len(sent[0]) > MAX_QUEUED_RESPONSE_BYTES

    _run(tmp_path, loop, body)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_connection_lost_mid_send_releases_the_pins(tmp_path: Path, loop: str) -> None:
    async def body(server: BrokerServer) -> None:
        _reader, writer = await _connect(server.port)
        conn = _server_conn(server)
        writer.write(_fetch_frame({0: 0, 1: 0}))
        await _until(lambda: conn.writer.busy, "a response being sent")
        assert any(pins for pins, _ in _pins(server))
        writer.transport.abort()
        await _until(lambda: conn.closed and conn._out_fd < 0, "the connection closed")
        assert _pins(server) == [(0, 0)] * len(_pins(server))
        assert not server.limits.connections

    _run(tmp_path, loop, body)


def test_log_read_slices_equal_copied_bytes_and_unpin(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20), 1)  # four segments
    try:
        for i in range(BIG_BATCHES):
            assert log.append(validate_produce_batch(_batch(50, 2000, i)), 1).error == 0
        for offset in (0, 777, 1000):
            copied = log.read(offset, 1 << 30)
            sliced = log.read(offset, 1 << 30, zero_copy_min=1)
            assert len(sliced.chunks) == len(copied.chunks) > 1  # one per segment
            assert all(isinstance(c, FileSlice) for c in sliced.chunks)
            assert b"".join(c.read() for c in sliced.chunks) == b"".join(copied.chunks)
            assert sliced.size == copied.size
            assert all(seg._pins == 1 for seg in log._segments[-len(sliced.chunks) :])
            release_chunks(sliced.chunks)
            release_chunks(sliced.chunks)  # a second release is harmless
            assert all(seg._pins == 0 for seg in log._segments)
    finally:
        log.close(1)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_sendfile_waits_for_bytes_the_transport_buffered(
    tmp_path: Path, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copied response stuck in the transport's buffer, then one sent from the file: the
    # second must not overtake the first on the wire.
    async def body(server: BrokerServer) -> None:
        # The first stays under the transport's high-water mark: the second is handled.
        frames = [_fetch_frame({0: 0}, 1, 300_000), _fetch_frame({0: 500, 1: 0}, 2)]
        reader, writer = await _connect(server.port)
        conn = _server_conn(server)
        assert conn.transport is not None
        monkeypatch.setattr(fetch_handler, "ZERO_COPY_MIN", 1 << 40)  # copy this one
        writer.write(frames[0])
        await _until(lambda: conn.transport.get_write_buffer_size() > 0, "bytes buffered")
        monkeypatch.undo()
        writer.write(frames[1])
        await _until(lambda: conn.writer.busy, "a response being sent")
        writer.transport.resume_reading()  # type: ignore[attr-defined]
        sent = [await _read_frame(reader), await _read_frame(reader)]
        writer.close()

        monkeypatch.setattr(KafkaConnection, "sendfile_enabled", False)
        reader, writer = await _connect(server.port)
        await _until(lambda: len(server.limits.connections) == 1, "the old connection gone")
        writer.transport.resume_reading()  # type: ignore[attr-defined]
        copied = []
        for frame in frames:
            writer.write(frame)
            copied.append(await _read_frame(reader))
        writer.close()
        assert sent == copied

    _run(tmp_path, loop, body)


def test_a_client_that_stops_reading_is_closed_when_idle(tmp_path: Path) -> None:
    # A stuck send holds pinned descriptors: connections.max.idle.ms (no progress) bounds it.
    async def body(server: BrokerServer) -> None:
        _reader, writer = await _connect(server.port)
        conn = _server_conn(server)
        writer.write(_fetch_frame({0: 0, 1: 0}))
        await _until(lambda: conn.writer.busy, "a response being sent")
        assert any(pins for pins, _ in _pins(server))
        await _until(lambda: conn.closed, "the idle connection closed")
        await _until(lambda: conn._out_fd < 0, "its descriptor closed")
        assert _pins(server) == [(0, 0)] * len(_pins(server))
        writer.close()

    _run(tmp_path, "uvloop", body, connections_max_idle_ms=300)


def test_tls_connections_copy_and_answer_the_same_bytes(tmp_path: Path) -> None:
    # TLS must see every byte: no sendfile there, and the copied answer is the same.
    pki = make_pki(tmp_path / "pki")
    properties = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "ssl.keystore.location": str(pki.broker),
        "ssl.truststore.location": str(pki.ca),
    }

    async def body(server: BrokerServer) -> None:
        plain, tls = (e.sockets[0].getsockname()[1] for e in server.endpoints)
        frame = _fetch_frame({0: 0, 1: 0})
        answers = []
        for port, ctx in ((plain, None), (tls, ssl.create_default_context(cafile=str(pki.ca)))):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, limit=1 << 24
            )
            await _until(lambda: len(server.limits.connections) == 1, "the connection")
            (conn,) = server.limits.connections
            assert conn.zero_copy is (ctx is None)
            writer.write(frame)
            answers.append(await _read_frame(reader))
            writer.close()
            await _until(lambda: not server.limits.connections, "the connection gone")
        assert answers[0] == answers[1] and len(answers[0]) > MAX_QUEUED_RESPONSE_BYTES
        assert _pins(server) == [(0, 0)] * len(_pins(server))

    _run(tmp_path, "uvloop", body, properties)
