"""Rolling upgrade of a group of confluent-kafka consumers from ``group.protocol=classic`` to
``consumer`` and back, against one samsa broker (docs/semantics.md, rule 38).

Over a 6-partition topic, after each step more records are produced and the test waits until
the group's committed offsets reach the end of every partition:

1. two classic consumers (range, eager) form a classic group;
2. one is restarted as a consumer-protocol member: the group becomes a consumer group with
   one member of each protocol, every partition owned by exactly one of them;
3. the broker is SIGKILLed and restarted: the mixed group is replayed and both carry on;
4. the other is restarted as a consumer-protocol member too;
5. downgrade: one is restarted as a classic member (it joins the consumer group), then the
   last consumer-protocol member leaves and the group is a classic group again.

Then, from the workers' logs: every record was delivered, and none was delivered after a
commit past it had succeeded. A second broker with ``group.consumer.migration.policy=disabled``
refuses a consumer-protocol member of a classic group with Kafka's GROUP_ID_NOT_FOUND. A static
consumer-protocol member SIGKILLed and restarted as a classic consumer under the same
``group.instance.id`` replaces its old instance and the group becomes classic again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from test_consumer_groups import PARTITIONS, PHASE_TIMEOUT, Scenario, describe

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing import create_topic

BATCH = 60
SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
    "group.consumer.session.timeout.ms": "2000",
    "group.consumer.heartbeat.interval.ms": "300",
    "offsets.topic.num.partitions": "3",
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "data", SETTINGS).start()
    yield b
    b.kill()
    assert not b.log_contains("Traceback"), "\n".join(b.log[-60:])


def owned(conn: BlockingConnection, group: str) -> tuple[str, list[frozenset[int]]]:
    """(state, each member's partitions) from ConsumerGroupDescribe."""
    return _describe(conn, group)[:2]  # type: ignore[return-value]


def member_types(conn: BlockingConnection, group: str) -> list[int]:
    """Each member's type (KIP-1099): 0 classic, 1 consumer protocol."""
    return sorted(_describe(conn, group)[2])


def _describe(conn: BlockingConnection, group: str) -> tuple[str, list[frozenset[int]], list[int]]:
    req = make_request(
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        1,
        "ConsumerGroupDescribeRequest",
        group_ids=(group,),
        include_authorized_operations=False,
    )
    g = conn.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, req).groups[0]
    if g.error_code != ErrorCode.NONE:
        return "not a consumer group", [], []
    parts = [
        frozenset(p for tp in m.assignment.topic_partitions for p in tp.partitions)
        for m in g.members
    ]
    return g.group_state, parts, [int(m.member_type) for m in g.members]


