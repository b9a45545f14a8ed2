"""The config and partition APIs over the wire (raw protocol): DescribeConfigs,
IncrementalAlterConfigs, AlterConfigs, CreatePartitions, DeleteRecords."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import create_topic, fetch_request, produce_one

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND = 0, 1, 2


@pytest.fixture
def conn(shared_broker: Any) -> Iterator[BlockingConnection]:
    with BlockingConnection("127.0.0.1", shared_broker.port) as c:
        yield c


_names = iter(range(10_000))


@pytest.fixture
def topic(conn: BlockingConnection) -> str:
    name = f"cfg-{next(_names)}"
    assert create_topic(conn, name, 1) == 0
    return name


def describe(
    conn: BlockingConnection,
    rtype: int,
    name: str,
    *,
    synonyms: bool = False,
    docs: bool = False,
    keys: tuple[str, ...] | None = None,
) -> Any:
    k, v = ApiKey.DESCRIBE_CONFIGS, 4
    res = make_request(
        k,
        v,
        "DescribeConfigsResource",
        resource_type=rtype,
        resource_name=name,
        configuration_keys=keys,
    )
    req = make_request(
        k,
        v,
        "DescribeConfigsRequest",
        resources=(res,),
        include_synonyms=synonyms,
        include_documentation=docs,
    )
    return conn.request(k, v, req).results[0]


def incremental(
    conn: BlockingConnection,
    name: str,
    ops: list[tuple[str, int, str | None]],
    *,
    validate_only: bool = False,
    rtype: int = TOPIC,
) -> tuple[int, str | None]:
    k, v = ApiKey.INCREMENTAL_ALTER_CONFIGS, 1
    configs = tuple(
        make_request(k, v, "AlterableConfig", name=n, config_operation=op, value=val)
        for n, op, val in ops
    )
    res = make_request(
        k, v, "AlterConfigsResource", resource_type=rtype, resource_name=name, configs=configs
    )
    req = make_request(
        k, v, "IncrementalAlterConfigsRequest", resources=(res,), validate_only=validate_only
    )
    r = conn.request(k, v, req).responses[0]
    return int(r.error_code), r.error_message


def alter(conn: BlockingConnection, name: str, configs: dict[str, str]) -> int:
    k, v = ApiKey.ALTER_CONFIGS, 2
    res = make_request(
        k,
        v,
        "AlterConfigsResource",
        resource_type=TOPIC,
        resource_name=name,
        configs=tuple(
            make_request(k, v, "AlterableConfig", name=n, value=val) for n, val in configs.items()
        ),
    )
    req = make_request(k, v, "AlterConfigsRequest", resources=(res,), validate_only=False)
    return int(conn.request(k, v, req).responses[0].error_code)


def dynamic(conn: BlockingConnection, name: str) -> dict[str, str]:
    return {c.name: c.value for c in describe(conn, TOPIC, name).configs if c.config_source == 1}


def test_describe_answers_sources_synonyms_and_documentation(
    conn: BlockingConnection, topic: str
) -> None:
    assert incremental(conn, topic, [("retention.ms", SET, "1000")]) == (0, None)
    result = describe(conn, TOPIC, topic, synonyms=True, docs=True)
    configs = {c.name: c for c in result.configs}
    ret = configs["retention.ms"]
    assert (ret.value, ret.config_source, ret.read_only, ret.config_type) == ("1000", 1, False, 5)
    # No log.retention.ms is set, so Kafka lists no broker synonym (log.retention.hours=168
    # only follows a log.retention.ms): tests/oracle/test_kafka_tools.py compares.
    assert [(s.name, s.source) for s in ret.synonyms] == [("retention.ms", 1)]
    assert ret.documentation
    only = describe(conn, TOPIC, topic, keys=("retention.ms", "segment.ms"))
    assert sorted(c.name for c in only.configs) == ["retention.ms", "segment.ms"]
    plain = {c.name: c for c in describe(conn, TOPIC, topic).configs}
    assert plain["retention.ms"].synonyms == () and plain["retention.ms"].documentation is None
    assert plain["segment.bytes"].config_source == 5
    unknown = describe(conn, TOPIC, "no-such-topic")
    assert int(unknown.error_code) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    broker = {c.name: c for c in describe(conn, BROKER, "0").configs}
    assert broker["num.partitions"].read_only and broker["num.partitions"].value == "1"
    assert broker["ssl.key.password"].is_sensitive and broker["ssl.key.password"].value is None
    assert int(describe(conn, BROKER, "7").error_code) == ErrorCode.INVALID_REQUEST


def test_incremental_alter_configs(conn: BlockingConnection, topic: str) -> None:
    assert incremental(conn, topic, [("segment.ms", SET, "1000")], validate_only=True)[0] == 0
    assert dynamic(conn, topic) == {}
    assert incremental(
        conn, topic, [("segment.ms", SET, "1000"), ("cleanup.policy", APPEND, "compact")]
    ) == (0, None)
    assert dynamic(conn, topic) == {"segment.ms": "1000", "cleanup.policy": "delete,compact"}
    assert incremental(conn, topic, [("segment.ms", DELETE, None)])[0] == 0
    assert dynamic(conn, topic) == {"cleanup.policy": "delete,compact"}
    code, message = incremental(conn, topic, [("segment.ms", SET, "0")])
    assert code == ErrorCode.INVALID_CONFIG and "segment.ms" in (message or "")
    code, message = incremental(conn, topic, [("no.such.key", SET, "1")])
    assert code == ErrorCode.INVALID_CONFIG and "no.such.key" in (message or "")
    assert incremental(conn, topic, [("a", SET, "1"), ("a", SET, "2")])[0] == (
        ErrorCode.INVALID_REQUEST
    )
    assert incremental(conn, "nope", [("segment.ms", SET, "5")])[0] == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert incremental(conn, "0", [("num.partitions", SET, "5")], rtype=BROKER) == (
        ErrorCode.INVALID_REQUEST,  # rule 44: not dynamically updatable, as Kafka answers
        "Cannot update these configs dynamically: [num.partitions]",
    )
    assert dynamic(conn, topic) == {"cleanup.policy": "delete,compact"}  # refusals changed nothing


def test_alter_configs_replaces_the_whole_set(conn: BlockingConnection, topic: str) -> None:
    assert incremental(conn, topic, [("segment.ms", SET, "1000")])[0] == 0
    assert alter(conn, topic, {"retention.ms": "5000"}) == 0
    assert dynamic(conn, topic) == {"retention.ms": "5000"}
    assert alter(conn, topic, {"retention.ms": "-7"}) == ErrorCode.INVALID_CONFIG
    assert dynamic(conn, topic) == {"retention.ms": "5000"}


def test_max_message_bytes_is_checked_in_produce(conn: BlockingConnection, topic: str) -> None:
    records = build_batch([NewRecord(b"x" * 500)])
    assert produce_one(conn, topic, 0, records)[0] == 0
    assert incremental(conn, topic, [("max.message.bytes", SET, "200")])[0] == 0
    assert produce_one(conn, topic, 0, records)[0] == ErrorCode.MESSAGE_TOO_LARGE


def create_partitions(
    conn: BlockingConnection, name: str, count: int, validate_only: bool = False
) -> int:
    k, v = ApiKey.CREATE_PARTITIONS, 3
    t = make_request(k, v, "CreatePartitionsTopic", name=name, count=count, assignments=None)
    req = make_request(
        k, v, "CreatePartitionsRequest", topics=(t,), timeout=5000, validate_only=validate_only
    )
    return int(conn.request(k, v, req).results[0].error_code)


def partition_count(conn: BlockingConnection, name: str) -> int:
    k, v = ApiKey.METADATA, 12
    t = make_request(k, v, "MetadataRequestTopic", name=name, topic_id=None)
    req = make_request(
        k,
        v,
        "MetadataRequest",
        topics=(t,),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return len(conn.request(k, v, req).topics[0].partitions)


def test_create_partitions(conn: BlockingConnection, topic: str) -> None:
    assert create_partitions(conn, topic, 3, validate_only=True) == 0
    assert partition_count(conn, topic) == 1
    assert create_partitions(conn, topic, 3) == 0
    assert partition_count(conn, topic) == 3  # Metadata shows them at once
    assert produce_one(conn, topic, 2, build_batch([NewRecord(b"v")])) == (0, 0)
    assert create_partitions(conn, topic, 2) == ErrorCode.INVALID_PARTITIONS
    assert create_partitions(conn, "nope", 2) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def delete_records(conn: BlockingConnection, name: str, partition: int, offset: int) -> Any:
    k, v = ApiKey.DELETE_RECORDS, 2
    p = make_request(k, v, "DeleteRecordsPartition", partition_index=partition, offset=offset)
    t = make_request(k, v, "DeleteRecordsTopic", name=name, partitions=(p,))
    req = make_request(k, v, "DeleteRecordsRequest", topics=(t,), timeout=5000)
    r = conn.request(k, v, req).topics[0].partitions[0]
    return int(r.error_code), int(r.low_watermark)


def earliest(conn: BlockingConnection, name: str) -> int:
    k, v = ApiKey.LIST_OFFSETS, 7
    p = make_request(
        k, v, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=-2
    )
    t = make_request(k, v, "ListOffsetsTopic", name=name, partitions=(p,))
    req = make_request(k, v, "ListOffsetsRequest", replica_id=-1, isolation_level=0, topics=(t,))
    return int(conn.request(k, v, req).topics[0].partitions[0].offset)


def test_delete_records(conn: BlockingConnection, topic: str) -> None:
    for _ in range(3):
        produce_one(conn, topic, 0, build_batch([NewRecord(b"v")] * 2))
    assert delete_records(conn, topic, 0, 7) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert delete_records(conn, topic, 0, 3) == (0, 3)
    assert earliest(conn, topic) == 3
    resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): 1}))
    assert int(resp.responses[0].partitions[0].error_code) == ErrorCode.OFFSET_OUT_OF_RANGE
    resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): 3}))
    part = resp.responses[0].partitions[0]
    assert int(part.error_code) == 0 and int(part.log_start_offset) == 3
    assert delete_records(conn, topic, 0, -1) == (0, 6)
    assert delete_records(conn, topic, 5, 0) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)


def test_the_new_apis_are_advertised(conn: BlockingConnection) -> None:
    k = ApiKey.API_VERSIONS
    req = make_request(
        k, 3, "ApiVersionsRequest", client_software_name="t", client_software_version="1"
    )
    keys = {a.api_key: a.max_version for a in conn.request(k, 3, req).api_keys}
    assert {keys[21], keys[33], keys[37], keys[44]} >= {1} and keys[37] == 3


def create_with(
    conn: BlockingConnection, name: str, configs: dict[str, str], validate_only: bool, v: int = 7
) -> Any:
    k = ApiKey.CREATE_TOPICS
    topic = make_request(
        k,
        v,
        "CreatableTopic",
        name=name,
        num_partitions=2,
        replication_factor=1,
        assignments=(),
        configs=tuple(
            make_request(k, v, "CreatableTopicConfig", name=n, value=val)
            for n, val in configs.items()
        ),
    )
    req = make_request(
        k, v, "CreateTopicsRequest", topics=(topic,), timeout=5000, validate_only=validate_only
    )
    return conn.request(k, v, req).topics[0]


def test_create_topics_answers_the_configs_and_refuses_unknown_keys(
    conn: BlockingConnection,
) -> None:
    for validate_only in (True, False):
        result = create_with(conn, "created-cfg", {"segment.ms": "5000"}, validate_only)
        assert int(result.error_code) == 0 and result.num_partitions == 2
        configs = {c.name: (c.value, c.config_source) for c in result.configs}
        assert configs["segment.ms"] == ("5000", 1)
        assert configs["retention.ms"] == ("604800000", 5)
    assert dynamic(conn, "created-cfg") == {"segment.ms": "5000"}
    bad = create_with(conn, "created-bad", {"no.such.config": "2"}, False)
    assert int(bad.error_code) == ErrorCode.INVALID_CONFIG and bad.configs == ()  # as Kafka
    assert int(describe(conn, TOPIC, "created-bad").error_code) == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    # Before v5 the response has no configs: still answered.
    assert int(create_with(conn, "created-v4", {"segment.ms": "5000"}, False, v=4).error_code) == 0
