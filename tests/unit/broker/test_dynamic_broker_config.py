"""Dynamic broker configs (rule 44 of docs/semantics.md) on the broker's domain API: the
levels and their order, live logs taking a new default at once (and topics with their own
value keeping it), Kafka's refusals, validate_only, the file written before the answer and
read at start, and a damaged file stopping the start. Over the wire and with real clients:
tests/interop/test_dynamic_broker_configs.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from samsa.broker.broker import Broker, StartupError
from samsa.broker.config import BrokerConfig
from samsa.broker.dynamic_config import (
    DYNAMIC_CONFIGS_FILE,
    DYNAMIC_KEYS,
    DynamicConfigError,
    describe_broker,
)
from samsa.broker.topic_config import AlterOp, ConfigSource, DescribedConfig, apply_incremental

S = ConfigSource


def _open(data_dir: Path, **static: object) -> Broker:
    broker = Broker(BrokerConfig(data_dir=data_dir, **static))  # type: ignore[arg-type]
    broker.start()
    return broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = _open(tmp_path, log_retention_ms=5000)
    yield b
    b.close()


def _retention(broker: Broker, topic: str) -> int:
    return broker.topics.topics[topic].partitions[0].log.config.retention_ms


def _described(broker: Broker, name: str, resource: str = "0") -> DescribedConfig:
    return next(
        c for c in describe_broker(broker.dynamic, broker.config, resource) if c.name == name
    )


def test_levels_apply_at_once_and_in_kafkas_order(broker: Broker) -> None:
    broker.create_topic("plain", 2)
    broker.create_topic("own", 1, {"retention.ms": "7"})
    broker.alter_broker_configs("", {"log.retention.ms": "1234"}, False)
    assert [p.log.config.retention_ms for p in broker.topics.topics["plain"].partitions] == [
        1234,
        1234,
    ]
    assert _retention(broker, "own") == 7  # the topic's own value wins
    broker.alter_broker_configs("0", {"log.retention.ms": "999"}, False)
    assert _retention(broker, "plain") == 999  # this broker's value wins over the default
    broker.create_topic("later", 1)
    assert _retention(broker, "later") == 999  # and topics created later take it
    entry = _described(broker, "log.retention.ms")
    assert (entry.value, entry.source, entry.read_only) == ("999", S.DYNAMIC_BROKER_CONFIG, False)
    assert [(s.value, s.source) for s in entry.synonyms] == [
        ("999", S.DYNAMIC_BROKER_CONFIG),
        ("1234", S.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("5000", S.STATIC_BROKER_CONFIG),
        ("168", S.DEFAULT_CONFIG),
    ]  # Kafka's default of log.retention.ms is null; its group's is log.retention.hours=168
    assert _described(broker, "broker.id").read_only
    # The default resource lists the cluster defaults alone.
    default = describe_broker(broker.dynamic, broker.config, "")
    assert [(c.name, c.value, c.source) for c in default] == [
        ("log.retention.ms", "1234", S.DYNAMIC_DEFAULT_BROKER_CONFIG)
    ]
    topic = {c.name: c for c in broker.describe_topic({})}["retention.ms"]
    assert [(s.name, s.source) for s in topic.synonyms] == [
        ("log.retention.ms", S.DYNAMIC_BROKER_CONFIG),
        ("log.retention.ms", S.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.retention.ms", S.STATIC_BROKER_CONFIG),
        ("log.retention.hours", S.DEFAULT_CONFIG),
    ]  # as Kafka 4.4: the group's default, in hours, last
    # Deleting this broker's value falls back to the cluster default, live.
    broker.alter_broker_configs("0", {}, False)
    assert _retention(broker, "plain") == 1234
    assert _described(broker, "log.retention.ms").source == S.DYNAMIC_DEFAULT_BROKER_CONFIG


def test_refusals_and_validate_only_change_nothing(broker: Broker) -> None:
    broker.create_topic("t", 1)
    cases = {
        ("", "broker.id"): "Cannot update these configs dynamically: [broker.id]",
        ("", "log.dirs"): "Cannot update these configs dynamically: [log.dirs]",
        ("", "log.retention.hours"): "Cannot update these configs dynamically",
        ("", "no.such.key"): "Unknown broker configs: [no.such.key]",
        ("", "log.segment.bytes"): "log.segment.bytes must be at least 1048576",
        ("7", "log.retention.ms"): "Unexpected broker id, expected 0, but received 7",
        ("x", "log.retention.ms"): "Node id must be an integer, but it is: x",
    }
    for (resource, key), message in cases.items():
        with pytest.raises(DynamicConfigError, match=re.escape(message)):
            broker.alter_broker_configs(resource, {key: "5"}, False)
    with pytest.raises(DynamicConfigError, match="not a valid int"):
        broker.alter_broker_configs("", {"log.retention.ms": "soon"}, False)
    broker.alter_broker_configs("", {"log.retention.ms": "10"}, True)  # validate_only
    assert _retention(broker, "t") == 5000
    assert broker.dynamic.default == {} and broker.dynamic.broker == {}
    assert not (broker.data_dir / DYNAMIC_CONFIGS_FILE).exists()


def test_a_new_default_that_no_topic_can_take_is_refused(broker: Broker) -> None:
    broker.create_topic("lagged", 1, {"max.compaction.lag.ms": "100"})
    with pytest.raises(DynamicConfigError, match="topic lagged"):
        broker.alter_broker_configs("", {"log.cleaner.min.compaction.lag.ms": "500"}, False)
    assert broker.dynamic.default == {}


def test_incremental_list_ops_on_a_broker_key() -> None:
    lists = {"log.cleanup.policy": "delete"}
    ops = [("log.cleanup.policy", int(AlterOp.APPEND), "compact")]
    assert apply_incremental({}, ops, lists) == {"log.cleanup.policy": "delete,compact"}
    with pytest.raises(ValueError, match="append is not allowed"):
        apply_incremental({}, [("log.retention.ms", int(AlterOp.APPEND), "1")], lists)


def test_a_kept_key_takes_a_broker_default_too(broker: Broker) -> None:
    """Keys rule 43 validates and keeps have their broker default, dynamic as in Kafka."""
    broker.create_topic("t", 1)
    broker.alter_broker_configs("", {"log.segment.delete.delay.ms": "5"}, False)
    assert broker.topics.topics["t"].partitions[0].log.config.file_delete_delay_ms == 5
    entry = {c.name: c for c in broker.describe_topic({})}["file.delete.delay.ms"]
    assert (entry.value, entry.source) == ("5", S.DYNAMIC_DEFAULT_BROKER_CONFIG)
    with pytest.raises(DynamicConfigError, match=r"unclean\.leader\.election\.enable"):
        broker.alter_broker_configs("", {"unclean.leader.election.enable": "maybe"}, False)


def test_dynamic_keys_are_kafkas_dynamic_log_configs() -> None:
    assert {"log.retention.ms", "log.segment.bytes", "log.roll.ms", "message.max.bytes"} <= (
        DYNAMIC_KEYS
    )
    assert not {"broker.id", "log.dirs", "listeners", "log.retention.hours"} & DYNAMIC_KEYS


def test_restart_applies_the_file_before_the_logs_open(tmp_path: Path) -> None:
    b = _open(tmp_path)
    b.create_topic("t", 1)
    b.alter_broker_configs("", {"log.segment.bytes": "2097152"}, False)
    b.alter_broker_configs("0", {"log.retention.ms": "4321"}, False)
    b.close()
    b = _open(tmp_path)
    try:
        plog = b.topics.topics["t"].partitions[0].log
        assert (plog.config.retention_ms, plog.config.segment_bytes) == (4321, 2097152)
        assert b.dynamic.default == {"log.segment.bytes": "2097152"}
    finally:
        b.close()


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"version": 1, "default": {"broker.id": "3"}, "broker": {}}),
        json.dumps({"version": 1, "default": {"log.retention.ms": 5}, "broker": {}}),
        json.dumps({"version": 2}),
    ],
)
def test_a_damaged_file_stops_the_start(tmp_path: Path, text: str) -> None:
    (tmp_path / DYNAMIC_CONFIGS_FILE).write_text(text)
    with pytest.raises(StartupError, match=DYNAMIC_CONFIGS_FILE):
        Broker(BrokerConfig(data_dir=tmp_path))
    assert (tmp_path / DYNAMIC_CONFIGS_FILE).read_text() == text  # nothing lost
