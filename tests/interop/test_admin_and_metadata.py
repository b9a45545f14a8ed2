"""Admin and metadata through real clients: topics, auto-creation, ListOffsets."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from samsa.client import Producer as SamsaProducer
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import produce_one

TIMEOUT = 15.0


def _admin(broker) -> AdminClient:  # type: ignore[no-untyped-def]
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _create_error(admin: AdminClient, topic: NewTopic, **kwargs) -> int | None:  # type: ignore[no-untyped-def]
    """The librdkafka error code creating ``topic`` (None on success)."""
    try:
        admin.create_topics([topic], **kwargs)[topic.topic].result(timeout=TIMEOUT)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def _delete_error(admin: AdminClient, name: str) -> int | None:
    try:
        admin.delete_topics([name], operation_timeout=10)[name].result(timeout=TIMEOUT)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def _metadata(port: int, names: list[str] | None, allow_auto: bool, version: int = 12):  # type: ignore[no-untyped-def]
    req = make_request(
        ApiKey.METADATA,
        version,
        "MetadataRequest",
        topics=None
        if names is None
        else tuple(
            make_request(
                ApiKey.METADATA, version, "MetadataRequestTopic", name=n, topic_id=uuid.UUID(int=0)
            )
            for n in names
        ),
        allow_auto_topic_creation=allow_auto,
        include_topic_authorized_operations=False,
    )
    with BlockingConnection("127.0.0.1", port) as conn:
        return conn.request(ApiKey.METADATA, version, req)


# --- confluent-kafka AdminClient -----------------------------------------------------------


@pytest.mark.timeout(45)
def test_confluent_admin_create_list_delete(shared_broker) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(shared_broker)
    futures = admin.create_topics(
        [NewTopic("ck-admin-a", num_partitions=4, replication_factor=1), NewTopic("ck-admin-b", 1)]
    )
    for f in futures.values():
        assert f.result(timeout=TIMEOUT) is None

    md = admin.list_topics(timeout=TIMEOUT)
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {
        0: ("127.0.0.1", shared_broker.port)
    }
    assert md.controller_id == 0
    for name, n in (("ck-admin-a", 4), ("ck-admin-b", 1)):
        topic = md.topics[name]
        assert topic.error is None
        assert sorted(topic.partitions) == list(range(n))
        for p in topic.partitions.values():
            assert (p.leader, p.replicas, p.isrs, p.error) == (0, [0], [0], None)

    # errors, each for its own reason
    assert (
        _create_error(admin, NewTopic("ck-admin-a", num_partitions=2, replication_factor=1))
        == KafkaError.TOPIC_ALREADY_EXISTS
    )
    assert (
        _create_error(admin, NewTopic("ck-admin-c", num_partitions=1, replication_factor=3))
        == KafkaError.INVALID_REPLICATION_FACTOR
    )
    assert (
        _create_error(admin, NewTopic("bad/name", num_partitions=1, replication_factor=1))
        == KafkaError.TOPIC_EXCEPTION
    )
    # validate_only checks without creating
    assert _create_error(admin, NewTopic("ck-admin-v", 2, 1), validate_only=True) is None
    assert "ck-admin-v" not in admin.list_topics(timeout=TIMEOUT).topics

    assert _delete_error(admin, "ck-admin-a") is None
    topics = admin.list_topics(timeout=TIMEOUT).topics
    assert "ck-admin-a" not in topics and "ck-admin-b" in topics
    assert _delete_error(admin, "ck-admin-a") == KafkaError.UNKNOWN_TOPIC_OR_PART

    # a deleted name can be created again, empty
    assert (
        _create_error(admin, NewTopic("ck-admin-a", num_partitions=2, replication_factor=1)) is None
    )
    assert sorted(admin.list_topics(timeout=TIMEOUT).topics["ck-admin-a"].partitions) == [0, 1]


@pytest.mark.timeout(30)
def test_confluent_describe_cluster(shared_broker) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(shared_broker)  # keep the handle alive until the result is in
    desc = admin.describe_cluster(request_timeout=10).result(timeout=TIMEOUT)
    assert desc.cluster_id
    assert [(n.id, n.host, n.port) for n in desc.nodes] == [(0, "127.0.0.1", shared_broker.port)]
    assert desc.controller.id == 0


# --- kafka-python KafkaAdminClient ---------------------------------------------------------


@pytest.mark.timeout(45)
def test_kafka_python_admin_create_list_delete(shared_broker) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic
    from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError

    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([KpNewTopic("kp-admin-a", 3, 1), KpNewTopic("kp-admin-b", 1, 1)])
        assert {"kp-admin-a", "kp-admin-b"} <= set(admin.list_topics())
        (described,) = admin.describe_topics(["kp-admin-a"])
        assert (described["name"], described["error_code"]) == ("kp-admin-a", 0)
        assert sorted(p["partition_index"] for p in described["partitions"]) == [0, 1, 2]
        assert {(p["leader_id"], tuple(p["replica_nodes"])) for p in described["partitions"]} == {
            (0, (0,))
        }
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([KpNewTopic("kp-admin-a", 3, 1)])

        admin.delete_topics(["kp-admin-a"])
        names = set(admin.list_topics())
        assert "kp-admin-a" not in names and "kp-admin-b" in names
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics(["kp-admin-a"])
    finally:
        admin.close()


# --- auto-creation -------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_metadata_auto_creates_only_when_allowed(shared_broker) -> None:  # type: ignore[no-untyped-def]
    resp = _metadata(shared_broker.port, ["auto-meta-no"], allow_auto=False)
    assert [(t.name, t.error_code) for t in resp.topics] == [
        ("auto-meta-no", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    ]
    resp = _metadata(shared_broker.port, ["auto-meta-yes"], allow_auto=True)
    (topic,) = resp.topics
    assert (topic.name, topic.error_code) == ("auto-meta-yes", ErrorCode.NONE)
    assert [p.partition_index for p in topic.partitions] == [0]  # num.partitions defaults to 1
    assert topic.topic_id != uuid.UUID(int=0)

    listed = {t.name for t in _metadata(shared_broker.port, None, allow_auto=False).topics}
    assert "auto-meta-yes" in listed and "auto-meta-no" not in listed
    # the same topic id on the next lookup: created once
    again = _metadata(shared_broker.port, ["auto-meta-yes"], allow_auto=True).topics[0]
    assert again.topic_id == topic.topic_id


@pytest.mark.timeout(30)
def test_producer_auto_creates_topic(shared_broker) -> None:  # type: ignore[no-untyped-def]
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap})
    reports: list[tuple[object, int, int]] = []
    producer.produce(
        "auto-by-producer",
        value=b"v",
        on_delivery=lambda err, msg: reports.append((err, msg.partition(), msg.offset())),
    )
    assert producer.flush(TIMEOUT) == 0
    assert reports == [(None, 0, 0)]
    md = _admin(shared_broker).list_topics(timeout=TIMEOUT)
    assert sorted(md.topics["auto-by-producer"].partitions) == [0]


@pytest.mark.timeout(30)
def test_no_auto_creation_when_disabled(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(overrides={"auto.create.topics.enable": "false"}).start()
    resp = _metadata(broker.port, ["auto-off"], allow_auto=True)
    assert [(t.name, t.error_code) for t in resp.topics] == [
        ("auto-off", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    ]
    # Produce never creates a topic (only Metadata may): a raw one is refused...
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        batch = build_batch([NewRecord(b"v")])
        assert produce_one(conn, "auto-off", 0, batch)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # ... and samsa's producer, which asks Metadata first as Java's does, gives up after
    # max.block.ms with the broker's answer.
    config = {"bootstrap.servers": broker.bootstrap, "max.block.ms": 1000}
    with SamsaProducer(config) as p:
        with pytest.raises(Exception, match="UNKNOWN_TOPIC_OR_PARTITION"):
            p.send("auto-off", value=b"v").result(timeout=TIMEOUT)
    assert _metadata(broker.port, None, allow_auto=False).topics == ()


# --- ListOffsets ---------------------------------------------------------------------------

T0 = 1_700_000_000_000
# record i's timestamp; record 6 carries the maximum, out of order
TIMESTAMPS = [T0 + i * 1000 for i in range(10)]
TIMESTAMPS[6] = T0 + 20_000


@pytest.fixture(scope="module")
def timed_topic(shared_broker) -> str:  # type: ignore[no-untyped-def]
    """Ten records in three batches (0-3, 4-7, 8-9) with the timestamps above."""
    topic = "list-offsets"
    admin = _admin(shared_broker)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=TIMEOUT)
    admin.create_topics([NewTopic(topic + "-empty", 1, 1)])[topic + "-empty"].result(
        timeout=TIMEOUT
    )
    producer = Producer(
        {"bootstrap.servers": shared_broker.bootstrap, "linger.ms": 50, "enable.idempotence": True}
    )
    offsets: list[int] = []
    for group in (range(0, 4), range(4, 8), range(8, 10)):
        for i in group:
            producer.produce(
                topic,
                value=b"r%d" % i,
                partition=0,
                timestamp=TIMESTAMPS[i],
                on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()),
            )
        assert producer.flush(TIMEOUT) == 0
    assert offsets == list(range(10))
    return topic


# target timestamp -> (offset, timestamp of that record) for "first offset with ts >= target"
BY_TIME = [
    (T0 - 1, 0),
    (T0, 0),
    (T0 + 1, 1),
    (T0 + 3000, 3),
    (T0 + 4500, 5),  # inside the second batch: a record offset, not the batch's base
    (T0 + 5001, 6),
    (T0 + 8000, 6),  # record 6 (T0+20000) comes first among ts >= T0+8000
    (T0 + 20_000, 6),
    (T0 + 20_001, -1),  # nothing that late
]


@pytest.mark.timeout(30)
def test_confluent_watermarks_and_offsets_for_times(shared_broker, timed_topic: str) -> None:  # type: ignore[no-untyped-def]
    consumer = Consumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "unused"})
    try:
        tp = TopicPartition(timed_topic, 0)
        assert consumer.get_watermark_offsets(tp, timeout=TIMEOUT, cached=False) == (0, 10)
        empty = TopicPartition(timed_topic + "-empty", 0)
        assert consumer.get_watermark_offsets(empty, timeout=TIMEOUT, cached=False) == (0, 0)
        for target, offset in BY_TIME:
            (found,) = consumer.offsets_for_times(
                [TopicPartition(timed_topic, 0, target)], timeout=TIMEOUT
            )
            assert found.error is None
            assert found.offset == offset, f"timestamp {target - T0:+d}"
        (found,) = consumer.offsets_for_times(
            [TopicPartition(timed_topic + "-empty", 0, T0)], timeout=TIMEOUT
        )
        assert found.offset == -1
    finally:
        consumer.close()


@pytest.mark.timeout(30)
def test_confluent_admin_list_offsets(shared_broker, timed_topic: str) -> None:  # type: ignore[no-untyped-def]
    admin = _admin(shared_broker)
    tp = TopicPartition(timed_topic, 0)
    specs = {
        "earliest": (OffsetSpec.earliest(), 0),
        "latest": (OffsetSpec.latest(), 10),
        "max": (OffsetSpec.max_timestamp(), 6),
        "t+4500": (OffsetSpec.for_timestamp(T0 + 4500), 5),
    }
    for name, (spec, offset) in specs.items():
        info = admin.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=TIMEOUT)
        assert info.offset == offset, name
        if name in ("max", "t+4500"):
            assert info.timestamp == TIMESTAMPS[offset], name


@pytest.mark.timeout(30)
def test_kafka_python_offsets(shared_broker, timed_topic: str) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=shared_broker.bootstrap, group_id=None, request_timeout_ms=10_000
    )
    try:
        tp = KpTopicPartition(timed_topic, 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        for target, offset in BY_TIME:
            found = consumer.offsets_for_times({tp: target})[tp]
            if offset < 0:
                assert found is None
            else:
                assert (found.offset, found.timestamp) == (offset, TIMESTAMPS[offset])
    finally:
        consumer.close()


def _raw_list_offsets(
    port: int, topic: str, partition: int, timestamp: int
) -> tuple[int, int, int]:
    """(error code, timestamp, offset) from a raw ListOffsets v8."""
    v = 8
    req = make_request(
        ApiKey.LIST_OFFSETS,
        v,
        "ListOffsetsRequest",
        replica_id=-1,
        isolation_level=0,
        topics=(
            make_request(
                ApiKey.LIST_OFFSETS,
                v,
                "ListOffsetsTopic",
                name=topic,
                partitions=(
                    make_request(
                        ApiKey.LIST_OFFSETS,
                        v,
                        "ListOffsetsPartition",
                        partition_index=partition,
                        current_leader_epoch=-1,
                        timestamp=timestamp,
                    ),
                ),
            ),
        ),
    )
    with BlockingConnection("127.0.0.1", port) as conn:
        resp = conn.request(ApiKey.LIST_OFFSETS, v, req)
    p = resp.topics[0].partitions[0]
    return int(p.error_code), int(p.timestamp), int(p.offset)


@pytest.mark.timeout(30)
def test_raw_list_offsets(shared_broker, timed_topic: str) -> None:  # type: ignore[no-untyped-def]
    port = shared_broker.port
    assert _raw_list_offsets(port, timed_topic, 0, -2) == (0, -1, 0)
    assert _raw_list_offsets(port, timed_topic, 0, -1) == (0, -1, 10)
    assert _raw_list_offsets(port, timed_topic, 0, -3) == (0, TIMESTAMPS[6], 6)
    assert _raw_list_offsets(port, timed_topic, 0, T0 + 4500) == (0, TIMESTAMPS[5], 5)
    assert _raw_list_offsets(port, timed_topic + "-empty", 0, -3) == (0, -1, -1)
    assert _raw_list_offsets(port, timed_topic, 5, -1)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert _raw_list_offsets(port, "no-such-topic", 0, -1)[0] == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )


# --- ElectLeaders (KIP-460) ----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_confluent_elect_leaders(shared_broker) -> None:  # type: ignore[no-untyped-def]
    """One replica per partition, already its leader: each named partition answers
    ELECTION_NOT_NEEDED (as Kafka's controller for a partition with its preferred leader),
    an unknown partition UNKNOWN_TOPIC_OR_PARTITION."""
    from confluent_kafka import ElectionType

    admin = _admin(shared_broker)
    name = f"elect-{uuid.uuid4().hex[:8]}"
    assert _create_error(admin, NewTopic(name, num_partitions=2, replication_factor=1)) is None
    for election in (ElectionType.PREFERRED, ElectionType.UNCLEAN):
        asked = [TopicPartition(name, 0), TopicPartition(name, 1), TopicPartition(name, 7)]
        got = admin.elect_leaders(election, asked).result(timeout=TIMEOUT)
        codes = {tp.partition: (err.code() if err is not None else None) for tp, err in got.items()}
        assert codes == {
            0: KafkaError.ELECTION_NOT_NEEDED,
            1: KafkaError.ELECTION_NOT_NEEDED,
            7: KafkaError.UNKNOWN_TOPIC_OR_PART,
        }


@pytest.mark.timeout(30)
def test_elect_leaders_raw_versions(shared_broker) -> None:  # type: ignore[no-untyped-def]
    """v0 (preferred only, no top-level error) and v2; a request for every partition (null)
    lists none, since none needed an election; an unknown election type is refused."""
    name = f"elect-raw-{uuid.uuid4().hex[:8]}"
    assert _create_error(_admin(shared_broker), NewTopic(name, 1, 1)) is None
    with BlockingConnection("127.0.0.1", shared_broker.port) as conn:
        for v in (0, 1, 2):
            tp = make_request(
                ApiKey.ELECT_LEADERS, v, "TopicPartitions", topic=name, partitions=(0,)
            )
            resp = conn.request(
                ApiKey.ELECT_LEADERS,
                v,
                make_request(
                    ApiKey.ELECT_LEADERS,
                    v,
                    "ElectLeadersRequest",
                    election_type=0,
                    topic_partitions=(tp,),
                    timeout=10_000,
                ),
            )
            [result] = resp.replica_election_results
            assert result.topic == name
            assert [(p.partition_id, p.error_code) for p in result.partition_result] == [
                (0, ErrorCode.ELECTION_NOT_NEEDED)
            ]
        every = conn.request(
            ApiKey.ELECT_LEADERS,
            2,
            make_request(
                ApiKey.ELECT_LEADERS,
                2,
                "ElectLeadersRequest",
                election_type=0,
                topic_partitions=None,
                timeout=10_000,
            ),
        )
        assert every.error_code == ErrorCode.NONE and every.replica_election_results == ()
        bad = conn.request(
            ApiKey.ELECT_LEADERS,
            2,
            make_request(
                ApiKey.ELECT_LEADERS,
                2,
                "ElectLeadersRequest",
                election_type=5,
                topic_partitions=(tp,),
                timeout=10_000,
            ),
        )
        assert bad.error_code == ErrorCode.INVALID_REQUEST
        assert bad.replica_election_results[0].partition_result[0].error_code == (
            ErrorCode.INVALID_REQUEST
        )


# --- DescribeLogDirs -----------------------------------------------------------------------


@pytest.mark.timeout(45)
def test_kafka_python_describe_log_dirs(shared_broker) -> None:  # type: ignore[no-untyped-def]
    """kafka-python's describe_log_dirs: the data directory, each partition's size as the
    bytes of its segment files, and the file system's space; a named partition alone."""
    from kafka.admin import KafkaAdminClient

    name = f"logdirs-{uuid.uuid4().hex[:8]}"
    assert _create_error(_admin(shared_broker), NewTopic(name, 2, 1)) is None
    p = Producer({"bootstrap.servers": shared_broker.bootstrap})
    for _ in range(50):
        p.produce(name, b"x" * 100, partition=0)
    assert p.flush(TIMEOUT) == 0
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap)
    try:
        [everything] = admin.describe_log_dirs()
        [one] = admin.describe_log_dirs(topic_partitions={name: [1]})
    finally:
        admin.close()
    [log_dir] = everything["log_dirs"]
    assert log_dir["error_code"] == 0
    assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    [topic] = [t for t in log_dir["topics"] if t["name"] == name]
    sizes = {q["partition_index"]: q["partition_size"] for q in topic["partitions"]}
    data = [d for d in Path(log_dir["log_dir"]).iterdir() if d.name.startswith(f"{name}-")]
    on_disk = {
        int(d.name.rsplit("-", 1)[1]): sum(f.stat().st_size for f in d.glob("*.log")) for d in data
    }
    assert sizes == on_disk and sizes[0] > 5000 and sizes[1] == 0
    [only] = one["log_dirs"]
    listed = [(t["name"], [q["partition_index"] for q in t["partitions"]]) for t in only["topics"]]
    assert listed == [(name, [1])]