class Migration(Scenario):
    def spawn_as(self, lib: str) -> int:
        self.lib = lib
        return self.spawn()

    def leave(self, worker: int) -> None:
        self.workers[worker].send_signal(signal.SIGTERM)  # a clean close: LeaveGroup
        assert self.workers[worker].wait(20) == 0

    def wait_consumer_group(self, n: int) -> None:
        """Stable with n members, each partition owned by exactly one of them."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        while True:
            state, members = owned(self.conn, self.group)
            every = sorted(p for m in members for p in m)
            if state == "Stable" and len(members) == n and every == list(range(PARTITIONS)):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.group}: wanted Stable with {n}, got {members}")
            time.sleep(0.1)

    def step(self) -> None:
        self.produce(BATCH)
        self.wait_all_committed()


def test_rolling_upgrade_and_downgrade_lose_nothing(broker: BrokerProcess, tmp_path: Path) -> None:
    s = Migration(broker, tmp_path, "confluent", "range")
    try:
        assert create_topic(s.conn, s.topic, PARTITIONS) == 0
        s.spawn_as("confluent")
        s.spawn_as("confluent")
        s.wait_members(2)
        s.step()

        # 2. Worker 0 comes back speaking the consumer protocol: the group converts.
        s.leave(0)
        upgraded = s.spawn_as("confluent-consumer")
        s.wait_consumer_group(2)
        upgraded_at = time.monotonic_ns()
        assert describe(s.conn, s.group)[0] == "Dead"  # no longer a classic group
        assert member_types(s.conn, s.group) == [0, 1]  # one classic, one consumer member
        s.step()

        # 3. A crash of the broker mid-migration: the mixed group is replayed.
        s.conn.close()
        broker.kill()
        broker.start()
        s.conn = BlockingConnection("127.0.0.1", broker.port, timeout=10)
        s.wait_consumer_group(2)
        assert member_types(s.conn, s.group) == [0, 1]
        s.step()

        # 4. Worker 1 too.
        s.leave(1)
        s.spawn_as("confluent-consumer")
        s.wait_consumer_group(2)
        assert member_types(s.conn, s.group) == [1, 1]
        s.step()

        # 5. Back: a classic member joins the consumer group, then the last consumer-protocol
        # member leaves and the group is a classic group again.
        s.leave(upgraded)
        s.spawn_as("confluent")
        s.wait_consumer_group(2)
        assert member_types(s.conn, s.group) == [0, 1]
        s.step()
        s.leave(3)
        s.wait_members(1)
        assert owned(s.conn, s.group)[0] == "not a consumer group"
        s.step()
        s.stop()
        s.verify(upgraded, upgraded_at)
    finally:
        s.kill_all()


def _join(conn: BlockingConnection, group: str, member_id: str) -> Any:
    sub = b"\x00\x01\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff\x00\x00\x00\x00"  # v1: topic t
    proto = make_request(
        ApiKey.JOIN_GROUP, 5, "JoinGroupRequestProtocol", name="range", metadata=sub
    )
    req = make_request(
        ApiKey.JOIN_GROUP,
        5,
        "JoinGroupRequest",
        group_id=group,
        session_timeout=10_000,
        rebalance_timeout=10_000,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(proto,),
    )
    return conn.request(ApiKey.JOIN_GROUP, 5, req)


def test_disabled_policy_refuses_the_consumer_protocol(tmp_path: Path) -> None:
    b = BrokerProcess(
        tmp_path / "data", {**SETTINGS, "group.consumer.migration.policy": "disabled"}
    ).start()
    try:
        with BlockingConnection("127.0.0.1", b.port, timeout=10) as conn:
            assert create_topic(conn, "t", 2) == 0
            first = _join(conn, "g", "")
            assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
            joined = _join(conn, "g", first.member_id)
            assert (joined.error_code, joined.generation_id) == (ErrorCode.NONE, 1)
            req = make_request(
                ApiKey.CONSUMER_GROUP_HEARTBEAT,
                0,
                "ConsumerGroupHeartbeatRequest",
                group_id="g",
                member_id="k",
                member_epoch=0,
                instance_id=None,
                rack_id=None,
                rebalance_timeout=10_000,
                subscribed_topic_names=("t",),
                server_assignor=None,
                topic_partitions=(),
            )
            hb = conn.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, req)
            assert hb.error_code == ErrorCode.GROUP_ID_NOT_FOUND
            assert "online upgrade is disabled" in hb.error_message
            assert describe(conn, "g") == ("CompletingRebalance", 1)  # still classic
    finally:
        b.kill()
    assert not b.log_contains("Traceback"), "\n".join(b.log[-60:])


# A consumer-protocol static member that gets SIGKILLed (so it never leaves) once assigned.
_OLD_INSTANCE = """
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "group.protocol": "consumer", "group.instance.id": "static-1"})
c.subscribe([sys.argv[3]])
deadline = time.monotonic() + 15
while not c.assignment() and time.monotonic() < deadline:
    c.poll(0.1)
print("assigned" if c.assignment() else "none", flush=True)
time.sleep(60)
"""


def test_static_member_restarted_as_classic_replaces_its_consumer_instance(
    tmp_path: Path,
) -> None:
    """A static consumer-protocol member crashes and comes back as a classic consumer under
    the same ``group.instance.id`` well within its session: it replaces its old instance (no
    UNRELEASED_INSTANCE_ID), and as it replaced the last consumer-protocol member the group
    becomes a classic group it consumes from."""
    b = BrokerProcess(
        tmp_path / "data", {**SETTINGS, "group.consumer.session.timeout.ms": "30000"}
    ).start()
    old: subprocess.Popen[str] | None = None
    consumer: Consumer | None = None
    try:
        conn = BlockingConnection("127.0.0.1", b.port, timeout=10)
        assert create_topic(conn, "st", 2) == 0
        producer = Producer({"bootstrap.servers": b.bootstrap})
        for i in range(10):
            producer.produce("st", value=b"v%d" % i, partition=i % 2)
        assert producer.flush(10) == 0
        old = subprocess.Popen(
            [sys.executable, "-c", _OLD_INSTANCE, b.bootstrap, "sg", "st"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert old.stdout is not None and old.stdout.readline().strip() == "assigned"
        old.kill()
        old.wait(10)
        assert member_types(conn, "sg") == [1]  # still there: its session is 30 s
        consumer = Consumer(
            {
                "bootstrap.servers": b.bootstrap,
                "group.id": "sg",
                "group.instance.id": "static-1",
                "session.timeout.ms": 6000,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe(["st"])
        got: list[bytes] = []
        deadline = time.monotonic() + 12
        while len(got) < 10 and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=10, timeout=0.2):
                assert m.error() is None, m.error()
                got.append(m.value())
        assert sorted(got) == sorted(b"v%d" % i for i in range(10))
        assert owned(conn, "sg")[0] == "not a consumer group"
        assert describe(conn, "sg") == ("Stable", 1)
        conn.close()
    finally:
        if consumer is not None:
            consumer.close()
        if old is not None and old.poll() is None:
            old.kill()
            old.wait(10)
        b.kill()
    assert not b.log_contains("Traceback"), "\n".join(b.log[-60:])
