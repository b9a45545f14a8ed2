"""Broker.append: a batch whose records inflate past what the event loop may check in one
turn is checked in a worker thread while the loop goes on, a small one on the loop, and
appends to a partition still happen in the order they arrived."""

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


_BIG = 300_000  # inflated bytes: more than the loop checks in a turn (_INLINE_TURN_BYTES)


def test_a_compressed_batch_inflating_past_the_turn_is_checked_off_the_event_loop(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _HeldCheck(broker_module.check_client_batch)
    monkeypatch.setattr(broker_module, "check_client_batch", held)

    async def body() -> None:
        part = broker.topics.get_partition("t", 0)
        assert part is not None
        appended = broker.append(part, _batch(b"z" * _BIG, Compression.GZIP))
        assert isinstance(appended, asyncio.Future)
        ticks = 0
        for _ in range(5):  # the loop keeps running while the check is held
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 5 and not appended.done()
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


def test_the_event_loop_checks_a_bounded_share_of_a_turn(broker: Broker) -> None:
    """Small uncompressed batches are checked on the loop only up to 256 KB in one turn of it
    (a request of many partitions cannot hold the loop); the rest go to the workers, and
    all are appended in order."""
    from samsa.broker.broker import _INLINE_TURN_BYTES

    async def body() -> None:
        part = broker.topics.get_partition("t", 0)
        assert part is not None
        batches = [_batch(bytes([i]) * 30_000) for i in range(20)]  # 600 KB in all
        appended = [broker.append(part, b) for b in batches]  # one turn of the loop
        inline = [a for a in appended if isinstance(a, AppendResult)]
        assert 0 < len(inline) * 30_000 <= _INLINE_TURN_BYTES < 20 * 30_000
        results = [a if isinstance(a, AppendResult) else await a for a in appended]
        assert [r.base_offset for r in results] == list(range(20))
        await asyncio.sleep(0)  # a new turn: the loop checks again
        assert isinstance(broker.append(part, _batch(b"later")), AppendResult)

    asyncio.run(body())


def test_small_compressed_batches_are_checked_on_the_loop_up_to_a_turn_of_inflation(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread hand-off costs more than a small compressed batch's check: those are checked
    on the loop while their records, inflated, fit in the turn's budget; the rest go to the
    workers, in order. A refused one spends the turn (a bomb is not read to its end)."""
    from samsa.broker.broker import _INLINE_TURN_BYTES

    held = _HeldCheck(broker_module.check_client_batch)
    held.release.set()
    monkeypatch.setattr(broker_module, "check_client_batch", held)

    async def body() -> None:
        part = broker.topics.get_partition("t", 0)
        assert part is not None
        batches = [_batch(bytes([i]) * 60_000, Compression.GZIP) for i in range(10)]
        assert all(b.size < 1000 for b in batches)  # 600 KB inflated from a few KB
        appended = [broker.append(part, b) for b in batches]  # one turn of the loop
        inline = [a for a in appended if isinstance(a, AppendResult)]
        assert 0 < len(inline) * 60_000 <= _INLINE_TURN_BYTES < 10 * 60_000
        results = [a if isinstance(a, AppendResult) else await a for a in appended]
        assert [r.base_offset for r in results] == list(range(10))
        assert len(held.threads) == 10 - len(inline)
        await asyncio.sleep(0)  # a new turn
        good = _batch(b"x" * 1000, Compression.GZIP)
        body = bytes(good.buf)[HEADER_SIZE:-8] + bytes(8)  # a gzip trailer that is wrong
        broken = with_records_section(good, Compression.GZIP, body)
        refused = broker.append(part, validate_produce_batch(broken))
        assert isinstance(refused, AppendResult) and refused.error != 0
        assert isinstance(broker.append(part, _batch(b"later", Compression.GZIP)), asyncio.Future)

    asyncio.run(body())
