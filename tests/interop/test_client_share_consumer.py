"""samsa's Python share consumer (client/_share_consumer.py, KIP-932) against samsa: two
consumers sharing one partition get every record once; explicit acknowledgements (release,
then accept) redeliver with a higher delivery count; a consumer abandoned while holding records
(no acknowledgement, no close) has them redelivered to another after the lock expires."""

from __future__ import annotations

import asyncio
import time

from _broker import BrokerProcess
from _share import share_topic
from samsa.client._share_consumer import ACCEPT, RELEASE, AsyncShareConsumer


def test_two_python_share_consumers(shared_broker: BrokerProcess) -> None:
    topic, group = share_topic(shared_broker.bootstrap, 30, "py")

    async def run() -> list[bytes]:
        consumers = [AsyncShareConsumer(shared_broker.bootstrap, group) for _ in range(2)]
        seen: list[bytes] = []
        try:
            for c in consumers:
                await c.subscribe([topic])
            deadline = time.monotonic() + 20
            while len(seen) < 30 and time.monotonic() < deadline:
                for batch in await asyncio.gather(*(c.poll(0.2) for c in consumers)):
                    seen += [r.value or b"" for r in batch]
        finally:
            for c in consumers:
                await c.close()
        return seen

    assert sorted(asyncio.run(run())) == sorted(f"v{i}".encode() for i in range(30))


def test_explicit_release_redelivers(shared_broker: BrokerProcess) -> None:
    topic, group = share_topic(shared_broker.bootstrap, 3, "py")

    async def run() -> list[tuple[bytes, int]]:
        c = AsyncShareConsumer(shared_broker.bootstrap, group, acknowledgement_mode="explicit")
        got: list[tuple[bytes, int]] = []
        try:
            await c.subscribe([topic])
            deadline = time.monotonic() + 20
            while len(got) < 4 and time.monotonic() < deadline:
                for r in await c.poll(0.2):
                    got.append((r.value or b"", r.delivery_count))
                    first_time = r.value == b"v1" and r.delivery_count == 1
                    c.acknowledge(r, RELEASE if first_time else ACCEPT)
                await c.commit()
        finally:
            await c.close()
        return got

    assert sorted(asyncio.run(run())) == [(b"v0", 1), (b"v1", 1), (b"v1", 2), (b"v2", 1)]


def test_an_abandoned_consumers_records_come_back(broker_factory: type[BrokerProcess]) -> None:
    broker = broker_factory(overrides={"group.share.record.lock.duration.ms": "1500"}).start()
    topic, group = share_topic(broker.bootstrap, 5, "py")

    async def run() -> list[tuple[bytes, int]]:
        dead = AsyncShareConsumer(broker.bootstrap, group, acknowledgement_mode="explicit")
        await dead.subscribe([topic])
        held: list[object] = []
        deadline = time.monotonic() + 20
        while not held and time.monotonic() < deadline:
            held += await dead.poll(0.2)
        await dead._cluster.close()  # dies: no acknowledgement, no session close, no leave
        alive = AsyncShareConsumer(broker.bootstrap, group)
        got: list[tuple[bytes, int]] = []
        try:
            await alive.subscribe([topic])
            deadline = time.monotonic() + 20
            while len(got) < 5 and time.monotonic() < deadline:
                got += [(r.value or b"", r.delivery_count) for r in await alive.poll(0.2)]
        finally:
            await alive.close()
        assert len(held) == 5
        return got

    assert sorted(asyncio.run(run())) == [(f"v{i}".encode(), 2) for i in range(5)]
