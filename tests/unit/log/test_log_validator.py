"""Topic configs the log applies to each client batch (docs/semantics.md, rules 39-42):
compression.type re-encodes batches in the topic's codec (rule 39), CreateTime windows refuse
out-of-range timestamps (rule 41), flush.messages and flush.ms make a flush due (rule 42);
min.insync.replicas (rule 40) is the produce handler's, in
tests/unit/broker/test_produce_topic_configs.py."""

from __future__ import annotations

from pathlib import Path

import crc32c
import pytest

from samsa.log.log import Log, LogConfig
from samsa.log.producer_state import AppendOrigin
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    Compression,
    NewRecord,
    RecordBatchView,
    build_batch,
    decode_records,
    iter_batches,
)

NOW = 1_800_000_000_000
RECORDS = [
    NewRecord(value=b"value-%d" % i * 10, key=b"k%d" % i, timestamp=NOW + i) for i in range(50)
]


def batch(
    codec: int, pid: int = -1, seq: int = -1, *, transactional: bool = False
) -> RecordBatchView:
    return RecordBatchView(
        build_batch(
            RECORDS,
            producer_id=pid,
            producer_epoch=3 if pid >= 0 else -1,
            base_sequence=seq,
            transactional=transactional,
            compression=codec,
        )
    )


def stored(log: Log) -> list[RecordBatchView]:
    data = b"".join(
        c if isinstance(c, bytes) else c.read()
        for c in log.read(log.log_start_offset, 1 << 22).chunks
    )
    return list(iter_batches(data))


def _content(view: RecordBatchView) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [(r.offset, r.timestamp, r.key, r.value) for r in decode_records(view)]


@pytest.mark.parametrize(
    ("topic_codec", "sent", "kept"),
    [
        ("zstd", Compression.LZ4, Compression.ZSTD),
        ("gzip", Compression.NONE, Compression.GZIP),
        ("snappy", Compression.ZSTD, Compression.SNAPPY),
        ("lz4", Compression.GZIP, Compression.LZ4),
        ("uncompressed", Compression.GZIP, Compression.NONE),
        ("producer", Compression.SNAPPY, Compression.SNAPPY),
        ("producer", Compression.NONE, Compression.NONE),
    ],
)
def test_batches_are_stored_in_the_topics_codec(
    tmp_path: Path, topic_codec: str, sent: int, kept: int
) -> None:
    """Rule 38: the stored batch is in the topic's codec, with the same records, offsets,
    producer fields and a valid CRC."""
    log = Log.open(tmp_path, LogConfig(compression_type=topic_codec), NOW)
    log.append(batch(Compression.NONE), NOW)  # offsets 0-49 first, so the next is re-based
    original = batch(sent, pid=7, seq=0)
    result = log.append(original, NOW)
    assert result.error == ErrorCode.NONE and (result.base_offset, result.last_offset) == (50, 99)
    (_, out) = stored(log)
    assert out.compression == kept and out.crc_is_valid()
    assert (out.producer_id, out.producer_epoch, out.base_sequence) == (7, 3, 0)
    assert (out.base_timestamp, out.max_timestamp) == (
        original.base_timestamp,
        original.max_timestamp,
    )
    assert [r[1:] for r in _content(out)] == [r[1:] for r in _content(original)]
    assert [r[0] for r in _content(out)] == list(range(50, 100))
    if kept == sent:  # nothing to re-encode: the producer's bytes, untouched
        assert out.to_bytes()[8:] == original.to_bytes()[8:]
    log.close(NOW)


def test_levels_are_applied(tmp_path: Path) -> None:
    """Rule 38: compression.zstd.level chooses the level of the re-encode."""
    sizes = []
    for level in (1, 19):
        log = Log.open(
            tmp_path / str(level),
            LogConfig(compression_type="zstd", compression_zstd_level=level),
            NOW,
        )
        log.append(batch(Compression.NONE), NOW)
        sizes.append(stored(log)[0].size)
        log.close(NOW)
    assert sizes[1] < sizes[0]


def test_a_retry_of_a_recompressed_batch_is_a_duplicate(tmp_path: Path) -> None:
    """Rule 38 with rule 6: producer state keys on sequences, which a re-encode keeps."""
    log = Log.open(tmp_path, LogConfig(compression_type="zstd"), NOW)
    first = log.append(batch(Compression.LZ4, pid=9, seq=0), NOW)
    retry = log.append(batch(Compression.LZ4, pid=9, seq=0), NOW)
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (0, 49)
    assert first.base_offset == 0 and log.log_end_offset == 50 and len(stored(log)) == 1
    log.close(NOW)


def test_transactional_batches_keep_their_flag_and_abort_as_before(tmp_path: Path) -> None:
    """Rule 38: the transactional flag survives the re-encode, so the marker ends it."""
    log = Log.open(tmp_path, LogConfig(compression_type="gzip"), NOW)
    log.append(batch(Compression.ZSTD, pid=4, seq=0, transactional=True), NOW)
    assert log.last_stable_offset == 0
    log.append_end_txn_marker(4, 3, 0, False, NOW)
    assert log.last_stable_offset == log.log_end_offset == 51
    data, marker = stored(log)
    assert data.is_transactional and data.compression == Compression.GZIP
    assert marker.is_control and marker.compression == Compression.NONE
    assert log.aborted_transactions(0, 51) == [(4, 0)]
    log.close(NOW)


