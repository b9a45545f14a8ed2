"""Fetch semantics over the wire: long poll, min/max bytes, several partitions; acks=0."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import iter_batches
from samsa.testing import (
    create_topic,
    fetch_request,
    idempotent_batch,
    produce_one,
    produce_request,
)

_names = iter(range(10_000))


@pytest.fixture
def conn(shared_broker) -> BlockingConnection:  # type: ignore[no-untyped-def]
    with BlockingConnection("127.0.0.1", shared_broker.port) as c:
        yield c


@pytest.fixture
def topic(conn: BlockingConnection) -> str:
    name = f"fetch-{next(_names)}"
    assert create_topic(conn, name, 3) == 0
    return name


def _fetch(conn: BlockingConnection, parts: dict[tuple[str, int], int], **kw: int):  # type: ignore[no-untyped-def]
    return conn.request(ApiKey.FETCH, 12, fetch_request(parts, **kw))


def test_long_poll_returns_when_data_arrives(
    shared_broker, conn: BlockingConnection, topic: str
) -> None:  # type: ignore[no-untyped-def]
    def produce_later() -> None:
        time.sleep(0.4)
        with BlockingConnection("127.0.0.1", shared_broker.port) as other:
            produce_one(other, topic, 1, idempotent_batch(-1, -1, -1, 3))

    t = threading.Thread(target=produce_later)
    start = time.monotonic()
    t.start()
    resp = _fetch(conn, {(topic, 0): 0, (topic, 1): 0}, max_wait_ms=10_000, min_bytes=1)
    elapsed = time.monotonic() - start
    t.join()
    parts = {p.partition_index: p for p in resp.responses[0].partitions}
    assert 0.3 < elapsed < 5
    assert [b.record_count for b in iter_batches(parts[1].records or b"")] == [3]
    assert not parts[0].records


def test_long_poll_times_out_empty(conn: BlockingConnection, topic: str) -> None:
    start = time.monotonic()
    resp = _fetch(conn, {(topic, 0): 0}, max_wait_ms=300, min_bytes=1)
    elapsed = time.monotonic() - start
    assert 0.25 < elapsed < 3
    assert not resp.responses[0].partitions[0].records


def test_min_bytes_waits_for_enough_data(
    shared_broker, conn: BlockingConnection, topic: str
) -> None:  # type: ignore[no-untyped-def]
    one = idempotent_batch(-1, -1, -1, 1)
    produce_one(conn, topic, 0, one)

    def produce_more() -> None:
        time.sleep(0.3)
        with BlockingConnection("127.0.0.1", shared_broker.port) as other:
            produce_one(other, topic, 0, idempotent_batch(-1, -1, -1, 1))

    t = threading.Thread(target=produce_more)
    t.start()
    start = time.monotonic()
    resp = _fetch(conn, {(topic, 0): 0}, max_wait_ms=10_000, min_bytes=len(one) + 1)
    t.join()
    assert 0.2 < time.monotonic() - start < 5
    assert len(list(iter_batches(resp.responses[0].partitions[0].records or b""))) == 2


def test_size_limits(conn: BlockingConnection, topic: str) -> None:
    """The limits cut a partition's bytes where Kafka's LogSegment.read does: at
    partition_max_bytes or what is left of max_bytes, inside a batch if need be (clients drop
    a partial last batch)."""
    batch = idempotent_batch(-1, -1, -1, 10, value=b"v" * 100)
    for _ in range(5):
        produce_one(conn, topic, 0, batch)
        produce_one(conn, topic, 2, batch)
    small = idempotent_batch(-1, -1, -1, 1)
    produce_one(conn, topic, 1, small)
    size = len(batch)
    # partition_max_bytes: that many bytes, the second batch cut 10 bytes in.
    resp = _fetch(conn, {(topic, 0): 0}, partition_max_bytes=size * 2 + 10)
    records = resp.responses[0].partitions[0].records
    assert len(records) == size * 2 + 10
    assert [b.record_count for b in iter_batches(records)] == [10, 10]
    # Too small for one batch: the first batch still comes whole (KIP-74) ...
    resp = _fetch(conn, {(topic, 0): 0}, partition_max_bytes=10)
    assert len(resp.responses[0].partitions[0].records) == size
    # ... but only for the first partition with data; max_bytes bounds the response.
    resp = _fetch(conn, {(topic, 0): 0, (topic, 2): 0}, max_bytes=size + 10)
    parts = {p.partition_index: p for p in resp.responses[0].partitions}
    assert len(parts[0].records) == size + 10 and not parts[2].records
    # The cut batch's bytes count against max_bytes: the later partition's small batch, which
    # would fit beside the whole batches alone, does not come.
    assert len(small) < size // 2
    resp = _fetch(conn, {(topic, 0): 0, (topic, 1): 0}, max_bytes=size + size // 2)
    parts = {p.partition_index: p for p in resp.responses[0].partitions}
    assert len(parts[0].records) == size + size // 2 and not parts[1].records
    # Fetching from inside a batch returns that whole batch (the client skips earlier records).
    resp = _fetch(conn, {(topic, 2): 15})
    first = next(iter_batches(resp.responses[0].partitions[0].records))
    assert first.base_offset == 10
    assert int(resp.responses[0].partitions[0].high_watermark) == 50


def test_min_bytes_counts_a_cut_batch(conn: BlockingConnection, topic: str) -> None:
    """min_bytes is met by the bytes answered, a cut last batch's included (Kafka's
    bytesReadable): with that many bytes there the answer comes at once, not at max_wait."""
    batch = idempotent_batch(-1, -1, -1, 10, value=b"v" * 100)
    produce_one(conn, topic, 0, batch)
    produce_one(conn, topic, 0, batch)
    want = len(batch) + 100
    start = time.monotonic()
    resp = _fetch(
        conn, {(topic, 0): 0}, partition_max_bytes=want, min_bytes=want, max_wait_ms=10_000
    )
    assert time.monotonic() - start < 5
    assert len(resp.responses[0].partitions[0].records) == want


def test_min_bytes_is_measured_as_kafkas_delayed_fetch(
    conn: BlockingConnection, topic: str
) -> None:
    """A Fetch short of min_bytes is answered at once when the bytes up to the partitions'
    ends, each counted up to partition_max_bytes but not max_bytes, reach min_bytes (Kafka's
    DelayedFetch.tryComplete runs as the request is parked)."""
    batch = idempotent_batch(-1, -1, -1, 10, value=b"v" * 100)
    produce_one(conn, topic, 0, batch)
    produce_one(conn, topic, 0, batch)
    size = len(batch)
    start = time.monotonic()
    resp = _fetch(conn, {(topic, 0): 0}, max_bytes=size, min_bytes=2 * size, max_wait_ms=10_000)
    assert time.monotonic() - start < 5
    assert len(resp.responses[0].partitions[0].records) == size
    # Counted up to partition_max_bytes: short of min_bytes, it waits for max_wait.
    start = time.monotonic()
    resp = _fetch(
        conn, {(topic, 0): 0}, partition_max_bytes=size, min_bytes=2 * size, max_wait_ms=300
    )
    assert 0.25 < time.monotonic() - start < 5
    assert len(resp.responses[0].partitions[0].records) == size


def test_offset_out_of_range(conn: BlockingConnection, topic: str) -> None:
    produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1, 2))
    resp = _fetch(conn, {(topic, 0): 3})
    assert int(resp.responses[0].partitions[0].error_code) == 1  # OFFSET_OUT_OF_RANGE
    resp = _fetch(conn, {(topic, 0): 2})  # the log end: empty, no error
    assert int(resp.responses[0].partitions[0].error_code) == 0


def test_acks_zero_sends_no_response_but_writes(conn: BlockingConnection, topic: str) -> None:
    conn.send(
        ApiKey.PRODUCE, 9, produce_request({(topic, 0): idempotent_batch(-1, -1, -1, 4)}, acks=0)
    )
    # The next response on the connection is the fetch's: receive() checks correlation ids.
    resp = _fetch(conn, {(topic, 0): 0})
    assert int(resp.responses[0].partitions[0].high_watermark) == 4


def _topic_id(conn: BlockingConnection, topic: str) -> uuid.UUID:
    req = make_request(
        ApiKey.METADATA,
        13,
        "MetadataRequest",
        topics=(
            make_request(ApiKey.METADATA, 13, "MetadataRequestTopic", topic_id=None, name=topic),
        ),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    resp = conn.request(ApiKey.METADATA, 13, req)
    assert int(resp.error_code) == 0
    return resp.topics[0].topic_id


def _fetch_by_id(conn: BlockingConnection, version: int, topic_id: uuid.UUID, offset: int):  # type: ignore[no-untyped-def]
    part = make_request(
        ApiKey.FETCH,
        version,
        "FetchPartition",
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=offset,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    req = make_request(
        ApiKey.FETCH,
        version,
        "FetchRequest",
        cluster_id=None,
        replica_id=-1,
        max_wait=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            make_request(
                ApiKey.FETCH, version, "FetchTopic", topic_id=topic_id, partitions=(part,)
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    return conn.request(ApiKey.FETCH, version, req)


@pytest.mark.parametrize("version", [13, 15, 16])
def test_fetch_by_topic_id(conn: BlockingConnection, topic: str, version: int) -> None:
    produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1, 3))
    topic_id = _topic_id(conn, topic)
    resp = _fetch_by_id(conn, version, topic_id, 1)
    assert resp.responses[0].topic_id == topic_id
    part = resp.responses[0].partitions[0]
    assert int(part.error_code) == 0 and int(part.high_watermark) == 3
    assert [b.base_offset for b in iter_batches(part.records)] == [0]
    unknown = _fetch_by_id(conn, version, uuid.uuid4(), 0)
    assert int(unknown.responses[0].partitions[0].error_code) == 100  # UNKNOWN_TOPIC_ID
