"""The Spark source and exactly-once sink against a virtual 3-broker cluster
(samsa.testing.cluster): executors' clients go to each partition's leader and each
transactional id's coordinator, and follow leaders and coordinators that move while a
streaming query runs."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.client import Producer
from samsa.testing import read_topic
from samsa.testing.cluster import VirtualCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(spark_broker: BrokerProcess) -> Iterator[VirtualCluster]:
    with VirtualCluster(spark_broker.bootstrap, nodes=3) as vc:
        yield vc


def _mover(cluster: VirtualCluster, topics: list[str], stop: threading.Event) -> None:
    """Move every partition's leader, and every coordinator this run used, to the next node
    every 0.3 s until stopped."""
    while not stop.wait(0.3):
        for topic in topics:
            for part in range(4):
                cluster.move_leader(topic, part, (cluster.leader(topic, part) + 1) % 3)
        for key in cluster.coordinator_keys:
            cluster.move_coordinator(key, (cluster.coordinator(key) + 1) % 3)


def test_spark_sink_and_source_exactly_once_on_a_moving_cluster(
    spark: Any, cluster: VirtualCluster, new_topic: Callable[..., str], checkpoint: str
) -> None:
    bs = cluster.bootstrap
    src, out = new_topic(4, "vcsrc"), new_topic(4, "vcout")
    n = 1200
    with Producer({"bootstrap.servers": bs}) as p:
        for i in range(n):
            p.produce(src, b"%d" % i, partition=i % 4)
        assert p.flush(30) == 0
    stop = threading.Event()
    mover = threading.Thread(target=_mover, args=(cluster, [src, out], stop))
    mover.start()
    try:
        q = (
            spark.readStream.format("samsa")
            .option("kafka.bootstrap.servers", bs)
            .option("subscribe", src)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "300")
            .load()
            .selectExpr("CAST(CAST(value AS STRING) AS INT) AS n")
            .selectExpr("CAST(n AS STRING) AS key", "CAST(n * 10 AS STRING) AS value")
            .writeStream.format("samsa")
            .option("kafka.bootstrap.servers", bs)
            .option("topic", out)
            .option("checkpointLocation", checkpoint)
            .option("injectTaskFailure", "0:50")  # a retried task: its output is aborted
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(180) and q.exception() is None
    finally:
        stop.set()
        mover.join(10)
    got = collections.Counter(r.value for r in read_topic(bs, out, timeout=10.0))
    assert got == collections.Counter(b"%d" % (i * 10) for i in range(n))
    # The batch source reads the output back through the cluster, read_committed.
    rows = (
        spark.read.format("samsa")
        .option("kafka.bootstrap.servers", bs)
        .option("subscribe", out)
        .option("kafka.isolation.level", "read_committed")
        .load()
        .selectExpr("CAST(value AS STRING) AS v")
        .collect()
    )
    assert sorted(int(r.v) for r in rows) == [i * 10 for i in range(n)]
    assert cluster.stats.not_leader > 0 and cluster.stats.not_coordinator > 0
