"""Consumer groups with the classic protocol against samsa's group coordinator."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from samsa.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition

PARTITIONS = 4


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_two_members_split_partitions_and_commit(shared_broker) -> None:  # type: ignore[no-untyped-def]
    bs = shared_broker.bootstrap
    topic = f"grp-{uuid.uuid4().hex[:6]}"
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
        "auto.offset.reset": "earliest",
        "heartbeat.interval.ms": 200,
        "session.timeout.ms": 6000,
        "auto.commit.interval.ms": 200,
        "partition.assignment.strategy": "roundrobin",
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
                if now and (not owned[i] or owned[i][-1] != now):
                    owned[i].append(now)
            final[i] = c.assignment()
            c.commit()

    produce(0, 200)
    t0 = threading.Thread(target=member, args=(0,))
    t1 = threading.Thread(target=member, args=(1,))
    t0.start()
    try:
        # The first member owns everything and reads the first half...
        _wait(lambda: len(got[0]) == 200 and owned[0][-1:] == [everything], "member 0 read all")
        t1.start()
        # ...then has to give half away when the second joins.
        _wait(
            lambda: (
                [len(a[-1]) for a in owned.values() if a] == [2, 2]
                and sorted(len(m) for m in _current(bs, group)) == [2, 2]
            ),
            "the partitions are split",
        )
        produce(200, 400)
        _wait(lambda: len(got[0]) + len(got[1]) >= 400, "all 400 records are read")
        time.sleep(0.5)  # a duplicate delivery would arrive now
    finally:
        stop.set()
        t0.join(30)
        if t1.ident is not None:  # started
            t1.join(30)
    values = [r.value for rs in got.values() for r in rs]
    # Each record once: the first member committed what it read before giving partitions away.
    assert sorted(values) == sorted(b"v%d" % i for i in range(400))
    assert owned[0][0] == everything and len(owned[1]) == 1
    assert sorted(final[0] + final[1]) == everything
    assert len(final[0]) == len(final[1]) == 2
    # The second half went to each partition's new owner.
    for i in (0, 1):
        late = [r for r in got[i] if int(r.value[1:]) >= 200]  # type: ignore[index]
        assert late and all(TopicPartition(topic, r.partition) in final[i] for r in late)
    with Consumer({"bootstrap.servers": bs, "group.id": group}) as c:
        committed = c.committed(everything)
    assert committed == {tp: 100 for tp in everything}
    with Admin({"bootstrap.servers": bs}) as admin:
        assert group in [g.group_id for g in admin.list_groups()]


def _current(bs: str, group: str) -> list[tuple[TopicPartition, ...]]:
    with Admin({"bootstrap.servers": bs}) as admin:
        (desc,) = admin.describe_groups([group])
    return [m.assignment for m in desc.members]
