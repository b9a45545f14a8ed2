"""samsa's consumer validates its positions with a new leader on a 3-node Kafka cluster.

KIP-320 as Java's consumer does it: the leader of a partition being read is SIGKILLed; the
consumer learns the new leader and epoch from the metadata and asks it OffsetForLeaderEpoch
for the epoch of the last record it consumed before fetching from it. The test checks the
fault happened (another node leads, the epoch moved, the records written after it carry the
new epoch), that the consumer validated (the OffsetForLeaderEpoch answers it received are
counted), that every acknowledged record is read exactly once and in order, and that a
consumer resuming from the committed offsets (which carry the epoch) validates them first.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from test_kafka_cluster_faults import assert_exactly_once_in_order, cluster, new_topic

from samsa.client import Consumer, Producer, TopicPartition
from samsa.client._subscription import OffsetAndEpoch
from samsa.protocol.messages import ApiKey
from samsa.testing.kafka import KafkaCluster

__all__ = ["cluster"]  # the fixture, shared with the faults tests
pytestmark = pytest.mark.timeout(240)
PARTS = 2


def produce(bootstrap: str, topic: str, phase: str, n: int, sent: dict[int, list[bytes]]) -> None:
    """``n`` records a partition, idempotently, all acknowledged (small batches: the consumer
    fetches many times)."""
    cfg = {"bootstrap.servers": bootstrap, "linger.ms": 1, "batch.size": 512}
    with Producer(cfg) as p:
        for part in range(PARTS):
            vals = [b"%s%d-%04d" % (phase.encode(), part, i) for i in range(n)]
            for v in vals:
                p.produce(topic, v, partition=part)
            sent[part].extend(vals)
        assert p.flush(60) == 0


def count_validations(c: Consumer) -> list[int]:
    """A counter of the OffsetForLeaderEpoch answers the consumer receives."""
    answered = [0]
    cluster = c._core.cluster
    send: Callable[..., Awaitable[Any]] = cluster.send

    async def counting(node: int | None, api_key: int, *args: Any, **kw: Any) -> Any:
        resp = await send(node, api_key, *args, **kw)
        answered[0] += api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH
        return resp

    cluster.send = counting  # type: ignore[method-assign]
    return answered


def read_to_end(c: Consumer, tps: list[TopicPartition], got: list[Any]) -> None:
    ends = c.list_offsets(tps, -1)
    deadline = time.monotonic() + 60
    while any(c.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
        got += c.consume(50, 0.5)


def test_the_consumer_validates_with_the_new_leader_after_a_kill(cluster: KafkaCluster) -> None:
    topic = new_topic(cluster, PARTS, "validate")
    tps = [TopicPartition(topic, p) for p in range(PARTS)]
    sent: dict[int, list[bytes]] = collections.defaultdict(list)
    produce(cluster.bootstrap, topic, "a", 200, sent)
    cfg = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": f"g-{topic}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "max.partition.fetch.bytes": 1024,
        "request.timeout.ms": 4000,
    }
    got: list[Any] = []
    with Consumer(cfg) as c:
        answered = count_validations(c)
        c.assign(tps)
        deadline = time.monotonic() + 30
        # mid-read, with a record of partition 0 handed out: only a position read in a
        # known epoch has anything to validate (the buffer may hand out partition 1 first)
        while (len(got) < 100 or not any(r.partition == 0 for r in got)) and (
            time.monotonic() < deadline
        ):
            got += c.consume(20, 0.5)
        assert 0 < len(got) < 2 * 200
        state = c._core.subscriptions.state(tps[0])
        assert state is not None and state.offset_epoch >= 0, "partition 0 read in an epoch"
        before = answered[0]
        old, old_epoch, new, new_epoch = cluster.kill_leader(topic, 0, wait=False)
        assert new != old and new_epoch > old_epoch
        produce(cluster.bootstrap, topic, "b", 100, sent)
        read_to_end(c, tps, got)
        assert answered[0] > before, "the consumer fetched from the new leader unvalidated"
        # checked against the leader elected after the kill (or a later one, should the
        # restarted node take its preferred leadership back meanwhile)
        state = c._core.subscriptions.state(tps[0])
        assert state is not None and state.leader is not None and state.leader[1] >= new_epoch
        epochs = {r.leader_epoch for r in got if r.partition == 0 and r.value[:1] == b"b"}
        assert min(epochs) >= new_epoch, "records written after the kill carry the new epoch"
        c.commit()
        stored = c._lt.run(c._core._fetch_committed(tps))[tps[0]]
        assert stored == OffsetAndEpoch(300, max(epochs)), "the commit carries the epoch"
    assert_exactly_once_in_order(got, sent)

    produce(cluster.bootstrap, topic, "c", 10, sent)
    more: list[Any] = []
    with Consumer(cfg) as c:
        answered = count_validations(c)
        c.assign(tps)
        read_to_end(c, tps, more)
        assert answered[0] >= 1, "committed offsets resumed unvalidated"
    assert [r.value[:1] for r in more] == [b"c"] * 2 * 10
    assert_exactly_once_in_order(got + more, sent)
