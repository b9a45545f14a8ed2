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
