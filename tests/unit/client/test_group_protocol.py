"""Assignors and the consumer protocol's subscription/assignment encoding."""

from __future__ import annotations

from samsa.client import TopicPartition
from samsa.client._assignors import (
    assigned_partitions,
    encode_plan,
    range_assign,
    roundrobin_assign,
)
from samsa.protocol.consumer_protocol import decode_subscription, encode_subscription


def test_range_assignor_matches_kafka() -> None:
    subs = {"c1": ["t1", "t2"], "c0": ["t1", "t2"]}
    plan = range_assign(subs, {"t1": 3, "t2": 3})
    assert plan == {"c0": {"t1": [0, 1], "t2": [0, 1]}, "c1": {"t1": [2], "t2": [2]}}


def test_roundrobin_assignor_matches_kafka() -> None:
    subs = {"c0": ["t1", "t2"], "c1": ["t1", "t2"]}
    plan = roundrobin_assign(subs, {"t1": 3, "t2": 3})
    assert plan == {"c0": {"t1": [0, 2], "t2": [1]}, "c1": {"t1": [1], "t2": [0, 2]}}


def test_assignors_respect_subscriptions() -> None:
    subs = {"a": ["t1"], "b": ["t1", "t2"]}
    for assign in (range_assign, roundrobin_assign):
        plan = assign(subs, {"t1": 2, "t2": 2})
        assert "t2" not in plan["a"]
        got = sorted((t, p) for m in plan.values() for t, ps in m.items() for p in ps)
        assert got == [("t1", 0), ("t1", 1), ("t2", 0), ("t2", 1)]


def test_subscription_and_assignment_round_trip() -> None:
    data = encode_subscription(["b", "a"], [TopicPartition("a", 1)], generation=4)
    assert data[:2] == b"\x00\x03"  # version 3, as Kafka's ConsumerProtocol writes
    sub = decode_subscription(data)
    assert sub.topics == ("a", "b") and sub.owned == {"a": frozenset({1})}
    ((member, a),) = encode_plan({"m": {"a": [0, 2], "b": [1]}})
    assert member == "m" and a[:2] == b"\x00\x03"
    assert assigned_partitions(a) == [
        TopicPartition("a", 0),
        TopicPartition("a", 2),
        TopicPartition("b", 1),
    ]
    assert assigned_partitions(b"") == []
