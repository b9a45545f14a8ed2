"""Topic configs, CreatePartitions and DeleteRecords through real clients: confluent-kafka's
and kafka-python's admin clients, LogAppendTime as a consumer sees it, the log start offset
after a SIGKILL, and the ``samsa configs|topics alter|records delete`` commands."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)

TIMEOUT = 15.0


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _create(admin: AdminClient, name: str, partitions: int, configs: dict[str, str]) -> None:
    admin.create_topics([NewTopic(name, partitions, 1, config=configs)])[name].result(TIMEOUT)


def _describe(admin: AdminClient, name: str) -> dict[str, Any]:
    res = ConfigResource("topic", name)
    return dict(admin.describe_configs([res])[res].result(TIMEOUT))


def _produce(bootstrap: str, topic: str, n: int, partition: int = 0, **extra: Any) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **extra})
    for i in range(n):
        producer.produce(topic, b"v%d" % i, b"k", partition=partition)
        producer.flush(TIMEOUT)  # one batch each
        time.sleep(0.002)  # so that segment.ms=1 rolls a segment per batch
    assert producer.flush(TIMEOUT) == 0


def _first(bootstrap: str, topic: str, partition: int = 0) -> Any:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, partition, -2)])  # OFFSET_BEGINNING
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                return msg
        raise AssertionError("no record consumed")
    finally:
        consumer.close()


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_confluent_admin_configs_partitions_and_records(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(overrides={"log.retention.ms": "86400000"}).start()
    admin = _admin(broker.bootstrap)
    _create(admin, "t", 1, {"segment.ms": "1", "retention.bytes": "1000000000"})
    configs = _describe(admin, "t")
    assert (configs["segment.ms"].value, configs["segment.ms"].source) == (
        "1",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )
    assert configs["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert configs["retention.ms"].value == "86400000"
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    # Incremental: SET one key, DELETE another; the rest stays.
    res = ConfigResource(
        "topic",
        "t",
        incremental_configs=[
            ConfigEntry("max.message.bytes", "500000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.bytes", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    admin.incremental_alter_configs([res])[res].result(TIMEOUT)
    configs = _describe(admin, "t")
    assert configs["max.message.bytes"].value == "500000"
    assert configs["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["segment.ms"].value == "1"
    # An invalid value is refused with INVALID_CONFIG and changes nothing.
    bad = ConfigResource(
        "topic",
        "t",
        incremental_configs=[
            ConfigEntry("segment.ms", "0", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    try:
        admin.incremental_alter_configs([bad])[bad].result(TIMEOUT)
        raise AssertionError("segment.ms=0 was accepted")
    except KafkaException as exc:
        assert exc.args[0].code() == KafkaError.INVALID_CONFIG
    # AlterConfigs replaces the whole set: keys left out go back to their defaults.
    whole = ConfigResource("topic", "t", set_config={"segment.ms": "1"})
    admin.alter_configs([whole])[whole].result(TIMEOUT)
    configs = _describe(admin, "t")
    assert configs["max.message.bytes"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.ms"].value == "1"
    # CreatePartitions: only upwards; a running producer picks the new ones up.
    admin.create_partitions([NewPartitions("t", 3)])["t"].result(TIMEOUT)
    assert len(admin.list_topics("t", timeout=TIMEOUT).topics["t"].partitions) == 3
    try:
        admin.create_partitions([NewPartitions("t", 2)])["t"].result(TIMEOUT)
        raise AssertionError("the partition count went down")
    except KafkaException as exc:
        assert exc.args[0].code() == KafkaError.INVALID_PARTITIONS
    _produce(broker.bootstrap, "t", 1, partition=2)
    assert _first(broker.bootstrap, "t", 2).offset() == 0
    # DeleteRecords: the start offset moves, whole segments below it go.
    _produce(broker.bootstrap, "t", 6)
    deleted = admin.delete_records([TopicPartition("t", 0, 4)])
    [future] = deleted.values()
    assert future.result(TIMEOUT).low_watermark == 4
    assert _first(broker.bootstrap, "t").offset() == 4
    segments = sorted(p.name for p in (broker.data_dir / "t-0").glob("*.log"))
    assert segments[0] == "00000000000000000004.log"


def test_log_append_time_is_what_a_consumer_sees(broker_factory) -> None:  # type: ignore[no-untyped-def]
    # The broker's default is LogAppendTime; one topic keeps it, one overrides it.
    broker = broker_factory(overrides={"log.message.timestamp.type": "LogAppendTime"}).start()
    admin = _admin(broker.bootstrap)
    _create(admin, "lat", 1, {})
    _create(admin, "ct", 1, {"message.timestamp.type": "CreateTime"})
    assert _describe(admin, "lat")["message.timestamp.type"].source == (
        ConfigSource.STATIC_BROKER_CONFIG.value
    )
    before = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for topic in ("lat", "ct"):
        producer.produce(topic, b"v", timestamp=1_000_000)  # a producer timestamp in 1970
    assert producer.flush(TIMEOUT) == 0
    kind, ts = _first(broker.bootstrap, "lat").timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME and before <= ts <= int(time.time() * 1000)
    assert _first(broker.bootstrap, "ct").timestamp() == (TIMESTAMP_CREATE_TIME, 1_000_000)


def test_kafka_python_admin(broker) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType
    from kafka.admin import NewPartitions as KpNewPartitions
    from kafka.admin import NewTopic as KpNewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([KpNewTopic("kp", 1, 1, topic_configs={"segment.ms": "1"})])
        described = admin.describe_configs([KpResource(ConfigResourceType.TOPIC, "kp")])
        assert described["topic"]["kp"]["segment.ms"]["value"] == "1"
        result = admin.alter_configs(
            [KpResource(ConfigResourceType.TOPIC, "kp", configs={"retention.ms": "3600000"})],
            incremental=False,
        )
        assert result["topic"]["kp"] == "OK"
        modified = admin.describe_configs([KpResource(ConfigResourceType.TOPIC, "kp")])
        # kafka-python's AlterConfigs keeps the other modified keys, as Kafka requires.
        assert {k: v["value"] for k, v in modified["topic"]["kp"].items()} == {
            "segment.ms": "1",
            "retention.ms": "3600000",
        }
        # Its default path is IncrementalAlterConfigs.
        result = admin.alter_configs(
            [KpResource(ConfigResourceType.TOPIC, "kp", configs={"segment.ms": "2"})]
        )
        assert result["topic"]["kp"] == "OK"
        described = admin.describe_configs([KpResource(ConfigResourceType.TOPIC, "kp")])
        assert described["topic"]["kp"]["segment.ms"]["value"] == "2"
        assert described["topic"]["kp"]["retention.ms"]["value"] == "3600000"
        admin.create_partitions({"kp": KpNewPartitions(2)})
        assert len(admin.describe_topics(["kp"])[0]["partitions"]) == 2
        _produce(broker.bootstrap, "kp", 4)
        low = admin.delete_records({KpTopicPartition("kp", 0): 2})
        assert [v["low_watermark"] for v in low.values()] == [2]
    finally:
        admin.close()


def test_the_start_offset_survives_sigkill(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory().start()
    admin = _admin(broker.bootstrap)
    _create(admin, "d", 1, {})
    _produce(broker.bootstrap, "d", 5)
    [future] = admin.delete_records([TopicPartition("d", 0, 3)]).values()
    assert future.result(TIMEOUT).low_watermark == 3
    broker.kill()
    broker.start()
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition("d", 0), timeout=TIMEOUT)
    finally:
        consumer.close()
    assert (low, high) == (3, 5)
    assert _first(broker.bootstrap, "d").offset() == 3


def _samsa(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "samsa", *args, "--bootstrap-server", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_samsa_commands_round_trip(broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert _samsa(broker.bootstrap, "topics", "create", "c").returncode == 0
    entity = ["configs", "--entity-type", "topics", "--entity-name", "c"]
    out = _samsa(
        broker.bootstrap,
        *entity,
        "--alter",
        "--add-config",
        "retention.ms=5000,cleanup.policy=[compact,delete]",
    )
    assert out.returncode == 0, out.stderr
    out = _samsa(broker.bootstrap, *entity, "--describe")
    assert out.stdout.splitlines()[0] == "Dynamic configs for topic c are:"
    assert "  cleanup.policy=compact,delete sensitive=false" in out.stdout
    assert "retention.ms=5000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=5000" in (
        out.stdout
    )
    configs = _describe(_admin(broker.bootstrap), "c")
    assert configs["retention.ms"].value == "5000"
    assert (
        _samsa(broker.bootstrap, *entity, "--alter", "--delete-config", "retention.ms").returncode
        == 0
    )
    assert "retention.ms" not in _samsa(broker.bootstrap, *entity, "--describe").stdout
    bad = _samsa(broker.bootstrap, *entity, "--alter", "--add-config", "segment.ms=0")
    assert bad.returncode == 1 and "INVALID_CONFIG" in bad.stderr
    # topics alter --partitions, and records delete with kafka-delete-records' JSON.
    alter = _samsa(broker.bootstrap, "topics", "alter", "--topic", "c", "--partitions", "2")
    assert alter.returncode == 0, alter.stderr
    assert (
        _samsa(broker.bootstrap, "topics", "alter", "--topic", "c", "--partitions", "1").returncode
        == 1
    )
    _produce(broker.bootstrap, "c", 3, partition=1)
    spec = tmp_path / "offsets.json"
    spec.write_text(json.dumps({"partitions": [{"topic": "c", "partition": 1, "offset": 2}]}))
    out = _samsa(broker.bootstrap, "records", "delete", "--offset-json-file", str(spec))
    assert out.returncode == 0 and "partition: c-1\tlow_watermark: 2" in out.stdout
    out = _samsa(
        broker.bootstrap, "records", "delete", "--topic", "c", "--partition", "1", "--offset", "9"
    )
    assert out.returncode == 1 and "OFFSET_OUT_OF_RANGE" in out.stdout


def test_a_group_consumer_picks_up_added_partitions(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(overrides={"group.initial.rebalance.delay.ms": "0"}).start()
    admin = _admin(broker.bootstrap)
    _create(admin, "grow", 1, {})
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "grow-group",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    try:
        consumer.subscribe(["grow"])
        deadline = time.monotonic() + TIMEOUT
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert [tp.partition for tp in consumer.assignment()] == [0]
        admin.create_partitions([NewPartitions("grow", 2)])["grow"].result(TIMEOUT)
        _produce(broker.bootstrap, "grow", 1, partition=1)
        seen = None
        while seen is None and time.monotonic() < deadline + TIMEOUT:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen = (msg.partition(), msg.offset())
        assert seen == (1, 0)
        assert sorted(tp.partition for tp in consumer.assignment()) == [0, 1]
    finally:
        consumer.close()
