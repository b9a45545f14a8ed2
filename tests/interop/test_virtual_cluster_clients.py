"""kafka-python and aiokafka against a virtual 3-broker cluster (samsa.testing.cluster).

Each client family produces idempotently with every leader moved mid-stream, runs
transactions with the transaction coordinator moved between them, and reads everything back
read_committed in a consumer group whose leaders and group coordinator move mid-read. The
records come back exactly once (aborted ones never), and the virtual cluster's
NOT_LEADER_OR_FOLLOWER / NOT_COORDINATOR counters show the clients took the cluster paths.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from _broker import BrokerProcess
from samsa.client import Admin
from samsa.testing.cluster import VirtualCluster

T = 20.0
N = 600  # idempotent records, half before the leaders move
OVERRIDES = {
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("vclients"), OVERRIDES).start()
    yield b
    b.stop()


@pytest.fixture
def cluster(upstream: BrokerProcess) -> Iterator[VirtualCluster]:
    with VirtualCluster(upstream.bootstrap, nodes=3) as vc:
        yield vc


def _topic(bootstrap: str) -> str:
    name = f"vcc-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, 6)
    return name


def _move_leaders(cluster: VirtualCluster, topic: str) -> None:
    for part in range(6):
        cluster.move_leader(topic, part, (cluster.leader(topic, part) + 1) % 3)


def _move_coordinator(cluster: VirtualCluster, key: str) -> None:
    cluster.move_coordinator(key, (cluster.coordinator(key) + 1) % 3)


def _want() -> list[bytes]:
    """What a read_committed reader must see: the idempotent records and the committed
    transactions' (``c``, ``d``), never the aborted one's (``x``)."""
    return sorted(
        [b"p%04d" % i for i in range(N)]
        + [b"c%04d" % i for i in range(60)]
        + [b"d%04d" % i for i in range(60)]
    )


class _Moves:
    """Leaders and the group coordinator move once while a group consumer reads."""

    def __init__(self, cluster: VirtualCluster, topic: str, group: str) -> None:
        self.cluster, self.topic, self.group = cluster, topic, group
        self.leaders_moved = self.coordinator_moved = False
        self.not_leader = cluster.stats.not_leader
        self.not_coordinator = cluster.stats.not_coordinator

    def after(self, got: int) -> None:
        if not self.leaders_moved and got >= N // 3:
            self.leaders_moved = True
            _move_leaders(self.cluster, self.topic)
        if not self.coordinator_moved and got >= 2 * N // 3:
            self.coordinator_moved = True
            _move_coordinator(self.cluster, self.group)

    def check(self) -> None:
        assert self.leaders_moved and self.coordinator_moved
        assert self.cluster.stats.not_leader > self.not_leader
        assert self.cluster.stats.not_coordinator > self.not_coordinator


def test_kafka_python_against_the_virtual_cluster(cluster: VirtualCluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = _topic(cluster.bootstrap)
    txn_id, group = f"vckp-t-{uuid.uuid4().hex[:6]}", f"vckp-g-{uuid.uuid4().hex[:6]}"
    base = {"bootstrap_servers": cluster.bootstrap, "request_timeout_ms": 10_000}

    p = KafkaProducer(**base, enable_idempotence=True, acks="all", linger_ms=5)
    try:
        futures = [p.send(topic, b"p%04d" % i, partition=i % 6) for i in range(N // 2)]
        p.flush(T)
        _move_leaders(cluster, topic)
        futures += [p.send(topic, b"p%04d" % i, partition=i % 6) for i in range(N // 2, N)]
        p.flush(T)
        for f in futures:
            f.get(T)
    finally:
        p.close(timeout=5)
    assert cluster.stats.not_leader > 0

    tp = KafkaProducer(**base, transactional_id=txn_id, linger_ms=2)
    try:
        tp.init_transactions()
        tp.begin_transaction()
        for i in range(60):
            tp.send(topic, b"c%04d" % i, partition=i % 6)
        tp.commit_transaction()
        before = cluster.stats.not_coordinator
        _move_coordinator(cluster, txn_id)
        tp.begin_transaction()
        for i in range(30):
            tp.send(topic, b"x%04d" % i, partition=i % 6)
        tp.flush()  # in the log before the abort (an abort may drop unsent batches)
        tp.abort_transaction()
        _move_coordinator(cluster, txn_id)
        tp.begin_transaction()
        for i in range(60):
            tp.send(topic, b"d%04d" % i, partition=i % 6)
        tp.commit_transaction()
    finally:
        tp.close(timeout=5)
    assert cluster.stats.not_coordinator > before

    moves = _Moves(cluster, topic, group)
    c = KafkaConsumer(
        topic,
        **base,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=1024,
        heartbeat_interval_ms=200,
    )
    got: list[bytes] = []
    try:
        end = time.monotonic() + T
        while len(got) < len(_want()) and time.monotonic() < end:
            for msgs in c.poll(timeout_ms=300).values():
                got += [m.value for m in msgs]
            if got:
                c.commit()
            moves.after(len(got))
        assert c.poll(timeout_ms=300) == {}  # nothing more comes
        c.commit()
        committed = [c.committed(TopicPartition(topic, i)) or 0 for i in range(6)]
    finally:
        c.close()
    assert sorted(got) == _want()
    assert sum(committed) > len(_want())  # commit and abort markers take offsets too
    moves.check()


def test_aiokafka_against_the_virtual_cluster(cluster: VirtualCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    topic = _topic(cluster.bootstrap)
    txn_id, group = f"vcai-t-{uuid.uuid4().hex[:6]}", f"vcai-g-{uuid.uuid4().hex[:6]}"
    base = {"bootstrap_servers": cluster.bootstrap, "request_timeout_ms": 10_000}

    async def produce() -> int:
        p = AIOKafkaProducer(**base, enable_idempotence=True, linger_ms=5)
        await p.start()
        try:
            futures = [await p.send(topic, b"p%04d" % i, partition=i % 6) for i in range(N // 2)]
            await p.flush()
            _move_leaders(cluster, topic)
            futures += [
                await p.send(topic, b"p%04d" % i, partition=i % 6) for i in range(N // 2, N)
            ]
            await asyncio.gather(*futures)
        finally:
            await p.stop()
        assert cluster.stats.not_leader > 0

        tp = AIOKafkaProducer(**base, transactional_id=txn_id, linger_ms=2)
        await tp.start()  # InitProducerId
        try:
            async with tp.transaction():
                for i in range(60):
                    await tp.send(topic, b"c%04d" % i, partition=i % 6)
            before = cluster.stats.not_coordinator
            _move_coordinator(cluster, txn_id)
            await tp.begin_transaction()
            for i in range(30):
                await tp.send(topic, b"x%04d" % i, partition=i % 6)
            await tp.flush()  # in the log before the abort
            await tp.abort_transaction()
            _move_coordinator(cluster, txn_id)
            async with tp.transaction():
                for i in range(60):
                    await tp.send(topic, b"d%04d" % i, partition=i % 6)
        finally:
            await tp.stop()
        return before

    async def consume(moves: _Moves) -> tuple[list[bytes], list[int]]:
        c = AIOKafkaConsumer(
            topic,
            **base,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=1024,
            heartbeat_interval_ms=200,
        )
        await c.start()
        got: list[bytes] = []
        try:
            while len(got) < len(_want()):
                for msgs in (await c.getmany(timeout_ms=300)).values():
                    got += [m.value for m in msgs]
                if got:
                    await c.commit()
                moves.after(len(got))
            assert await c.getmany(timeout_ms=300) == {}  # nothing more comes
            await c.commit()
            committed = [await c.committed(TopicPartition(topic, i)) or 0 for i in range(6)]
        finally:
            await c.stop()
        return got, committed

    before = asyncio.run(asyncio.wait_for(produce(), T))
    assert cluster.stats.not_coordinator > before
    moves = _Moves(cluster, topic, group)  # counted from here: the consumer's own
    got, committed = asyncio.run(asyncio.wait_for(consume(moves), T))
    assert sorted(got) == _want()
    assert sum(committed) > len(_want())
    moves.check()
