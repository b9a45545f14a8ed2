"""samsa's consumer validates its positions with new leaders (KIP-320) on a virtual cluster.

The virtual cluster (samsa.testing.cluster) moves every partition's leader while a consumer
reads: the consumer must ask each new leader OffsetForLeaderEpoch before fetching from it
(counted in the broker's request metrics), drop what the old leaders sent ahead and read on
from its positions, every record exactly once and in order. Its commit records the leader
epoch of the records consumed, and a consumer resuming from it validates the committed
offsets first. The virtual cluster has one log, so nothing is ever truncated: the truncation
cases are in tests/unit/client/test_position_validation.py and, on a real cluster, in
tests/oracle/test_kafka_cluster_validation.py.
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from _broker import BrokerProcess
from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.client._subscription import OffsetAndEpoch
from samsa.log.segment import LEADER_EPOCH
from samsa.testing.cluster import VirtualCluster
from samsa.testing.kafka import free_port

T = 20.0
PARTS = 3


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int]]:
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("validate"), {"metrics.port": str(port)}).start()
    yield b, port
    b.stop()


def served(metrics_port: int) -> int:
    """OffsetForLeaderEpoch requests the broker answered."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    m = re.search(
        r'kafka_network_requestmetrics_totaltimems_count\{request="OffsetForLeaderEpoch"\} (\S+)',
        text,
    )
    return int(float(m.group(1))) if m else 0


def produce(bootstrap: str, topic: str, prefix: bytes, n: int) -> dict[int, list[bytes]]:
    sent: dict[int, list[bytes]] = {p: [] for p in range(PARTS)}
    # small batches: the consumer fetches many times, some from the moved leaders
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "batch.size": 256}) as prod:
        for i in range(n):
            v = b"%s%05d" % (prefix, i)
            prod.produce(topic, v, partition=i % PARTS)
            sent[i % PARTS].append(v)
        assert prod.flush(T) == 0
    return sent


def read(c: Consumer, want: int, got: dict[int, list[bytes]], *, move: VirtualCluster | None = None,
         topic: str = "") -> None:  # fmt: skip
    """Poll until ``want`` records in all; halfway, every leader moves (``move``)."""
    start = sum(map(len, got.values()))
    end = time.monotonic() + T
    while sum(map(len, got.values())) < want and time.monotonic() < end:
        if move is not None and sum(map(len, got.values())) - start >= (want - start) // 2:
            for part in range(PARTS):
                move.move_leader(topic, part, (move.leader(topic, part) + 1) % move.size)
            move = None
        for r in c.consume(50, 0.5):
            got[r.partition].append(r.value)
    assert c.consume(1000, 0.3) == []  # nothing more


def test_positions_are_validated_with_moved_leaders_and_committed_with_their_epoch(
    upstream: tuple[BrokerProcess, int],
) -> None:
    broker, port = upstream
    with VirtualCluster(broker.bootstrap, nodes=3) as cluster:
        topic = f"val-{uuid.uuid4().hex[:8]}"
        with Admin({"bootstrap.servers": cluster.bootstrap}) as admin:
            admin.create_topic(topic, PARTS)
        sent = produce(cluster.bootstrap, topic, b"a", 600)
        tps = [TopicPartition(topic, p) for p in range(PARTS)]
        cfg = {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"g-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": 1024,  # many fetches, some fetched ahead at the move
        }
        got: dict[int, list[bytes]] = {p: [] for p in range(PARTS)}
        before = served(port)
        with Consumer(cfg) as c:
            c.assign(tps)
            read(c, 600, got, move=cluster, topic=topic)
            moved = served(port) - before
            # each partition's position was checked with its new leader (one request per
            # leader asked, partitions of a leader together, FENCED answers asked again)
            assert moved >= 1, "no position validated after the leaders moved"
            assert cluster.stats.not_leader > 0, "the consumer never met a moved leader"
            assert got == sent, "a record lost, duplicated or reordered across the move"
            c.commit()
            # the commit carries the epoch of the last records consumed (samsa's broker has
            # one leader epoch, which the virtual cluster does not rewrite)
            stored = c._lt.run(c._core._fetch_committed(tps))
            assert stored == {tp: OffsetAndEpoch(200, LEADER_EPOCH) for tp in tps}

        more = produce(cluster.bootstrap, topic, b"b", 60)
        before = served(port)
        again: dict[int, list[bytes]] = {p: [] for p in range(PARTS)}
        with Consumer(cfg) as c:
            c.assign(tps)
            read(c, 60, again)
        # the committed offsets, restored with their epoch, were validated before fetching
        assert served(port) - before >= 1
        assert again == more
