"""KIP-932 share groups with confluent-kafka's ShareConsumer (librdkafka): two share
consumers on one partition consume every record once, a record released on every delivery
stops coming after ``share.delivery.count.limit`` deliveries (archived), and a share group
with ``share.isolation.level=read_committed`` skips an aborted transaction's records."""

from __future__ import annotations

import asyncio
import time
import uuid

from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from _broker import BrokerProcess
from _share import share_topic
from samsa.client._share_consumer import AsyncShareConsumer


def _consumer(bootstrap: str, group: str, explicit: bool = False) -> ShareConsumer:
    conf = {"bootstrap.servers": bootstrap, "group.id": group}
    if explicit:
        conf["share.acknowledgement.mode"] = "explicit"
    return ShareConsumer(conf)


def test_two_share_consumers_get_every_record_once(shared_broker: BrokerProcess) -> None:
    topic, group = share_topic(shared_broker.bootstrap, 40, "cf")
    consumers = [_consumer(shared_broker.bootstrap, group) for _ in range(2)]
    seen: list[bytes] = []
    try:
        for c in consumers:
            c.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(seen) < 40 and time.monotonic() < deadline:
            for c in consumers:
                seen += [m.value() for m in c.poll(0.2) if m.error() is None]
        for c in consumers:
            c.commit_sync()
    finally:
        for c in consumers:
            c.close()
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(40))


def test_a_record_released_every_time_is_archived(shared_broker: BrokerProcess) -> None:
    topic, group = share_topic(shared_broker.bootstrap, 1, "cfp")
    c = _consumer(shared_broker.bootstrap, group, explicit=True)
    deliveries = 0
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            got = [m for m in c.poll(0.2) if m.error() is None]
            for m in got:
                deliveries += 1
                c.acknowledge(m, AcknowledgeType.RELEASE)
            if got:
                c.commit_sync()
            if deliveries >= 5 and not got:
                break
    finally:
        c.close()
    assert deliveries == 5  # group.share.delivery.count.limit


def _consume_all(bootstrap: str, group: str, topic: str, want: int) -> list[bytes]:
    c = _consumer(bootstrap, group)
    seen: list[bytes] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 20
        while len(seen) < want and time.monotonic() < deadline:
            seen += [m.value() for m in c.poll(0.2) if m.error() is None]
        seen += [m.value() for m in c.poll(0.5) if m.error() is None]  # nothing more comes
        c.commit_sync()
    finally:
        c.close()
    return seen


def test_read_committed_share_group_skips_aborted_records(shared_broker: BrokerProcess) -> None:
    bootstrap = shared_broker.bootstrap
    topic, _ = share_topic(bootstrap, 1, "cftx")  # v0, not transactional
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    p.init_transactions(20)
    for outcome in ("aborted", "committed"):
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, value=f"{outcome}-{i}".encode())
        assert p.flush(20) == 0  # written: an abort would drop records still queued
        if outcome == "aborted":
            p.abort_transaction(20)
        else:
            p.commit_transaction(20)
    groups = {level: f"sg-{level}-{uuid.uuid4().hex[:8]}" for level in ("uncommitted", "committed")}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for level, group in groups.items():
        entries = [
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in (
                ("share.auto.offset.reset", "earliest"),
                ("share.isolation.level", f"read_{level}"),
            )
        ]
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
        for f in admin.incremental_alter_configs([resource]).values():
            f.result(timeout=20)
    committed = _consume_all(bootstrap, groups["committed"], topic, 4)
    assert sorted(committed) == [b"committed-0", b"committed-1", b"committed-2", b"v0"]
    # read_uncommitted (Kafka's default too) hands out the aborted records as well; read by
    # samsa's own share consumer, a second client
    everything = asyncio.run(_consume_all_python(bootstrap, groups["uncommitted"], topic, 7))
    assert sorted(everything)[:4] == [b"aborted-0", b"aborted-1", b"aborted-2", b"committed-0"]
    assert len(everything) == 7


async def _consume_all_python(bootstrap: str, group: str, topic: str, want: int) -> list[bytes]:
    c = AsyncShareConsumer(bootstrap, group)
    seen: list[bytes] = []
    try:
        await c.subscribe([topic])
        deadline = time.monotonic() + 20
        while len(seen) < want and time.monotonic() < deadline:
            seen += [r.value or b"" for r in await c.poll(0.2)]
    finally:
        await c.close()
    return seen
