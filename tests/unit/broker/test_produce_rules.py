"""Raw-protocol tests of the idempotence rules (docs/semantics.md, rules 1-8), one per rule."""

from __future__ import annotations

import dataclasses

import pytest

from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import NewRecord, build_batch, build_control_batch, iter_batches
from samsa.testing import (
    PRODUCE_VERSION,
    create_topic,
    fetch_request,
    idempotent_batch,
    init_producer_id,
    produce_one,
    produce_request,
)


@pytest.fixture
def conn(shared_broker) -> BlockingConnection:  # type: ignore[no-untyped-def]
    with BlockingConnection("127.0.0.1", shared_broker.port) as c:
        yield c


_topics = iter(range(10_000))


@pytest.fixture
def topic(conn: BlockingConnection) -> str:
    name = f"rules-{next(_topics)}"
    assert create_topic(conn, name, 2) == 0
    return name


def fetch_offsets(
    conn: BlockingConnection, topic: str, partition: int = 0
) -> list[tuple[int, int, int]]:
    """(base offset, producer id, base sequence) of every batch in the partition."""
    resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, partition): 0}))
    records = resp.responses[0].partitions[0].records or b""
    return [(b.base_offset, b.producer_id, b.base_sequence) for b in iter_batches(records)]


def test_in_sequence_batches_get_consecutive_offsets(conn: BlockingConnection, topic: str) -> None:
    code, pid, epoch = init_producer_id(conn)
    assert (code, epoch) == (0, 0)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, 0, 3)) == (0, 0)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, 3, 2)) == (0, 3)
    assert fetch_offsets(conn, topic) == [(0, pid, 0), (3, pid, 3)]


def test_duplicate_in_window_answers_original_offset_and_writes_nothing(
    conn: BlockingConnection, topic: str
) -> None:
    _, pid, _ = init_producer_id(conn)
    offsets = [produce_one(conn, topic, 0, idempotent_batch(pid, 0, i * 2, 2))[1] for i in range(5)]
    assert offsets == [0, 2, 4, 6, 8]
    for i in range(5):  # every batch of the 5-batch window is recognised
        assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, i * 2, 2)) == (0, offsets[i])
    assert len(fetch_offsets(conn, topic)) == 5


def test_duplicate_older_than_window_is_out_of_order(conn: BlockingConnection, topic: str) -> None:
    _, pid, _ = init_producer_id(conn)
    for seq in range(6):
        assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, seq))[0] == 0
    code, _ = produce_one(conn, topic, 0, idempotent_batch(pid, 0, 0))
    assert code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert len(fetch_offsets(conn, topic)) == 6


def test_sequence_gap_is_refused(conn: BlockingConnection, topic: str) -> None:
    _, pid, _ = init_producer_id(conn)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, 0))[0] == 0
    assert (
        produce_one(conn, topic, 0, idempotent_batch(pid, 0, 2))[0]
        == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    assert len(fetch_offsets(conn, topic)) == 1


def test_lower_epoch_is_fenced(conn: BlockingConnection, topic: str) -> None:
    _, pid, _ = init_producer_id(conn)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 1, 0))[0] == 0
    assert (
        produce_one(conn, topic, 0, idempotent_batch(pid, 0, 1))[0]
        == ErrorCode.INVALID_PRODUCER_EPOCH
    )


def test_higher_epoch_must_start_at_zero(conn: BlockingConnection, topic: str) -> None:
    _, pid, _ = init_producer_id(conn)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, 0, 5))[0] == 0
    code, _ = produce_one(conn, topic, 0, idempotent_batch(pid, 1, 5))
    assert code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 1, 0)) == (0, 5)  # KIP-360 bump


def test_unknown_producer_accepted_with_any_sequence(conn: BlockingConnection, topic: str) -> None:
    # A producer id the partition has no state for (new, expired, or retention removed it).
    _, pid, _ = init_producer_id(conn)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 3, 1234)) == (0, 0)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 3, 1235)) == (0, 1)


