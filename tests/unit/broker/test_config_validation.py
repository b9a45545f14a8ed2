"""Every setting is checked against Kafka's documented range at start."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from samsa.broker import config as config_module
from samsa.broker.broker import Broker
from samsa.broker.config import INT_MAX, LONG_MAX, BrokerConfig, ConfigError


def check(props: dict[str, str]) -> BrokerConfig:
    return BrokerConfig().with_properties(props).validate()


def test_every_integer_setting_has_a_range() -> None:
    ints = {f.name for f in fields(BrokerConfig) if "int" in str(f.type)}
    assert ints - set(config_module._RANGES) == set()
    assert BrokerConfig().validate() == BrokerConfig()  # the defaults are valid


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("log.segment.bytes", "-1", "log.segment.bytes must be at least 1048576, got -1"),
        ("socket.request.max.bytes", "0", "socket.request.max.bytes must be at least 1, got 0"),
        ("offsets.topic.num.partitions", "0", "offsets.topic.num.partitions must be at least 1"),
        ("num.partitions", "0", "num.partitions must be at least 1, got 0"),
        ("message.max.bytes", "-5", "message.max.bytes must be at least 0, got -5"),
        ("listeners", "PLAINTEXT://127.0.0.1:70000", "port must be between 0 and 65535"),
        ("log.retention.ms", "0", "log.retention.ms must be -1 (no limit) or at least 1"),
        ("log.retention.hours", "0", "log.retention.ms must be -1 (no limit) or at least 1"),
        ("node.id", "-1", "broker.id/node.id must be at least 0"),
        ("log.flush.interval.messages", "0", "log.flush.interval.messages must be at least 1"),
        ("transaction.max.timeout.ms", "0", "transaction.max.timeout.ms must be at least 1"),
        ("num.partitions", str(INT_MAX + 1), "at most 2147483647 (a 32-bit integer)"),
        ("log.retention.bytes", str(LONG_MAX + 1), "at most 9223372036854775807"),
        (
            "queued.max.request.bytes",
            "1000",
            "queued.max.request.bytes must be -1 (no limit) or at least socket.request.max.bytes",
        ),
        ("max.connections", "-1", "max.connections must be at least 0, got -1"),
        ("max.connections.per.ip", "0", "max.connections.per.ip must be at least 1, got 0"),
        ("socket.request.read.timeout.ms", "0", "request.read.timeout.ms must be at least 1"),
        ("log.max.open.files", "0", "log.max.open.files must be at least 1, got 0"),
        (
            "log.flush.scheduler.interval.ms",
            "0",
            "log.flush.scheduler.interval.ms must be at least 1, got 0",
        ),
    ],
)
def test_out_of_range_values_are_refused_by_name(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check({key: value})
    assert message in str(caught.value)


def test_kafkas_bounds_themselves_are_accepted() -> None:
    c = check(
        {
            "log.segment.bytes": "1048576",
            "message.max.bytes": "0",
            "log.index.interval.bytes": "0",
            "log.flush.interval.messages": str(LONG_MAX),
            "num.partitions": str(INT_MAX),
            "log.retention.ms": "1",
            "group.initial.rebalance.delay.ms": "0",
            "listeners": "PLAINTEXT://127.0.0.1:65535",
        }
    )
    assert (c.log_segment_bytes, c.port, c.log_flush_interval_messages) == (
        1048576,
        65535,
        LONG_MAX,
    )
    assert check({"log.retention.ms": "-1"}).log_retention_ms == -1
    assert check({"log.retention.bytes": "-1"}).log_retention_bytes == -1
    assert check({"queued.max.request.bytes": "-1"}).queued_max_request_bytes == -1
    queued = {"queued.max.request.bytes": "104857600", "socket.request.max.bytes": "104857600"}
    assert check(queued).queued_max_request_bytes == 104857600
    assert BrokerConfig(port=0).validate().port == 0


def test_malformed_values_are_refused() -> None:
    for key, value in [
        ("num.partitions", "1_000"),
        ("num.partitions", "0x10"),
        ("num.partitions", "3.0"),
        ("auto.create.topics.enable", "yes"),
    ]:
        with pytest.raises(ConfigError, match="is not a valid"):
            check({key: value})
    with pytest.raises(ConfigError, match="exactly one data directory"):
        check({"log.dirs": "/a,/b"})
    assert check({"log.dirs": " /a "}).data_dir == Path("/a")


def test_an_embedded_broker_refuses_bad_settings_before_touching_disk(tmp_path: Path) -> None:
    data_dir = tmp_path / "never-created"
    with pytest.raises(ConfigError, match=r"socket\.request\.max\.bytes"):
        Broker(BrokerConfig(data_dir=data_dir, socket_request_max_bytes=0))
    with pytest.raises(ConfigError, match="port"):
        Broker(BrokerConfig(data_dir=data_dir, port=70000))
    assert not data_dir.exists()


def test_consumer_group_settings() -> None:
    c = check({"group.consumer.session.timeout.ms": "2000", "group.consumer.assignors": "range"})
    assert (c.group_consumer_session_timeout_ms, c.group_consumer_assignors) == (2000, "range")
    with pytest.raises(ConfigError, match="must name assignors"):
        check({"group.consumer.assignors": "uniform,sticky"})
    with pytest.raises(ConfigError, match=r"heartbeat\.interval\.ms must be at least 1"):
        check({"group.consumer.heartbeat.interval.ms": "0"})
