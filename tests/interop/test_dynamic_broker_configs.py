"""Dynamic broker configs (rule 44 of docs/semantics.md) through real clients: the cluster
default set with AlterConfigs as kafka-configs sends it (librdkafka and kafka-python refuse a
broker resource without an id), confluent-kafka's AdminClient setting this broker's value,
topics without their own value rolling and deleting segments by them at once while a topic
with its own keeps it, the sources and synonyms DescribeConfigs reports, Kafka's refusals,
the values surviving SIGKILL, and ``samsa configs --entity-type brokers --entity-default``."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request

TIMEOUT = 15.0
THIS = ConfigResource("broker", "0")


def _set(admin: AdminClient, res: ConfigResource, validate_only: bool = False, **kv: str) -> None:
    entries = [
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for k, v in kv.items()
    ]
    target = ConfigResource(res.restype, res.name, incremental_configs=entries)
    admin.incremental_alter_configs([target], validate_only=validate_only)[target].result(TIMEOUT)


def _refusal(admin: AdminClient, res: ConfigResource, **kv: str) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        _set(admin, res, **kv)
    return info.value.args[0]


def _set_default(port: int, name: str = "", **kv: str) -> tuple[int, str | None]:
    """The legacy AlterConfigs on broker ``name`` (the cluster default): its whole set becomes
    ``kv``."""
    k, v = ApiKey.ALTER_CONFIGS, 2
    entries = tuple(
        make_request(k, v, "AlterableConfig", name=name.replace("_", "."), value=value)
        for name, value in kv.items()
    )
    res = make_request(
        k, v, "AlterConfigsResource", resource_type=4, resource_name=name, configs=entries
    )
    req = make_request(k, v, "AlterConfigsRequest", resources=(res,), validate_only=False)
    with BlockingConnection("127.0.0.1", port) as conn:
        r = conn.request(k, v, req).responses[0]
    return int(r.error_code), r.error_message


def _describe_default(port: int) -> list[tuple[str, str, int]]:
    k, v = ApiKey.DESCRIBE_CONFIGS, 4
    res = make_request(
        k, v, "DescribeConfigsResource", resource_type=4, resource_name="", configuration_keys=None
    )
    req = make_request(
        k,
        v,
        "DescribeConfigsRequest",
        resources=(res,),
        include_synonyms=True,
        include_documentation=False,
    )
    with BlockingConnection("127.0.0.1", port) as conn:
        result = conn.request(k, v, req).results[0]
    assert result.error_code == 0
    return [(c.name, c.value, c.config_source) for c in result.configs]


def _describe(admin: AdminClient, res: ConfigResource) -> dict[str, Any]:
    return dict(admin.describe_configs([res])[res].result(TIMEOUT))


def _segments(data_dir: Path, topic: str) -> int:
    return len(list((data_dir / f"{topic}-0").glob("*.log")))


def _produce(bootstrap: str, topics: list[str], n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(n):
        for t in topics:
            producer.produce(t, b"v%d" % i, b"k")
        producer.flush(TIMEOUT)  # one batch each
        time.sleep(0.005)  # so that log.roll.ms=1 rolls a segment per batch
    assert producer.flush(TIMEOUT) == 0


def _watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "w"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
        return int(low), int(high)
    finally:
        consumer.close()


def _low(bootstrap: str, topic: str) -> int:
    return _watermarks(bootstrap, topic)[0]


def _high(bootstrap: str, topic: str) -> int:
    return _watermarks(bootstrap, topic)[1]


def test_confluent_admin_changes_broker_defaults_live(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(overrides={"log.retention.check.interval.ms": "100"}).start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    own = {"segment.ms": "3600000", "retention.ms": "3600000"}
    futures = admin.create_topics([NewTopic("plain", 1, 1), NewTopic("own", 1, 1, config=own)])
    for f in futures.values():
        f.result(TIMEOUT)

    # The cluster default: every topic without segment.ms rolls each batch from now on.
    assert _set_default(broker.port, log_roll_ms="1") == (0, None)
    _produce(broker.bootstrap, ["plain", "own"], 4)
    assert _segments(broker.data_dir, "plain") >= 4
    assert _segments(broker.data_dir, "own") == 1  # its own segment.ms wins

    # This broker's value: retention deletes the old segments of "plain" at once.
    _set(admin, THIS, log_retention_ms="1")
    deadline = time.monotonic() + TIMEOUT
    while _low(broker.bootstrap, "plain") == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _low(broker.bootstrap, "plain") > 0
    assert _low(broker.bootstrap, "own") == 0

    configs = _describe(admin, THIS)
    ret, roll = configs["log.retention.ms"], configs["log.roll.ms"]
    assert (ret.value, ret.source, ret.is_read_only) == (
        "1",
        ConfigSource.DYNAMIC_BROKER_CONFIG.value,
        False,
    )
    assert (roll.value, roll.source) == ("1", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    # confluent-kafka keys synonyms by name, so the levels of one name show as its last one;
    # their order is checked over the wire in tests/unit/broker/test_dynamic_broker_config.py.
    # After log.roll.ms comes its group's default, log.roll.hours=168, as Kafka lists it.
    assert list(roll.synonyms) == ["log.roll.ms", "log.roll.hours"]
    assert configs["broker.id"].is_read_only
    assert _describe_default(broker.port) == [
        ("log.roll.ms", "1", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    ]
    topic = _describe(admin, ConfigResource("topic", "plain"))
    assert topic["segment.ms"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    assert topic["retention.ms"].value == "1"

    # Kafka's refusals: all INVALID_REQUEST, nothing changed.
    for res, kv, text in [
        (THIS, {"broker_id": "3"}, "Cannot update these configs dynamically: [broker.id]"),
        (THIS, {"no_such_key": "1"}, "Unknown broker configs"),
        (THIS, {"log_segment_bytes": "5"}, "log.segment.bytes must be at least 1048576"),
    ]:
        err = _refusal(admin, res, **kv)
        assert err.code() == KafkaError.INVALID_REQUEST and text in err.str(), err
    # librdkafka sends a broker resource to that broker: broker 7 only over the wire.
    assert _set_default(broker.port, "7", log_roll_ms="5") == (
        KafkaError.INVALID_REQUEST,
        "Unexpected broker id, expected 0, but received 7",
    )
    _set(admin, THIS, validate_only=True, log_roll_ms="99")
    assert _describe(admin, THIS)["log.roll.ms"].value == "1"
    assert _set_default(broker.port, log_roll_ms="1", log_dirs="/elsewhere") == (
        KafkaError.INVALID_REQUEST,
        "Cannot update these configs dynamically: [log.dirs]",
    )

    # SIGKILL: both levels are back after the restart, before any log opened.
    broker.kill()
    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    configs = _describe(admin, THIS)
    assert (configs["log.retention.ms"].value, configs["log.roll.ms"].value) == ("1", "1")
    assert configs["log.roll.ms"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    # ... and the logs opened with them: new batches roll and the old ones are deleted.
    before = _high(broker.bootstrap, "plain")
    _produce(broker.bootstrap, ["plain"], 3)
    deadline = time.monotonic() + TIMEOUT
    while _low(broker.bootstrap, "plain") <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _low(broker.bootstrap, "plain") > before


def _samsa(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "samsa",
            "configs",
            "--entity-type",
            "brokers",
            *args,
            "--bootstrap-server",
            bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_samsa_configs_entity_default(broker) -> None:  # type: ignore[no-untyped-def]
    out = _samsa(
        broker.bootstrap, "--entity-default", "--alter", "--add-config", "log.retention.bytes=4096"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Completed updating default config for brokers in the cluster."
    out = _samsa(broker.bootstrap, "--entity-default", "--describe")
    assert out.stdout.splitlines() == [
        "Default configs for brokers in the cluster are:",
        "  log.retention.bytes=4096 sensitive=false "
        "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.bytes=4096}",
    ]
    out = _samsa(broker.bootstrap, "--entity-name", "0", "--describe")
    assert (
        "  log.retention.bytes=4096 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:"
        in (out.stdout)
    )
    out = _samsa(broker.bootstrap, "--entity-name", "0", "--alter", "--add-config", "log.dirs=/x")
    assert out.returncode == 1 and "INVALID_REQUEST" in out.stderr
    assert "Cannot update these configs dynamically" in out.stderr
    out = _samsa(
        broker.bootstrap, "--entity-default", "--alter", "--delete-config", "log.retention.bytes"
    )
    assert out.returncode == 0, out.stderr
    out = _samsa(broker.bootstrap, "--entity-default", "--describe")
    assert out.stdout.splitlines() == ["Default configs for brokers in the cluster are:"]
