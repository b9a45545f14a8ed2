"""The samsa client's consumer with ``group.protocol=consumer`` (KIP-848) against samsa: the
broker assigns, a second member gets half of the partitions only after the first gave them up
(docs/semantics.md, rules 34-35), every record is delivered once, commits carry the member
epoch, and a confluent-kafka consumer-protocol member shares the group with it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer as CkConsumer

from _broker import BrokerProcess
from samsa.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition

PARTITIONS = 4


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_samsa_consumers_share_a_consumer_protocol_group(
    broker_factory: type[BrokerProcess],
) -> None:
    broker = broker_factory(overrides={"group.consumer.heartbeat.interval.ms": "200"}).start()
    bs = broker.bootstrap
    topic = f"k848-{uuid.uuid4().hex[:6]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    everything = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with Admin({"bootstrap.servers": bs}) as admin:
        admin.create_topic(topic, PARTITIONS)

    def produce(first: int, end: int) -> None:
        with Producer({"bootstrap.servers": bs}) as p:
            for i in range(first, end):
                p.produce(topic, b"v%d" % i, partition=i % PARTITIONS)
            assert p.flush(30) == 0

    config = {
        "bootstrap.servers": bs,
        "group.id": group,
        "group.protocol": "consumer",
        "group.remote.assignor": "range",
        "auto.offset.reset": "earliest",
        "auto.commit.interval.ms": 200,
    }
    got: dict[int, list[ConsumerRecord]] = {0: [], 1: []}
    owned: dict[int, list[list[TopicPartition]]] = {0: [], 1: []}  # each new assignment
    final: dict[int, list[TopicPartition]] = {}
    stop = threading.Event()

    def member(i: int) -> None:
        with Consumer(config) as c:
            c.subscribe([topic])
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                got[i] += c.poll(0.2)
                now = sorted(c.assignment())
                # Once stopping, the first member to leave hands its partitions to the other:
                # not part of what is checked.
                if now and not stop.is_set() and (not owned[i] or owned[i][-1] != now):
                    owned[i].append(now)
            final[i] = owned[i][-1]
            c.commit()

    produce(0, 200)
    t0 = threading.Thread(target=member, args=(0,))
    t1 = threading.Thread(target=member, args=(1,))
    t0.start()
    try:
        _wait(lambda: len(got[0]) == 200 and owned[0][-1:] == [everything], "member 0 read all")
        t1.start()
        _wait(
            lambda: [len(a[-1]) for a in owned.values() if a] == [2, 2],
            "the partitions are split",
        )
        produce(200, 400)
        _wait(lambda: len(got[0]) + len(got[1]) >= 400, "all 400 records are read")
        time.sleep(0.5)  # a duplicate delivery would arrive now
    finally:
        stop.set()
        t0.join(30)
        if t1.ident is not None:
            t1.join(30)
    values = [r.value for rs in got.values() for r in rs]
    assert sorted(values) == sorted(b"v%d" % i for i in range(400))
    assert owned[0][0] == everything and len(owned[1]) == 1
    assert sorted(final[0] + final[1]) == everything
    for i in (0, 1):  # the second half went to each partition's new owner
        late = [r for r in got[i] if int(r.value[1:]) >= 200]  # type: ignore[index]
        assert late and all(TopicPartition(topic, r.partition) in final[i] for r in late)
    with Consumer({"bootstrap.servers": bs, "group.id": group}) as c:
        assert c.committed(everything) == {tp: 100 for tp in everything}

    # A confluent-kafka member and a samsa member in one consumer-protocol group.
    produce(400, 480)
    mixed = f"{group}-mixed"
    ck = CkConsumer(
        {
            "bootstrap.servers": bs,
            "group.id": mixed,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
        }
    )
    ck.subscribe([topic])
    seen: list[bytes] = []
    try:
        with Consumer({**config, "group.id": mixed}) as c:
            c.subscribe([topic])
            deadline = time.monotonic() + 30

            def split() -> bool:  # both members own partitions, none twice
                mine, theirs = c.assignment(), ck.assignment()
                return bool(mine and theirs) and len(mine) + len(theirs) == PARTITIONS

            while (len(seen) < 480 or not split()) and time.monotonic() < deadline:
                seen += [r.value for r in c.poll(0.05)]  # type: ignore[misc]
                m = ck.poll(0.05)
                if m is not None and m.error() is None:
                    seen.append(m.value())
            assert split(), (c.assignment(), ck.assignment())
    finally:
        ck.close()
    assert sorted(seen) == sorted(b"v%d" % i for i in range(480))
