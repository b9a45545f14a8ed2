"""Client telemetry (KIP-714) over the wire: subscriptions as CLIENT_METRICS config
resources (IncrementalAlterConfigs, DescribeConfigs, ListConfigResources, kept across a
restart), GetTelemetrySubscriptions and PushTelemetry's answers, and confluent-kafka
(librdkafka pushes when the broker offers a subscription) arriving on /metrics."""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from prometheus_client.parser import text_string_to_metric_families

from _broker import BrokerProcess
from samsa.broker.client_metrics import ACCEPTED_COMPRESSION, kafka_uuid
from samsa.client import Admin
from samsa.client._admin_configs import AlterConfigOp, ConfigResource
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

CLIENT_METRICS = 16
GET = ApiKey.GET_TELEMETRY_SUBSCRIPTIONS
PUSH = ApiKey.PUSH_TELEMETRY
LIST = ApiKey.LIST_CONFIG_RESOURCES


@pytest.fixture(scope="module")
def telemetry_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    overrides = {"metrics.port": "0", "telemetry.max.bytes": "4096"}
    b = BrokerProcess(tmp_path_factory.mktemp("telemetry"), overrides).start()
    yield b
    b.stop()


def metrics_port(broker: BrokerProcess) -> int:
    line = broker.wait_for_log("metrics on http://127.0.0.1:")
    return int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))  # type: ignore[union-attr]


def scrape(broker: BrokerProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    url = f"http://127.0.0.1:{metrics_port(broker)}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def subscribe(broker: BrokerProcess, name: str, **configs: str) -> None:
    ops = [AlterConfigOp(k.replace("_", "."), v) for k, v in configs.items()]
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        result = admin.incremental_alter_configs({ConfigResource(CLIENT_METRICS, name): ops})
    assert list(result.values()) == [None]


def get_subscriptions(conn: BlockingConnection, instance: uuid.UUID | None) -> Any:
    return conn.request(GET, 0, make_request(GET, 0, "GetTelemetrySubscriptionsRequest",
                                             client_instance_id=instance))  # fmt: skip


def push(conn: BlockingConnection, instance: uuid.UUID, sub: int, data: bytes, **kw: object) -> int:
    request = make_request(PUSH, 0, "PushTelemetryRequest", client_instance_id=instance,
                           subscription_id=sub, terminating=kw.get("terminating", False),
                           compression_type=kw.get("compression", 0), metrics=data)  # fmt: skip
    return int(conn.request(PUSH, 0, request).error_code)


def test_subscriptions_are_config_resources_kept_across_a_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        subscribe(broker, "prod", metrics="org.apache.kafka.producer.", interval_ms="1000",
                  match="client_id=app-.*")  # fmt: skip
        broker.stop()
        broker.start()
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            [described] = admin.describe_configs([ConfigResource(CLIENT_METRICS, "prod")]).values()
        assert {(c.name, c.value, c.source) for c in described.values()} == {
            ("metrics", "org.apache.kafka.producer.", 7),
            ("interval.ms", "1000", 7),
            ("match", "client_id=app-.*", 7),
        }
        with BlockingConnection("127.0.0.1", broker.port) as conn:
            for v in (0, 1):
                types = (CLIENT_METRICS,) if v else ()
                req = make_request(LIST, v, "ListConfigResourcesRequest", resource_types=types)
                answer = conn.request(LIST, v, req)
                assert int(answer.error_code) == 0
                assert [r.resource_name for r in answer.config_resources] == ["prod"]
            bad = make_request(
                ApiKey.INCREMENTAL_ALTER_CONFIGS,
                1,
                "IncrementalAlterConfigsRequest",
                validate_only=False,
                resources=tuple(
                    make_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "AlterConfigsResource",
                                 resource_type=CLIENT_METRICS, resource_name=f"bad-{n}",
                                 configs=(make_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1,
                                                       "AlterableConfig", name=n,
                                                       config_operation=0, value=val),))
                    for n, val in (("interval.ms", "5"), ("match", "nosuch=1"), ("x", "1"))
                ),
            )  # fmt: skip
            codes = [
                int(r.error_code)
                for r in conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, bad).responses
            ]
        # each refused as Kafka refuses it: INVALID_REQUEST, INVALID_CONFIG, INVALID_REQUEST
        assert codes == [42, 40, 42]
    finally:
        broker.stop()


def test_get_and_push_answer_as_kafka(telemetry_broker: BrokerProcess) -> None:
    subscribe(telemetry_broker, "raw", metrics="org.samsa.test.", interval_ms="60000",
              match="client_id=raw-telemetry")  # fmt: skip
    with BlockingConnection("127.0.0.1", telemetry_broker.port, client_id="raw-telemetry") as conn:
        first = get_subscriptions(conn, None)
        assert int(first.error_code) == 0
        instance = first.client_instance_id
        assert instance is not None and instance.int != 0
        assert first.requested_metrics == ("org.samsa.test.",)
        assert first.push_interval.total_seconds() == 60
        assert first.accepted_compression_types == ACCEPTED_COMPRESSION
        assert first.delta_temporality is True
        assert first.telemetry_max_bytes == 4096
        sub = first.subscription_id
        again = get_subscriptions(conn, instance)
        assert int(again.error_code) == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        data = metrics_pb2.MetricsData()
        m = data.resource_metrics.add().scope_metrics.add().metrics.add(name="org.samsa.test.x")
        m.gauge.data_points.add(as_int=42)
        payload = data.SerializeToString()
        assert push(conn, instance, sub + 1, payload) == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
        assert get_subscriptions(conn, instance).error_code == 0  # may fetch it again at once
        assert push(conn, instance, sub, payload) == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        assert push(conn, instance, sub, payload, terminating=True) == 0
        assert push(conn, instance, sub, payload) == ErrorCode.INVALID_REQUEST
        assert push(conn, uuid.UUID(int=0), sub, payload) == ErrorCode.INVALID_REQUEST
        other = get_subscriptions(conn, None)  # another instance, to push too much at once
        big = push(conn, other.client_instance_id, other.subscription_id, b"\0" * 4097)
        assert big == ErrorCode.TELEMETRY_TOO_LARGE
    samples = scrape(telemetry_broker)["samsa_client_org_samsa_test_x"]
    assert samples == [
        ({"client_id": "raw-telemetry", "client_instance_id": kafka_uuid(instance)}, 42.0)
    ]


def test_librdkafka_pushes_arrive_on_metrics(telemetry_broker: BrokerProcess) -> None:
    # ApiVersions names the software: confluent-kafka's wrapper, over librdkafka
    match = "client_id=rdkafka-telemetry,client_software_name=confluent-kafka-python"
    subscribe(telemetry_broker, "librdkafka", metrics="org.apache.kafka.producer.",
              interval_ms="200", match=match)  # fmt: skip
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": telemetry_broker.bootstrap, "client.id": "rdkafka-telemetry"}
    )
    try:
        deadline = time.monotonic() + 20
        found: list[tuple[dict[str, str], float]] = []
        while time.monotonic() < deadline and not found:
            producer.produce("telemetry", b"v")
            producer.poll(0.2)
            found = [
                (labels, value)
                for name, samples in scrape(telemetry_broker).items()
                if name.startswith("samsa_client_org_apache_kafka_producer_")
                for labels, value in samples
                if labels.get("client_id") == "rdkafka-telemetry"
            ]
        assert found, "no pushed producer metric on /metrics"
        assert {labels["client_instance_id"] for labels, _ in found} != {""}
    finally:
        producer.flush(10)
