"""KIP-932 share groups with confluent-kafka's ShareConsumer (librdkafka): two share
consumers on one partition consume every record once, and a record released on every
delivery stops coming after ``share.delivery.count.limit`` deliveries (archived)."""

from __future__ import annotations

import time

from confluent_kafka import AcknowledgeType, ShareConsumer

from _broker import BrokerProcess
from _share import share_topic


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
