"""The samsa client's consumer with ``group.protocol=consumer`` (KIP-848) against samsa: the
broker assigns, a second member gets half of the partitions only after the first gave them up
(docs/semantics.md, rules 34-35), every record is delivered once, commits carry the member
epoch, and a confluent-kafka consumer-protocol member shares the group with it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer as CkConsumer

from _broker import BrokerProcess
from samsa.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition
from samsa.client._aconn import AsyncConnection
from samsa.client._consumer import AsyncConsumer
from samsa.client._membership import ConsumerProtocolMembership
from samsa.protocol.messages import ApiKey

PARTITIONS = 4


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


class _Spy:
    """Every assignment change of every samsa consumer in this process, in the order they
    happened, and the member epoch each sent OffsetCommit carried beside the one its member
    last received in a heartbeat."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lock = threading.Lock()
        self.assignments: list[tuple[str, frozenset[TopicPartition]]] = []
        self.epochs: dict[str, int] = {}  # member id -> last epoch a heartbeat gave it
        self.commits: list[tuple[str, str, int, int | None]] = []  # group, member, sent, held
        set_assignment, on_heartbeat = (
            AsyncConsumer._assign,
            ConsumerProtocolMembership._on_consumer_heartbeat,
        )
        send = AsyncConnection.send_nowait

        def spy_set(core: AsyncConsumer, tps: list[TopicPartition], keep: bool = True) -> None:
            with self.lock:
                set_assignment(core, tps, keep)
                assert core.membership is not None
                member = core.membership.member_id
                self.assignments.append((member, frozenset(core.assignment())))

        async def spy_heartbeat(member: ConsumerProtocolMembership, resp: Any) -> bool:
            if not int(resp.error_code):
                with self.lock:
                    self.epochs[member.member_id] = int(resp.member_epoch)
            return await on_heartbeat(member, resp)

        def spy_send(conn: AsyncConnection, api_key: int, entity: Any, **kw: Any) -> Any:
            if api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT and entity.member_epoch < 0:
                with self.lock:  # leaving the group gives up everything
                    self.assignments.append((entity.member_id, frozenset()))
            if api_key == ApiKey.OFFSET_COMMIT:
                with self.lock:
                    held = self.epochs.get(entity.member_id)
                    sent = int(entity.generation_id_or_member_epoch)
                    self.commits.append((entity.group_id, entity.member_id, sent, held))
            return send(conn, api_key, entity, **kw)

        monkeypatch.setattr(AsyncConsumer, "_assign", spy_set)
        monkeypatch.setattr(ConsumerProtocolMembership, "_on_consumer_heartbeat", spy_heartbeat)
        monkeypatch.setattr(AsyncConnection, "send_nowait", spy_send)

    def owned_twice(self) -> list[tuple[TopicPartition, ...]]:
        """Partitions some consumer was given while another still held them."""
        now: dict[str, frozenset[TopicPartition]] = {}
        twice = []
        for who, tps in self.assignments:
            now[who] = tps
            held = [tp for other, theirs in now.items() if other != who for tp in theirs]
            twice += [tuple(sorted(tps & set(held)))] if tps & set(held) else []
        return twice


def test_samsa_consumers_share_a_consumer_protocol_group(
    broker_factory: type[BrokerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _Spy(monkeypatch)
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
    # A partition moved to the second member only once the first had given it up.
    assert len(spy.assignments) >= 3 and spy.owned_twice() == []
    with Consumer({"bootstrap.servers": bs, "group.id": group}) as c:
        assert c.committed(everything) == {tp: 100 for tp in everything}
    # Every commit carried its member's id and the epoch the coordinator last gave it.
    commits = [c for c in spy.commits if c[0] == group]
    assert len({m for _g, m, _s, _h in commits}) == 2
    assert all(sent == held and sent > 0 for _g, _m, sent, held in commits), commits

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
                mine = {(tp.topic, tp.partition) for tp in c.assignment()}
                theirs = {(tp.topic, tp.partition) for tp in ck.assignment()}
                every = {(tp.topic, tp.partition) for tp in everything}
                return bool(mine and theirs) and not mine & theirs and mine | theirs == every

            while (len(seen) < 480 or not split()) and time.monotonic() < deadline:
                seen += [r.value for r in c.poll(0.05)]  # type: ignore[misc]
                m = ck.poll(0.05)
                if m is not None and m.error() is None:
                    seen.append(m.value())
            assert split(), (c.assignment(), ck.assignment())
    finally:
        ck.close()
    assert sorted(seen) == sorted(b"v%d" % i for i in range(480))
