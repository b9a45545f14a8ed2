"""Finalized features with real clients (rule 45): kafka-python's describe_features and
update_features, and samsa's transactional producer committing before, across and after a
downgrade of transaction.version to 1 and an upgrade back to 2 (TV1 keeps the epoch at each
commit, TV2 bumps it). confluent-kafka 2.16 has no describe_features. Raw protocol:
tests/unit/broker/test_features.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient
from kafka.errors import InvalidUpdateVersionError

from _broker import BrokerProcess
from samsa.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition

T = 20.0
TV = "transaction.version"
OVERRIDES = {"transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1"}


@pytest.fixture
def broker(broker_factory: type[BrokerProcess]) -> BrokerProcess:
    return broker_factory(overrides=OVERRIDES).start()


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[Any]:
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    yield a
    a.close()


def test_kafka_python_describes_and_updates_features(admin: Any) -> None:
    before = admin.describe_features()
    assert before["group.version"]["supported"] == (0, 1)
    assert before["group.version"]["finalized"] == (1, 1)
    assert before[TV]["supported"] == (0, 2)
    assert before[TV]["finalized"] == (2, 2)
    assert admin.update_features({TV: ("SAFE_DOWNGRADE", 1)}, validate_only=True) == {TV: "OK"}
    assert admin.describe_features()[TV]["finalized"] == (2, 2)
    assert admin.update_features({TV: ("SAFE_DOWNGRADE", 1)}) == {TV: "OK"}
    after = admin.describe_features()
    assert after[TV]["finalized"] == (1, 1)
    assert after[TV]["finalized_epoch"] == before[TV]["finalized_epoch"] + 1
    with pytest.raises(InvalidUpdateVersionError, match="without setting the upgrade type"):
        admin.update_features({TV: 0})
    with pytest.raises(InvalidUpdateVersionError, match="cannot turn them off"):
        admin.update_features({"group.version": ("UNSAFE_DOWNGRADE", 0)})
    assert admin.update_features({TV: 2}) == {TV: "OK"}
    assert admin.describe_features()[TV]["finalized"] == (2, 2)


def _read(bootstrap: str, topic: str, expect: int) -> list[bytes]:
    config = {
        "bootstrap.servers": bootstrap,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    out: list[ConsumerRecord] = []
    with Consumer(config) as c:
        c.assign([TopicPartition(topic, 0)])
        for _ in range(100):
            if len(out) >= expect:
                break
            out += c.poll(0.2)
        out += c.poll(0.2)
    return sorted(r.value for r in out if r.value is not None)


def _producer(bootstrap: str) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"feat-{uuid.uuid4().hex[:8]}",
            "linger.ms": 2,
            "max.block.ms": 20_000,
        }
    )
    p.init_transactions(T)
    return p


def _commit(p: Producer, topic: str, tag: bytes) -> int:
    p.begin_transaction()
    p.produce(topic, tag, b"k")
    p.commit_transaction(T)
    return p.epoch


def test_transactions_commit_across_a_downgrade_and_an_upgrade(
    broker: BrokerProcess, admin: Any
) -> None:
    topic = f"feat-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": broker.bootstrap}) as a:
        a.create_topic(topic, 1)
    old = _producer(broker.bootstrap)  # chose TV2 at init
    try:
        old.begin_transaction()
        old.produce(topic, b"in-flight", b"k")
        old.flush(T)
        assert admin.update_features({TV: ("SAFE_DOWNGRADE", 1)}) == {TV: "OK"}
        old.commit_transaction(T)  # the open transaction still commits (rule 36)
    finally:
        old.close()
    tv1 = _producer(broker.bootstrap)  # a new producer sees level 1
    try:
        first = tv1.epoch
        assert (_commit(tv1, topic, b"tv1-a"), _commit(tv1, topic, b"tv1-b")) == (first, first)
    finally:
        tv1.close()
    assert admin.update_features({TV: 2}) == {TV: "OK"}
    tv2 = _producer(broker.bootstrap)
    try:
        first = tv2.epoch
        bumped = (_commit(tv2, topic, b"tv2-a"), _commit(tv2, topic, b"tv2-b"))
        assert bumped == (first + 1, first + 2)  # EndTxn v5 bumps the epoch at each commit
    finally:
        tv2.close()
    assert _read(broker.bootstrap, topic, 5) == [
        b"in-flight",
        b"tv1-a",
        b"tv1-b",
        b"tv2-a",
        b"tv2-b",
    ]
