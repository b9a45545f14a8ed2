"""Consumer groups with the classic protocol against samsa's group coordinator."""

from __future__ import annotations

import threading
import time
import uuid

from samsa.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition

PARTITIONS = 4


def test_two_members_split_partitions_and_commit(shared_broker) -> None:  # type: ignore[no-untyped-def]
    bs = shared_broker.bootstrap
    topic = f"grp-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    with Admin({"bootstrap.servers": bs}) as admin:
        admin.create_topic(topic, PARTITIONS)
    with Producer({"bootstrap.servers": bs}) as p:
        for i in range(400):
            p.produce(topic, b"v%d" % i, partition=i % PARTITIONS)
        assert p.flush(30) == 0

    config = {
        "bootstrap.servers": bs,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "heartbeat.interval.ms": 200,
        "session.timeout.ms": 6000,
        "auto.commit.interval.ms": 200,
        "partition.assignment.strategy": "roundrobin",
    }
    got: dict[int, list[ConsumerRecord]] = {0: [], 1: []}
    final: dict[int, list[TopicPartition]] = {}
    stop = threading.Event()

    def member(i: int) -> None:
        with Consumer(config) as c:
            c.subscribe([topic])
            deadline = time.monotonic() + 30
            while not stop.is_set() and time.monotonic() < deadline:
                got[i] += c.poll(0.2)
            final[i] = c.assignment()
            c.commit()

    t0 = threading.Thread(target=member, args=(0,))
    t0.start()
    time.sleep(1.0)  # the first member owns everything, then has to give half away
    t1 = threading.Thread(target=member, args=(1,))
    t1.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        values = {r.value for rs in got.values() for r in rs}
        if len(values) == 400 and all(len(c) == 2 for c in _current(bs, group)):
            break
        time.sleep(0.2)
    stop.set()
    t0.join(30)
    t1.join(30)
    values = [r.value for rs in got.values() for r in rs]
    assert sorted(set(values)) == sorted(b"v%d" % i for i in range(400))
    assert sorted(final[0] + final[1]) == [TopicPartition(topic, p) for p in range(PARTITIONS)]
    assert len(final[0]) == len(final[1]) == 2
    with Consumer({"bootstrap.servers": bs, "group.id": group}) as c:
        committed = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)])
    assert committed == {TopicPartition(topic, p): 100 for p in range(PARTITIONS)}
    with Admin({"bootstrap.servers": bs}) as admin:
        assert group in [g.group_id for g in admin.list_groups()]


def _current(bs: str, group: str) -> list[tuple[TopicPartition, ...]]:
    with Admin({"bootstrap.servers": bs}) as admin:
        (desc,) = admin.describe_groups([group])
    return [m.assignment for m in desc.members] or [()]
