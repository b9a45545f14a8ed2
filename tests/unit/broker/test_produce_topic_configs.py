"""Topic configs a Produce meets on the wire (docs/semantics.md, rules 40 and 42):
min.insync.replicas above the one replica samsa has refuses acks=all with NOT_ENOUGH_REPLICAS
and appends nothing, leaving acks=1 alone (rule 40); flush.messages and flush.ms make a topic's
appends fsynced before the ack (rule 42)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.testing import fetch_request, idempotent_batch, produce_one

TIMEOUT = 15.0


@pytest.fixture
def conn(shared_broker: Any) -> Iterator[BlockingConnection]:
    with BlockingConnection("127.0.0.1", shared_broker.port) as c:
        yield c


def _create(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(TIMEOUT)


def _end(conn: BlockingConnection, topic: str) -> int:
    resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): 0}))
    return int(resp.responses[0].partitions[0].high_watermark)


def test_min_insync_replicas_refuses_acks_all(shared_broker: Any, conn: BlockingConnection) -> None:
    """Rule 39: acks=all refused, nothing appended; acks=1 and a topic at 1 unaffected."""
    _create(shared_broker.bootstrap, "misr-2", {"min.insync.replicas": "2"})
    _create(shared_broker.bootstrap, "misr-1", {"min.insync.replicas": "1"})
    assert produce_one(conn, "misr-2", 0, idempotent_batch(-1, -1, -1, 3), acks=-1)[0] == (
        ErrorCode.NOT_ENOUGH_REPLICAS
    )
    assert _end(conn, "misr-2") == 0  # nothing appended
    assert produce_one(conn, "misr-2", 0, idempotent_batch(-1, -1, -1, 3), acks=1) == (0, 0)
    assert produce_one(conn, "misr-1", 0, idempotent_batch(-1, -1, -1, 3), acks=-1) == (0, 0)
    assert _end(conn, "misr-2") == 3 and _end(conn, "misr-1") == 3


def _fsyncs(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kafka_log_logflushstats_logflushrateandtimems_count":
                return sample.value
    raise AssertionError("no fsync histogram")


def test_flush_messages_and_flush_ms_fsync_per_append(broker_factory: Any) -> None:
    """Rule 41: a topic with flush.messages=1 (or flush.ms=0) has each append fsynced before
    the ack (the broker's fsync histogram counts one per Produce); a topic without them, on a
    broker that leaves flushing to the OS, has none."""
    broker = broker_factory(overrides={"metrics.port": "0"}).start()
    line = broker.wait_for_log("metrics on http://127.0.0.1:")
    assert line is not None
    metrics_port = int(line.rsplit(":", 1)[1].split("/")[0])
    _create(broker.bootstrap, "lazy", {})
    _create(broker.bootstrap, "each-message", {"flush.messages": "1"})
    _create(broker.bootstrap, "each-ms", {"flush.ms": "0"})
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        start = _fsyncs(metrics_port)
        for _ in range(3):
            assert produce_one(conn, "lazy", 0, idempotent_batch(-1, -1, -1, 2))[0] == 0
        # Without log.flush.scheduler.interval.ms no timer looks at an idle flush.ms topic.
        _create(broker.bootstrap, "idle-200ms", {"flush.ms": "200"})
        assert produce_one(conn, "idle-200ms", 0, idempotent_batch(-1, -1, -1, 2))[0] == 0
        time.sleep(0.6)
        assert _fsyncs(metrics_port) == start
        for topic in ("each-message", "each-ms"):
            for i in range(3):
                assert produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1, 2))[0] == 0
                # Counted before the response went out: the ack waited for the fsync.
                assert _fsyncs(metrics_port) == start + 1 + i
            start += 3


def test_log_flusher_fsyncs_idle_logs_past_flush_ms(broker_factory: Any) -> None:
    """Rule 42: with log.flush.scheduler.interval.ms set, a topic with flush.ms=200 whose
    last append was not fsynced (the ms had not passed) is fsynced by the timer, with no
    further append; a topic without flush.ms is left to the OS."""
    broker = broker_factory(
        overrides={"metrics.port": "0", "log.flush.scheduler.interval.ms": "100"}
    ).start()
    line = broker.wait_for_log("metrics on http://127.0.0.1:")
    assert line is not None
    metrics_port = int(line.rsplit(":", 1)[1].split("/")[0])
    _create(broker.bootstrap, "lazy", {})
    _create(broker.bootstrap, "timed", {"flush.ms": "200"})
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        start = _fsyncs(metrics_port)
        assert produce_one(conn, "lazy", 0, idempotent_batch(-1, -1, -1, 2))[0] == 0
        assert produce_one(conn, "timed", 0, idempotent_batch(-1, -1, -1, 2))[0] == 0
        assert _fsyncs(metrics_port) == start  # acked without an fsync
        deadline = time.monotonic() + 3.0
        while _fsyncs(metrics_port) == start and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _fsyncs(metrics_port) == start + 1  # "timed", by the log flusher
        time.sleep(0.5)  # several more passes: "lazy" stays unflushed, "timed" is clean
        assert _fsyncs(metrics_port) == start + 1
