"""``samsa groups list|describe|delete`` as a subprocess against a real broker."""

from __future__ import annotations

import subprocess
import sys
import time

from confluent_kafka import Consumer, Producer

from samsa.client._connection import BlockingConnection
from samsa.testing import create_topic


def _samsa(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "samsa", "groups", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_groups_list_describe_with_lag_and_delete(broker_factory: type) -> None:
    broker = broker_factory(overrides={"group.initial.rebalance.delay.ms": "0"}).start()
    bs = ["--bootstrap-server", broker.bootstrap]
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        assert create_topic(conn, "lagged", 2) == 0
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce("lagged", value=b"%d" % i, partition=i % 2)  # 5 per partition
    assert producer.flush(10) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "cli-group",
            "client.id": "lag-watcher",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["lagged"])
    consumed = 0
    deadline = time.monotonic() + 20
    while consumed < 6 and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error() and m.offset() < 3:
            consumer.commit(message=m, asynchronous=False)  # commits offsets 1..3
            consumed += 1
    assert consumed == 6
    try:
        listed = _samsa("list", *bs)
        assert listed.returncode == 0, listed.stderr
        assert "cli-group\tStable\tconsumer" in listed.stdout

        described = _samsa("describe", "cli-group", *bs)
        assert described.returncode == 0, described.stderr
        rows = [line.split("\t") for line in described.stdout.splitlines()[2:]]
        assert [r[:5] for r in rows] == [
            ["lagged", "0", "3", "5", "2"],
            ["lagged", "1", "3", "5", "2"],
        ]
        assert all(r[6] == "lag-watcher" and r[5].startswith("lag-watcher-") for r in rows)

        busy = _samsa("delete", "cli-group", *bs)
        assert busy.returncode == 1 and "NON_EMPTY_GROUP" in busy.stderr
    finally:
        consumer.close()

    deleted = _samsa("delete", "cli-group", *bs)
    assert deleted.returncode == 0, deleted.stderr
    assert "cli-group" not in _samsa("list", *bs).stdout
    missing = _samsa("describe", "cli-group", *bs)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
