"""Client telemetry (KIP-714, broker/client_metrics.py): subscriptions, the answers to
GetTelemetrySubscriptions and PushTelemetry on a fake clock, what pushed payloads become, the
bounds on instances and series, and their export on /metrics."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import cramjam
import lz4.frame
import pytest
import zstandard
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from samsa.broker import client_metrics as cm
from samsa.broker.client_metrics import (
    DEFAULT_INTERVAL_MS,
    ClientInfo,
    ClientMetricsConfigs,
    ClientMetricsError,
    ClientMetricsManager,
    kafka_uuid,
    monotonic_ms,
)
from samsa.broker.config import ConfigError
from samsa.broker.metrics import _client_telemetry
from samsa.protocol.errors import ErrorCode

INFO = ClientInfo("app-1", "127.0.0.1", "50000", "librdkafka", "2.16.1")
T0 = 1_000_000
_DELTA = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def payload(*points: tuple[str, float], delta_sum: bool = False, **attrs: str) -> bytes:
    """An OTLP MetricsData: each (name, value) a gauge (or a delta sum) with ``attrs``."""
    data = metrics_pb2.MetricsData()
    scope = data.resource_metrics.add().scope_metrics.add()
    for name, value in points:
        metric = scope.metrics.add(name=name)
        body = metric.sum if delta_sum else metric.gauge
        if delta_sum:
            metric.sum.aggregation_temporality = _DELTA
            metric.sum.is_monotonic = True
        point = body.data_points.add(as_double=value)
        for k, v in attrs.items():
            point.attributes.add(key=k, value=common_pb2.AnyValue(string_value=v))
    return data.SerializeToString()


def manager(tmp_path: Path, **subscriptions: dict[str, str]) -> ClientMetricsManager:
    configs = ClientMetricsConfigs(tmp_path / cm.CLIENT_METRICS_FILE)
    m = ClientMetricsManager(configs)
    for name, values in subscriptions.items():
        configs.alter(name, values, validate_only=False)
        m.subscriptions_changed()
    return m


def subscribed(m: ClientMetricsManager, now: int = T0) -> cm.Answer:
    answer = m.get_subscriptions(None, INFO, now)
    assert answer.error == ErrorCode.NONE
    return answer


def push(m: ClientMetricsManager, a: cm.Answer, data: bytes, now: int, **kw: object) -> ErrorCode:
    args: dict[str, object] = {"terminating": False, "compression": 0, **kw}
    return m.push(a.instance_id, a.subscription_id, args["terminating"], args["compression"],
                  data, INFO, now)  # type: ignore[arg-type]  # fmt: skip


def series(m: ClientMetricsManager) -> dict[str, float]:
    return {name: value for _inst, name, _labels, value in m.series()}


def test_a_client_no_subscription_matches_is_asked_for_nothing(tmp_path: Path) -> None:
    m = manager(tmp_path, other={"metrics": "org.apache.kafka.", "match": "client_id=other"})
    answer = subscribed(m)
    assert answer.instance_id.int != 0
    assert (answer.metrics, answer.interval_ms) == ((), DEFAULT_INTERVAL_MS)


def test_matching_subscriptions_are_merged(tmp_path: Path) -> None:
    m = manager(
        tmp_path,
        a={"metrics": "org.apache.kafka.producer.", "interval.ms": "2000",
           "match": "client_id=app-.*,client_software_name=librdkafka"},
        b={"metrics": "org.apache.kafka.consumer.", "interval.ms": "1000"},
        c={"metrics": "org.apache.kafka.admin.", "match": "client_id=app"},  # not a full match
    )  # fmt: skip
    answer = subscribed(m)
    assert answer.metrics == ("org.apache.kafka.consumer.", "org.apache.kafka.producer.")
    assert answer.interval_ms == 1000  # the least interval of those that match
    m.configs.alter("all", {"metrics": "*"}, validate_only=False)
    m.subscriptions_changed()
    again = m.get_subscriptions(answer.instance_id, INFO, T0 + 1)  # changed: not throttled
    assert again.metrics == ("*",)
    assert again.subscription_id != answer.subscription_id


def test_the_instance_id_is_a_selector(tmp_path: Path) -> None:
    m = manager(tmp_path)
    answer = subscribed(m)
    name = kafka_uuid(answer.instance_id)
    m.configs.alter("me", {"metrics": "x.", "match": f"client_instance_id={name}"}, False)
    m.subscriptions_changed()
    assert m.get_subscriptions(answer.instance_id, INFO, T0 + 1).metrics == ("x.",)
    assert subscribed(m, T0 + 2).metrics == ()  # another instance


def test_asking_again_before_the_interval_is_throttled(tmp_path: Path) -> None:
    m = manager(tmp_path, s={"metrics": "*", "interval.ms": "1000"})
    answer = subscribed(m)
    early = m.get_subscriptions(answer.instance_id, INFO, T0 + 999)
    assert early.error == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert m.get_subscriptions(answer.instance_id, INFO, T0 + 1000).error == ErrorCode.NONE


def test_pushes_are_judged_as_kafka_does(tmp_path: Path) -> None:
    m = manager(tmp_path, s={"metrics": "*", "interval.ms": "1000"})
    a = subscribed(m)
    data = payload(("org.apache.kafka.producer.x", 1.0))
    assert push(m, a, data, T0 + 10) == ErrorCode.NONE  # at once after subscribing: jitter
    assert push(m, a, data, T0 + 500) == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert push(m, a, data, T0 + 1010) == ErrorCode.NONE
    wrong = cm.Answer(ErrorCode.NONE, a.instance_id, a.subscription_id + 1)
    assert push(m, wrong, data, T0 + 2010) == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    # the client has to fetch its subscription again, and may at once; that does not
    # restart its push interval (Kafka takes no time from an early GetTelemetrySubscriptions)
    assert m.get_subscriptions(a.instance_id, INFO, T0 + 2011).error == ErrorCode.NONE
    assert push(m, a, data, T0 + 2012) == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert push(m, a, data, T0 + 3010, compression=9) == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert m.get_subscriptions(a.instance_id, INFO, T0 + 3011).error == ErrorCode.NONE
    assert push(m, a, b"\xff\xff", T0 + 4010) == ErrorCode.INVALID_RECORD
    m.max_bytes = 64
    assert push(m, a, b"x" * 65, T0 + 5010) == ErrorCode.TELEMETRY_TOO_LARGE
    zeros = payload(("y" * 40, 0.0), ("z" * 40, 0.0))  # small compressed, large inflated
    assert push(m, a, zstandard.compress(zeros), T0 + 6010, compression=4) == (
        ErrorCode.TELEMETRY_TOO_LARGE
    )
    # a terminating push is accepted early; nothing is after it
    assert push(m, a, data, T0 + 6011, terminating=True) == ErrorCode.NONE
    assert push(m, a, data, T0 + 9000) == ErrorCode.INVALID_REQUEST
    bad = cm.Answer(ErrorCode.NONE, uuid.UUID(int=0), 0)
    assert push(m, bad, data, T0) == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize(
    ("codec", "compress"),
    [
        (0, bytes),
        (1, gzip.compress),
        (2, lambda b: bytes(cramjam.snappy.compress_raw(b))),
        (3, lz4.frame.compress),
        (4, zstandard.compress),
    ],
)
def test_pushed_metrics_are_decoded(tmp_path: Path, codec: int, compress: object) -> None:
    m = manager(tmp_path, s={"metrics": "*"})
    a = subscribed(m)
    data = payload(("org.apache.kafka.producer.record.queue.time.avg", 2.5), node_id="0")
    assert push(m, a, compress(data), T0 + 1, compression=codec) == ErrorCode.NONE  # type: ignore[operator]
    [(inst, name, labels, value)] = list(m.series())
    assert (name, labels, value) == (
        "org.apache.kafka.producer.record.queue.time.avg",
        (("node_id", "0"),),
        2.5,
    )
    assert inst.info.client_id == "app-1"


def test_delta_sums_add_up_and_gauges_replace(tmp_path: Path) -> None:
    m = manager(tmp_path, s={"metrics": "*", "interval.ms": "100"})
    a = subscribed(m)
    for i in range(3):
        assert push(m, a, payload(("sent", 5.0), delta_sum=True), T0 + 1 + 100 * i) == 0
    assert series(m) == {"sent": 15.0}
    assert push(m, a, payload(("queue", 7.0)), T0 + 301) == ErrorCode.NONE
    assert push(m, a, payload(("queue", 3.0)), T0 + 401) == ErrorCode.NONE
    assert series(m) == {"sent": 15.0, "queue": 3.0}


def test_series_and_instances_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cm, "MAX_SERIES_PER_CLIENT", 3)
    monkeypatch.setattr(cm, "MAX_SERIES", 5)
    monkeypatch.setattr(cm, "MAX_CLIENT_INSTANCES", 2)
    m = manager(tmp_path, s={"metrics": "*"})
    many = payload(*[(f"m{i}", 1.0) for i in range(10)])
    first, second = subscribed(m), subscribed(m, T0 + 1)
    assert push(m, first, many, T0 + 2) == ErrorCode.NONE
    assert push(m, second, many, T0 + 3) == ErrorCode.NONE
    assert m.series_count == 5 and len(list(m.series())) == 5  # 3 + 2: the total's bound
    assert m.series_dropped == 7 + 8
    third = subscribed(m, T0 + 4)  # the least recently heard from (first) goes
    assert set(m.instances) == {second.instance_id, third.instance_id}
    assert m.instances_evicted == 1
    assert m.series_count == 2
    assert push(m, third, many, T0 + 5) == ErrorCode.NONE
    assert m.series_count == 5


def test_stale_instances_expire_after_three_intervals(tmp_path: Path) -> None:
    m = manager(tmp_path, s={"metrics": "*", "interval.ms": "30000"})
    a = subscribed(m)
    assert push(m, a, payload(("x", 1.0)), T0 + 1) == ErrorCode.NONE
    m.expire(T0 + 1 + 89_999)
    assert a.instance_id in m.instances
    m.expire(T0 + 1 + 90_000)  # 3 x 30 s after its last request
    assert m.instances == {} and m.series_count == 0
    short = manager(tmp_path / "x", s={"metrics": "*", "interval.ms": "100"})
    b = subscribed(short)
    short.expire(T0 + 59_999)  # never sooner than 60 s
    assert b.instance_id in short.instances
    short.expire(T0 + 60_000)
    assert short.instances == {}


def test_subscriptions_are_validated_and_kept(tmp_path: Path) -> None:
    configs = ClientMetricsConfigs(tmp_path / "cm.json")
    for name, values, invalid_config in [
        ("", {"metrics": "*"}, False),
        ("s", {"nosuch": "1"}, False),
        ("s", {"interval.ms": "99"}, False),
        ("s", {"interval.ms": "3600001"}, False),
        ("s", {"interval.ms": "soon"}, False),
        ("s", {"match": "nosuch=x"}, True),
        ("s", {"match": "client_id"}, True),
        ("s", {"match": "client_id=("}, True),
    ]:
        with pytest.raises(ClientMetricsError) as info:
            configs.alter(name, values, validate_only=False)
        assert info.value.invalid_config == invalid_config, (name, values)
    assert not (tmp_path / "cm.json").exists()
    wanted = {"metrics": "org.apache.kafka.", "interval.ms": "1000", "match": "client_id=a.*"}
    assert configs.alter("s", wanted, validate_only=True) is False
    assert configs.resources == {}
    assert configs.alter("s", wanted, validate_only=False) is True
    again = ClientMetricsConfigs(tmp_path / "cm.json")
    again.load()
    assert again.resources == {"s": wanted}
    assert [(d.name, d.value, int(d.source)) for d in again.describe("s")] == [
        (k, wanted[k], 7) for k in ("metrics", "interval.ms", "match")
    ]
    # every key of one that does not exist, at its default (as Kafka 4.4)
    assert [(d.name, d.value, int(d.source), d.synonyms) for d in again.describe("x")] == [
        ("metrics", "", 5, ()),
        ("interval.ms", "300000", 5, ()),
        ("match", "", 5, ()),
    ]
    assert configs.alter("s", {}, validate_only=False) is True  # every key deleted: gone
    assert json.loads((tmp_path / "cm.json").read_text())["subscriptions"] == {}
    (tmp_path / "cm.json").write_text('{"version": 1, "subscriptions": {"s": {"x": "1"}}}')
    with pytest.raises(ConfigError, match="cannot read the client metrics"):
        again.load()


def test_pushed_metrics_are_exported_with_bounded_labels(tmp_path: Path) -> None:
    m = manager(tmp_path, s={"metrics": "*"})
    now = monotonic_ms()  # the scrape expires instances on the real clock
    a = subscribed(m, now)
    data = payload(("org.apache.kafka.producer.node.request.latency.avg", 1.5), node_id="0",
                   client_id="spoofed", **{"9bad key": "v" * 500})  # fmt: skip
    assert push(m, a, data, now + 1) == ErrorCode.NONE
    broker = SimpleNamespace(client_metrics=m)
    families = {f.name: f for f in _client_telemetry(broker)}  # type: ignore[arg-type]
    name = "samsa_client_org_apache_kafka_producer_node_request_latency_avg"
    [sample] = families[name].samples
    assert sample.value == 1.5
    assert sample.labels == {
        "client_instance_id": kafka_uuid(a.instance_id),
        "client_id": "app-1",  # the broker's, not the payload's
        "node_id": "0",
        "a_9bad_key": "v" * cm.MAX_LABEL_CHARS,
    }
    assert families["samsa_client_telemetry_instances"].samples[0].value == 1
    assert families["samsa_client_telemetry_series"].samples[0].value == 1

    class Collector:
        def collect(self) -> Iterator[Metric]:
            return _client_telemetry(broker)  # type: ignore[arg-type]

    registry = CollectorRegistry()
    registry.register(Collector())
    text = generate_latest(registry).decode()  # valid exposition: the parser reads it back
    assert {f.name for f in text_string_to_metric_families(text)} >= {name}


def test_subscriptions_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cm, "MAX_SUBSCRIPTIONS", 2)
    configs = ClientMetricsConfigs(tmp_path / "cm.json")
    for name in ("a", "b"):
        configs.alter(name, {"metrics": "*"}, validate_only=False)
    with pytest.raises(ClientMetricsError, match="at most 2"):
        configs.alter("c", {"metrics": "*"}, validate_only=False)
    configs.alter("b", {"metrics": "x."}, validate_only=False)  # an existing one may change
    configs.alter("b", {}, validate_only=False)  # and go, making room
    configs.alter("c", {"metrics": "*"}, validate_only=False)
    assert sorted(configs.resources) == ["a", "c"]


def test_series_no_longer_subscribed_are_dropped(tmp_path: Path) -> None:
    m = manager(tmp_path, s={"metrics": "a.,b."})
    first = subscribed(m)
    assert push(m, first, payload(("a.x", 1.0), ("b.y", 2.0)), T0 + 1) == ErrorCode.NONE
    m.configs.alter("s", {"metrics": "b."}, validate_only=False)
    m.subscriptions_changed()
    assert m.get_subscriptions(first.instance_id, INFO, T0 + 2).metrics == ("b.",)
    assert series(m) == {"b.y": 2.0} and m.series_count == 1
    m.configs.alter("s", {}, validate_only=False)
    m.subscriptions_changed()
    assert m.get_subscriptions(first.instance_id, INFO, T0 + 3).metrics == ()
    assert series(m) == {} and m.series_count == 0


def test_a_serving_broker_loads_otlp_and_pyjwt_only_when_used() -> None:
    """The broker's start-up does not import OTLP's protobuf classes (~100 ms) nor PyJWT
    (~45 ms): they load at the first telemetry push or OAUTHBEARER key set. The delta
    constant the module spells out is OTLP's own."""
    temporality = metrics_pb2.AggregationTemporality
    assert cm._DELTA == temporality.AGGREGATION_TEMPORALITY_DELTA
    probe = (
        "import sys, samsa.broker.server, samsa.cli.broker; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jwt', 'opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
