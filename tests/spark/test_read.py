"""Batch reads: Kafka source schema, offsets options, isolation level, clear errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from samsa.client import Producer

pytestmark = pytest.mark.timeout(240)


def fill(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(n):
            p.produce(
                topic, b"v%d" % i, b"k%d" % i, partition=i % partitions, headers=[("h", b"%d" % i)]
            )
        p.flush()


def aborted(bootstrap: str, topic: str, n: int) -> None:
    with Producer({"bootstrap.servers": bootstrap, "transactional.id": f"abort-{topic}"}) as p:
        p.init_transactions()
        p.begin_transaction()
        for _ in range(n):
            p.produce(topic, b"aborted", partition=0)
        p.flush()  # in the log, then aborted
        p.abort_transaction()


def reader(spark: Any, bootstrap: str, **opts: str) -> Any:
    r = spark.read.format("samsa").option("kafka.bootstrap.servers", bootstrap)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_schema_offsets_and_isolation(
    spark: Any, bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    fill(bootstrap, topic, 100, 2)
    aborted(bootstrap, topic, 10)  # offsets 50..60 of partition 0, then its abort marker
    fill(bootstrap, topic, 10, 2)

    df = reader(spark, bootstrap, subscribe=topic, includeHeaders="true")
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    rows = df.collect()
    assert len(rows) == 110  # read_committed: the aborted records are not there
    assert {bytes(r.value) for r in rows} == {b"v%d" % i for i in range(100)} | {
        b"v%d" % i for i in range(10)
    }
    first = next(r for r in rows if r.partition == 1 and r.offset == 0)
    assert (bytes(first.key), bytes(first.value), first.topic) == (b"k1", b"v1", topic)
    assert first.timestampType == 0 and first.timestamp is not None
    assert [(h.key, bytes(h.value)) for h in first.headers] == [("h", b"1")]

    dirty = reader(
        spark, bootstrap, subscribe=topic, **{"kafka.isolation.level": "read_uncommitted"}
    )
    assert dirty.count() == 120

    ranged = reader(
        spark,
        bootstrap,
        assign=json.dumps({topic: [1]}),
        startingOffsets=json.dumps({topic: {"1": 10}}),
        endingOffsets=json.dumps({topic: {"1": 20}}),
    )
    offs = sorted(r.offset for r in ranged.select("offset").collect())
    assert offs == list(range(10, 20))

    pattern = reader(
        spark, bootstrap, subscribePattern=topic.replace("-", "[-]"), minPartitions="4"
    )
    assert pattern.rdd.getNumPartitions() >= 4 and pattern.count() == 110


def test_bad_options_fail_with_a_clear_message(spark: Any, bootstrap: str) -> None:
    with pytest.raises(Exception, match="exactly one of the options subscribe"):
        reader(spark, bootstrap).count()
    with pytest.raises(Exception, match="startingOffsets cannot be latest"):
        reader(spark, bootstrap, subscribe="x", startingOffsets="latest").count()
    with pytest.raises(Exception, match="not read by this query"):
        reader(
            spark, bootstrap, subscribe="nope-topic", startingOffsets='{"other":{"0":1}}'
        ).count()
