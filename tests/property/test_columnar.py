"""The columnar codec against the per-record paths, on arbitrary input.

* encoder: for arbitrary keys, values, nulls, headers, timestamps, codecs and producer
  fields, every batch is byte for byte what ``build_batch`` makes of the same rows (so it
  decodes like it), kio reads the uncompressed ones, and confluent-kafka reads back the
  same records after the batches are produced raw to a samsa broker;
* murmur2: the vectorised hash and partition equal the per-record ones;
* decoder: on arbitrary logs of plain, transactional (committed, aborted, open), control,
  compacted (offset gaps inside a batch), LogAppendTime and compressed batches, with a
  partial batch at the end, the Arrow batch equals the reference ``parse_fetched`` (tests/) turned
  into Arrow by the Spark source's ``to_arrow``, and the next position is the same;
* corrupt bytes never escape as anything but :class:`InvalidBatchError`.
"""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import TopicPartition as CkTP
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch

from _fetch_reference import parse_fetched
from samsa.client import Admin, TopicPartition, murmur2, partition_for_key
from samsa.client._connection import BlockingConnection
from samsa.protocol.columnar import (
    HEADERS_TYPE,
    decode_fetched,
    encode_batches,
    encode_sections,
    murmur2_array,
    partitions_for_keys,
)
from samsa.protocol.constants import READ_COMMITTED
from samsa.protocol.fetched import AbortedTxn
from samsa.protocol.records import (
    CONTROL_FLAG,
    CRC_START,
    HEADER_SIZE,
    TIMESTAMP_TYPE_FLAG,
    TRANSACTIONAL_FLAG,
    ControlType,
    InvalidBatchError,
    NewRecord,
    build_batch,
    compress,
    encode_record,
)
from samsa.spark._read import to_arrow
from samsa.testing import produce_one

NOW = 1_700_000_000_000

blob = st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=8))
header = st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=8)))
row = st.tuples(blob, blob, st.lists(header, max_size=3), st.integers(0, 2**42))
codec = st.sampled_from([0, 1, 2, 3, 4])
# confluent-kafka's Python binding cuts header names at a NUL (C strings): not ours to test
ck_header = st.tuples(
    st.text(st.characters(blacklist_characters="\x00"), max_size=6),
    st.one_of(st.none(), st.binary(max_size=8)),
)
ck_row = st.tuples(blob, blob, st.lists(ck_header, max_size=3), st.integers(0, 2**42))


def as_bytes(v: bytes | str | None) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


def columns(rows: list[Any], form: str) -> dict[str, Any]:
    """The rows as encode_batches arguments: Python lists, or Arrow arrays (sliced)."""
    values = [r[0] for r in rows]
    keys = [r[1] for r in rows]
    headers = [r[2] for r in rows]
    ts = [r[3] for r in rows]
    if form == "lists":
        return {"values": values, "keys": keys, "headers": headers, "timestamps": ts}
    pad = [b"pad"]
    return {
        "values": pa.array(pad + [as_bytes(v) for v in values], pa.binary()).slice(1),
        "keys": pa.array(pad + [as_bytes(k) for k in keys], pa.large_binary()).slice(1),
        "headers": pa.array([[], *headers], HEADERS_TYPE).slice(1),
        "timestamps": pa.array(ts, pa.int64()),
    }


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(row, max_size=60),
    codec=codec,
    producer=st.sampled_from([(-1, -1, -1), (42, 3, 0), (7, 0, 2**31 - 5)]),
    transactional=st.booleans(),
    max_batch_bytes=st.integers(62, 3000),
    form=st.sampled_from(["lists", "arrow"]),
)
def test_encoder_is_build_batch_row_for_row(
    rows: list[Any],
    codec: int,
    producer: tuple[int, int, int],
    transactional: bool,
    max_batch_bytes: int,
    form: str,
) -> None:
    pid, epoch, seq = producer
    batches = encode_batches(
        **columns(rows, form),
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=transactional and pid >= 0,
        compression=codec,
        max_batch_bytes=max_batch_bytes,
    )
    records = [NewRecord(as_bytes(v), as_bytes(k), t, h) for v, k, h, t in rows]
    assert [(b.first, b.count) for b in batches] == _runs(batches, len(rows))
    # the producer's path: the same sections and timestamps, the header left to the sender
    sections = encode_sections(
        **columns(rows, form), compression=codec, max_batch_bytes=max_batch_bytes
    )
    assert [(s.first, s.count) for s in sections] == [(b.first, b.count) for b in batches]
    for s, b in zip(sections, batches, strict=True):
        assert bytes(s.section) == b.data[HEADER_SIZE:]
        assert (s.first_timestamp, s.max_timestamp) == struct.unpack_from(">qq", b.data, 27)
    for b in batches:
        part = records[b.first : b.first + b.count]
        plain = build_batch(part, producer_id=pid, producer_epoch=epoch, base_sequence=-1)
        assert b.count == 1 or len(plain) <= max_batch_bytes
        expected_seq = (seq + b.first) % 2**31 if seq >= 0 else -1
        assert b.base_sequence == expected_seq
        assert b.data == build_batch(
            part,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=expected_seq,
            transactional=transactional and pid >= 0,
            compression=codec,
        )
        if codec == 0:
            kio_batch, size = read_batch(b.data, 0)  # kio checks CRC and lengths itself
            assert size == len(b.data)
            assert [(r.key, r.value) for r in kio_batch.records] == [(r.key, r.value) for r in part]
            assert [[(h.key, h.value) for h in r.headers] for r in kio_batch.records] == [
                [(k.encode(), v) for k, v in r.headers] for r in part
            ]


