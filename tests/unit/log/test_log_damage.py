"""Damage at rest, found by flipping bytes in the files of a closed log: a bad batch is
caught whatever the shutdown, replay does not believe it, and an index entry that points off a
batch boundary is rebuilt instead of failing every read of its range."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from samsa.log.log import Log, LogConfig
from samsa.log.segment import LogSegment
from samsa.log.snapshot import list_snapshots, snapshot_path
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    NewRecord,
    RecordBatchView,
    base_offset_prefix,
    build_batch,
    validate_produce_batch,
)

NOW = 1_700_000_000_000
SMALL = LogConfig(segment_bytes=6000, index_interval_bytes=2000)  # ~5 batches per segment
DENSE = LogConfig(index_interval_bytes=1)  # an index entry for every batch but the first


def raw_batch(records: int = 10, *, ts: int = NOW, pid: int = -1, seq: int = -1) -> bytes:
    return build_batch(
        [NewRecord(b"v" * 100, timestamp=ts + i) for i in range(records)],
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
    )


def fill(lg: Log, count: int, *, pid: int = -1) -> list[bytes]:
    out = []
    for i in range(count):
        raw = raw_batch(ts=NOW + 100 * i, pid=pid, seq=10 * i if pid >= 0 else -1)
        result = lg.append(validate_produce_batch(raw), NOW)
        assert result.error == ErrorCode.NONE
        out.append(base_offset_prefix(result.base_offset) + raw[8:])
    return out


def flip(path: Path, position: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


def batch_positions(seg: LogSegment) -> list[int]:
    data = seg.path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        out.append(pos)
        pos += RecordBatchView(data, pos).size
    return out


# -- a bad batch after a clean shutdown ---------------------------------------------------------


def test_flipped_byte_in_the_active_segment_after_a_clean_shutdown_is_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, LogConfig(), NOW)
    batches = fill(lg, 10)
    lg.close(NOW)
    seg = lg.segments[-1]
    # Inside the records of the 5th batch: the headers stay sound, only the CRC can tell.
    flip(seg.path, batch_positions(seg)[4] + 100)
    with caplog.at_level(logging.INFO, logger="samsa.log"):
        lg = Log.open(directory, LogConfig(), NOW)
    try:
        report = lg.load_report
        assert report.clean_shutdown and report.verified_segments == 1
        assert report.lost_records
        # Kafka's recovery rule: the log ends before the first bad batch, and says so loudly.
        assert lg.log_end_offset == 40
        assert b"".join(lg.read(0, 10**9).chunks) == b"".join(batches[:4])
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert any("CRC mismatch" in r.getMessage() for r in errors)
        assert any("damage at rest" in r.getMessage() for r in errors)
    finally:
        lg.close(NOW)


def test_a_clean_log_is_opened_without_recovery(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    batches = fill(lg, 12)
    lg.close(NOW)
    lg = Log.open(directory, SMALL, NOW)
    try:
        report = lg.load_report
        assert (report.verified_segments, report.recovered_segments) == (1, 0)
        assert not report.lost_records
        assert b"".join(lg.read(0, 10**9).chunks) == b"".join(batches)
    finally:
        lg.close(NOW)


@pytest.mark.parametrize("size", [30, 500], ids=["torn-header", "torn-batch"])
def test_check_crcs_reports_a_torn_tail(tmp_path: Path, size: int) -> None:
    seg = LogSegment.create(tmp_path, 0, 4096)
    try:
        for i in range(3):
            raw = raw_batch()
            seg.append(RecordBatchView(raw), 10 * i, 10 * i + 9)
        whole = seg.size
        with open(seg.path, "ab") as f:
            f.write((base_offset_prefix(30) + raw_batch()[8:])[:size])
        assert seg.check_crcs(0) == (
            whole,
            3,
            f"torn batch{' header' * (size < 61)} at byte {whole}",
        )
    finally:
        seg.close()


def test_check_crcs_reads_batches_larger_than_a_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("samsa.log.segment.RECOVER_CHUNK", 700)
    seg = LogSegment.create(tmp_path, 0, 4096)
    try:
        for i in range(4):
            seg.append(RecordBatchView(raw_batch()), 10 * i, 10 * i + 9)
        assert seg.check_crcs(0) == (seg.size, 4, None)
        flip(seg.path, seg.size - 10)
        assert seg.check_crcs(0)[1:] == (3, f"CRC mismatch at byte {batch_positions(seg)[3]}")
    finally:
        seg.close()


# -- producer-state replay ----------------------------------------------------------------------


def test_producer_state_replay_does_not_believe_a_corrupt_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    fill(lg, 4, pid=7)  # producer 7, epoch 0, in the first segment only
    fill(lg, 8)  # rolls twice
    lg.flush()  # the recovery point is in the last segment: the first is not rescanned
    first = lg.segments[0]
    for seg in lg.segments:
        seg.close()  # kill -9
    for offset in list_snapshots(directory):
        snapshot_path(directory, offset).unlink()  # so the whole log is replayed
    # The last batch of producer 7 says epoch 256 now (a flipped bit inside the CRC).
    flip(first.path, batch_positions(first)[3] + 51, 0x01)
    with caplog.at_level(logging.ERROR, logger="samsa.log"):
        lg = Log.open(directory, SMALL, NOW)
    try:
        assert lg.load_report.recovered_segments == 1
        assert lg.load_report.corrupt_batches == 1
        assert "CRC-32C mismatch" in caplog.text
        # Believing it would fence epoch 0 (INVALID_PRODUCER_EPOCH); the previous batch's
        # state stands instead, so the producer's retry of that batch is a new append.
        raw = raw_batch(pid=7, seq=30)
        assert lg.append(validate_produce_batch(raw), NOW).error == ErrorCode.NONE
    finally:
        lg.close(NOW)


# -- index entries off a batch boundary ----------------------------------------------------------


def _write_entry(path: Path, index: int, relative_offset: int, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(8 * index)
        f.write(struct.pack(">ii", relative_offset, position))


@pytest.mark.parametrize("shift", [1, 61, -7], ids=["next-byte", "past-header", "before"])
def test_index_entry_off_a_batch_boundary_is_rebuilt_on_lookup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, shift: int
) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, DENSE, NOW)
    batches = fill(lg, 8)
    lg.close(NOW)
    seg = lg.segments[0]
    index = seg.offset_index.path
    good = index.read_bytes()
    # Entry 3 names offset 39 (the 4th batch); point it a few bytes off that batch's start.
    position = batch_positions(seg)[3]
    _write_entry(index, 2, 39, position + shift)
    with caplog.at_level(logging.WARNING, logger="samsa.log"):
        lg = Log.open(directory, DENSE, NOW)
        try:
            for offset in (35, 39, 40, 45):
                assert lg.read(offset, 1).chunks == [batches[offset // 10]]
            assert b"".join(lg.read(0, 10**9).chunks) == b"".join(batches)
            assert "is not the start of that batch" in caplog.text
            assert index.read_bytes() == good  # rebuilt on disk: no rebuild on the next start
        finally:
            lg.close(NOW)


def test_index_entry_off_a_boundary_is_rebuilt_when_a_read_is_cut_by_its_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, DENSE, NOW)
    batches = fill(lg, 8)
    lg.close(NOW)
    seg = lg.segments[0]
    positions = batch_positions(seg)
    _write_entry(seg.offset_index.path, 4, 59, positions[5] + 3)
    lg = Log.open(directory, DENSE, NOW)
    try:
        # From offset 0 with a budget ending inside the 6th batch: the read's end is found
        # from the index entry at or below the budget, which is the bad one.
        with caplog.at_level(logging.WARNING, logger="samsa.log"):
            got = lg.read(0, positions[5] + 100).chunks
        assert got == [b"".join(batches[:5])]
        assert "is not the start of that batch" in caplog.text
    finally:
        lg.close(NOW)


def test_index_entry_off_a_boundary_is_rebuilt_for_a_lookup_by_time(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, DENSE, NOW)
    fill(lg, 8)
    lg.close(NOW)
    seg = lg.segments[0]
    _write_entry(seg.offset_index.path, 3, 49, batch_positions(seg)[4] + 20)
    lg = Log.open(directory, DENSE, NOW)
    try:
        assert lg.offset_for_timestamp(NOW + 405) == (45, NOW + 405)
    finally:
        lg.close(NOW)


@pytest.mark.parametrize("which", [0, -1], ids=["first", "last"])
def test_index_whose_first_or_last_entry_is_off_is_rebuilt_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: int
) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, DENSE, NOW)
    batches = fill(lg, 8)
    lg.close(NOW)
    seg = lg.segments[0]
    index = seg.offset_index.path
    good = index.read_bytes()
    entries = len(good) // 8
    entry = which % entries
    relative, position = struct.unpack_from(">ii", good, 8 * entry)
    _write_entry(index, entry, relative, position + 1)
    with caplog.at_level(logging.WARNING, logger="samsa.log"):
        lg = Log.open(directory, DENSE, NOW)
        try:
            assert lg.read(75, 1).chunks == [batches[7]]
            assert f"{'first' if which == 0 else 'last'} entry" in caplog.text
            assert index.read_bytes() == good
        finally:
            lg.close(NOW)


# -- whole-partition replay ---------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [8 * 1024 * 1024, 500], ids=["chunked", "batch-per-read"])
def test_verified_batches_skip_damage_and_say_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr("samsa.log.segment.RECOVER_CHUNK", chunk)
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    fill(lg, 15)  # segments at 0, 50, 100
    lg.close(NOW)
    first, second, _ = lg.segments
    flip(first.path, batch_positions(first)[1] + 300)  # offsets 10-19 fail their CRC
    flip(second.path, batch_positions(second)[2] + 16, 0x07)  # no magic: 70-99 unreadable
    lg = Log.open(directory, SMALL, NOW)
    try:
        damage: list[str] = []
        seen = []
        for view in lg.verified_batches(damage.append):
            seen.append((view.base_offset, len(damage)))
            assert view.pos + view.size <= len(view.buf) and view.crc_is_valid()  # whole
        # In order: each batch with the number of damage reports before it.
        assert seen == [(0, 0), (20, 1), (30, 1), (40, 1), (50, 1), (60, 1)] + [
            (o, 2) for o in range(100, 150, 10)
        ]
        assert "offsets 10-19) fails its CRC-32C check" in damage[0]
        assert f"no batch header at byte {batch_positions(second)[2]}" in damage[1]
    finally:
        lg.close(NOW)
