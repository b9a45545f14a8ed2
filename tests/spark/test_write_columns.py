"""The sink's task writer on Arrow batches (no Spark needed): every column of Spark's Kafka
sink schema reaches the log through produce_batch (topic column split per topic, nullable
partition column, headers, string or binary key/value), rows in order per partition, and
the transaction commits them together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from samsa.client import partition_for_key
from samsa.spark._options import SinkOptions
from samsa.spark._write import commit_job, write_task

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _rows(lo: int, hi: int, topics: tuple[str, str]) -> pa.RecordBatch:
    idx = range(lo, hi)
    return pa.RecordBatch.from_pydict(
        {
            "value": [f"v{i}" for i in idx],
            "key": [None if i % 3 == 0 else f"k{i % 5}".encode() for i in idx],
            "topic": [topics[i % 2] for i in idx],
            "partition": pa.array([1 if i % 4 == 1 else None for i in idx], pa.int32()),
            "headers": pa.array(
                [[{"key": "i", "value": b"%d" % i}] if i % 2 else None for i in idx], HEADERS
            ),
        }
    )


@pytest.mark.parametrize("exactly_once", [True, False])
def test_columns_reach_the_log_per_topic_in_order(
    bootstrap: str,
    new_topic: Callable[..., str],
    read_topic: Callable[..., Any],
    tmp_path: Any,
    exactly_once: bool,
) -> None:
    topics = (new_topic(3), new_topic(3))
    opts = SinkOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "exactlyOnce": str(exactly_once).lower()},
        streaming=False,
        job_id=f"cols-{tmp_path.name}",
    )
    msg = write_task(opts, iter([_rows(0, 400, topics), _rows(400, 1000, topics)]), 0, 0)
    assert msg.records == 1000
    commit_job(opts, [msg], None)
    for t, topic in enumerate(topics):
        got = read_topic(topic)
        assert sorted(int(r.value[1:]) for r in got) == list(range(t, 1000, 2))
        for r in got:
            i = int(r.value[1:])
            if i % 4 == 1:
                assert r.partition == 1
            elif i % 3:
                assert r.partition == partition_for_key(f"k{i % 5}".encode(), 3)
            assert r.key == (None if i % 3 == 0 else f"k{i % 5}".encode())
            assert r.headers == ((("i", b"%d" % i),) if i % 2 else ())
        for p in range(3):
            order = [int(r.value[1:]) for r in got if r.partition == p]
            assert order == sorted(order)


def test_a_null_topic_fails_the_task(bootstrap: str, new_topic: Callable[..., str]) -> None:
    opts = SinkOptions.parse(
        {"kafka.bootstrap.servers": bootstrap, "exactlyOnce": "false"},
        streaming=False,
        job_id="nulltopic",
    )
    batch = pa.RecordBatch.from_pydict(
        {"value": ["a", "b"], "topic": pa.array([new_topic(1), None], pa.string())}
    )
    with pytest.raises(ValueError, match="null topic"):
        write_task(opts, iter([batch]), 0, 0)