def _runs(batches: list[Any], n: int) -> list[tuple[int, int]]:
    """The batches must cover the rows in order, without gap or overlap."""
    runs, at = [], 0
    for b in batches:
        runs.append((at, b.count))
        at += b.count
    assert at == n
    return runs


@given(st.lists(st.one_of(st.none(), st.binary(max_size=70)), max_size=50), st.integers(1, 50))
def test_murmur2_column_is_the_per_record_hash(keys: list[bytes | None], n: int) -> None:
    assert list(murmur2_array(keys)) == [murmur2(k or b"") for k in keys]
    assert list(partitions_for_keys(keys, n)) == [
        -1 if k is None else partition_for_key(k, n) for k in keys
    ]


# --- arbitrary logs for the decoder --------------------------------------------------------


def raw_batch(
    records: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    *,
    base_offset: int,
    last_delta: int,
    base_ts: int,
    max_ts: int,
    pid: int = -1,
    attributes: int = 0,
) -> bytes:
    """A v2 batch from (offset delta, timestamp delta, key, value, headers) records: offset
    deltas may leave gaps, as compaction does (build_batch cannot make those)."""
    body = b"".join(encode_record(o, t, k, v, h) for o, t, k, v, h in records)
    body = compress(attributes & 0x07, body)
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            last_delta,
            base_ts,
            max_ts,
            pid,
            0 if pid >= 0 else -1,
            0 if pid >= 0 else -1,
            len(records),
        )
        + body
    )
    head = struct.pack(">qiibI", base_offset, len(after_crc) + 9, 0, 2, crc32c.crc32c(after_crc))
    return head + after_crc


@st.composite
def logs(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int]], int]:
    """(fetched bytes, aborted transactions, end offset) of an arbitrary partition log."""
    out = bytearray()
    offset = 0
    open_txn: dict[int, int] = {}  # producer id -> first offset of its open transaction
    aborted: list[tuple[int, int]] = []
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["plain", "txn", "txn", "end"]))
        pid = draw(st.integers(1, 3))
        if kind == "end":
            if not open_txn:
                continue
            pid = draw(st.sampled_from(sorted(open_txn)))
            commit = draw(st.booleans())
            marker = ControlType.COMMIT if commit else ControlType.ABORT
            key = struct.pack(">hh", 0, marker)
            out += raw_batch(
                [(0, 0, key, struct.pack(">hi", 0, 0), [])],
                base_offset=offset,
                last_delta=0,
                base_ts=NOW,
                max_ts=NOW,
                pid=pid,
                attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
            )
            first = open_txn.pop(pid)
            if not commit:
                aborted.append((pid, first))
            offset += 1
            continue
        rows = draw(st.lists(row, min_size=1, max_size=12))
        gaps = draw(st.lists(st.integers(0, 3), min_size=len(rows), max_size=len(rows)))
        deltas, d = [], 0
        for g, _r in zip(gaps, rows, strict=True):
            d += g if draw(st.booleans()) else 0  # compaction removed some records
            deltas.append(d)
            d += 1
        last_delta = deltas[-1] + draw(st.sampled_from([0, 0, 2]))  # compacted tail too
        base_ts = rows[0][3]
        records = [
            (o, t - base_ts, as_bytes(k), as_bytes(v), h)
            for o, (v, k, h, t) in zip(deltas, rows, strict=True)
        ]
        attributes = draw(codec)
        max_ts = max(r[3] for r in rows)
        if draw(st.integers(0, 4)) == 0:
            attributes |= TIMESTAMP_TYPE_FLAG  # LogAppendTime: the broker's clock for all
            max_ts = NOW + offset
        if kind == "txn":
            attributes |= TRANSACTIONAL_FLAG
            open_txn.setdefault(pid, offset)
        out += raw_batch(
            records,
            base_offset=offset,
            last_delta=last_delta,
            base_ts=base_ts,
            max_ts=max_ts,
            pid=pid if kind == "txn" else -1,
            attributes=attributes,
        )
        offset += last_delta + 1
    end = offset
    if draw(st.booleans()):  # the start of one more batch: a fetch cut by its size limit
        tail = raw_batch(
            [(0, 0, None, b"cut", [])], base_offset=offset, last_delta=0, base_ts=NOW, max_ts=NOW
        )
        out += tail[: draw(st.integers(1, len(tail) - 1))]
    return bytes(out), aborted, end


