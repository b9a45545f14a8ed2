"""Committed offsets survive a broker SIGKILL: they are in ``__consumer_offsets``, in the
kernel before OffsetCommit is answered, and the coordinator is rebuilt by replaying it."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing import create_topic

OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "7",
    "group.min.session.timeout.ms": "500",
}


def _commit_simple(
    conn: BlockingConnection, group: str, topic: str, offsets: dict[int, int]
) -> None:
    """OffsetCommit v2 as a "simple" consumer: generation -1, no member id."""
    v = 2
    req = make_request(
        ApiKey.OFFSET_COMMIT,
        v,
        "OffsetCommitRequest",
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        retention_time=-1,
        topics=(
            make_request(
                ApiKey.OFFSET_COMMIT,
                v,
                "OffsetCommitRequestTopic",
                name=topic,
                partitions=tuple(
                    make_request(
                        ApiKey.OFFSET_COMMIT,
                        v,
                        "OffsetCommitRequestPartition",
                        partition_index=p,
                        committed_offset=o,
                        committed_metadata=f"meta-{p}",
                    )
                    for p, o in offsets.items()
                ),
            ),
        ),
    )
    resp = conn.request(ApiKey.OFFSET_COMMIT, v, req)
    assert [int(p.error_code) for p in resp.topics[0].partitions] == [0] * len(offsets)


def _fetch(conn: BlockingConnection, group: str, topic: str, n: int) -> dict[int, tuple[int, str]]:
    v = 5
    req = make_request(
        ApiKey.OFFSET_FETCH,
        v,
        "OffsetFetchRequest",
        group_id=group,
        topics=(
            make_request(
                ApiKey.OFFSET_FETCH,
                v,
                "OffsetFetchRequestTopic",
                name=topic,
                partition_indexes=tuple(range(n)),
            ),
        ),
    )
    resp = conn.request(ApiKey.OFFSET_FETCH, v, req)
    return {
        p.partition_index: (int(p.committed_offset), p.metadata) for p in resp.topics[0].partitions
    }


def test_committed_offsets_survive_sigkill(broker_factory: type) -> None:
    broker = broker_factory(overrides=OVERRIDES).start()
    topic = "crash-offsets"
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        assert create_topic(conn, topic, 3) == 0
        # Many small commits from a simple consumer: the last one per partition wins.
        for i in range(1, 51):
            _commit_simple(conn, "simple-group", topic, {p: i * 10 + p for p in range(3)})

    # A group member of a real client commits what it consumed.
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        producer.produce(topic, value=b"r%d" % i, partition=i % 3)
    assert producer.flush(10) == 0
    consumer_conf = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": "real-group",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 1500,
        "heartbeat.interval.ms": 300,
    }
    c = Consumer(consumer_conf)
    c.subscribe([topic])
    seen: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(seen) < 20 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            seen.append(m.value())
            c.commit(message=m, asynchronous=False)
    assert len(seen) == 20
    committed_before = {
        # librdkafka says -1001 (OFFSET_INVALID) where the protocol says -1: nothing committed
        tp.partition: max(tp.offset, -1)
        for tp in c.committed([TopicPartition(topic, p) for p in range(3)])
    }

    broker.kill()  # SIGKILL: no clean shutdown; the consumer is not closed either
    broker.start()

    with BlockingConnection("127.0.0.1", broker.port) as conn:
        assert _fetch(conn, "simple-group", topic, 3) == {
            p: (500 + p, f"meta-{p}") for p in range(3)
        }
        real = _fetch(conn, "real-group", topic, 3)
    assert {p: o for p, (o, _) in real.items()} == committed_before
    c.close()

    # A new member resumes where the group left off: the 10 uncommitted records, no more.
    c2 = Consumer({**consumer_conf, "group.id": "real-group"})
    c2.subscribe([topic])
    rest: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(rest) < 10 and time.monotonic() < deadline:
        m = c2.poll(0.2)
        if m is not None and not m.error():
            rest.append(m.value())
    extra = c2.poll(1.0)
    c2.close()
    assert extra is None or extra.error() is not None
    assert sorted(seen + rest) == sorted(b"r%d" % i for i in range(30))
    assert broker.log_contains("group coordinator loaded")