def test_undecompressable_records_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """A batch whose records its codec cannot read is refused with Kafka's answer,
    UNKNOWN_SERVER_ERROR (tests/oracle/test_record_validation.py)."""
    raw = bytearray(batch(Compression.NONE).to_bytes())
    raw[21:23] = (Compression.GZIP).to_bytes(2, "big")  # claims gzip, holds plain records
    raw[17:21] = crc32c.crc32c(bytes(raw[21:])).to_bytes(4, "big")
    log = Log.open(tmp_path, LogConfig(compression_type="zstd"), NOW)
    result = log.append(RecordBatchView(bytes(raw)), NOW)
    assert result.error == ErrorCode.UNKNOWN_SERVER_ERROR and "decompress" in (result.message or "")
    assert log.log_end_offset == 0
    log.close(NOW)


def test_coordinator_batches_are_not_re_encoded(tmp_path: Path) -> None:
    """Rule 38 applies to client batches; the coordinators' records are written as given."""
    log = Log.open(tmp_path, LogConfig(compression_type="zstd"), NOW)
    log.append(batch(Compression.NONE), NOW, AppendOrigin.COORDINATOR)
    assert stored(log)[0].compression == Compression.NONE
    log.close(NOW)


DAY = 86_400_000


def stamped(*timestamps: int) -> RecordBatchView:
    return RecordBatchView(
        build_batch([NewRecord(value=b"v", key=b"k", timestamp=ts) for ts in timestamps])
    )


@pytest.mark.parametrize("codec", ["producer", "zstd"])
def test_create_time_outside_the_window_is_refused(tmp_path: Path, codec: str) -> None:
    """Rule 40: each record's timestamp is checked, not only the batch's first or max one;
    the whole batch is refused and nothing is written."""
    config = LogConfig(message_timestamp_before_max_ms=DAY, compression_type=codec)
    log = Log.open(tmp_path, config, NOW)
    for bad in (
        stamped(NOW, NOW - DAY - 1, NOW),  # an old record in the middle
        stamped(NOW + 3_600_001),  # Kafka 4's after.max.ms default: one hour ahead
    ):
        result = log.append(bad, NOW)
        # Kafka's words: the batch's message, then a RecordError per record out of range
        assert result.error == ErrorCode.INVALID_TIMESTAMP and "invalid timestamp" in (
            result.message or ""
        )
        assert "out of range" in result.record_errors[0][1]
    assert log.log_end_offset == 0 and stored(log) == []
    ok = log.append(stamped(NOW - DAY, NOW + 3_600_000, NOW), NOW)
    assert ok.error == ErrorCode.NONE and log.log_end_offset == 3
    log.close(NOW)


def test_the_window_follows_the_config(tmp_path: Path) -> None:
    """Rule 40: after.max.ms widens or narrows the future side; before.max.ms at its default
    (Long.MAX) lets any past timestamp in."""
    log = Log.open(tmp_path, LogConfig(message_timestamp_after_max_ms=10 * DAY), NOW)
    assert log.append(stamped(0, NOW + 10 * DAY), NOW).error == ErrorCode.NONE
    log.config = LogConfig(message_timestamp_after_max_ms=0)
    assert log.append(stamped(NOW + 1), NOW).error == ErrorCode.INVALID_TIMESTAMP
    assert log.append(stamped(NOW), NOW).error == ErrorCode.NONE
    log.close(NOW)


def test_log_append_time_topics_are_not_checked(tmp_path: Path) -> None:
    """Rule 40: under LogAppendTime the broker's clock replaces the producer's timestamps."""
    config = LogConfig(message_timestamp_type="LogAppendTime", message_timestamp_before_max_ms=0)
    log = Log.open(tmp_path, config, NOW)
    result = log.append(stamped(NOW - 10 * DAY, NOW + 10 * DAY), NOW)
    assert result.error == ErrorCode.NONE and result.log_append_time == NOW
    log.close(NOW)


def test_flush_is_due_by_the_topics_messages_or_age(tmp_path: Path) -> None:
    """Rule 41: flush.messages counts unflushed records, flush.ms the age of the oldest
    unflushed append; a flush resets both."""
    log = Log.open(tmp_path, LogConfig(flush_interval_messages=5, flush_ms=1000), NOW)
    assert not log.flush_due(NOW)
    log.append(stamped(NOW, NOW), NOW)
    assert not log.flush_due(NOW + 999)
    assert log.flush_due(NOW + 1000)  # the first append's records are a second old
    log.append(stamped(NOW, NOW, NOW), NOW + 10)
    assert log.flush_due(NOW + 10)  # five records
    log.flush()
    assert not log.flush_due(NOW + 5000)
    log.append(stamped(NOW), NOW + 5000)
    assert not log.flush_due(NOW + 5999) and log.flush_due(NOW + 6000)
    log.close(NOW)


def test_segment_jitter_rolls_sooner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 42: segment.jitter.ms takes a random share (here fixed at half an hour) off
    segment.ms for each new segment; without it the same appends do not roll."""
    hour = 3_600_000
    monkeypatch.setattr("samsa.log.log._JITTER.randrange", lambda n: min(n - 1, hour // 2))
    for jitter, segments in ((0, 1), (hour, 2)):
        log = Log.open(
            tmp_path / str(jitter), LogConfig(segment_ms=hour, segment_jitter_ms=jitter), NOW
        )
        log.append(stamped(NOW), NOW)
        log.append(stamped(NOW + hour // 2 + 1), NOW + hour // 2 + 1)
        assert len(log.segments) == segments
        log.close(NOW)
