from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.records.readers import read_batch

from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    Compression,
    ControlType,
    InvalidBatchError,
    NewRecord,
    RecordBatchView,
    build_batch,
    build_control_batch,
    control_type_of,
    decode_records,
    scan_batches,
    set_base_offset,
    validate_produce_batch,
)

records_st = st.lists(
    st.builds(
        NewRecord,
        value=st.one_of(st.none(), st.binary(max_size=64)),
        key=st.one_of(st.none(), st.binary(max_size=16)),
        timestamp=st.integers(0, 2**40),
        headers=st.lists(
            st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
        ),
    ),
    min_size=1,
    max_size=20,
)


@given(records_st, st.sampled_from([0, 1, 2, 3, 4]))
def test_build_then_decode_round_trips(records: list[NewRecord], codec: int) -> None:
    data = build_batch(
        records, producer_id=9, producer_epoch=1, base_sequence=100, compression=codec
    )
    view = validate_produce_batch(data)
    assert view.record_count == len(records)
    assert view.compression == codec
    decoded = decode_records(view)
    assert [(r.key, r.value, r.timestamp) for r in decoded] == [
        (r.key, r.value, r.timestamp) for r in records
    ]
    assert [list(r.headers) for r in decoded] == [list(r.headers) for r in records]


def test_uncompressed_batches_agree_with_kio_reader() -> None:
    data = build_batch(
        [NewRecord(value=b"v%d" % i, key=b"k") for i in range(4)],
        producer_id=3,
        producer_epoch=0,
        base_sequence=7,
        now_ms=1_700_000_000_000,
    )
    kio_batch, size = read_batch(data, 0)  # kio checks the CRC and the length itself
    assert size == len(data)
    view = RecordBatchView(data)
    assert (kio_batch.producer_id, kio_batch.base_sequence, kio_batch.last_offset_delta) == (
        3,
        7,
        3,
    )
    assert view.crc == kio_batch.crc and view.last_sequence == 10


def test_base_offset_rewrite_keeps_crc_valid() -> None:
    data = bytearray(build_batch([NewRecord(value=b"x")] * 3))
    set_base_offset(data, 0, 12345)
    view = RecordBatchView(data)
    assert view.base_offset == 12345 and view.crc_is_valid() and view.last_offset == 12347


def test_sequence_wraps() -> None:
    view = RecordBatchView(
        build_batch(
            [NewRecord(value=b"x")] * 3, producer_id=1, producer_epoch=0, base_sequence=2**31 - 2
        )
    )
    assert view.last_sequence == 0


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda b: b[:-1], ErrorCode.CORRUPT_MESSAGE),
        (lambda b: b[:30], ErrorCode.CORRUPT_MESSAGE),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), ErrorCode.CORRUPT_MESSAGE),
        (lambda b: b + b, ErrorCode.INVALID_RECORD),
        (lambda b: b[:16] + b"\x01" + b[17:], ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT),
    ],
)
def test_invalid_batches(mutate, code: ErrorCode) -> None:  # type: ignore[no-untyped-def]
    data = build_batch(
        [NewRecord(value=b"hello")], producer_id=1, producer_epoch=0, base_sequence=0
    )
    with pytest.raises(InvalidBatchError) as err:
        validate_produce_batch(mutate(data))
    assert err.value.code == code


def test_control_batches() -> None:
    data = build_control_batch(
        ControlType.COMMIT, producer_id=4, producer_epoch=2, coordinator_epoch=0
    )
    view = RecordBatchView(data)
    assert view.is_control and view.is_transactional and view.base_sequence == -1
    assert control_type_of(view) == ControlType.COMMIT
    with pytest.raises(InvalidBatchError):
        validate_produce_batch(data)


def test_scan_stops_at_torn_or_corrupt_tail() -> None:
    a = bytearray(build_batch([NewRecord(value=b"a")] * 2))
    b = bytearray(build_batch([NewRecord(value=b"b")]))
    set_base_offset(b, 0, 2)
    good = bytes(a + b)
    assert scan_batches(good).valid_bytes == len(good)
    torn = scan_batches(good + bytes(b[:20]))
    assert torn.valid_bytes == len(good) and "torn" in (torn.problem or "")
    flipped = bytearray(good)
    flipped[-3] ^= 0x40
    result = scan_batches(bytes(flipped))
    assert result.valid_bytes == len(a) and "CRC" in (result.problem or "")
    garbage = scan_batches(good + b"\xde\xad" * 100)
    assert garbage.valid_bytes == len(good)
    assert scan_batches(good + bytes(200)).valid_bytes == len(good)


def test_codecs_compress() -> None:
    records = [NewRecord(value=b"a" * 1000)] * 10
    plain = len(build_batch(records))
    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        assert len(build_batch(records, compression=codec)) < plain / 5
