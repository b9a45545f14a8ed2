"""Exactly-once writes: a failed and retried task, a driver crash between the sink's commit
and Spark's checkpoint commit, and a commit that runs twice. The output topic must hold each
input record's result exactly once (read_committed), while the log shows that the faults
really left output behind (aborted transactions, read_uncommitted)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from samsa.client import Producer
from samsa.spark._options import SinkOptions
from samsa.spark._write import commit_job, committed_batches, write_task

pytestmark = pytest.mark.timeout(300)


def fill(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(n):
            p.produce(topic, b"%d" % i, partition=i % partitions)
        p.flush()


def values(records: list[Any]) -> collections.Counter[bytes]:
    return collections.Counter(r.value for r in records)


def test_batch_write_with_a_failed_task_is_exactly_once(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], read_topic: Callable[..., Any]
) -> None:
    out = new_topic(3)
    df = spark.range(0, 3000, numPartitions=3).selectExpr(
        "CAST(id AS STRING) AS value", "CAST(id % 7 AS STRING) AS key"
    )
    (
        df.write.format("samsa")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("injectTaskFailure", "1:400")  # attempt 0 of partition 1 dies after 400 rows
        .mode("append")
        .save()
    )
    got = values(read_topic(out))
    assert got == collections.Counter(b"%d" % i for i in range(3000))
    # the failed attempt's 400 records are in the log, in an aborted transaction
    assert len(read_topic(out, committed=False)) >= 3400


def stream_query(
    spark: Any, bootstrap: str, src: str, out: str, checkpoint: str, **sink: str
) -> Any:
    w = (
        spark.readStream.format("samsa")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", src)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "600")
        .load()
        .selectExpr("CAST(CAST(value AS STRING) AS INT) AS n")
        .repartition(2)
        .selectExpr("CAST(n AS STRING) AS key", "CAST(n * 10 AS STRING) AS value")
        .writeStream.format("samsa")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    for k, v in sink.items():
        w = w.option(k, v)
    return w.start()


def expected(n: int) -> collections.Counter[bytes]:
    return collections.Counter(b"%d" % (i * 10) for i in range(n))


def test_stream_write_with_a_failed_task_is_exactly_once(
    spark: Any,
    bootstrap: str,
    new_topic: Callable[..., str],
    read_topic: Callable[..., Any],
    checkpoint: str,
) -> None:
    src, out = new_topic(2), new_topic(2)
    fill(bootstrap, src, 1500, 2)
    q = stream_query(spark, bootstrap, src, out, checkpoint, injectTaskFailure="0:100")
    assert q.awaitTermination(180) and q.exception() is None
    assert values(read_topic(out)) == expected(1500)
    assert len(read_topic(out, committed=False)) > 1500  # the failed attempts' output


def test_driver_crash_after_the_sink_commit_replays_without_duplicates(
    spark: Any,
    bootstrap: str,
    new_topic: Callable[..., str],
    read_topic: Callable[..., Any],
    checkpoint: str,
) -> None:
    src, out = new_topic(2), new_topic(2)
    fill(bootstrap, src, 1500, 2)
    # batch 1 is committed by the sink, then the "driver" dies before Spark's commit log
    q = stream_query(spark, bootstrap, src, out, checkpoint, injectCommitFailure="1")
    with pytest.raises(Exception, match="injected driver crash"):
        q.awaitTermination(180)
    after_crash = values(read_topic(out))
    assert after_crash == expected(1200)  # batches 0 and 1 are visible

    # restart: Spark replays batch 1 (same offsets, same batch id); the sink aborts it
    q = stream_query(spark, bootstrap, src, out, checkpoint)
    assert q.awaitTermination(180) and q.exception() is None
    assert values(read_topic(out)) == expected(1500)
    assert len(read_topic(out, committed=False)) >= 1500 + 600  # the replay is in the log


def test_commit_twice_and_replayed_batch_commit_once(
    bootstrap: str, new_topic: Callable[..., str], read_topic: Callable[..., Any], tmp_path: Any
) -> None:
    out = new_topic(1)
    opts = SinkOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "topic": out, "checkpointLocation": str(tmp_path)},
        streaming=True,
        job_id="unused",
    )

    def rows(lo: int, hi: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"value": [str(i) for i in range(lo, hi)]})

    # batch 0: two tasks, committed twice
    msgs = [
        write_task(opts, iter([rows(0, 50)]), 0, 0),
        write_task(opts, iter([rows(50, 80)]), 1, 0),
    ]
    first = commit_job(opts, msgs, 0)
    second = commit_job(opts, msgs, 0)
    assert (first.committed, first.replayed) == (2, 0)
    assert (second.committed, second.replayed) == (0, 2)
    assert committed_batches(opts, [0, 1]) == {0: 1, 1: 1}

    # batch 0 replayed after a "driver restart": new attempts of the tasks, then commit
    replay = [
        write_task(opts, iter([rows(0, 50)]), 0, 0),
        write_task(opts, iter([rows(50, 80)]), 1, 0),
    ]
    assert commit_job(opts, replay, 0).replayed == 2

    # batch 1 goes through
    assert commit_job(opts, [write_task(opts, iter([rows(80, 100)]), 0, 0)], 1).committed == 1
    got = values(read_topic(out))
    assert got == collections.Counter(b"%d" % i for i in range(100))
    assert len(read_topic(out, committed=False)) == 100 + 80  # one replay's worth aborted
