"""Testing tools: raw-protocol helpers and the fault-injecting Kafka proxy.

The helpers speak the wire protocol directly (no client logic), so a test can send exactly
the batch a rule is about: a retry, a gap, a stale epoch, a corrupt CRC. The proxy
(:class:`FaultProxy`, from :mod:`samsa.testing.proxy`) sits between clients and a broker and
loses responses, resets connections and delays frames.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Mapping
from typing import Any

from samsa.client import Admin, Consumer, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.client._fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchPlan,
)
from samsa.client._fetch_session import fetch_request as build_fetch_request
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing.proxy import FaultProxy, Faults, ProxyStats

__all__ = [
    "FETCH_VERSION",
    "PRODUCE_VERSION",
    "FaultProxy",
    "Faults",
    "ProxyStats",
    "add_partitions_to_txn",
    "create_topic",
    "fetch_request",
    "idempotent_batch",
    "init_producer_id",
    "produce_one",
    "produce_request",
    "read_frame",
    "read_topic",
]

PRODUCE_VERSION = 9
FETCH_VERSION = 12


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed frame from a blocking raw socket (without its prefix);
    ConnectionResetError if the broker closes the connection first."""

    def read(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionResetError("closed by the broker")
            data += chunk
        return data

    (size,) = struct.unpack(">i", read(4))
    return read(size)


def idempotent_batch(
    producer_id: int,
    epoch: int,
    base_sequence: int,
    count: int = 1,
    *,
    value: bytes = b"x",
    timestamp: int | None = None,
) -> bytes:
    # Now by default: producer expiry counts from batch timestamps, so an old timestamp
    # would make the producer expire (and lose its dedup window) at the next restart.
    ts = time.time_ns() // 1_000_000 if timestamp is None else timestamp
    return build_batch(
        [NewRecord(value=value + b"-%d" % i, timestamp=ts) for i in range(count)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
    )


def produce_request(
    partitions: Mapping[tuple[str | uuid.UUID, int], bytes],
    *,
    acks: int = -1,
    timeout_ms: int = 10_000,
    version: int = PRODUCE_VERSION,
) -> Any:
    """A Produce request; a topic given as a UUID is named by id (v13+, KIP-516)."""
    by_topic: dict[str | uuid.UUID, list[Any]] = {}
    for (topic, index), records in partitions.items():
        by_topic.setdefault(topic, []).append(
            make_request(
                ApiKey.PRODUCE, version, "PartitionProduceData", index=index, records=records
            )
        )
    return make_request(
        ApiKey.PRODUCE,
        version,
        "ProduceRequest",
        transactional_id=None,
        acks=acks,
        timeout=timeout_ms,
        topic_data=tuple(
            make_request(
                ApiKey.PRODUCE,
                version,
                "TopicProduceData",
                **({"topic_id": t} if isinstance(t, uuid.UUID) else {"name": t}),
                partition_data=tuple(p),
            )
            for t, p in by_topic.items()
        ),
    )


def fetch_request(
    partitions: dict[tuple[str, int], int],
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 * 1024 * 1024,
    partition_max_bytes: int = 10 * 1024 * 1024,
    isolation_level: int = 0,
    version: int = FETCH_VERSION,
) -> Any:
    """A sessionless Fetch (session 0, epoch -1) of ``partitions`` from their offsets, built
    by the consumer's own request builder."""
    plan = FetchPlan(
        INVALID_SESSION_ID,
        FINAL_EPOCH,
        {tp: (offset, partition_max_bytes, -1) for tp, offset in partitions.items()},
    )
    return build_fetch_request(
        version,
        plan,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
    )


def create_topic(conn: BlockingConnection, name: str, partitions: int = 1) -> int:
    """Create a topic; returns the error code (0 on success)."""
    v = 7
    req = make_request(
        ApiKey.CREATE_TOPICS,
        v,
        "CreateTopicsRequest",
        topics=(
            make_request(
                ApiKey.CREATE_TOPICS,
                v,
                "CreatableTopic",
                name=name,
                num_partitions=partitions,
                replication_factor=1,
                assignments=(),
                configs=(),
            ),
        ),
        timeout=10_000,
        validate_only=False,
    )
    resp = conn.request(ApiKey.CREATE_TOPICS, v, req)
    return int(resp.topics[0].error_code)


def init_producer_id(
    conn: BlockingConnection, transactional_id: str | None = None
) -> tuple[int, int, int]:
    """(error code, producer id, epoch)."""
    v = 4
    req = make_request(
        ApiKey.INIT_PRODUCER_ID,
        v,
        "InitProducerIdRequest",
        transactional_id=transactional_id,
        transaction_timeout=60_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    resp = conn.request(ApiKey.INIT_PRODUCER_ID, v, req)
    return int(resp.error_code), int(resp.producer_id), int(resp.producer_epoch)


def add_partitions_to_txn(
    conn: BlockingConnection,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    topic: str,
    partitions: tuple[int, ...],
) -> dict[int, int]:
    """AddPartitionsToTxn v3 (a client's call); {partition: error code}."""
    v = 3
    req = make_request(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        v,
        "AddPartitionsToTxnRequest",
        v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=producer_id,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(
            make_request(
                ApiKey.ADD_PARTITIONS_TO_TXN,
                v,
                "AddPartitionsToTxnTopic",
                name=topic,
                partitions=partitions,
            ),
        ),
    )
    resp = conn.request(ApiKey.ADD_PARTITIONS_TO_TXN, v, req)
    return {
        int(p.partition_index): int(p.partition_error_code)
        for t in resp.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def produce_one(
    conn: BlockingConnection, topic: str, partition: int, records: bytes, *, acks: int = -1
) -> tuple[int, int]:
    """Send one batch; returns (error code, base offset)."""
    resp = conn.request(
        ApiKey.PRODUCE, PRODUCE_VERSION, produce_request({(topic, partition): records}, acks=acks)
    )
    p = resp.responses[0].partition_responses[0]
    return int(p.error_code), int(p.base_offset)


def read_topic(
    bootstrap: str, topic: str, *, committed: bool = True, timeout: float = 60.0
) -> list[Any]:
    """Every record of ``topic`` up to its end as of now (read_committed by default), through
    samsa's client; TimeoutError if they do not all arrive within ``timeout`` seconds."""
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        (meta,) = admin.describe_topics([topic])
    tps = [TopicPartition(topic, p.partition) for p in meta.partitions]
    iso = "read_committed" if committed else "read_uncommitted"
    with Consumer({"bootstrap.servers": bootstrap, "isolation.level": iso}) as c:
        ends = c.list_offsets(tps, -1)
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}")
            out.extend(c.poll(0.2, 10_000))
        return out
