"""Topic configs a Produce meets on the wire (docs/semantics.md, rule 39): min.insync.replicas
above the one replica samsa has refuses acks=all with NOT_ENOUGH_REPLICAS and appends nothing,
and leaves acks=1 and acks=0 alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.testing import fetch_request, idempotent_batch, produce_one

TIMEOUT = 15.0


@pytest.fixture
def conn(shared_broker: Any) -> Iterator[BlockingConnection]:
    with BlockingConnection("127.0.0.1", shared_broker.port) as c:
        yield c


def _create(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(TIMEOUT)


def _end(conn: BlockingConnection, topic: str) -> int:
    resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): 0}))
    return int(resp.responses[0].partitions[0].high_watermark)


def test_min_insync_replicas_refuses_acks_all(shared_broker: Any, conn: BlockingConnection) -> None:
    """Rule 39: acks=all refused, nothing appended; acks=1 and a topic at 1 unaffected."""
    _create(shared_broker.bootstrap, "misr-2", {"min.insync.replicas": "2"})
    _create(shared_broker.bootstrap, "misr-1", {"min.insync.replicas": "1"})
    assert produce_one(conn, "misr-2", 0, idempotent_batch(-1, -1, -1, 3), acks=-1)[0] == (
        ErrorCode.NOT_ENOUGH_REPLICAS
    )
    assert _end(conn, "misr-2") == 0  # nothing appended
    assert produce_one(conn, "misr-2", 0, idempotent_batch(-1, -1, -1, 3), acks=1) == (0, 0)
    assert produce_one(conn, "misr-1", 0, idempotent_batch(-1, -1, -1, 3), acks=-1) == (0, 0)
    assert _end(conn, "misr-2") == 3 and _end(conn, "misr-1") == 3
