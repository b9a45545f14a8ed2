"""Micro-batch reads: admission control, Trigger.AvailableNow, restart, new partitions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from samsa.client import Producer

pytestmark = pytest.mark.timeout(300)


def fill(bootstrap: str, topic: str, start: int, n: int, partitions: int = 1) -> None:
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(start, start + n):
            p.produce(topic, b"%d" % i, partition=i % partitions)
        p.flush()


def run_available_now(
    spark: Any, bootstrap: str, checkpoint: str, out: Path, **opts: str
) -> list[int]:
    """One AvailableNow run writing values to parquet; returns rows per micro-batch."""
    r = spark.readStream.format("samsa").option("kafka.bootstrap.servers", bootstrap)
    for k, v in opts.items():
        r = r.option(k, v)
    q = (
        r.load()
        .selectExpr("CAST(value AS STRING) AS v", "topic", "partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(180), "the AvailableNow query did not finish"
    assert q.exception() is None
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def test_stream_admission_restart_and_new_partitions(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], checkpoint: str, tmp_path: Path
) -> None:
    prefix = f"st{tmp_path.name[-6:].replace('_', '')}"
    first = new_topic(2, prefix)
    fill(bootstrap, first, 0, 250, 2)
    out = tmp_path / "out"
    opts = {
        "subscribePattern": f"{prefix}-.*",
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "100",
    }
    batches = run_available_now(spark, bootstrap, checkpoint, out, **opts)
    assert batches == [100, 100, 50]  # admission control, then everything available
    assert sorted(int(r.v) for r in spark.read.parquet(str(out)).collect()) == list(range(250))

    # restart from the checkpoint: only the new records, and a new topic's partitions
    fill(bootstrap, first, 250, 30, 2)
    second = new_topic(1, prefix)
    fill(bootstrap, second, 1000, 20)
    batches = run_available_now(spark, bootstrap, checkpoint, out, **opts)
    assert sum(batches) == 50
    values = sorted(int(r.v) for r in spark.read.parquet(str(out)).collect())
    assert values == list(range(280)) + list(range(1000, 1020))

    offsets = sorted(Path(checkpoint, "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    last = offsets[-1].read_text().splitlines()[-1]
    assert f'"{first}": {{"0": 140, "1": 140}}' in last or f'"{first}":{{"0":140,"1":140}}' in last
