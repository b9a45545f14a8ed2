"""Unit tests for samsa.log.log: append, roll, read and timestamp semantics, flush, lifecycle."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest

from samsa.log.loader import RECOVERY_POINT_FILE
from samsa.log.log import Log, LogConfig, OffsetOutOfRangeError, ReadResult
from samsa.log.producer_state import AppendOrigin
from samsa.log.snapshot import list_snapshots
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    CRC_START,
    ControlType,
    NewRecord,
    RecordBatchView,
    base_offset_prefix,
    build_batch,
    build_control_batch,
    control_type_of,
    iter_batches,
    validate_produce_batch,
)

NOW = 1_700_000_000_000


def raw_batch(
    records: int = 10,
    *,
    value_size: int = 100,
    ts: int = NOW,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
) -> bytes:
    return build_batch(
        [NewRecord(b"v" * value_size, timestamp=ts + i) for i in range(records)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


def view(raw: bytes) -> RecordBatchView:
    return validate_produce_batch(raw)


def stored(raw: bytes, base_offset: int) -> bytes:
    return base_offset_prefix(base_offset) + raw[8:]


def joined(result: ReadResult) -> bytes:
    return b"".join(result.chunks)


def offsets(result: ReadResult) -> list[int]:
    return [v.base_offset for c in result.chunks for v in iter_batches(c)]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    lg = Log.open(tmp_path / "topic-0", LogConfig(), NOW)
    yield lg
    lg.close(NOW)


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Log]:
    """Segments of ~5 batches, an index entry every ~2 batches."""
    lg = Log.open(
        tmp_path / "topic-1", LogConfig(segment_bytes=6000, index_interval_bytes=2000), NOW
    )
    yield lg
    lg.close(NOW)


def fill(lg: Log, count: int, records: int = 10, ts: int = NOW) -> list[bytes]:
    """Append batches with increasing timestamps; return them as stored."""
    out = []
    for i in range(count):
        raw = raw_batch(records, ts=ts + 100 * i)
        result = lg.append(view(raw), NOW)
        assert result.error == ErrorCode.NONE
        out.append(stored(raw, result.base_offset))
    return out


# -- append ---------------------------------------------------------------------------------------


def test_append_assigns_consecutive_offsets(log: Log) -> None:
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 0, 0)
    r1 = log.append(view(raw_batch(10)), NOW)
    r2 = log.append(view(raw_batch(3)), NOW)
    assert (r1.error, r1.base_offset, r1.last_offset, r1.log_start_offset) == (0, 0, 9, 0)
    assert (r2.base_offset, r2.last_offset, r2.log_append_time, r2.duplicate) == (10, 12, -1, False)
    assert log.log_end_offset == log.high_watermark == 13
    assert log.unflushed_messages == 13


def test_appended_bytes_are_in_the_file_before_any_flush(log: Log) -> None:
    batches = fill(log, 3)
    with open(log.directory / "00000000000000000000.log", "rb") as f:
        assert f.read() == b"".join(batches)


def test_batch_is_written_without_reencoding(log: Log) -> None:
    raw = build_batch([NewRecord(b"abc", key=b"k", headers=[("h", b"1")])], now_ms=NOW)
    log.append(view(raw), NOW)
    log.append(view(raw), NOW)
    data = joined(log.read(1, 1_000_000))
    assert data == stored(raw, 1)  # only the base offset differs
    assert RecordBatchView(data).crc_is_valid()


def test_too_large_batch_is_refused(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(max_message_bytes=500), NOW)
    try:
        result = lg.append(view(raw_batch(10)), NOW)
        assert result.error == ErrorCode.MESSAGE_TOO_LARGE
        assert lg.log_end_offset == 0
        assert lg.append(view(raw_batch(1)), NOW).error == ErrorCode.NONE
    finally:
        lg.close(NOW)


def test_idempotent_duplicates_get_their_original_offsets(log: Log) -> None:
    fill(log, 1)  # offsets 0..9, no producer
    results = [
        log.append(view(raw_batch(2, pid=7, epoch=0, seq=2 * i, ts=NOW + i)), NOW) for i in range(6)
    ]
    assert [r.base_offset for r in results] == [10, 12, 14, 16, 18, 20]
    end = log.log_end_offset
    for i in range(1, 6):  # the last five batches are retained
        dup = log.append(view(raw_batch(2, pid=7, epoch=0, seq=2 * i, ts=NOW + i)), NOW)
        assert dup.error == ErrorCode.NONE and dup.duplicate
        assert (dup.base_offset, dup.last_offset) == (10 + 2 * i, 11 + 2 * i)
        assert dup.log_append_time == NOW + i + 1  # Kafka answers with the stored timestamp
    assert log.log_end_offset == end  # nothing written
    too_old = log.append(view(raw_batch(2, pid=7, epoch=0, seq=0)), NOW)
    assert too_old.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    gap = log.append(view(raw_batch(2, pid=7, epoch=0, seq=20)), NOW)
    assert gap.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and gap.message
    assert log.log_end_offset == end
    ok = log.append(view(raw_batch(2, pid=7, epoch=0, seq=12)), NOW)
    assert (ok.error, ok.base_offset) == (ErrorCode.NONE, end)


def test_lower_epoch_is_fenced(log: Log) -> None:
    assert log.append(view(raw_batch(1, pid=3, epoch=5, seq=0)), NOW).error == ErrorCode.NONE
    result = log.append(view(raw_batch(1, pid=3, epoch=4, seq=1)), NOW)
    assert result.error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert log.log_end_offset == 1


def test_a_coordinator_append_writes_control_batches(log: Log) -> None:
    log.append(view(raw_batch(1, pid=3, epoch=0, seq=0)), NOW)
    marker = build_control_batch(
        ControlType.COMMIT, producer_id=3, producer_epoch=0, coordinator_epoch=1, now_ms=NOW
    )
    result = log.append(RecordBatchView(marker), NOW, AppendOrigin.COORDINATOR)
    assert (result.error, result.base_offset) == (ErrorCode.NONE, 1)
    (batch,) = list(iter_batches(joined(log.read(1, 10_000))))
    assert batch.is_control and control_type_of(batch) == ControlType.COMMIT


def test_only_a_client_append_is_judged_by_producer_state(log: Log) -> None:
    assert log.append(view(raw_batch(1, pid=3, epoch=5, seq=0)), NOW).error == ErrorCode.NONE
    stale = view(raw_batch(1, pid=3, epoch=4, seq=7))  # older epoch and a gap
    assert log.append(stale, NOW).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert log.log_end_offset == 1
    # A coordinator is the writer of its batches: written as they are, at the next offset.
    result = log.append(stale, NOW, AppendOrigin.COORDINATOR)
    assert (result.error, result.base_offset, log.log_end_offset) == (ErrorCode.NONE, 1, 2)


def test_expired_producers_are_forgotten(log: Log) -> None:
    log.append(view(raw_batch(1, pid=3, epoch=0, seq=0, ts=NOW)), NOW)
    log.remove_expired_producers(NOW + 1000)
    assert log.producer_state.last_entry(3) is not None
    log.remove_expired_producers(NOW + 86_400_000 + 1)
    assert log.producer_state.last_entry(3) is None
    # Unknown producer: any sequence starts it again.
    assert log.append(view(raw_batch(1, pid=3, epoch=0, seq=42)), NOW).error == ErrorCode.NONE


def test_failed_write_is_a_storage_error_and_leaves_no_trace(
    monkeypatch: pytest.MonkeyPatch, log: Log
) -> None:
    batches = fill(log, 2)

    def broken(fd: int, buffers: list[bytes]) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "writev", broken)
    result = log.append(view(raw_batch(1, pid=9, epoch=0, seq=0)), NOW)
    monkeypatch.undo()
    assert result.error == ErrorCode.KAFKA_STORAGE_ERROR
    assert log.log_end_offset == 20
    assert log.producer_state.last_entry(9) is None  # state only follows successful appends
    assert joined(log.read(0, 10**6)) == b"".join(batches)
    assert log.append(view(raw_batch(1, pid=9, epoch=0, seq=0)), NOW).base_offset == 20


# -- roll -----------------------------------------------------------------------------------------


def test_roll_by_size(small: Log) -> None:
    batches = fill(small, 23)
    size = len(batches[0])
    per_segment = 6000 // size
    segs = small.segments
    assert len(segs) == -(-23 // per_segment)
    assert [s.base_offset for s in segs] == [10 * per_segment * i for i in range(len(segs))]
    assert all(s.size <= 6000 for s in segs)
    # A snapshot of producer state at every new segment's base offset.
    assert list_snapshots(small.directory) == [s.base_offset for s in segs[1:]]


def test_batch_larger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1000), NOW)
    try:
        fill(lg, 3)  # each ~1.2 KB
        assert [s.base_offset for s in lg.segments] == [0, 10, 20]
    finally:
        lg.close(NOW)


def with_delta(raw: bytes, last_offset_delta: int) -> bytes:
    """A batch claiming ``last_offset_delta`` (CRC fixed), to reach huge offsets quickly."""
    data = bytearray(raw)
    struct.pack_into(">i", data, 23, last_offset_delta)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[CRC_START:])))
    return bytes(data)


def test_roll_before_relative_offsets_overflow(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(), NOW)
    try:
        lg.append(view(raw_batch(1)), NOW)
        big = RecordBatchView(with_delta(raw_batch(1), 2**31 - 1))
        result = lg.append(big, NOW)
        assert (result.base_offset, result.last_offset) == (1, 2**31)
        assert [s.base_offset for s in lg.segments] == [0, 1]  # 2**31 - 0 does not fit int32
        lg.append(view(raw_batch(1)), NOW)
        assert lg.log_end_offset == 2**31 + 2
        assert offsets(lg.read(2**31 - 5, 10**6)) == [1, 2**31 + 1]
    finally:
        lg.close(NOW)


# -- read -----------------------------------------------------------------------------------------


def test_read_starts_at_the_batch_containing_the_offset(log: Log) -> None:
    batches = fill(log, 5)
    for offset in range(50):
        result = log.read(offset, 1)
        assert result.chunks == [batches[offset // 10]]
        assert (result.size, result.high_watermark, result.last_stable_offset) == (
            len(batches[0]),
            50,
            50,
        )
        assert result.log_start_offset == 0


def test_read_returns_whole_batches_within_max_bytes(log: Log) -> None:
    batches = fill(log, 5)
    size = len(batches[0])
    assert joined(log.read(0, int(size * 2.5))) == b"".join(batches[:2])
    assert joined(log.read(13, 3 * size)) == b"".join(batches[1:4])
    assert joined(log.read(0, 10**9)) == b"".join(batches)
    assert log.read(0, 10**9).size == 5 * size


def test_min_one_batch(log: Log) -> None:
    batches = fill(log, 2)
    assert log.read(5, 10).chunks == [batches[0]]  # KIP-74: one whole batch even if larger
    assert log.read(5, 0).chunks == [batches[0]]
    empty = log.read(5, 10, min_one_batch=False)
    assert (empty.chunks, empty.size, empty.high_watermark) == ([], 0, 20)


def test_read_never_passes_max_offset(log: Log) -> None:
    batches = fill(log, 5)
    assert joined(log.read(0, 10**9, max_offset=30)) == b"".join(batches[:3])
    # A batch holding max_offset is left out entirely.
    assert joined(log.read(0, 10**9, max_offset=25)) == b"".join(batches[:2])
    assert log.read(20, 10**9, max_offset=25).chunks == []
    assert log.read(30, 10**9, max_offset=30).chunks == []
    assert joined(log.read(0, 10**9, max_offset=10**6)) == b"".join(batches)


def test_read_at_the_end_and_out_of_range(log: Log) -> None:
    fill(log, 2)
    at_end = log.read(20, 1000)
    assert (at_end.chunks, at_end.size, at_end.high_watermark) == ([], 0, 20)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(21, 1000)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 1000)


def test_empty_log_reads(log: Log) -> None:
    assert log.read(0, 100).chunks == []
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 100)
    assert log.offset_for_timestamp(0) is None


def test_reads_across_segments(small: Log) -> None:
    batches = fill(small, 23)
    assert len(small.segments) > 3
    size = len(batches[0])
    for offset in range(0, 230, 3):
        assert small.read(offset, 1).chunks == [batches[offset // 10]]
    everything = small.read(0, 10**9)
    assert joined(everything) == b"".join(batches)
    assert len(everything.chunks) == len(small.segments)  # one pread per segment
    # A budget ending in a later segment still yields whole batches only.
    assert joined(small.read(7, int(size * 7.5))) == b"".join(batches[0:7])
    assert joined(small.read(0, 10**9, max_offset=123)) == b"".join(batches[:12])


def test_fetch_reads_are_kafkas_byte_slices(small: Log) -> None:
    """whole_batches=False (Fetch) reads as Kafka's LogSegment.read: max_bytes exactly, the
    last batch cut; the first batch whole when min_one_batch; one segment at most; never past
    max_offset or into the next segment."""
    batches = fill(small, 23)
    size = len(batches[0])
    data = b"".join(batches)
    per_segment = [seg.size // size for seg in small.segments]  # batches of one size
    first = per_segment[0]
    cut = small.read(0, int(size * 2.5), whole_batches=False)
    assert joined(cut) == data[: int(size * 2.5)] and cut.size == int(size * 2.5)
    assert joined(small.read(13, 10, whole_batches=False)) == batches[1]  # KIP-74
    # Without min_one_batch even a batch's first bytes come, as Kafka's; none for 0 bytes.
    assert joined(small.read(13, 10, min_one_batch=False, whole_batches=False)) == data[size:][:10]
    assert small.read(13, 0, min_one_batch=False, whole_batches=False).chunks == []
    # The rest of the offset's segment, not the next one's batches (Kafka's LocalLog.read).
    rest = small.read(10, 10**9, whole_batches=False)
    assert joined(rest) == b"".join(batches[1:first])
    nxt = small.read(first * 10, 10**9, whole_batches=False)
    assert joined(nxt) == b"".join(batches[first : first + per_segment[1]])
    # max_offset (the high watermark or the last stable offset) bounds the slice.
    assert joined(small.read(0, 10**9, max_offset=25, whole_batches=False)) == data[: 2 * size]


def test_bytes_to_end_as_kafkas_delayed_fetch(small: Log) -> None:
    """The bytes a parked Fetch at an offset could read, Kafka's DelayedFetch measure: from
    the batch holding it to the end in one segment; None from an older segment or past the
    end (Kafka answers at once), 0 at the end."""
    batches = fill(small, 23)
    size = len(batches[0])
    last_base = small.segments[-1].base_offset
    assert small.bytes_to_end(230) == 0
    assert small.bytes_to_end(last_base) == small.segments[-1].size
    assert small.bytes_to_end(last_base + 5) == small.segments[-1].size  # its batch's start
    assert small.bytes_to_end(last_base + 10, max_offset=last_base + 20) == size
    assert small.bytes_to_end(0) is None  # an older segment
    assert small.bytes_to_end(0, max_offset=20) == 2 * size
    assert small.bytes_to_end(21, max_offset=20) is None  # past the end (the LSO)


def test_read_sees_appends_after_a_reopen(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=6000, index_interval_bytes=2000)
    lg = Log.open(tmp_path / "t-0", config, NOW)
    batches = fill(lg, 12)
    lg.close(NOW)
    lg = Log.open(tmp_path / "t-0", config, NOW)
    try:
        batches += fill(lg, 12)
        for offset in range(0, 240, 11):
            assert lg.read(offset, 1).chunks == [batches[offset // 10]]
        assert joined(lg.read(0, 10**9)) == b"".join(batches)
    finally:
        lg.close(NOW)


# -- timestamps -----------------------------------------------------------------------------------


def test_offset_for_timestamp(small: Log) -> None:
    fill(small, 23, ts=NOW)  # batch i: timestamps NOW + 100 i + 0..9 at offsets 10 i + 0..9
    assert small.offset_for_timestamp(0) == (0, NOW)
    assert small.offset_for_timestamp(NOW + 705) == (75, NOW + 705)
    assert small.offset_for_timestamp(NOW + 750) == (80, NOW + 800)  # first one at or after
    assert small.offset_for_timestamp(NOW + 2209) == (229, NOW + 2209)
    assert small.offset_for_timestamp(NOW + 2210) is None


def test_offset_for_timestamp_with_out_of_order_timestamps(log: Log) -> None:
    log.append(view(raw_batch(5, ts=NOW + 1000)), NOW)
    log.append(view(raw_batch(5, ts=NOW)), NOW)  # older timestamps later in the log
    log.append(view(raw_batch(5, ts=NOW + 2000)), NOW)
    assert log.offset_for_timestamp(NOW + 2) == (0, NOW + 1000)
    assert log.offset_for_timestamp(NOW + 1003) == (3, NOW + 1003)
    assert log.offset_for_timestamp(NOW + 1500) == (10, NOW + 2000)


def test_offset_for_timestamp_after_a_clean_reopen(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=6000, index_interval_bytes=2000)
    lg = Log.open(tmp_path / "t-0", config, NOW)
    fill(lg, 23)
    lg.close(NOW)
    lg = Log.open(tmp_path / "t-0", config, NOW)
    try:
        assert lg.load_report.recovered_segments == 0
        assert lg.offset_for_timestamp(NOW + 705) == (75, NOW + 705)
        assert lg.offset_for_timestamp(NOW + 2209) == (229, NOW + 2209)
    finally:
        lg.close(NOW)


# -- flush, close, delete -------------------------------------------------------------------------


def test_flush_resets_the_counter_and_advances_the_recovery_point(small: Log) -> None:
    fill(small, 3)
    assert small.unflushed_messages == 30
    small.flush()
    assert small.unflushed_messages == 0
    assert small.recovery_point == 30
    fill(small, 10)  # moves into later segments: the checkpoint file follows
    small.flush()
    text = (small.directory / RECOVERY_POINT_FILE).read_text().split()
    assert int(text[1]) == small.log_end_offset == small.recovery_point


def test_flush_from_another_thread_while_appending(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=50_000)
    lg = Log.open(tmp_path / "t-0", config, NOW)
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                lg.flush()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        batches = fill(lg, 300, records=2)
    finally:
        stop.set()
        thread.join()
    assert not errors
    lg.flush()
    assert lg.unflushed_messages == 0 and lg.recovery_point == 600
    lg.close(NOW)
    lg = Log.open(tmp_path / "t-0", config, NOW)
    try:
        assert lg.load_report.recovered_segments == 0
        assert joined(lg.read(0, 10**9)) == b"".join(batches)
    finally:
        lg.close(NOW)


def test_close_is_idempotent_and_appends_after_it_fail(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(), NOW)
    fill(lg, 1)
    lg.close(NOW)
    lg.close(NOW)
    lg.flush()
    assert lg.append(view(raw_batch(1)), NOW).error == ErrorCode.KAFKA_STORAGE_ERROR


def test_delete_removes_the_directory(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=6000), NOW)
    fill(lg, 10)
    lg.delete()
    assert not (tmp_path / "t-0").exists()
