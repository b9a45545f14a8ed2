"""Prometheus metrics (broker/metrics.py): a broker with ``metrics.port`` does known work, then
``/metrics`` is scraped over HTTP and each value checked against that work."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from _broker import BrokerProcess
from samsa.broker.metrics import (
    MAX_HTTP_REQUEST_BYTES,
    BrokerMetrics,
    http_response,
    request_label,
)
from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.hotpath import ProducePartitionResult
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import iter_batches
from samsa.testing import fetch_request, idempotent_batch, init_producer_id, produce_one

REPO = Path(__file__).resolve().parents[3]
TOPIC = "metered"
N = 40  # records the samsa client produces, 20 to each partition
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@dataclass
class Work:
    broker: BrokerProcess
    metrics_port: int
    samples: Samples
    batches: dict[int, list[tuple[int, int]]]  # partition -> (size, records) of each batch
    fetched_bytes: int
    raw_produces: int
    txn_first_offset: int
    committed: dict[int, int]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Work]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("metrics"),
        {
            "metrics.port": "0",
            "log.flush.interval.messages": "1",  # every acknowledged write is fsynced
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
        },
    ).start()
    txn: Producer | None = None
    try:
        line = broker.wait_for_log("metrics on http://127.0.0.1:")
        assert line is not None
        metrics_port = int(line.rsplit(":", 1)[1].split("/")[0])
        boot = {"bootstrap.servers": broker.bootstrap}
        with Admin(boot) as admin:
            admin.create_topic(TOPIC, 2)
        with Producer({**boot, "enable.idempotence": True, "linger.ms": 0}) as producer:
            for i in range(N):
                producer.produce(TOPIC, b"v%d" % i, partition=i % 2)
            assert producer.flush(30) == 0

        raw_produces = 0
        with BlockingConnection("127.0.0.1", broker.port) as conn:
            _, pid, _ = init_producer_id(conn)
            first = idempotent_batch(pid, 0, 0, 3)
            assert produce_one(conn, TOPIC, 0, first)[0] == 0
            assert produce_one(conn, TOPIC, 0, first)[0] == 0  # a retry: the duplicate
            gap = idempotent_batch(pid, 0, 5)
            assert produce_one(conn, TOPIC, 0, gap)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
            assert produce_one(conn, TOPIC, 1, idempotent_batch(pid, 1, 0))[0] == 0  # epoch 1
            stale = idempotent_batch(pid, 0, 1)
            assert produce_one(conn, TOPIC, 1, stale)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
            assert produce_one(conn, "no-such-topic", 0, first)[0] == (
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
            raw_produces = 6

        # A transaction left open on partition 1.
        txn = Producer({**boot, "transactional.id": "metrics-txn", "linger.ms": 0})
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce(TOPIC, b"t1", partition=1)
        txn.produce(TOPIC, b"t2", partition=1)
        assert txn.flush(30) == 0

        # What the log holds, read back (read_uncommitted, from offset 0).
        batches: dict[int, list[tuple[int, int]]] = {}
        fetched = 0
        txn_first = -1
        with BlockingConnection("127.0.0.1", broker.port) as conn:
            for p in (0, 1):
                resp = conn.request(ApiKey.FETCH, 12, fetch_request({(TOPIC, p): 0}))
                records = resp.responses[0].partitions[0].records or b""
                fetched += len(records)
                views = list(iter_batches(records))
                batches[p] = [(v.size, v.record_count) for v in views]
                if p == 1:
                    txn_first = next(v.base_offset for v in views if v.is_transactional)

        committed = {0: 5, 1: 7}
        group = {**boot, "group.id": "metrics-group", "enable.auto.commit": False}
        with Consumer(group) as consumer:
            consumer.commit({TopicPartition(TOPIC, p): o for p, o in committed.items()})

        samples = scrape(metrics_port)
        yield Work(
            broker, metrics_port, samples, batches, fetched, raw_produces, txn_first, committed
        )
    finally:
        if txn is not None:
            txn.close(5)
        broker.stop()


def test_messages_and_bytes_in_equal_what_the_log_holds(work: Work) -> None:
    s = work.samples
    all_batches = work.batches[0] + work.batches[1]
    # N client records, 3 raw + 1 raw at epoch 1, 2 transactional: no duplicate, no refusal.
    assert sum(n for _, n in all_batches) == N + 3 + 1 + 2
    assert value(s, "kafka_server_brokertopicmetrics_messagesin_total", topic=TOPIC) == (
        N + 3 + 1 + 2
    )
    assert value(s, "kafka_server_brokertopicmetrics_bytesin_total", topic=TOPIC) == sum(
        size for size, _ in all_batches
    )
    # At least the raw fetch's bytes went out (the clients fetched none: they only produced).
    assert value(s, "kafka_server_brokertopicmetrics_bytesout_total", topic=TOPIC) == (
        work.fetched_bytes
    )


def test_refusals_are_counted_by_kind(work: Work) -> None:
    s = work.samples
    assert value(s, "samsa_produce_duplicates_total", topic=TOPIC) == 1
    assert value(s, "samsa_produce_out_of_order_sequence_total", topic=TOPIC) == 1
    assert value(s, "samsa_produce_fenced_total", topic=TOPIC) == 1
    assert value(s, "kafka_server_brokertopicmetrics_failedproducerequests_total", topic=TOPIC) == 2
    assert value(s, "kafka_server_brokertopicmetrics_failedfetchrequests_total", topic=TOPIC) == 0
    # One per partition per request: the raw ones to this topic, plus the clients' (>= 1 each).
    produced = value(s, "kafka_server_brokertopicmetrics_totalproducerequests_total", topic=TOPIC)
    assert produced >= work.raw_produces - 1 + 2 + 1
    assert value(s, "kafka_server_brokertopicmetrics_totalfetchrequests_total", topic=TOPIC) == 2
    # A topic that does not exist gets no series (a client cannot make up labels).
    assert not [key for key in s if ("topic", "no-such-topic") in key[1]]


def test_transactions_and_last_stable_offset(work: Work) -> None:
    s = work.samples
    assert value(s, "samsa_transactions_ongoing") == 1
    assert 0 < value(s, "samsa_transactions_oldest_age_seconds") < 120
    end1 = value(s, "kafka_log_log_logendoffset", topic=TOPIC, partition="1")
    assert end1 == sum(n for _, n in work.batches[1])
    assert value(s, "samsa_log_last_stable_offset_lag", topic=TOPIC, partition="1") == (
        end1 - work.txn_first_offset
    )
    assert value(s, "samsa_log_last_stable_offset_lag", topic=TOPIC, partition="0") == 0


def test_producer_state_per_partition(work: Work) -> None:
    s = work.samples
    # Partition 0: the client's idempotent producer and the raw one; partition 1: those and
    # the transactional producer.
    assert value(s, "samsa_producer_state_entries", topic=TOPIC, partition="0") == 2
    assert value(s, "samsa_producer_state_entries", topic=TOPIC, partition="1") == 3
    assert value(s, "samsa_producer_state_bytes", topic=TOPIC, partition="1") > value(
        s, "samsa_producer_state_bytes", topic=TOPIC, partition="0"
    )


def test_group_lag_is_end_minus_committed(work: Work) -> None:
    s = work.samples
    for p, offset in work.committed.items():
        end = value(s, "kafka_log_log_logendoffset", topic=TOPIC, partition=str(p))
        labels = {"consumergroup": "metrics-group", "topic": TOPIC, "partition": str(p)}
        assert value(s, "kafka_consumergroup_lag", **labels) == end - offset
        assert value(s, "kafka_consumergroup_current_offset", **labels) == offset


def test_latency_histograms_count_the_requests(work: Work) -> None:
    s = work.samples
    hist = "kafka_network_requestmetrics_totaltimems"
    produce = value(s, f"{hist}_count", request="Produce")
    assert produce >= work.raw_produces + 2  # the raw ones, and each client's (>= 1)
    assert value(s, f"{hist}_bucket", request="Produce", le="+Inf") == produce
    assert value(s, f"{hist}_count", request="Fetch") >= 2
    assert value(s, f"{hist}_count", request="InitProducerId") >= 2
    assert value(s, f"{hist}_count", request="OffsetCommit") >= 1
    assert value(s, f"{hist}_sum", request="Produce") > 0
    # log.flush.interval.messages=1: each append that wrote something was fsynced: at least
    # one fsync per batch in the topic's logs (the internal topics' appends add more).
    fsyncs = value(s, "kafka_log_logflushstats_logflushrateandtimems_count")
    appended = sum(len(b) for b in work.batches.values())
    assert appended >= 4 and fsyncs >= appended, (fsyncs, appended)
    assert value(s, "kafka_server_replicamanager_partitioncount") >= 2


def test_deleted_topic_loses_its_series(work: Work) -> None:
    with Admin({"bootstrap.servers": work.broker.bootstrap}) as admin:
        admin.create_topic("doomed", 1)
        with BlockingConnection("127.0.0.1", work.broker.port) as conn:
            _, pid, _ = init_producer_id(conn)
            assert produce_one(conn, "doomed", 0, idempotent_batch(pid, 0, 0, 2))[0] == 0
        before = scrape(work.metrics_port)
        messages_in = "kafka_server_brokertopicmetrics_messagesin_total"
        assert value(before, messages_in, topic="doomed") == 2
        assert admin.delete_topics(["doomed"]) == {"doomed": None}
    deadline = time.monotonic() + 10
    while True:
        after = scrape(work.metrics_port)
        left = [key for key in after if ("topic", "doomed") in key[1]]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left == []


def test_http_answers_errors_clearly(work: Work) -> None:
    base = f"http://127.0.0.1:{work.metrics_port}"
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/nope", timeout=10)
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as post:
        urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", b"x"), timeout=10)
    assert post.value.code == 405
    # The sans-IO side: a malformed request line is a 400; HEAD gets no body.
    assert http_response(b"garbage\r\n\r\n", lambda: b"m").startswith(b"HTTP/1.0 400 ")
    head = http_response(b"HEAD /metrics HTTP/1.1\r\n\r\n", lambda: b"metric 1\n")
    assert head.startswith(b"HTTP/1.0 200 ") and head.endswith(b"\r\n\r\n")
    assert b"Content-Length: 9\r\n" in head
    assert MAX_HTTP_REQUEST_BYTES <= 65536


def test_oversized_request_head_is_refused(work: Work) -> None:
    with socket.create_connection(("127.0.0.1", work.metrics_port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_HTTP_REQUEST_BYTES * 2))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 400 ")


def test_request_labels_are_kafka_api_names() -> None:
    assert request_label(ApiKey.PRODUCE) == "Produce"
    assert request_label(ApiKey.API_VERSIONS) == "ApiVersions"
    assert request_label(ApiKey.INIT_PRODUCER_ID) == "InitProducerId"


_METRIC = re.compile(r"\b(?:kafka|samsa)_[a-z0-9_]+")


def test_grafana_dashboard_uses_only_exported_metrics(work: Work) -> None:
    dashboard = json.loads((REPO / "docs" / "grafana" / "samsa.json").read_text())
    exprs = [
        target["expr"]
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if "expr" in target
    ]
    assert len(exprs) >= 8
    exported = {name for name, _labels in work.samples}
    for expr in exprs:
        names = _METRIC.findall(expr)
        assert names, expr
        for name in names:
            assert name in exported, f"{name} (in {expr!r}) is not a metric the broker exports"


class _Topics:
    def __init__(self, names: set[str]) -> None:
        self.topics = dict.fromkeys(names)
        self.topics_by_id: dict[object, object] = {}


class _FakeBroker:
    def __init__(self, names: set[str]) -> None:
        self.topics = _Topics(names)


def test_counters_hold_only_existing_topics() -> None:
    broker = _FakeBroker({"a"})
    m = BrokerMetrics(broker)  # type: ignore[arg-type]
    m.produced([("a", [ProducePartitionResult(0, ErrorCode.NONE)])])
    for i in range(1000):  # names a client made up: no entry each
        m.produced([(f"made-up-{i}", [ProducePartitionResult(0, ErrorCode.NONE)])])
    assert m.produce_requests == {"a": 1}
    broker.topics.topics = dict.fromkeys(["b"])  # "a" deleted, "b" created
    m.produced([("b", [ProducePartitionResult(0, ErrorCode.NOT_LEADER_OR_FOLLOWER)])])
    assert m.produce_requests == {"b": 1}
    assert m.failed_produce == {"b": 1}


def test_scrape_connections_are_bounded(work: Work) -> None:
    # METRICS_MAX_CONNECTIONS (8) connections that say nothing: the next one is closed at once
    # (without the bound it would wait up to 10 s for a request); once they go, scrapes work.
    address = ("127.0.0.1", work.metrics_port)
    idle = [socket.create_connection(address, timeout=10) for _ in range(8)]
    try:
        time.sleep(0.2)  # the server has taken them all
        with socket.create_connection(address, timeout=5) as extra:
            assert extra.recv(1024) == b""  # closed, not waiting for a request
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            scrape(work.metrics_port)
            break
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline
            time.sleep(0.05)
