"""``__transaction_state`` record formats: Kafka's bytes, both value versions, round trips."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from samsa.coordinator.txn_records import (
    TransactionLogValue,
    TxnRecordFormatError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)


def test_key_is_version_0_and_a_classic_string() -> None:
    assert encode_key("tx-é") == b"\x00\x00" + b"\x00\x05" + "tx-é".encode()
    assert decode_key(encode_key("tx-é")) == "tx-é"


def test_key_of_another_version_is_refused() -> None:
    with pytest.raises(TxnRecordFormatError):
        decode_key(b"\x00\x01\x00\x01a")


def test_value_v0_bytes_match_kafkas_layout() -> None:
    value = TransactionLogValue(
        producer_id=7,
        producer_epoch=3,
        transaction_timeout_ms=60_000,
        status=1,
        partitions=(("t", (0, 2)),),
        last_update_timestamp_ms=1000,
        start_timestamp_ms=900,
    )
    expected = (
        struct.pack(">hqhib", 0, 7, 3, 60_000, 1)
        + struct.pack(">i", 1)
        + struct.pack(">h", 1)
        + b"t"
        + struct.pack(">iii", 2, 0, 2)
        + struct.pack(">qq", 1000, 900)
    )
    assert encode_value(value) == expected
    assert decode_value(expected) == value


def test_empty_transaction_has_a_null_partition_list() -> None:
    value = TransactionLogValue(5, 0, 1000, 0, None, 1, -1)
    data = encode_value(value)
    assert data[2 + 8 + 2 + 4 + 1 :][:4] == b"\xff\xff\xff\xff"
    assert decode_value(data) == value


def test_value_v1_is_flexible_with_tagged_fields() -> None:
    value = TransactionLogValue(
        producer_id=9,
        producer_epoch=0,
        transaction_timeout_ms=100,
        status=4,
        partitions=(("ab", (1,)),),
        last_update_timestamp_ms=2,
        start_timestamp_ms=1,
        previous_producer_id=8,
    )
    data = encode_value(value)
    assert data[:2] == b"\x00\x01"  # a previous producer id needs version 1
    expected = (
        struct.pack(">hqhib", 1, 9, 0, 100, 4)
        + b"\x02"  # compact array: 1 element
        + b"\x03ab"  # compact string
        + b"\x02"
        + struct.pack(">i", 1)
        + b"\x00"  # nested tagged fields
        + struct.pack(">qq", 2, 1)
        + b"\x01"  # one tagged field
        + b"\x00\x08"  # tag 0, 8 bytes
        + struct.pack(">q", 8)
    )
    assert data == expected
    assert decode_value(data) == value


def test_v1_reader_skips_unknown_tags_and_reads_all_known_ones() -> None:
    value = TransactionLogValue(1, 2, 3, 2, (), 4, 5, 6, 7, 2, 9)
    data = encode_value(value, 1)
    # Append an unknown tag 40 by rewriting the tag count (4 known -> 5).
    head, tags = data[: data.rindex(b"\x04\x00\x08")], data[data.rindex(b"\x04\x00\x08") + 1 :]
    patched = head + b"\x05" + tags + b"\x28\x02zz"
    assert decode_value(patched) == value


def test_tombstone_and_unknown_value_version() -> None:
    assert decode_value(None) is None
    with pytest.raises(TxnRecordFormatError):
        decode_value(b"\x00\x02" + b"\x00" * 30)
    with pytest.raises(TxnRecordFormatError):
        decode_value(b"\x00\x00\x00")  # truncated


def test_tagged_fields_cannot_be_written_in_v0() -> None:
    with pytest.raises(ValueError):
        encode_value(TransactionLogValue(1, 0, 1, 0, None, 0, 0, previous_producer_id=3), 0)


_partitions = st.one_of(
    st.none(),
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=20),
            st.lists(st.integers(0, 2**31 - 1), max_size=5).map(tuple),
        ),
        max_size=4,
    ).map(tuple),
)


@given(
    pid=st.integers(-1, 2**63 - 1),
    epoch=st.integers(-1, 32767),
    timeout=st.integers(0, 2**31 - 1),
    status=st.integers(0, 7),
    parts=_partitions,
    ts=st.integers(-1, 2**62),
    prev=st.integers(-1, 2**62),
    version=st.sampled_from([None, 1]),
)
def test_round_trip(
    pid: int,
    epoch: int,
    timeout: int,
    status: int,
    parts: tuple[tuple[str, tuple[int, ...]], ...] | None,
    ts: int,
    prev: int,
    version: int | None,
) -> None:
    value = TransactionLogValue(pid, epoch, timeout, status, parts, ts, ts // 2, prev)
    assert decode_value(encode_value(value, version)) == value
