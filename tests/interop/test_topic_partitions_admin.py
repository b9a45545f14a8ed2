"""DescribeTopicPartitions (KIP-966) and the partition-reassignment APIs (KIP-455, KIP-860)
through kafka-python's admin and raw requests, as Kafka's broker answers on one broker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import (
    InvalidReplicationAssignmentError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)

from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

DTP = ApiKey.DESCRIBE_TOPIC_PARTITIONS
APR = ApiKey.ALTER_PARTITION_REASSIGNMENTS
LPR = ApiKey.LIST_PARTITION_REASSIGNMENTS


@pytest.fixture(scope="module")
def admin(shared_broker) -> Iterator[KafkaAdminClient]:  # type: ignore[no-untyped-def]
    client = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap, request_timeout_ms=10_000)
    yield client
    client.close()


@pytest.fixture(scope="module")
def topics(admin: KafkaAdminClient) -> tuple[str, str]:
    """Two topics in name order: 30 partitions, then 5."""
    tag = uuid.uuid4().hex[:8]
    a, b = f"dtp-a-{tag}", f"dtp-b-{tag}"
    admin.create_topics([NewTopic(a, 30, 1), NewTopic(b, 5, 1)])
    return a, b


def _describe(port: int, names: list[str], limit: int = 2000, cursor: Any = None) -> Any:
    req = make_request(
        DTP,
        0,
        "DescribeTopicPartitionsRequest",
        topics=tuple(make_request(DTP, 0, "TopicRequest", name=n) for n in names),
        response_partition_limit=limit,
        cursor=None
        if cursor is None
        else make_request(DTP, 0, "Cursor", topic_name=cursor[0], partition_index=cursor[1]),
    )
    with BlockingConnection("127.0.0.1", port) as conn:
        return conn.request(DTP, 0, req)


def _metadata_ops(port: int, name: str) -> int:
    """The topic's authorized operations as Metadata v12 reports them (KIP-430)."""
    req = make_request(
        ApiKey.METADATA,
        12,
        "MetadataRequest",
        topics=(
            make_request(ApiKey.METADATA, 12, "MetadataRequestTopic", name=name, topic_id=None),
        ),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    with BlockingConnection("127.0.0.1", port) as conn:
        [topic] = conn.request(ApiKey.METADATA, 12, req).topics
    return int(topic.topic_authorized_operations)


def _alter(port: int, v: int, topic: str, targets: dict[int, Any], allow: bool = True) -> Any:
    parts = tuple(
        make_request(APR, v, "ReassignablePartition", partition_index=p, replicas=r)
        for p, r in targets.items()
    )
    req = make_request(
        APR,
        v,
        "AlterPartitionReassignmentsRequest",
        timeout=10_000,
        allow_replication_factor_change=allow,
        topics=(make_request(APR, v, "ReassignableTopic", name=topic, partitions=parts),),
    )
    with BlockingConnection("127.0.0.1", port) as conn:
        resp = conn.request(APR, v, req)
    assert resp.error_code == ErrorCode.NONE
    [t] = resp.responses
    return {p.partition_index: p.error_code for p in t.partitions}


# --- DescribeTopicPartitions ---------------------------------------------------------------


@pytest.mark.timeout(30)
def test_kafka_python_describe_topic_partitions(
    shared_broker, admin: KafkaAdminClient, topics
) -> None:  # type: ignore[no-untyped-def]
    """Each partition as Metadata gives it (leader 0, replicas and ISR [0]), no ELR, the topic
    id of Metadata and every operation authorized (no authorizer); an unknown topic gets 3."""
    a, b = topics
    missing = f"dtp-missing-{uuid.uuid4().hex[:8]}"
    got = admin.describe_topic_partitions([b, missing])
    assert got["next_cursor"] is None
    [described, unknown] = got["topics"]
    [meta] = admin.describe_topics([b])
    assert (described["name"], described["error_code"]) == (b, 0)
    assert str(described["topic_id"]) == str(meta["topic_id"]) and not described["is_internal"]
    ops = described["topic_authorized_operations"]
    assert ops > 0 and ops == _metadata_ops(shared_broker.port, b)
    assert [
        (p["partition_index"], p["leader_id"], p["leader_epoch"], p["replica_nodes"],
         p["isr_nodes"], p["offline_replicas"], p["eligible_leader_replicas"],
         p["last_known_elr"], p["error_code"])
        for p in described["partitions"]
    ] == [(i, 0, 0, [0], [0], [], None, None, 0) for i in range(5)]  # fmt: skip
    assert (unknown["name"], unknown["error_code"], unknown["partitions"]) == (
        missing,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        [],
    )
    assert unknown["topic_id"] is None  # the zero id, which kafka-python reads as None
    # kafka-python's own cursor: the page after a limit of 25 starts at a's partition 25
    first = admin.describe_topic_partitions([a, b], response_partition_limit=25)
    assert first["next_cursor"] == {"topic_name": a, "partition_index": 25}
    rest = admin.describe_topic_partitions([a, b], cursor=first["next_cursor"])
    assert [(t["name"], len(t["partitions"])) for t in rest["topics"]] == [(a, 5), (b, 5)]
    assert rest["topics"][0]["partitions"][0]["partition_index"] == 25


@pytest.mark.timeout(30)
def test_pagination_pages_join_to_the_whole(shared_broker, topics) -> None:  # type: ignore[no-untyped-def]
    """A limit of 10 over 30 + 5 partitions: the cursor moves within a (10, 20), then to b's
    start when a ended exactly at the limit; the pages joined equal the unlimited answer."""
    a, b = topics
    whole = _describe(shared_broker.port, [b, a])  # asked out of order: answered by name
    assert whole.next_cursor is None
    everything = [(t.name, p.partition_index) for t in whole.topics for p in t.partitions]
    assert everything == [(a, i) for i in range(30)] + [(b, i) for i in range(5)]
    pages, cursors, cursor = [], [], None
    for _ in range(10):
        resp = _describe(shared_broker.port, [a, b], limit=10, cursor=cursor)
        pages.append([(t.name, p.partition_index) for t in resp.topics for p in t.partitions])
        if resp.next_cursor is None:
            break
        cursor = (resp.next_cursor.topic_name, resp.next_cursor.partition_index)
        cursors.append(cursor)
    assert cursors == [(a, 10), (a, 20), (b, 0)]
    assert [len(p) for p in pages] == [10, 10, 10, 5]
    assert [x for page in pages for x in page] == everything


@pytest.mark.timeout(30)
def test_describe_every_topic_and_the_errors(shared_broker, topics) -> None:  # type: ignore[no-untyped-def]
    a, b = topics
    port = shared_broker.port
    # no topic named: every topic, in name order, unknown ones never invented
    every = _describe(port, [])
    names = [t.name for t in every.topics]
    assert names == sorted(names) and {a, b} <= set(names)
    assert all(t.error_code == ErrorCode.NONE for t in every.topics)
    # a cursor on every topic starts at its topic and partition
    from_b = _describe(port, [], cursor=(b, 3))
    assert [(from_b.topics[0].name, [p.partition_index for p in from_b.topics[0].partitions])] == [
        (b, [3, 4])
    ]
    assert all(t.name >= b for t in from_b.topics)
    # an illegal name gets 17, an unknown one 3, a cursor on a topic not named 42 (each topic)
    bad = _describe(port, ["bad name!", f"{a}-nope"])
    assert sorted((t.name, t.error_code) for t in bad.topics) == [
        ("bad name!", ErrorCode.INVALID_TOPIC_EXCEPTION),
        (f"{a}-nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    refused = _describe(port, [a], cursor=(b, 0))
    assert [(t.name, t.error_code, t.partitions) for t in refused.topics] == [
        (a, ErrorCode.INVALID_REQUEST, ())
    ]
    # a limit of 0 gives nothing but a cursor at the first topic
    none = _describe(port, [a, b], limit=0)
    assert none.topics == ()
    assert (none.next_cursor.topic_name, none.next_cursor.partition_index) == (a, 0)


# --- ListPartitionReassignments / AlterPartitionReassignments ------------------------------


@pytest.mark.timeout(30)
def test_kafka_python_list_partition_reassignments(admin: KafkaAdminClient, topics) -> None:  # type: ignore[no-untyped-def]
    """Nothing is ever moving on one broker; unknown topics and partitions are skipped."""
    a, b = topics
    assert admin.list_partition_reassignments() == {}
    asked = {a: [0, 29, 30], b: [1], f"{a}-nope": [0]}
    assert admin.list_partition_reassignments(asked) == {}
    assert admin.list_partition_reassignments([TopicPartition(b, 4)]) == {}


@pytest.mark.timeout(30)
def test_kafka_python_alter_partition_reassignments(admin: KafkaAdminClient, topics) -> None:  # type: ignore[no-untyped-def]
    a, b = topics
    got = admin.alter_partition_reassignments(
        {
            TopicPartition(b, 0): [0],  # the current replicas: accepted, nothing moves
            TopicPartition(b, 1): [1],  # a broker that does not exist
            TopicPartition(b, 2): None,  # cancel: there is nothing to cancel
            TopicPartition(b, 5): [0],  # no such partition
            TopicPartition(f"{a}-nope", 0): [0],  # no such topic
        }
    )
    assert got == {
        TopicPartition(b, 0): None,
        TopicPartition(b, 1): InvalidReplicationAssignmentError,
        TopicPartition(b, 2): NoReassignmentInProgressError,
        TopicPartition(b, 5): UnknownTopicOrPartitionError,
        TopicPartition(f"{a}-nope", 0): UnknownTopicOrPartitionError,
    }
    assert admin.list_partition_reassignments() == {}
    [meta] = admin.describe_topics([b])
    assert {tuple(p["replica_nodes"]) for p in meta["partitions"]} == {(0,)}


@pytest.mark.timeout(30)
def test_alter_partition_reassignments_raw_codes(shared_broker, topics) -> None:  # type: ignore[no-untyped-def]
    """v0 and v1: an empty or duplicate target gets 39; with v1's
    allow_replication_factor_change false a change of length gets 38, a same-length target
    on another broker still 39, and [0] is accepted."""
    _, b = topics
    port = shared_broker.port
    for v in (0, 1):
        assert _alter(port, v, b, {0: (), 1: (0, 0), 2: (0,), 3: (0, 1)}) == {
            0: ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            1: ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            2: ErrorCode.NONE,
            3: ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        }
    assert _alter(port, 1, b, {0: (0,), 1: (0, 1), 2: (1,), 3: ()}, allow=False) == {
        0: ErrorCode.NONE,
        1: ErrorCode.INVALID_REPLICATION_FACTOR,
        2: ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        3: ErrorCode.INVALID_REPLICATION_FACTOR,
    }