def test_sequence_wraps_around(conn: BlockingConnection, topic: str) -> None:
    _, pid, _ = init_producer_id(conn)
    top = 2**31 - 1
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, top - 1, 2)) == (0, 0)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, 0, 1)) == (0, 2)
    # Resends on both sides of the wrap are duplicates: original offsets, nothing written.
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, 0, 1)) == (0, 2)
    assert produce_one(conn, topic, 0, idempotent_batch(pid, 0, top - 1, 2)) == (0, 0)
    assert fetch_offsets(conn, topic) == [(0, pid, top - 1), (2, pid, 0)]


def test_bad_crc_is_corrupt_message(conn: BlockingConnection, topic: str) -> None:
    batch = bytearray(idempotent_batch(1, 0, 0))
    batch[-1] ^= 0xFF
    assert produce_one(conn, topic, 0, bytes(batch))[0] == ErrorCode.CORRUPT_MESSAGE
    assert fetch_offsets(conn, topic) == []


def test_malformed_produce_is_invalid_record(conn: BlockingConnection, topic: str) -> None:
    two = idempotent_batch(1, 0, 0) + idempotent_batch(1, 0, 1)
    assert produce_one(conn, topic, 0, two)[0] == ErrorCode.INVALID_RECORD
    control = build_control_batch(1, producer_id=1, producer_epoch=0, coordinator_epoch=0)
    # A control batch is transactional: without a transactional id the whole request is
    # refused before any batch is looked at, as by Kafka; with one, the batch is invalid.
    assert (
        produce_one(conn, topic, 0, control)[0] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    req = dataclasses.replace(produce_request({(topic, 0): control}), transactional_id="x")
    resp = conn.request(ApiKey.PRODUCE, PRODUCE_VERSION, req)
    assert resp.responses[0].partition_responses[0].error_code == ErrorCode.INVALID_RECORD
    no_seq = build_batch([NewRecord(value=b"v")], producer_id=5, producer_epoch=0, base_sequence=-1)
    assert produce_one(conn, topic, 0, no_seq)[0] == ErrorCode.INVALID_RECORD
    assert fetch_offsets(conn, topic) == []


def test_partitions_of_one_request_are_independent(conn: BlockingConnection, topic: str) -> None:
    _, pid, _ = init_producer_id(conn)
    req = produce_request(
        {(topic, 0): idempotent_batch(pid, 0, 7), (topic, 1): idempotent_batch(pid, 0, 0)}
    )
    conn.request(ApiKey.PRODUCE, 9, req)
    gap = produce_request(
        {(topic, 0): idempotent_batch(pid, 0, 9), (topic, 1): idempotent_batch(pid, 0, 1)}
    )
    resp = conn.request(ApiKey.PRODUCE, 9, gap)
    codes = {p.index: int(p.error_code) for p in resp.responses[0].partition_responses}
    assert codes == {0: ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, 1: 0}


def test_every_produce_version_round_trips(conn: BlockingConnection, topic: str) -> None:
    for v in range(3, 12):
        resp = conn.request(
            ApiKey.PRODUCE,
            v,
            produce_request({(topic, 1): idempotent_batch(-1, -1, -1)}, version=v),
        )
        assert int(resp.responses[0].partition_responses[0].error_code) == 0
        assert int(resp.responses[0].partition_responses[0].base_offset) == v - 3


def test_init_producer_id_gives_fresh_ids_and_bumps_transactional_epochs(
    conn: BlockingConnection,
) -> None:
    ids = {init_producer_id(conn)[1] for _ in range(5)}
    assert len(ids) == 5
    # A transactional id keeps its producer id; each InitProducerId bumps the epoch (rule 10).
    code, pid, epoch = init_producer_id(conn, "txn-1")
    assert code == 0 and pid not in ids
    assert init_producer_id(conn, "txn-1") == (0, pid, epoch + 1)
