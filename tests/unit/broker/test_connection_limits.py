"""What one connection can make the broker hold: frames per turn, pending responses, unsent
response bytes, and the broker-wide request memory (queued.max.request.bytes).

The broker runs in-process; most tests drive :class:`KafkaConnection` through a fake
transport so that what was handled, paused and written is exact, the memory test uses real
sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.broker.server import (
    MAX_PENDING_RESPONSES,
    MAX_QUEUED_RESPONSE_BYTES,
    BrokerServer,
    KafkaConnection,
    RequestMemory,
)
from samsa.protocol.framing import FrameDecoder, frame_request, split_response, uvarint
from samsa.protocol.messages import ApiKey, decode_response, encode_request, make_request
from samsa.protocol.records import NewRecord, build_batch, validate_produce_batch
from samsa.testing import fetch_request, produce_request

API_VERSIONS_V0 = frame_request(ApiKey.API_VERSIONS, 0, 1, "t", b"", False)


class FakeTransport:
    """Records writes and pauses; like asyncio's, calls pause_writing above the high mark
    (the peer never reads, so nothing drains unless the test says so)."""

    def __init__(self) -> None:
        self.protocol: KafkaConnection | None = None
        self.written = bytearray()
        self.high = 64 * 1024
        self.reading = True
        self.aborted = False
        self._write_paused = False

    def writelines(self, pieces: list[bytes]) -> None:
        for p in pieces:
            self.written += p
        if len(self.written) > self.high and not self._write_paused:
            self._write_paused = True
            assert self.protocol is not None
            self.protocol.pause_writing()

    def drain(self) -> None:
        self.written.clear()
        if self._write_paused:
            self._write_paused = False
            assert self.protocol is not None
            self.protocol.resume_writing()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high if high is not None else self.high

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


def _connect(broker: Broker) -> tuple[KafkaConnection, FakeTransport]:
    conn = KafkaConnection(broker)
    transport = FakeTransport()
    transport.protocol = conn
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def _responses(data: bytes | bytearray) -> int:
    return len(FrameDecoder(1 << 30).feed(bytes(data)))


def _run(tmp_path: Path, body: Callable[[Broker], Awaitable[None]], **settings: Any) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path / "data", **settings))
        broker.start()
        try:
            await asyncio.wait_for(body(broker), 30)
        finally:
            broker.close()

    asyncio.run(main())


def test_one_turn_per_connection_then_the_others(tmp_path: Path) -> None:
    # 1,000 pipelined requests arrive in one read on each of two connections: each turn
    # handles at most MAX_PENDING_RESPONSES of them (or TURN_S of work), then the other
    # connection has its turn.
    async def body(broker: Broker) -> None:
        a, ta = _connect(broker)
        b, tb = _connect(broker)
        a.data_received(API_VERSIONS_V0 * 1000)
        assert 0 < a.core.handled <= MAX_PENDING_RESPONSES
        assert not ta.reading  # the rest waits decoded; nothing more is read meanwhile
        b.data_received(API_VERSIONS_V0 * 1000)
        assert 0 < b.core.handled <= MAX_PENDING_RESPONSES
        turns = 0
        while a.core.handled < 1000 or b.core.handled < 1000:
            before = (a.core.handled, b.core.handled)
            await asyncio.sleep(0)  # one loop iteration: one turn each
            turns += 1
            assert a.core.handled - before[0] <= MAX_PENDING_RESPONSES
            if a.core.handled < 1000 and b.core.handled < 1000:
                assert a.core.handled > before[0] and b.core.handled > before[1]
        assert turns >= 1000 // MAX_PENDING_RESPONSES
        assert _responses(ta.written) == _responses(tb.written) == 1000
        assert ta.reading and tb.reading

    _run(tmp_path, body)


def test_one_turn_per_connection_also_without_responses(tmp_path: Path) -> None:
    # acks=0 produce requests get no response, so only the turn limit stops a flood of them.
    async def body(broker: Broker) -> None:
        broker.create_topic("t", 1)
        request = encode_request(
            ApiKey.PRODUCE,
            9,
            produce_request({("t", 0): build_batch([NewRecord(b"x", timestamp=1)])}, acks=0),
        )
        frame = frame_request(ApiKey.PRODUCE, 9, 1, "t", request, True)
        conn, transport = _connect(broker)
        conn.data_received(frame * 1000)
        assert 0 < conn.core.handled <= MAX_PENDING_RESPONSES and not transport.reading
        partition = broker.topics.get_partition("t", 0)
        assert partition is not None
        # A loaded machine spends a turn's inline check budget: the rest are checked by the
        # workers (Broker.append), and appended once their check is back.
        while conn.core.handled < 1000 or partition.append_tail is not None:
            await asyncio.sleep(0.001)
        assert partition.log.log_end_offset == 1000
        assert transport.reading and not transport.written

    _run(tmp_path, body)


def test_a_turn_ends_after_its_time(tmp_path: Path) -> None:
    # Metadata of 150 partitions costs far more than TURN_S / 64: a turn ends after a few.
    async def body(broker: Broker) -> None:
        broker.create_topic("big", 150)
        request = encode_request(
            ApiKey.METADATA, 1, make_request(ApiKey.METADATA, 1, "MetadataRequest", topics=None)
        )
        conn, transport = _connect(broker)
        conn.data_received(frame_request(ApiKey.METADATA, 1, 1, "t", request, False) * 200)
        assert 0 < conn.core.handled < 64 and not transport.reading
        answered = 0
        while answered < 200:
            await asyncio.sleep(0)
            answered += _responses(transport.written)
            transport.drain()  # the client reads its responses
        assert conn.core.handled == 200

    _run(tmp_path, body)


def test_pending_responses_stop_decoding_until_they_complete(tmp_path: Path) -> None:
    # Long-polling fetches stay pending: at MAX_PENDING_RESPONSES of them the connection
    # takes no more frames and stops reading, until responses complete.
    async def body(broker: Broker) -> None:
        broker.create_topic("t", 1)
        conn, transport = _connect(broker)
        fetch = encode_request(ApiKey.FETCH, 12, fetch_request({("t", 0): 0}, max_wait_ms=20_000))
        frames = b"".join(frame_request(ApiKey.FETCH, 12, i, "t", fetch, True) for i in range(200))
        conn.data_received(frames)
        deadline = time.monotonic() + 10  # turns take long on a loaded machine
        while conn.core.handled < MAX_PENDING_RESPONSES and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # and then no more are taken
        assert conn.core.handled == MAX_PENDING_RESPONSES
        assert len(conn.core.backlog) == 200 - MAX_PENDING_RESPONSES
        assert not transport.reading
        partition = broker.topics.get_partition("t", 0)
        assert partition is not None
        batch = validate_produce_batch(build_batch([NewRecord(b"x", timestamp=1)]))
        broker.append(partition, batch)  # every waiting fetch completes
        for _ in range(200):
            if _responses(transport.written) == 200:
                break
            await asyncio.sleep(0.01)
        assert conn.core.handled == 200 and _responses(transport.written) == 200
        assert transport.reading

    _run(tmp_path, body)


def test_a_client_that_does_not_read_its_responses_is_paused(tmp_path: Path) -> None:
    # 20,000 pipelined requests, responses never read: once the unsent responses pass
    # MAX_QUEUED_RESPONSE_BYTES the connection stops handling and reading.
    async def body(broker: Broker) -> None:
        conn, transport = _connect(broker)
        conn.data_received(API_VERSIONS_V0 * 20_000)
        for _ in range(1000):
            await asyncio.sleep(0)
        turn = MAX_PENDING_RESPONSES * 1024  # an ApiVersions response is < 1 KiB
        assert (
            MAX_QUEUED_RESPONSE_BYTES < len(transport.written) < (MAX_QUEUED_RESPONSE_BYTES + turn)
        )
        held = conn.core.handled
        assert held < 20_000 and not transport.reading
        transport.drain()  # the client reads: handling resumes where it stopped
        for _ in range(10):
            await asyncio.sleep(0)
        assert conn.core.handled > held

    _run(tmp_path, body)


def test_request_memory_rules() -> None:
    mem = RequestMemory(16_000)
    assert mem.fits(0, 20_000)  # alone, even a frame larger than the pool
    mem.change(10_000)
    assert not mem.fits(0, 6_000)  # big frames leave the last sixteenth for small ones
    assert mem.fits(0, 1_000)
    assert mem.fits(10_000, 15_000)  # what the asker holds itself does not count
    mem.change(5_900)
    assert mem.has_room() and not mem.fits(0, 1_000)
    mem.change(100)
    assert not mem.has_room()
    unbounded = RequestMemory(-1)
    unbounded.change(10**12)
    assert unbounded.fits(0, 10**9) and unbounded.has_room()


def _big_api_versions(size: int, correlation_id: int) -> bytes:
    """A valid ApiVersions v3 request of about ``size`` bytes (a long software name)."""
    name = b"a" * (size - 64)
    body = uvarint(len(name) + 1) + name + uvarint(2) + b"1" + b"\x00"
    return frame_request(ApiKey.API_VERSIONS, 3, correlation_id, "t", body, True)


def test_queued_max_request_bytes_bounds_half_sent_frames(tmp_path: Path) -> None:
    limit = 8 << 20
    frame_size = 4 << 20

    async def body(server: BrokerServer) -> None:
        memory = server.limits.memory
        port = server.port
        frames = [_big_api_versions(frame_size - 100, i) for i in range(6)]
        # Six clients each send all of a 4 MB request but its last byte, then stall.
        attackers = []
        for frame in frames:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(frame[:-1])
            attackers.append((reader, writer))
        conns: list[KafkaConnection] = []
        for _ in range(200):
            await asyncio.sleep(0.02)
            conns = list(server.limits.connections)
            if len(conns) == 6 and any(
                c.core.decoder.buffered == len(frames[0]) - 1 for c in conns
            ):
                break
        await asyncio.sleep(0.2)
        buffered = sum(c.core.decoder.buffered for c in conns)
        assert memory.used <= limit and memory.peak <= limit
        assert buffered <= limit  # without the limit: 6 x 4 MB
        assert sum(c.core.waiting_memory for c in conns) >= 4
        # A small request from another client still gets through.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(API_VERSIONS_V0)
        frame = await _read_frame(reader)
        assert split_response(frame, False)[0] == 1
        writer.close()
        # Completing the frames frees their memory: every attacker is answered in turn.
        for i, (_reader, writer) in enumerate(attackers):
            writer.write(frames[i][-1:])
        for i, (reader, _writer) in enumerate(attackers):
            frame = await _read_frame(reader)
            assert split_response(frame, False)[0] == i
        assert memory.peak <= limit
        for _reader, writer in attackers:
            writer.close()

    async def main() -> None:
        config = BrokerConfig(
            data_dir=tmp_path / "data",
            port=0,
            socket_request_max_bytes=frame_size,
            queued_max_request_bytes=limit,
        )
        server = BrokerServer(config)
        await server.start()
        try:
            await asyncio.wait_for(body(server), 60)
        finally:
            await server.stop()

    asyncio.run(main())


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def test_a_throttled_client_is_answered_at_once_then_muted(tmp_path: Path) -> None:
    # KIP-219: a Produce over its client id's producer_byte_rate is answered at once with
    # throttle_time_ms; then nothing more is read or handled from the connection (the
    # ApiVersions behind it waits) until that time has passed.
    async def body(broker: Broker) -> None:
        broker.create_topic("t", 1)
        request = encode_request(
            ApiKey.PRODUCE,
            9,
            produce_request({("t", 0): build_batch([NewRecord(b"x", timestamp=1)])}, acks=1),
        )
        frame = frame_request(ApiKey.PRODUCE, 9, 1, "t", request, True)
        # One window of 1 s: the frame's bytes are 1.2 times the bound, 200 ms of throttle.
        broker.quotas.alter([((("client-id", "t"),), {"producer_byte_rate": len(frame) / 1.2})])
        conn, transport = _connect(broker)
        conn.data_received(frame + API_VERSIONS_V0)
        assert conn.core.handled == 1 and not transport.reading
        (answer,) = FrameDecoder(1 << 30).feed(bytes(transport.written))
        _cid, offset = split_response(answer, True)
        throttle = decode_response(ApiKey.PRODUCE, 9, answer, offset).throttle_time
        assert 150 <= throttle.total_seconds() * 1000 <= 250
        await asyncio.sleep(0.1)
        assert conn.core.handled == 1  # still muted
        await asyncio.sleep(throttle.total_seconds())
        assert conn.core.handled == 2 and transport.reading
        assert _responses(transport.written) == 2

    _run(tmp_path, body, quota_window_num=2, quota_window_size_seconds=1)