@settings(max_examples=300, deadline=None)
@given(
    log=logs(),
    start=st.integers(0, 60),
    committed=st.booleans(),
    include_headers=st.booleans(),
    max_records=st.one_of(st.none(), st.integers(1, 20)),
    as_objects=st.booleans(),
)
def test_decoder_equals_the_per_record_decoder(
    log: tuple[bytes, list[tuple[int, int]], int],
    start: int,
    committed: bool,
    include_headers: bool,
    max_records: int | None,
    as_objects: bool,
) -> None:
    data, aborted, end = log
    position = min(start, end)
    isolation = READ_COMMITTED if committed else 0
    records, next_offset = parse_fetched(
        TopicPartition("topic", 5),
        data,
        position,
        isolation_level=isolation,
        aborted=[AbortedTxn(pid, first) for pid, first in aborted],
    )
    if max_records is not None and len(records) > max_records:
        records = records[:max_records]
        next_offset = records[-1].offset + 1
    got = decode_fetched(
        data,
        "topic",
        5,
        position,
        isolation_level=isolation,
        aborted=[AbortedTxn(p, f) for p, f in aborted] if as_objects else aborted,
        include_headers=include_headers,
        max_records=max_records,
    )
    expected = to_arrow(records, include_headers)
    assert got.batch.equals(expected), (got.batch.to_pylist(), expected.to_pylist())
    assert got.next_offset == next_offset


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(row, min_size=1, max_size=20),
    codec=codec,
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
    fix_crc=st.booleans(),
)
def test_corrupt_bytes_give_a_clear_error(
    rows: list[Any], codec: int, flips: list[tuple[int, int]], fix_crc: bool
) -> None:
    batches = encode_batches(**columns(rows, "lists"), compression=codec)
    data = bytearray(b"".join(b.data for b in batches))
    for at, xor in flips:
        data[at % len(data)] ^= xor
    if fix_crc:  # corrupt records inside an intact-looking batch
        struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[CRC_START : len(data)])))
    try:
        got = decode_fetched(bytes(data), "t", 0, 0, include_headers=True)
    except InvalidBatchError:
        return
    assert got.batch.num_rows <= len(rows)


# --- confluent-kafka reads what the encoder wrote --------------------------------------------


@pytest.fixture(scope="module")
def samsa_port(shared_broker: Any) -> int:
    return int(shared_broker.port)


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(ck_row, min_size=1, max_size=30),
    codec=codec,
    max_batch_bytes=st.sampled_from([200, 100_000]),
)
def test_confluent_kafka_reads_the_encoded_batches(
    samsa_port: int, rows: list[Any], codec: int, max_batch_bytes: int
) -> None:
    bootstrap = f"127.0.0.1:{samsa_port}"
    topic = f"columnar-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, 1)
    now = int(time.time() * 1000)  # within the last day: retention works on timestamps
    rows = [(v, k, h, now - t % 86_400_000) for v, k, h, t in rows]
    batches = encode_batches(
        **columns(rows, "lists"), compression=codec, max_batch_bytes=max_batch_bytes
    )
    with BlockingConnection("127.0.0.1", samsa_port) as conn:
        for b in batches:  # Produce v3+: one batch per partition and request
            code, _ = produce_one(conn, topic, 0, b.data)
            assert code == 0
    consumer = CkConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "enable.auto.commit": False,
        }
    )
    got: list[Any] = []
    try:
        consumer.assign([CkTP(topic, 0, 0)])
        deadline = time.monotonic() + 20
        while len(got) < len(rows) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg)
    finally:
        consumer.close()
    assert [(m.offset(), m.key(), m.value(), m.timestamp()) for m in got] == [
        (i, as_bytes(k), as_bytes(v), (1, t)) for i, (v, k, _h, t) in enumerate(rows)
    ]
    assert [list(m.headers() or []) for m in got] == [list(h) for _v, _k, h, _t in rows]
