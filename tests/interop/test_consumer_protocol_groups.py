"""confluent-kafka consumers with ``group.protocol=consumer`` (KIP-848) against samsa, with a
classic group consuming side by side on the same broker (docs/semantics.md, rules 34-35).

One scenario per server-side assignor (``uniform``, ``range``), run concurrently, over a
6-partition topic; after each step more records are produced and the test waits until the
group's committed offsets reach the end of every partition:

1. three members join; the group becomes Stable with two partitions each;
2. a fourth member joins and gets partitions;
3. one member leaves cleanly (epoch -1);
4. the broker is SIGKILLed and restarted: the group is replayed from ``__consumer_offsets``
   and its members carry on;
5. one member is SIGKILLed: only its session timeout (2 s) removes it, and its partitions
   move on to the others.

Then, from the workers' logs: every record was delivered, and none was delivered after a
commit past it had succeeded. The classic group (range, eager) consumes its topic alongside:
what is produced to it while the scenarios run before the restart, and after the restart,
is committed by it; and ListGroups tells the two kinds of group apart.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupType
from confluent_kafka.admin import AdminClient
from test_consumer_groups import PARTITIONS, PHASE_TIMEOUT, WORKER, Scenario, committed

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing import create_topic

BATCH = 60
CLASSIC = ("classic-t", "classic-g")  # topic, group


@pytest.fixture
def kip848_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path / "data",
        {
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "500",
            "group.consumer.session.timeout.ms": "2000",
            "group.consumer.heartbeat.interval.ms": "300",
            "offsets.topic.num.partitions": "3",
        },
    ).start()
    yield b
    b.kill()
    assert not b.log_contains("Traceback"), "\n".join(b.log[-60:])


def consumer_describe(conn: BlockingConnection, group: str) -> tuple[str, list[int]]:
    """(state, partitions per member) from ConsumerGroupDescribe."""
    v = 0
    req = make_request(
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        v,
        "ConsumerGroupDescribeRequest",
        group_ids=(group,),
        include_authorized_operations=False,
    )
    g = conn.request(ApiKey.CONSUMER_GROUP_DESCRIBE, v, req).groups[0]
    sizes = [sum(len(tp.partitions) for tp in m.assignment.topic_partitions) for m in g.members]
    return g.group_state, sorted(sizes)


def list_groups(conn: BlockingConnection) -> dict[str, str]:
    v = 5
    req = make_request(
        ApiKey.LIST_GROUPS, v, "ListGroupsRequest", states_filter=(), types_filter=()
    )
    return {g.group_id: g.group_type for g in conn.request(ApiKey.LIST_GROUPS, v, req).groups}


class ConsumerProtocolScenario(Scenario):
    def reconnect(self) -> None:
        self.conn.close()
        self.conn = BlockingConnection("127.0.0.1", self.broker.port, timeout=10)

    def wait_members(self, n: int) -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT
        while True:
            state = consumer_describe(self.conn, self.group)
            # Stable: every member reconciled to the target; uniform spreads six evenly.
            if state[0] == "Stable" and len(state[1]) == n and sum(state[1]) == PARTITIONS:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.group}: wanted Stable with {n} members, got {state}")
            time.sleep(0.1)

    def before_restart(self) -> None:
        assert create_topic(self.conn, self.topic, PARTITIONS) == 0
        for _ in range(3):
            self.spawn()
        self.wait_members(3)
        assert consumer_describe(self.conn, self.group)[1] == [2, 2, 2]
        self.produce(BATCH)
        self.wait_all_committed()

        self.joiner = self.spawn()
        self.wait_members(4)
        self.joined_at = time.monotonic_ns()
        self.produce(BATCH)
        self.wait_all_committed()

        self.workers[0].send_signal(signal.SIGTERM)  # leaves: epoch -1
        assert self.workers[0].wait(20) == 0
        self.wait_members(3)
        self.left_at = time.monotonic_ns()
        self.produce(BATCH)
        self.wait_all_committed()

    def after_restart(self) -> None:
        self.reconnect()
        self.wait_members(3)  # replayed, and the members came back to it
        self.produce(BATCH)
        self.wait_all_committed()

        killed_at = time.monotonic_ns()
        self.workers[1].send_signal(signal.SIGKILL)
        self.workers[1].wait(10)
        assert len(consumer_describe(self.conn, self.group)[1]) == 3  # still counted
        expired_at = self.wait_until(lambda: len(consumer_describe(self.conn, self.group)[1]) != 3)
        self.produce(BATCH)
        self.wait_all_committed()
        self.wait_members(2)
        self.stop()
        self.verify(self.joiner, self.joined_at)
        self.verify_session_timeout(self.left_at, killed_at, expired_at)


def test_consumer_protocol_groups_lose_nothing(
    kip848_broker: BrokerProcess, tmp_path: Path
) -> None:
    broker = kip848_broker
    conn = BlockingConnection("127.0.0.1", broker.port, timeout=10)
    # A classic group on its own topic, consuming all along.
    assert create_topic(conn, "classic-t", PARTITIONS) == 0
    log = tmp_path / "classic.log"
    classic = subprocess.Popen(
        [sys.executable, str(WORKER), "confluent", "range", broker.bootstrap, *CLASSIC, str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    scenarios = [
        ConsumerProtocolScenario(broker, tmp_path, "confluent-consumer", a)
        for a in ("uniform", "range")
    ]
    from confluent_kafka import Producer

    def classic_round(n: int) -> None:
        """Produce a batch to the classic group's topic; wait until it committed it all."""
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(BATCH):
            producer.produce("classic-t", value=b"c%d" % i, partition=i % PARTITIONS)
        assert producer.flush(20) == 0
        want = dict.fromkeys(range(PARTITIONS), n * BATCH // PARTITIONS)
        deadline = time.monotonic() + PHASE_TIMEOUT
        while committed(conn, "classic-g", "classic-t") != want:
            assert time.monotonic() < deadline, committed(conn, "classic-g", "classic-t")
            time.sleep(0.1)

    try:
        with ThreadPoolExecutor(len(scenarios)) as pool:
            running = [pool.submit(s.before_restart) for s in scenarios]
            classic_round(1)  # while the consumer-protocol groups go through their steps
            for f in running:
                f.result(timeout=120)
            conn.close()
            broker.kill()  # SIGKILL: the groups come back by replaying __consumer_offsets
            broker.start()
            conn = BlockingConnection("127.0.0.1", broker.port, timeout=10)
            for f in [pool.submit(s.after_restart) for s in scenarios]:
                f.result(timeout=120)
        classic_round(2)  # and after the restart
        types = list_groups(conn)
        assert types["classic-g"] == "classic"
        assert {types[s.group] for s in scenarios} == {"consumer"}
        # confluent-kafka's admin client tells them apart too (ConsumerGroupDescribe).
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        listed = {g.group_id: g.type for g in admin.list_consumer_groups().result(20).valid}
        assert listed["classic-g"] == ConsumerGroupType.CLASSIC
        assert listed[scenarios[0].group] == ConsumerGroupType.CONSUMER
        desc = admin.describe_consumer_groups([scenarios[0].group])[scenarios[0].group].result(20)
        assert (desc.type, desc.partition_assignor) == (ConsumerGroupType.CONSUMER, "uniform")
    finally:
        for s in scenarios:
            s.kill_all()
        classic.kill()
        classic.wait(10)
        conn.close()
