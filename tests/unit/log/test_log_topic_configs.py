"""The log side of topic configs (docs/semantics.md, rules 28-31): segment.ms rolls,
LogAppendTime stamps batches, a new config applies at the next append, and DeleteRecords moves
the log start offset durably."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from samsa.log.log import LOG_START_OFFSET_FILE, Log, LogConfig, OffsetOutOfRangeError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    TIMESTAMP_TYPE_FLAG,
    NewRecord,
    RecordBatchView,
    build_batch,
    iter_batches,
)

NOW = 1_800_000_000_000
HOUR = 3_600_000


def batch(ts: int, n: int = 3, pid: int = -1, seq: int = -1) -> RecordBatchView:
    return RecordBatchView(
        build_batch(
            [NewRecord(value=b"v" * 20, key=b"k", timestamp=ts)] * n,
            producer_id=pid,
            producer_epoch=0 if pid >= 0 else -1,
            base_sequence=seq,
        )
    )


def stored(log: Log) -> list[RecordBatchView]:
    data = b"".join(
        c if isinstance(c, bytes) else c.read()
        for c in log.read(log.log_start_offset, 1 << 20).chunks
    )
    return list(iter_batches(data))


def test_segment_ms_rolls_when_the_first_batch_is_older_than_it(tmp_path: Path) -> None:
    log = Log.open(tmp_path, LogConfig(segment_ms=HOUR), NOW)
    log.append(batch(NOW), NOW)
    log.append(batch(NOW + HOUR), NOW + HOUR)  # exactly segment.ms later: no roll yet
    assert len(log.segments) == 1
    log.append(batch(NOW + HOUR + 1), NOW + HOUR + 1)
    assert [s.base_offset for s in log.segments] == [0, 6]
    # The rule follows the new segment's first batch, also after a reopen.
    log.close(NOW)
    log = Log.open(tmp_path, LogConfig(segment_ms=HOUR), NOW + 2 * HOUR)
    log.append(batch(NOW + 2 * HOUR), NOW + 2 * HOUR)
    assert len(log.segments) == 2
    log.append(batch(NOW + 2 * HOUR + 2), NOW + 2 * HOUR + 2)
    assert [s.base_offset for s in log.segments] == [0, 6, 12]
    log.close(NOW)


def test_log_append_time_rewrites_the_batch_header_with_a_valid_crc(tmp_path: Path) -> None:
    log = Log.open(tmp_path, LogConfig(message_timestamp_type="LogAppendTime"), NOW)
    result = log.append(batch(NOW - HOUR), NOW)
    assert (result.error, result.log_append_time) == (ErrorCode.NONE, NOW)
    [b] = stored(log)
    assert b.attributes & TIMESTAMP_TYPE_FLAG and b.max_timestamp == NOW and b.crc_is_valid()
    assert log.offset_for_timestamp(NOW) == (0, NOW)  # the time index has the append time
    # CreateTime (the default) keeps the producer's timestamp and answers -1.
    log.config = replace(log.config, message_timestamp_type="CreateTime")
    result = log.append(batch(NOW - HOUR), NOW)
    assert result.log_append_time == -1
    second = stored(log)[1]
    assert not second.attributes & TIMESTAMP_TYPE_FLAG and second.max_timestamp == NOW - HOUR
    log.close(NOW)


def test_a_changed_config_applies_at_the_next_append(tmp_path: Path) -> None:
    log = Log.open(tmp_path, LogConfig(), NOW)
    big = batch(NOW, n=40)
    assert log.append(big, NOW).error == ErrorCode.NONE
    log.config = replace(log.config, max_message_bytes=big.size - 1)
    assert log.append(big, NOW).error == ErrorCode.MESSAGE_TOO_LARGE
    log.close(NOW)


def _filled(tmp_path: Path) -> Log:
    log = Log.open(tmp_path, LogConfig(segment_ms=1), NOW)
    for i in range(5):  # one segment per batch: each is a millisecond after the last
        assert log.append(batch(NOW + 2 * i, pid=9, seq=3 * i), NOW + 2 * i).error == 0
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9, 12]
    return log


def test_delete_records_moves_the_start_and_deletes_whole_segments(tmp_path: Path) -> None:
    log = _filled(tmp_path)
    assert log.delete_records_before(7) == 7
    # Segments [0,3) and [3,6) are wholly below 7; [6,9) holds offset 7 and stays.
    assert [s.base_offset for s in log.segments] == [6, 9, 12]
    assert log.log_start_offset == 7
    with pytest.raises(OffsetOutOfRangeError):
        log.read(6, 1 << 20)
    assert log.read(7, 1 << 20).size > 0
    assert log.delete_records_before(4) == 7  # never moves back
    # The producer whose early batches went is still known (only expiration removes it).
    assert log.producer_state.last_entry(9) is not None
    # Up to the log end: the active segment stays, empty of readable records.
    assert log.delete_records_before(15) == 15
    assert [s.base_offset for s in log.segments] == [12]
    log.close(NOW)


def test_the_start_offset_survives_a_crash(tmp_path: Path) -> None:
    log = _filled(tmp_path)
    log.delete_records_before(7)
    log._close_files()  # as after SIGKILL: no clean shutdown
    again = Log.open(tmp_path, LogConfig(), NOW)
    assert again.log_start_offset == 7
    with pytest.raises(OffsetOutOfRangeError):
        again.read(6, 1 << 20)
    again.close(NOW)


def test_retention_never_moves_the_start_offset_back(tmp_path: Path) -> None:
    log = _filled(tmp_path)
    log._close_files()
    # A crash after the checkpoint was written, before the segments below it went.
    (tmp_path / LOG_START_OFFSET_FILE).write_text("0\n7\n")
    again = Log.open(tmp_path, LogConfig(retention_ms=-1), NOW)
    assert again.log_start_offset == 7 and len(again.segments) == 5
    # Retention deletes what lies wholly below it, [0, 3) and [3, 6), and keeps the start.
    assert again.apply_retention(NOW) == 2
    assert [s.base_offset for s in again.segments] == [6, 9, 12]
    assert again.log_start_offset == 7
    again.close(NOW)
