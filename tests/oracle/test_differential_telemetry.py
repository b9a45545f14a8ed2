"""Client telemetry (KIP-714) beside Apache Kafka: the same subscription on both, then
GetTelemetrySubscriptions and PushTelemetry answered alike (a differential scenario);
Kafka's kafka-client-metrics tool against both; and Kafka's Java client, which pushes when the
broker offers a subscription, arriving on samsa's /metrics."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from opentelemetry.proto.metrics.v1 import metrics_pb2
from prometheus_client.parser import text_string_to_metric_families

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing.kafka import KafkaNode, classpath, run_tool_in_process
from samsa.testing.oracle import Deviation, Outcome, Rule, Side

Run = Callable[..., Outcome]
CLIENT_METRICS = 16
GET, PUSH = ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, ApiKey.PUSH_TELEMETRY
PROGRAM = Path(__file__).parent / "java" / "TelemetryCheck.java"


def _alter(s: Side, label: str, name: str, ops: list[tuple[str, int, str | None]]) -> Any:
    k, v = ApiKey.INCREMENTAL_ALTER_CONFIGS, 1
    res = make_request(k, v, "AlterConfigsResource", resource_type=CLIENT_METRICS,
                       resource_name=name, configs=tuple(
                           make_request(k, v, "AlterableConfig", name=n, config_operation=op,
                                        value=x) for n, op, x in ops))  # fmt: skip
    req = make_request(k, v, "IncrementalAlterConfigsRequest", resources=(res,),
                       validate_only=False)  # fmt: skip
    return s.call(label, k, v, req)


def _get(s: Side, label: str, conn: BlockingConnection, instance: uuid.UUID | None) -> Any:
    req = make_request(GET, 0, "GetTelemetrySubscriptionsRequest", client_instance_id=instance)
    # Kafka applies a config change when its metadata log reaches the broker: ask until the
    # subscription is there.
    return s.call(label, GET, 0, req, conn=conn, retry=lambda r: r.error_code == 0 and
                  not r.requested_metrics)  # fmt: skip


def _push(s: Side, label: str, conn: BlockingConnection, instance: Any, sub: int,
          data: bytes, terminating: bool = False) -> Any:  # fmt: skip
    req = make_request(PUSH, 0, "PushTelemetryRequest", client_instance_id=instance,
                       subscription_id=sub, terminating=terminating, compression_type=0,
                       metrics=data)  # fmt: skip
    return s.call(label, PUSH, 0, req, conn=conn)


def test_telemetry_answers(differential: Run) -> None:
    def scenario(s: Side) -> None:
        client_id = s.unique("client")
        name = s.unique("sub")
        _alter(s, "subscribe", name, [("metrics", 0, "org.samsa.oracle."),
                                      ("interval.ms", 0, "60000"),
                                      ("match", 0, f"client_id={client_id}")])  # fmt: skip
        _alter(s, "bad-interval", s.unique("bad1"), [("interval.ms", 0, "5")])
        _alter(s, "bad-match", s.unique("bad2"), [("match", 0, "nosuch=1")])
        _alter(s, "unknown-key", s.unique("bad3"), [("no.such", 0, "1")])
        _alter(s, "subscribe-partial", s.unique("partial"), [("metrics", 0, "*")])
        for v in (0, 1):  # this module's are the only subscriptions on either broker
            lk = ApiKey.LIST_CONFIG_RESOURCES
            req = make_request(lk, v, "ListConfigResourcesRequest", resource_types=(16,))
            # Kafka's broker sees a new subscription a moment after answering its alter:
            # listed again (up to 20 s) until both are there; Kafka lists them in hash order.
            deadline = time.monotonic() + 20
            while True:
                listed = s.conn.request(lk, v, req)
                names = sorted(r.resource_name for r in listed.config_resources)
                if len(names) >= 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            s.note(f"list-v{v}", {"error": int(listed.error_code), "names": names})
        k, v = ApiKey.DESCRIBE_CONFIGS, 4
        resources = tuple(
            make_request(k, v, "DescribeConfigsResource", resource_type=CLIENT_METRICS,
                         resource_name=n, configuration_keys=None)
            for n in (name, s.unique("partial"), s.unique("none"))
        )  # fmt: skip
        s.call("describe", k, v, make_request(k, v, "DescribeConfigsRequest", resources=resources,
                                              include_synonyms=True,
                                              include_documentation=False))  # fmt: skip
        conn = BlockingConnection(s.host, s.port, client_id=client_id)
        s._conns.append(conn)  # closed with the side
        first = _get(s, "get", conn, None)
        instance, sub = first.client_instance_id, first.subscription_id
        _get(s, "get-early", conn, instance)
        data = metrics_pb2.MetricsData()
        metric = data.resource_metrics.add().scope_metrics.add().metrics.add(name="org.samsa.x")
        metric.gauge.data_points.add(as_int=1)
        payload = data.SerializeToString()
        _push(s, "push-unknown-subscription", conn, instance, sub + 1, payload)
        _get(s, "get-again", conn, instance)
        _push(s, "push-early", conn, instance, sub, payload)
        _push(s, "push-terminating", conn, instance, sub, payload, terminating=True)
        _push(s, "push-after-terminating", conn, instance, sub, payload)
        _push(s, "push-no-instance", conn, uuid.UUID(int=0), sub, payload)
        other = _get(s, "get-other", conn, None)
        _push(s, "push-not-otlp", conn, other.client_instance_id, other.subscription_id,
              b"\x00not OTLP")  # fmt: skip
        _alter(s, "delete", name, [("metrics", 1, None), ("interval.ms", 1, None),
                                   ("match", 1, None)])  # fmt: skip
        _alter(s, "delete-partial", s.unique("partial"), [("metrics", 1, None)])

    # D-TELEM-2: samsa reads what it exports; Kafka without a telemetry plugin reads nothing.
    not_read = Deviation("push-not-otlp.error_code", "INVALID_RECORD", "NONE", "D-TELEM-2")
    differential(
        scenario,
        deviations=[not_read],
        rules={"client_instance_id": Rule.ANY, "subscription_id": Rule.ANY},
    )


def _metrics_port(broker: BrokerProcess) -> int:
    line = broker.wait_for_log("metrics on http://127.0.0.1:")
    return int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))  # type: ignore[union-attr]


def test_java_client_pushes_arrive_on_metrics(broker_factory: type[BrokerProcess]) -> None:
    broker = broker_factory(overrides={"metrics.port": "0"}).start()
    tool = run_tool_in_process(
        "kafka-client-metrics", "--bootstrap-server", broker.bootstrap, "--alter",
        "--name", "java", "--metrics", "org.apache.kafka.producer.", "--interval", "500",
        "--match", "client_id=java-telemetry,client_software_name=apache-kafka-java",
    )  # fmt: skip
    assert tool.returncode == 0, tool.stderr
    # The producer sends for up to a minute; the test waits for its pushes on /metrics (the
    # first comes an interval after its subscription), then stops it.
    cmd = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath(), str(PROGRAM),
           broker.bootstrap, "java-telemetry", "java-telemetry", "60"]  # fmt: skip
    java = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert java.stdout is not None
        instance = json.loads(java.stdout.readline())["client_instance_id"]
        url = f"http://127.0.0.1:{_metrics_port(broker)}/metrics"
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(url, timeout=10) as resp:
                families = list(text_string_to_metric_families(resp.read().decode()))
            pushed = {
                f.name: s.labels
                for f in families
                if f.name.startswith("samsa_client_org_apache_kafka_producer_")
                for s in f.samples
            }
            if pushed or java.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        java.kill()
        java.wait()
    # the producer's own metrics, under the instance id the client reports
    assert "samsa_client_org_apache_kafka_producer_record_send_total" in pushed, sorted(pushed)
    assert {labels["client_instance_id"] for labels in pushed.values()} == {instance}
    assert {labels["client_id"] for labels in pushed.values()} == {"java-telemetry"}


def test_kafka_client_metrics_tool(
    shared_broker: BrokerProcess, differential_kafka: KafkaNode
) -> None:
    name = f"tool-{uuid.uuid4().hex[:8]}"
    commands = [
        ["--alter", "--name", name, "--metrics", "org.apache.kafka.producer.,org.apache.kafka"
         ".consumer.", "--interval", "1000", "--match", "client_id=app-.*"],
        ["--describe", "--name", name],
        ["--alter", "--name", name, "--interval", "5"],
        ["--alter", "--name", name, "--match", "nosuch=x"],
        ["--delete", "--name", name],
        ["--describe", "--name", name],
    ]  # fmt: skip

    def run(bootstrap: str) -> list[tuple[int, str, str]]:
        out = []
        for args in commands:
            done = run_tool_in_process(
                "kafka-client-metrics", "--bootstrap-server", bootstrap, *args
            )
            errors = [x for x in done.stdout.splitlines() + done.stderr.splitlines()
                      if x.startswith("Error")]  # fmt: skip
            out.append((done.returncode, done.stdout.strip(), "\n".join(errors)))
        return out

    with ThreadPoolExecutor(2) as pool:
        mine, kafka = pool.map(run, (shared_broker.bootstrap, differential_kafka.bootstrap))
    assert mine == kafka
    assert mine[1][1].splitlines()[1:] == [
        "  interval.ms=1000",
        "  match=client_id=app-.*",
        "  metrics=org.apache.kafka.producer.,org.apache.kafka.consumer.",
    ]
