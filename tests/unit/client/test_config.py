"""Configuration names and validation."""

from __future__ import annotations

import pytest

from samsa.client import AsyncProducer, ConfigError, ProducerState, TopicPartition


def test_unknown_property_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown"):
        AsyncProducer({"bootstrap.servers": "127.0.0.1:1", "linger": 5})


def test_idempotence_needs_acks_all() -> None:
    with pytest.raises(ConfigError):
        AsyncProducer({"acks": 1, "enable.idempotence": True})
    p = AsyncProducer({"acks": 1})
    assert not p.idempotent
    assert AsyncProducer({}).idempotent


def test_bad_codec() -> None:
    with pytest.raises(ConfigError):
        AsyncProducer({"compression.type": "brotli"})


def test_producer_state_json_round_trip() -> None:
    s = ProducerState(5, 2, {TopicPartition("t", 0): 10, TopicPartition("u", 3): 7})
    assert ProducerState.from_json(s.to_json()) == s


def test_group_protocol_is_classic_or_consumer() -> None:
    from samsa.client import AsyncConsumer

    with pytest.raises(ConfigError, match=r"group\.protocol"):
        AsyncConsumer({"group.protocol": "kip848"})
    assert AsyncConsumer({"group.protocol": "consumer"}).kip848
    assert not AsyncConsumer({}).kip848
