"""Fetch sessions (KIP-227) with real consumers.

kafka-python (3.x) opens a session with its first full Fetch and goes on with incremental
ones; librdkafka (2.16) sends sessionless fetches (session 0, epoch -1) and must read as
before from a broker that offers sessions. Both read the same topic at once, while records
arrive on one partition only (the others drop out of the incremental responses).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer import fetcher as kp_fetcher

from samsa.client._connection import BlockingConnection
from samsa.client._security import from_config
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing import create_topic, fetch_request

PARTITIONS = 3
FIRST = 50  # records per partition before the consumers start
LATER = 40  # then records on partition 1 only
IO_TIMEOUT = 30.0


def _produce(bootstrap: str, topic: str, partition: int, start: int, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(start, start + n):
        producer.produce(topic, value=f"p{partition}-{i}".encode(), partition=partition)
    assert producer.flush(IO_TIMEOUT) == 0


def _expected(counts: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    return {p: [(i, f"p{p}-{i}".encode()) for i in range(n)] for p, n in counts.items()}


def _read_kafka_python(bootstrap: str, topic: str, want: int, got: dict[int, list[Any]]) -> None:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=200,
        request_timeout_ms=10_000,
    )
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + IO_TIMEOUT
        while sum(len(v) for v in got.values()) < want and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=200).items():
                got[tp.partition].extend((m.offset, m.value) for m in msgs)
    finally:
        consumer.close()


def _read_confluent(bootstrap: str, topic: str, want: int, got: dict[int, list[Any]]) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused-assign-only",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 200,
        }
    )
    try:
        consumer.assign([CkTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + IO_TIMEOUT
        while sum(len(v) for v in got.values()) < want and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got[msg.partition()].append((msg.offset(), msg.value()))
    finally:
        consumer.close()


def test_consumers_read_through_incremental_fetch_sessions(
    shared_broker, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    bootstrap = shared_broker.bootstrap
    topic = "fetch-sessions-interop"
    with BlockingConnection("127.0.0.1", shared_broker.port) as conn:
        assert create_topic(conn, topic, PARTITIONS) == 0
    for p in range(PARTITIONS):
        _produce(bootstrap, topic, p, 0, FIRST)

    # What kafka-python's session handler sent and was answered.
    sent: list[tuple[int, int]] = []
    answered: list[tuple[int, int]] = []
    build_next = kp_fetcher.FetchSessionHandler.build_next
    handle_response = kp_fetcher.FetchSessionHandler.handle_response

    def spy_build(self: Any, next_partitions: Any) -> Any:
        data = build_next(self, next_partitions)
        sent.append((data.id, data.epoch))
        return data

    def spy_handle(self: Any, response: Any) -> Any:
        answered.append((response.error_code, response.session_id))
        return handle_response(self, response)

    monkeypatch.setattr(kp_fetcher.FetchSessionHandler, "build_next", spy_build)
    monkeypatch.setattr(kp_fetcher.FetchSessionHandler, "handle_response", spy_handle)

    want = PARTITIONS * FIRST + LATER
    got_kp: dict[int, list[Any]] = {p: [] for p in range(PARTITIONS)}
    got_ck: dict[int, list[Any]] = {p: [] for p in range(PARTITIONS)}
    readers = [
        threading.Thread(target=_read_kafka_python, args=(bootstrap, topic, want, got_kp)),
        threading.Thread(target=_read_confluent, args=(bootstrap, topic, want, got_ck)),
    ]
    for t in readers:
        t.start()
    time.sleep(1.0)  # both have read the first records and wait at the end
    _produce(bootstrap, topic, 1, FIRST, LATER)
    for t in readers:
        t.join(IO_TIMEOUT + 5)
    expected = _expected({0: FIRST, 1: FIRST + LATER, 2: FIRST})
    assert got_kp == expected
    assert got_ck == expected
    # kafka-python opened a session and its incremental fetches were answered without error.
    session_ids = {sid for err, sid in answered if err == 0 and sid != 0}
    assert len(session_ids) == 1
    (sid,) = session_ids
    assert [e for i, e in sent if i == sid and e >= 1][:3] == [1, 2, 3]
    assert all(err == 0 for err, _ in answered)


def _session_fetch(conn: BlockingConnection, session_id: int, epoch: int) -> Any:
    """An incremental Fetch v12 that changes nothing in the session."""
    req = make_request(
        ApiKey.FETCH, 12, "FetchRequest", cluster_id=None, replica_id=-1, max_wait=0,
        min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=session_id,
        session_epoch=epoch, topics=(), forgotten_topics_data=(), rack_id="",
    )  # fmt: skip
    return conn.request(ApiKey.FETCH, 12, req)


def test_session_partitions_are_authorized_on_every_fetch(broker_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Rule 33 holds for the partitions a session fetches without naming them: once bob's
    Read ACL is gone, his next incremental fetch gets TOPIC_AUTHORIZATION_FAILED for them."""
    users = tmp_path / "plain-users"
    users.write_text("admin=admin-pw\nbob=bob-pw\n")
    broker = broker_factory(
        overrides={
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.plain.users.file": str(users),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin",
        }
    ).start()

    def conf(user: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": broker.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": f"{user}-pw",
        }

    admin = AdminClient(conf("admin"))
    admin.create_topics([NewTopic("guarded", 1, 1)])["guarded"].result(10)
    read = AclBinding(ResourceType.TOPIC, "guarded", ResourcePatternType.LITERAL, "User:bob",
                      "*", AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
    for f in admin.create_acls([read]).values():
        f.result(10)
    with BlockingConnection("127.0.0.1", broker.port, security=from_config(conf("bob"))) as bob:
        opening = replace(fetch_request({("guarded", 0): 0}, version=12), session_epoch=0)
        full = bob.request(ApiKey.FETCH, 12, opening)
        part = full.responses[0].partitions[0]
        assert int(part.error_code) == ErrorCode.NONE and full.session_id != 0
        assert _session_fetch(bob, full.session_id, 1).responses == ()  # nothing new
        gone = AclBindingFilter(
            ResourceType.TOPIC,
            "guarded",
            ResourcePatternType.LITERAL,
            "User:bob",
            "*",
            AclOperation.READ,
            AclPermissionType.ALLOW,
        )
        for f in admin.delete_acls([gone]).values():
            assert len(f.result(10)) == 1
        denied = _session_fetch(bob, full.session_id, 2)
        assert int(denied.error_code) == 0
        codes = [int(p.error_code) for t in denied.responses for p in t.partitions]
        assert codes == [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
