"""Differences a real client's integration tests found between samsa and Apache Kafka (issue
22, part 5): each scenario runs the same raw requests against a Kafka node and a samsa
broker and asserts the two answer alike."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import produce_request
from samsa.testing.kafka import KafkaNode


@pytest.fixture(scope="module")
def samsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("samsa")).start()
    yield b
    b.stop()


def _conn(bootstrap: str) -> BlockingConnection:
    host, port = bootstrap.rsplit(":", 1)
    return BlockingConnection(host, int(port))


def _request(bootstrap: str, key: int, version: int, name: str, **fields: Any) -> Any:
    with _conn(bootstrap) as c:
        return c.request(key, version, make_request(key, version, name, **fields))


def _both(kafka: KafkaNode, samsa: BrokerProcess) -> list[str]:
    return [kafka.bootstrap, samsa.bootstrap]


def _create_topic(
    bootstrap: str, name: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> int:
    k, v = ApiKey.CREATE_TOPICS, 7
    topic = make_request(
        k,
        v,
        "CreatableTopic",
        name=name,
        num_partitions=partitions,
        replication_factor=1,
        assignments=(),
        configs=tuple(
            make_request(k, v, "CreatableTopicConfig", name=n, value=x)
            for n, x in (configs or {}).items()
        ),
    )
    r = _request(bootstrap, k, v, "CreateTopicsRequest", topics=(topic,), timeout=10_000,
                 validate_only=False)  # fmt: skip
    return int(r.topics[0].error_code)


# --- 1. Produce: each keyless record of a compacted topic is listed -------------------------


def test_keyless_records_on_a_compacted_topic_are_listed_by_index(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    ts = int(time.time() * 1000)
    keys = [b"k", None, b"k2", None]
    batch = build_batch([NewRecord(key=k, value=b"v", timestamp=ts) for k in keys])
    answers = []
    for bootstrap in _both(kafka, samsa):
        assert _create_topic(bootstrap, "compacted", configs={"cleanup.policy": "compact"}) == 0
        for version in (8, 9, 11):
            with _conn(bootstrap) as c:
                r = c.request(
                    ApiKey.PRODUCE,
                    version,
                    produce_request({("compacted", 0): batch}, version=version),
                )
            p = r.responses[0].partition_responses[0]
            answers.append(
                (
                    version,
                    int(p.error_code),
                    [(e.batch_index, e.batch_index_error_message) for e in p.record_errors],
                    p.error_message,
                )
            )
    kafka_answers, samsa_answers = answers[:3], answers[3:]
    assert [(i, m) for i, m in kafka_answers[0][2]] == [
        (1, "Compacted topic cannot accept message without key in topic partition compacted-0"),
        (3, "Compacted topic cannot accept message without key in topic partition compacted-0"),
    ]
    assert samsa_answers == kafka_answers


# --- 2. CreateTopics with a manual replica assignment ------------------------------------


def _assigned_topic(name: str, lists: list[list[int]], count: int = -1, factor: int = -1) -> Any:
    k, v = ApiKey.CREATE_TOPICS, 7
    return make_request(
        k,
        v,
        "CreatableTopic",
        name=name,
        num_partitions=count,
        replication_factor=factor,
        assignments=tuple(
            make_request(k, v, "CreatableReplicaAssignment", partition_index=i, broker_ids=tuple(b))
            for i, b in lists
        ),
        configs=(),
    )


def test_manual_replica_assignment_of_the_live_broker_is_taken(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    answers = []
    for bootstrap, me in ((kafka.bootstrap, kafka.node_id), (samsa.bootstrap, 0)):
        cases = [
            _assigned_topic("m-ok", [(0, [me]), (1, [me]), (2, [me])]),
            _assigned_topic("m-ok", [(0, [me])]),  # now it exists
            _assigned_topic("m-unknown", [(0, [me]), (1, [me + 7])]),
            _assigned_topic("m-twice", [(0, [me, me])]),
            _assigned_topic("m-empty", [(0, [])]),
            _assigned_topic("m-count", [(0, [me])], count=1),
            _assigned_topic("m-factor", [(0, [me])], factor=1),
            _assigned_topic("m-gap", [(1, [me])]),
            _assigned_topic("m-again", [(0, [me]), (0, [me])]),
        ]
        answer = []
        for t in cases:
            r = _request(bootstrap, ApiKey.CREATE_TOPICS, 7, "CreateTopicsRequest", topics=(t,),
                         timeout=10_000, validate_only=False)  # fmt: skip
            res = r.topics[0]
            message = (res.error_message or "").replace(f"broker {me + 7}", "broker N")
            message = message.replace(f"broker {me}", "broker ME")
            if "already exists" in message:
                message = "exists"  # the words differ; the code is what clients act on
            answer.append(
                (
                    t.name,
                    int(res.error_code),
                    message,
                    res.num_partitions,
                    res.replication_factor,
                    bool(res.configs),
                )
            )
        meta = _request(bootstrap, ApiKey.METADATA, 12, "MetadataRequest",
                        topics=(make_request(ApiKey.METADATA, 12, "MetadataRequestTopic",
                                             topic_id=None, name="m-ok"),),
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)  # fmt: skip
        parts = sorted(
            (p.partition_index, tuple(p.replica_nodes) == (me,)) for p in meta.topics[0].partitions
        )
        answers.append((answer, parts))
    assert answers[0][0][0][1:] == (0, "", 3, 1, True)
    assert answers[0][0][2][1:3] == (
        39,
        "The manual partition assignment includes broker N, but no such broker is registered.",
    )
    assert answers[1] == answers[0]
