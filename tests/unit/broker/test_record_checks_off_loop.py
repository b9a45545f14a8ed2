"""Broker.append: a batch whose records inflate past what the event loop may check in one
turn is checked in a worker thread while the loop goes on, a small one on the loop, and
appends to a partition still happen in the order they arrived. ListOffsets by time searches
compressed or large batches in a worker too."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from samsa.broker import broker as broker_module
from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.log.log import AppendResult
from samsa.log.segment import TimestampProbe
from samsa.protocol.errors import ErrorCode
from samsa.protocol.record_check import RecordChecker
from samsa.protocol.records import (
    HEADER_SIZE,
    Compression,
    NewRecord,
    build_batch,
    validate_produce_batch,
    with_records_section,
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig(data_dir=tmp_path))
    b.start()
    b.create_topic("t", 2)
    yield b
    b.close()


class _HeldCheck:
    """check_client_batch, held in its thread until released if the batch is compressed;
    records where it ran."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.threads: list[str] = []
        self.release = threading.Event()

    def __call__(self, *args: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        if args[0].compression:
            assert self.release.wait(10)
        return self.real(*args)


def _batch(value: bytes, codec: int = Compression.NONE) -> Any:
    return validate_produce_batch(
        build_batch([NewRecord(value=value, key=b"k")], compression=codec, now_ms=1)
    )


async def _loop_runs_while_held(held: asyncio.Future[Any]) -> None:
    """The loop keeps turning (five sleeps) while the work behind ``held`` is held."""
    ticks = 0
    for _ in range(5):
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 5 and not held.done()


_BIG = 300_000  # inflated bytes: more than the loop checks (_INLINE_INFLATE_BYTES)


def test_a_compressed_batch_inflating_past_the_inline_share_is_checked_off_the_loop(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _HeldCheck(broker_module.check_client_batch)
    monkeypatch.setattr(broker_module, "check_client_batch", held)

    async def body() -> None:
        part = broker.topics.get_partition("t", 0)
        assert part is not None
        appended = broker.append(part, _batch(b"z" * _BIG, Compression.GZIP))
        assert isinstance(appended, asyncio.Future)
        await _loop_runs_while_held(appended)
        held.release.set()
        result = await asyncio.wait_for(appended, 10)
        assert (result.error, result.base_offset) == (0, 0)

    asyncio.run(body())
    assert held.threads and all(name.startswith("samsa-check") for name in held.threads)


def test_appends_to_a_partition_keep_their_arrival_order(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small uncompressed batch arriving while a compressed one is being checked waits for
    it; another partition's does not."""
    held = _HeldCheck(broker_module.check_client_batch)
    monkeypatch.setattr(broker_module, "check_client_batch", held)

    async def body() -> None:
        p0 = broker.topics.get_partition("t", 0)
        p1 = broker.topics.get_partition("t", 1)
        assert p0 is not None and p1 is not None
        first = broker.append(p0, _batch(b"f" * _BIG, Compression.ZSTD))
        second = broker.append(p0, _batch(b"second"))
        await asyncio.sleep(0)  # a new turn: the first one's attempt on the loop spent this one
        elsewhere = broker.append(p1, _batch(b"elsewhere"))
        assert isinstance(elsewhere, AppendResult) and elsewhere.base_offset == 0
        assert isinstance(first, asyncio.Future) and isinstance(second, asyncio.Future)
        await asyncio.sleep(0.05)
        assert not second.done()  # its own check is done; the earlier one's is not
        held.release.set()
        one, two = await asyncio.wait_for(asyncio.gather(first, second), 10)
        assert (one.base_offset, two.base_offset) == (0, 1)
        assert p0.append_tail is None

    asyncio.run(body())


class _SlowClock:
    """The broker's clock, each reading ``step`` ns after the last: every check "takes" that."""

    def __init__(self, step: int) -> None:
        self.now = 0
        self.step = step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


def test_the_event_loop_checks_for_a_bounded_time_each_turn(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small batches, compressed or not, are checked on the loop (a thread hand-off costs
    more than their check) until the checks of this turn took _INLINE_TURN_NS (a request of
    many partitions cannot hold the loop); the rest go to the workers in one hand-off (two
    workers drain them: a hand-off per batch cost more than a small batch's check), and all
    are appended in order. A new turn checks on the loop again."""
    from samsa.broker.broker import _INLINE_TURN_NS

    held = _HeldCheck(broker_module.check_client_batch)
    held.release.set()
    monkeypatch.setattr(broker_module, "check_client_batch", held)
    monkeypatch.setattr(broker_module, "_clock", _SlowClock(_INLINE_TURN_NS // 3 + 1))
    executor = broker._checkers
    handed: list[object] = []

    def submit(fn: Any, *args: Any) -> Any:
        handed.append(fn)
        return type(executor).submit(executor, fn, *args)

    monkeypatch.setattr(executor, "submit", submit)

    async def body() -> None:
        part = broker.topics.get_partition("t", 0)
        assert part is not None
        batches = [_batch(bytes([i]) * 30_000, Compression.GZIP) for i in range(5)]
        batches += [_batch(bytes([i]) * 30_000) for i in range(5)]
        appended = [broker.append(part, b) for b in batches]  # one turn of the loop
        inline = [a for a in appended if isinstance(a, AppendResult)]
        assert len(inline) == 3  # each check "takes" a third of the turn
        assert all(isinstance(a, asyncio.Future) for a in appended[3:])
        results = [a if isinstance(a, AppendResult) else await a for a in appended]
        assert [r.base_offset for r in results] == list(range(10))
        assert len(held.threads) == 7 and len(handed) == 2  # 7 checks, 2 hand-offs
        await asyncio.sleep(0)  # a new turn: the loop checks again
        assert isinstance(broker.append(part, _batch(b"later", Compression.GZIP)), AppendResult)
        assert isinstance(broker.append(part, _batch(b"later")), AppendResult)

    asyncio.run(body())


def test_a_batch_inflating_past_the_inline_share_is_left_to_a_worker(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small compressed batch whose records inflate past _INLINE_INFLATE_BYTES stops being
    read on the loop there (a bomb costs the loop that much, not message.max.inflated.bytes)
    and is checked by a worker; one the codec cannot read is refused on the loop."""
    from samsa.broker.broker import _INLINE_INFLATE_BYTES

    held = _HeldCheck(broker_module.check_client_batch)
    held.release.set()
    monkeypatch.setattr(broker_module, "check_client_batch", held)

    async def body() -> None:
        part = broker.topics.get_partition("t", 0)
        assert part is not None
        small = _batch(b"s" * (_INLINE_INFLATE_BYTES - 100), Compression.ZSTD)
        big = _batch(b"b" * (_INLINE_INFLATE_BYTES + 100), Compression.ZSTD)
        assert isinstance(broker.append(part, small), AppendResult)
        assert not held.threads
        appended = broker.append(part, big)
        assert isinstance(appended, asyncio.Future)
        assert (await appended).base_offset == 1 and len(held.threads) == 1
        good = _batch(b"x" * 1000, Compression.GZIP)
        body = bytes(good.buf)[HEADER_SIZE:-8] + bytes(8)  # a gzip trailer that is wrong
        broken = with_records_section(good, Compression.GZIP, body)
        refused = broker.append(part, validate_produce_batch(broken))
        assert isinstance(refused, AppendResult)
        assert refused.error == ErrorCode.UNKNOWN_SERVER_ERROR

    asyncio.run(body())


def test_an_uncompressed_batch_is_checked_on_the_loop_while_its_reading_is_cheap(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An uncompressed batch has nothing to inflate: however large, it is checked on the loop
    while its records are laid out alike (a thread hand-off costs more than such a check), or
    of any layout if the C record walker reads them (a 32nd of numpy's cost a byte), and left
    to a worker once numpy's reading them one by one would take more than the loop's share."""
    import random

    held = _HeldCheck(broker_module.check_client_batch)
    held.release.set()
    monkeypatch.setattr(broker_module, "check_client_batch", held)
    rng = random.Random(27)
    alike = [NewRecord(value=b"%090d" % i) for i in range(5_000)]
    varied = [NewRecord(value=rng.randbytes(rng.randrange(180))) for _ in range(5_000)]

    async def body() -> None:
        part = broker.topics.get_partition("t", 0)
        assert part is not None
        uniform = broker.append(part, validate_produce_batch(build_batch(alike, now_ms=1)))
        assert isinstance(uniform, AppendResult) and uniform.error == 0
        base = 5_000
        if RecordChecker.walk is not None:
            await asyncio.sleep(0)  # a new turn of the loop, with its whole share for checks
            walked = broker.append(part, validate_produce_batch(build_batch(varied, now_ms=1)))
            assert isinstance(walked, AppendResult) and walked.base_offset == base
            base += 5_000
        assert not held.threads  # the loop's check is try_client_batch
        monkeypatch.setattr(RecordChecker, "walk", None)
        appended = broker.append(part, validate_produce_batch(build_batch(varied, now_ms=1)))
        assert isinstance(appended, asyncio.Future)
        assert (await appended).base_offset == base
        assert len(held.threads) == 1 and held.threads[0].startswith("samsa-check")

    asyncio.run(body())


class _HeldSearch:
    """TimestampProbe.search, held in its thread until released; records where it ran."""

    def __init__(self) -> None:
        self.real = TimestampProbe.search
        self.threads: list[str] = []
        self.release = threading.Event()

    def __call__(self, probe: TimestampProbe, timestamp: int) -> Any:
        self.threads.append(threading.current_thread().name)
        if threading.current_thread() is not threading.main_thread():
            assert self.release.wait(10)
        return self.real(probe, timestamp)


def test_listoffsets_by_time_searches_a_compressed_batch_off_the_loop(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListOffsets by time (issue 27): a compressed batch's records may inflate to
    message.max.inflated.bytes, so they are searched by a worker while the loop goes on; a
    small uncompressed batch is searched on the loop. The answers are the log's own."""
    held = _HeldSearch()
    monkeypatch.setattr(TimestampProbe, "search", lambda probe, ts: held(probe, ts))
    part = broker.topics.get_partition("t", 0)
    assert part is not None
    plog = part.log
    records = [NewRecord(value=b"v%d" % i, key=None, timestamp=1_000 + i) for i in range(2_000)]
    zstd = build_batch(records, compression=Compression.ZSTD)
    plain = build_batch([NewRecord(value=b"u", timestamp=5_000)])
    assert plog.append(validate_produce_batch(zstd), 6_000).error == 0
    assert plog.append(validate_produce_batch(plain), 6_000).error == 0

    async def body() -> None:
        searching = asyncio.ensure_future(broker.offset_for_timestamp(plog, 1_500))
        await _loop_runs_while_held(searching)
        held.release.set()
        assert await asyncio.wait_for(searching, 10) == (500, 1_500)
        assert held.threads and held.threads[0].startswith("samsa-check")
        held.threads.clear()
        assert await broker.offset_for_timestamp(plog, 4_000) == (2_000, 5_000)
        assert held.threads == ["MainThread"]  # the small batch: on the loop

    asyncio.run(body())
    assert plog.offset_for_timestamp(1_500) == (500, 1_500)
