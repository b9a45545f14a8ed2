"""The reference decoder (KeptBatches, then record by record) on crafted fetch data:
isolation levels, control batches, CRC, codecs."""

from __future__ import annotations

import pytest

from _fetch_reference import parse_fetched
from samsa.client import CorruptRecordError, TopicPartition
from samsa.protocol.constants import READ_COMMITTED
from samsa.protocol.fetched import AbortedTxn
from samsa.protocol.records import (
    Compression,
    ControlType,
    NewRecord,
    build_batch,
    build_control_batch,
)

TP = TopicPartition("t", 0)


def batch(
    base: int, values: list[bytes], *, pid: int = -1, txn: bool = False, **kw: object
) -> bytes:
    return build_batch(
        [NewRecord(value=v, key=b"k", timestamp=1000 + i) for i, v in enumerate(values)],
        base_offset=base,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
        transactional=txn,
        **kw,  # type: ignore[arg-type]
    )


def marker(base: int, pid: int, kind: int) -> bytes:
    return build_control_batch(
        kind, producer_id=pid, producer_epoch=0, coordinator_epoch=0, base_offset=base
    )


def log_with_transactions() -> tuple[bytes, list[AbortedTxn]]:
    # offsets: 0-1 plain, 2-3 txn pid 7 (aborted), 4-5 txn pid 8 (committed),
    # 6 abort marker pid 7, 7 commit marker pid 8, 8 plain, 9 txn pid 7 again (committed),
    # 10 commit marker pid 7
    data = (
        batch(0, [b"a", b"b"])
        + batch(2, [b"x1", b"x2"], pid=7, txn=True)
        + batch(4, [b"c1", b"c2"], pid=8, txn=True)
        + marker(6, 7, ControlType.ABORT)
        + marker(7, 8, ControlType.COMMIT)
        + batch(8, [b"d"])
        + batch(9, [b"y"], pid=7, txn=True)
        + marker(10, 7, ControlType.COMMIT)
    )
    return data, [AbortedTxn(7, 2)]


def values(records: list) -> list[bytes]:  # type: ignore[type-arg]
    return [r.value for r in records]


def test_read_uncommitted_returns_all_data_without_control_records() -> None:
    data, aborted = log_with_transactions()
    records, nxt = parse_fetched(TP, data, 0, aborted=aborted)
    assert values(records) == [b"a", b"b", b"x1", b"x2", b"c1", b"c2", b"d", b"y"]
    assert [r.offset for r in records] == [0, 1, 2, 3, 4, 5, 8, 9]
    assert nxt == 11


def test_read_committed_skips_aborted_transactions() -> None:
    data, aborted = log_with_transactions()
    records, nxt = parse_fetched(TP, data, 0, isolation_level=READ_COMMITTED, aborted=aborted)
    assert values(records) == [b"a", b"b", b"c1", b"c2", b"d", b"y"]
    assert nxt == 11


def test_read_committed_from_the_middle() -> None:
    data, aborted = log_with_transactions()
    records, _ = parse_fetched(TP, data, 3, isolation_level=READ_COMMITTED, aborted=aborted)
    assert values(records) == [b"c1", b"c2", b"d", b"y"]
    records, _ = parse_fetched(TP, data, 1, aborted=aborted)
    assert values(records)[0] == b"b"


def test_aborted_list_without_marker_in_range_skips_the_tail() -> None:
    data = batch(0, [b"a"]) + batch(1, [b"x"], pid=3, txn=True)
    records, nxt = parse_fetched(
        TP, data, 0, isolation_level=READ_COMMITTED, aborted=[AbortedTxn(3, 1)]
    )
    assert values(records) == [b"a"]
    assert nxt == 2


def test_non_transactional_batch_of_an_aborted_producer_is_kept() -> None:
    data = (
        batch(0, [b"x"], pid=3, txn=True)
        + marker(1, 3, ControlType.ABORT)
        + batch(2, [b"idem"], pid=3)
    )
    records, _ = parse_fetched(
        TP, data, 0, isolation_level=READ_COMMITTED, aborted=[AbortedTxn(3, 0)]
    )
    assert values(records) == [b"idem"]


def test_crc_mismatch_raises_and_can_be_disabled() -> None:
    data = bytearray(batch(0, [b"hello"]))
    data[17] ^= 0xFF  # the stored CRC itself
    with pytest.raises(CorruptRecordError):
        parse_fetched(TP, bytes(data), 0)
    records, _ = parse_fetched(TP, bytes(data), 0, check_crcs=False)
    assert len(records) == 1


def test_crc_mismatch_keeps_the_records_before_the_corrupt_batch() -> None:
    second = bytearray(batch(2, [b"c", b"d"]))
    second[-1] ^= 0x01  # a byte of the last record's value
    data = batch(0, [b"a", b"b"]) + bytes(second) + batch(4, [b"e"])
    with pytest.raises(CorruptRecordError) as info:
        parse_fetched(TP, data, 1)
    err = info.value
    assert (err.topic, err.partition, err.offset) == ("t", 0, 2)
    assert values(err.records) == [b"b"] and not err.retriable
    assert "t-0" in str(err) and "offset 2" in str(err)


@pytest.mark.parametrize(
    "codec",
    [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD],
)
def test_compressed_batches_are_decoded(codec: int) -> None:
    vals = [b"value-%d" % i * 10 for i in range(50)]
    records, nxt = parse_fetched(TP, batch(100, vals, compression=codec), 120)
    assert values(records) == vals[20:]
    assert records[0].offset == 120 and nxt == 150


def test_partial_trailing_batch_is_ignored() -> None:
    data = batch(0, [b"a"]) + batch(1, [b"b"])[:-5]
    records, nxt = parse_fetched(TP, data, 0)
    assert values(records) == [b"a"] and nxt == 1
