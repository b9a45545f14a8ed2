"""Time and size retention: old segments go, the log start moves, producer state follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from samsa.log.log import Log, LogConfig, OffsetOutOfRangeError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import NewRecord, RecordBatchView, build_batch

DAY = 86_400_000
NOW = 1_800_000_000_000


def batch(ts: int, pid: int = -1, seq: int = -1, n: int = 5) -> RecordBatchView:
    return RecordBatchView(
        build_batch(
            [NewRecord(value=b"v" * 50, timestamp=ts)] * n,
            producer_id=pid,
            producer_epoch=0 if pid >= 0 else -1,
            base_sequence=seq,
        )
    )


def open_log(path: Path, **kw: int) -> Log:
    return Log.open(path, LogConfig(segment_bytes=1000, **kw), NOW)


def test_time_retention_deletes_old_segments_but_never_the_active_one(tmp_path: Path) -> None:
    log = open_log(tmp_path, retention_ms=DAY)
    for i in range(6):  # old data from producer 7, several segments
        assert log.append(batch(NOW - 3 * DAY, pid=7, seq=i * 5), NOW).error == ErrorCode.NONE
    for _ in range(6):  # fresh data, no producer id
        log.append(batch(NOW), NOW)
    segments_before = len(log.segments)
    deleted = log.apply_retention(NOW)
    assert deleted >= 1 and len(log.segments) == segments_before - deleted
    start = log.log_start_offset
    # Two ~350-byte batches fit a 1000-byte segment: the old data filled three segments.
    assert (deleted, start) == (3, 30) and log.segments[0].base_offset == 30
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 1 << 20)
    assert log.read(start, 1 << 20).size > 0
    # Every record of producer 7 is gone: it is unknown again (rule 5), any sequence goes.
    assert log.producer_state.last_entry(7) is None
    assert log.append(batch(NOW, pid=7, seq=999), NOW).error == ErrorCode.NONE
    # Ten days on, everything is old, but the active segment always stays.
    log.apply_retention(NOW + 10 * DAY)
    assert len(log.segments) == 1 and log.log_start_offset == log.segments[0].base_offset
    # The start offset survives a restart, also without a clean shutdown.
    start = log.log_start_offset
    log._close_files()
    again = open_log(tmp_path, retention_ms=DAY)
    assert again.log_start_offset == start
    assert again.read(start, 1 << 20).size > 0


def test_size_retention(tmp_path: Path) -> None:
    log = open_log(tmp_path, retention_ms=-1, retention_bytes=2500)
    for _ in range(20):
        log.append(batch(NOW), NOW)
    log.apply_retention(NOW)
    total = sum(seg.size for seg in log.segments)
    # Kafka's rule: delete while what would remain is still at least retention.bytes.
    assert total >= 2500 > total - log.segments[0].size
    assert log.log_start_offset > 0
    assert log.read(log.log_start_offset, 1 << 20).size > 0


def test_no_retention_keeps_everything(tmp_path: Path) -> None:
    log = open_log(tmp_path, retention_ms=-1)
    for _ in range(10):
        log.append(batch(NOW - 30 * DAY), NOW)
    assert log.apply_retention(NOW) == 0
    assert log.log_start_offset == 0
