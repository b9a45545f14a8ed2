"""Recovery tests: a partition log reopened after a clean close, after kill -9, and after its
files were damaged; producer state rebuilt from snapshots and the log."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from samsa.log.log import Log, LogConfig, ReadResult
from samsa.log.producer_state import AppendOrigin
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
BIG = LogConfig()


def raw_batch(records: int = 10, *, ts: int = NOW, pid: int = -1, seq: int = -1) -> bytes:
    return build_batch(
        [NewRecord(b"v" * 100, timestamp=ts + i) for i in range(records)],
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
    )


def fill(lg: Log, count: int) -> list[bytes]:
    out = []
    for i in range(count):
        raw = raw_batch(ts=NOW + 100 * i)
        result = lg.append(validate_produce_batch(raw), NOW)
        assert result.error == ErrorCode.NONE
        out.append(base_offset_prefix(result.base_offset) + raw[8:])
    return out


def joined(result: ReadResult) -> bytes:
    return b"".join(result.chunks)


def crash(lg: Log) -> None:
    """kill -9: file descriptors go away; nothing is flushed, no marker is written."""
    for seg in lg.segments:
        seg.close()


def append_to_file(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# -- damage at the end of the active segment ------------------------------------------------------


def garbage(next_batch: bytes) -> bytes:
    return random.Random(7).randbytes(700)


def half_batch(next_batch: bytes) -> bytes:
    return next_batch[: len(next_batch) // 2]


def torn_header(next_batch: bytes) -> bytes:
    return next_batch[:30]


def flipped_byte(next_batch: bytes) -> bytes:
    damaged = bytearray(next_batch)
    damaged[len(damaged) // 2] ^= 0x40  # inside the records: only the CRC can tell
    return bytes(damaged)


def zero_tail(next_batch: bytes) -> bytes:
    return b"\x00" * 4096


@pytest.mark.parametrize(
    "damage", [garbage, half_batch, torn_header, flipped_byte, zero_tail], ids=lambda f: f.__name__
)
def test_damaged_tail_is_cut_at_the_last_valid_batch(
    tmp_path: Path, damage: Callable[[bytes], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    batches = fill(lg, 12)  # three segments
    active = lg.segments[-1].path
    crash(lg)
    tail = damage(base_offset_prefix(120) + raw_batch()[8:])
    append_to_file(active, tail)

    with caplog.at_level(logging.INFO, logger="samsa.log"):
        lg = Log.open(directory, SMALL, NOW)
    try:
        report = lg.load_report
        assert not report.clean_shutdown
        assert report.recovered_segments == 3  # no flush ever: everything is rescanned
        assert report.truncated_bytes == len(tail)
        assert f"truncated {len(tail)} bytes from {active}" in caplog.text
        assert lg.log_end_offset == 120
        assert joined(lg.read(0, 10**9)) == b"".join(batches)  # nothing before the damage lost
        for offset in range(0, 120, 10):
            assert lg.read(offset, 1).chunks == [batches[offset // 10]]
        result = lg.append(validate_produce_batch(raw_batch()), NOW)
        assert (result.error, result.base_offset) == (ErrorCode.NONE, 120)
        assert active.stat().st_size == sum(map(len, batches[10:])) + lg.read(120, 1).size
    finally:
        lg.close(NOW)


def test_corruption_in_an_older_segment_drops_everything_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    batches = fill(lg, 20)
    segments = lg.segments
    assert len(segments) == 4
    second = segments[1]
    size = len(batches[0])
    crash(lg)
    # Flip a byte in the third batch of the second segment.
    with open(second.path, "r+b") as f:
        f.seek(2 * size + 100)
        byte = f.read(1)
        f.seek(2 * size + 100)
        f.write(bytes([byte[0] ^ 0xFF]))

    with caplog.at_level(logging.WARNING, logger="samsa.log"):
        lg = Log.open(directory, SMALL, NOW)
    try:
        cut = second.base_offset + 20
        assert lg.log_end_offset == cut
        assert lg.load_report.deleted_segments == 2
        assert "CRC mismatch" in caplog.text
        assert [s.base_offset for s in lg.segments] == [0, second.base_offset]
        for later in segments[2:]:
            assert not later.path.exists()
            assert not later.offset_index.path.exists()
        assert all(offset <= cut for offset in list_snapshots(directory))
        assert joined(lg.read(0, 10**9)) == b"".join(batches[: cut // 10])
        assert lg.append(validate_produce_batch(raw_batch()), NOW).base_offset == cut
    finally:
        lg.close(NOW)


def test_unflushed_appends_survive_a_crash(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, BIG, NOW)
    batches = fill(lg, 30)
    crash(lg)  # the bytes are in the kernel: a process crash loses nothing
    lg = Log.open(directory, BIG, NOW)
    try:
        assert lg.load_report.truncated_bytes == 0
        assert lg.log_end_offset == 300
        assert joined(lg.read(0, 10**9)) == b"".join(batches)
    finally:
        lg.close(NOW)


# -- what gets scanned ----------------------------------------------------------------------------


def test_clean_shutdown_skips_the_scan(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    batches = fill(lg, 12)
    lg.close(NOW)
    with caplog.at_level(logging.INFO, logger="samsa.log"):
        lg = Log.open(directory, SMALL, NOW)
    assert lg.load_report.clean_shutdown
    assert lg.load_report.recovered_segments == 0
    assert "clean shutdown, skipping recovery" in caplog.text
    assert lg.log_end_offset == 120
    assert joined(lg.read(0, 10**9)) == b"".join(batches)
    # The marker was consumed: crashing now means recovery next time.
    crash(lg)
    lg = Log.open(directory, SMALL, NOW)
    try:
        assert not lg.load_report.clean_shutdown
        assert lg.load_report.recovered_segments == 1  # from the recovery point's segment
        assert joined(lg.read(0, 10**9)) == b"".join(batches)
    finally:
        lg.close(NOW)


def test_recovery_starts_at_the_recovery_point(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    fill(lg, 12)  # segments at 0, 50, 100
    lg.flush()
    fill(lg, 6)  # one more roll, at 150
    crash(lg)
    lg = Log.open(directory, SMALL, NOW)
    try:
        assert [s.base_offset for s in lg.segments] == [0, 50, 100, 150]
        assert lg.load_report.recovered_segments == 2  # the one holding offset 120, and after
        assert lg.log_end_offset == 180
    finally:
        lg.close(NOW)


def test_damage_after_a_clean_shutdown_is_still_caught(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    batches = fill(lg, 7)
    active = lg.segments[-1].path
    lg.close(NOW)
    append_to_file(active, b"\x00" * 100)
    lg = Log.open(directory, SMALL, NOW)
    try:
        assert lg.load_report.clean_shutdown
        assert lg.load_report.truncated_bytes == 100
        assert joined(lg.read(0, 10**9)) == b"".join(batches)
    finally:
        lg.close(NOW)


# -- index files ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "content"),
    [
        (".index", b"\x00\x01\x02"),
        (".index", b"\x00\x00\x00\x05\x00\x00\x00\x00" * 3),
        (".index", None),
        (".timeindex", os.urandom(36)),
        (".timeindex", None),
    ],
    ids=["index-torn", "index-not-increasing", "index-missing", "time-garbage", "time-missing"],
)
def test_bad_index_files_are_rebuilt(tmp_path: Path, suffix: str, content: bytes | None) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    batches = fill(lg, 12)
    lg.close(NOW)
    for seg in lg.segments:  # old segments and the active one alike
        path = seg.path.with_suffix(suffix)
        if content is None:
            path.unlink()
        else:
            path.write_bytes(content)
    lg = Log.open(directory, SMALL, NOW)
    try:
        for offset in range(0, 120, 7):
            assert lg.read(offset, 1).chunks == [batches[offset // 10]]
        assert lg.offset_for_timestamp(NOW + 705) == (75, NOW + 705)
        for seg in lg.segments:
            size = seg.path.with_suffix(suffix).stat().st_size
            assert size % (8 if suffix == ".index" else 12) == 0
    finally:
        lg.close(NOW)


def test_orphaned_indexes_and_temporary_files_are_removed(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    directory.mkdir()
    (directory / "00000000000000000500.index").write_bytes(b"")
    (directory / "00000000000000000500.timeindex").write_bytes(b"")
    (directory / "00000000000000000042.snapshot.tmp").write_bytes(b"half")
    lg = Log.open(directory, SMALL, NOW)
    try:
        assert sorted(os.listdir(directory)) == [
            "00000000000000000000.index",
            "00000000000000000000.log",
            "00000000000000000000.timeindex",
        ]
        assert (lg.log_start_offset, lg.log_end_offset) == (0, 0)
    finally:
        lg.close(NOW)


# -- producer state -------------------------------------------------------------------------------

PRODUCERS = (7, 8)


def produce_idempotent(lg: Log, count: int = 8) -> dict[int, list[tuple[int, int, int]]]:
    """Interleaved batches of two producers; per producer (first seq, base, last offset)."""
    sent: dict[int, list[tuple[int, int, int]]] = {pid: [] for pid in PRODUCERS}
    for i in range(count):
        for pid in PRODUCERS:
            raw = raw_batch(3, pid=pid, seq=3 * i, ts=NOW + i)
            result = lg.append(validate_produce_batch(raw), NOW)
            assert result.error == ErrorCode.NONE and not result.duplicate
            sent[pid].append((3 * i, result.base_offset, result.last_offset))
    return sent


def assert_state_survived(lg: Log, sent: dict[int, list[tuple[int, int, int]]]) -> None:
    end = lg.log_end_offset
    for pid, batches in sent.items():
        for seq, base, last in batches[-5:]:  # samsa keeps all five, not only the last
            retry = lg.append(validate_produce_batch(raw_batch(3, pid=pid, seq=seq)), NOW)
            assert retry.error == ErrorCode.NONE and retry.duplicate, (pid, seq)
            assert (retry.base_offset, retry.last_offset) == (base, last)
        older = lg.append(validate_produce_batch(raw_batch(3, pid=pid, seq=batches[-6][0])), NOW)
        assert older.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert lg.log_end_offset == end  # duplicates wrote nothing
    for pid, batches in sent.items():
        nxt = lg.append(validate_produce_batch(raw_batch(3, pid=pid, seq=batches[-1][0] + 3)), NOW)
        assert nxt.error == ErrorCode.NONE and not nxt.duplicate


def corrupt_latest_snapshot(directory: Path) -> None:
    path = snapshot_path(directory, list_snapshots(directory)[-1])
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def delete_snapshots(directory: Path) -> None:
    for offset in list_snapshots(directory):
        snapshot_path(directory, offset).unlink()


@pytest.mark.parametrize(
    ("config", "shutdown", "tamper", "replayed"),
    [
        (SMALL, "clean", None, False),
        (SMALL, "clean", corrupt_latest_snapshot, True),
        (SMALL, "clean", delete_snapshots, True),
        (BIG, "crash", None, True),  # no snapshot at all: replay from the log start
        (SMALL, "crash", None, True),  # roll snapshots plus the active segment
        (SMALL, "crash", corrupt_latest_snapshot, True),
        (SMALL, "crash", delete_snapshots, True),
    ],
    ids=[
        "clean",
        "clean-corrupt-snapshot",
        "clean-no-snapshot",
        "crash-no-snapshot-ever",
        "crash",
        "crash-corrupt-snapshot",
        "crash-no-snapshot",
    ],
)
def test_producer_state_survives_reopen(
    tmp_path: Path,
    config: LogConfig,
    shutdown: str,
    tamper: Callable[[Path], None] | None,
    replayed: bool,
) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, config, NOW)
    sent = produce_idempotent(lg)
    if shutdown == "clean":
        lg.close(NOW)
    else:
        crash(lg)
    if tamper is not None:
        tamper(directory)
    lg = Log.open(directory, config, NOW + 1000)
    try:
        assert (lg.load_report.replayed_batches > 0) == replayed
        assert lg.producer_state.map_end_offset == lg.log_end_offset == 48
        assert_state_survived(lg, sent)
    finally:
        lg.close(NOW)


def test_truncation_forgets_the_state_of_lost_batches(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    sent = produce_idempotent(lg, 12)  # 72 offsets, segments at 0, 45
    segments = lg.segments
    assert len(segments) >= 2
    crash(lg)
    # Cut the first segment short in its last batch: the later ones go, with their snapshots.
    first = segments[0].path
    os.truncate(first, first.stat().st_size - 5)
    lg = Log.open(directory, SMALL, NOW)
    try:
        end = lg.log_end_offset
        assert end == segments[1].base_offset - 3
        assert all(offset <= end for offset in list_snapshots(directory))
        survivors = {pid: [b for b in batches if b[2] < end] for pid, batches in sent.items()}
        lost = {pid: [b for b in batches if b[2] >= end] for pid, batches in sent.items()}
        for pid in PRODUCERS:
            seq, base, _last = survivors[pid][-1]
            retry = lg.append(validate_produce_batch(raw_batch(3, pid=pid, seq=seq)), NOW)
            assert retry.duplicate and retry.base_offset == base
            # The first lost batch is new again: appended, not answered as a duplicate.
            seq = lost[pid][0][0]
            again = lg.append(validate_produce_batch(raw_batch(3, pid=pid, seq=seq)), NOW)
            assert again.error == ErrorCode.NONE and not again.duplicate
    finally:
        lg.close(NOW)


@pytest.mark.parametrize("shutdown", ["clean", "crash"])
def test_expired_producers_are_not_restored(tmp_path: Path, shutdown: str) -> None:
    directory = tmp_path / "t-0"
    lg = Log.open(directory, SMALL, NOW)
    produce_idempotent(lg, 2)
    if shutdown == "clean":
        lg.close(NOW)
    else:
        crash(lg)
    later = NOW + 2 * 86_400_000
    lg = Log.open(directory, SMALL, later)
    try:
        assert lg.producer_state.entries() == []
        result = lg.append(validate_produce_batch(raw_batch(3, pid=7, seq=1000)), later)
        assert result.error == ErrorCode.NONE
    finally:
        lg.close(later)


def test_control_batches_replay_without_validation(tmp_path: Path) -> None:
    from samsa.protocol.records import ControlType, build_control_batch

    directory = tmp_path / "t-0"
    lg = Log.open(directory, BIG, NOW)
    lg.append(validate_produce_batch(raw_batch(3, pid=7, seq=0)), NOW)
    marker = build_control_batch(
        ControlType.ABORT, producer_id=7, producer_epoch=0, coordinator_epoch=0, now_ms=NOW
    )
    assert lg.append(RecordBatchView(marker), NOW, AppendOrigin.COORDINATOR).error == ErrorCode.NONE
    crash(lg)
    lg = Log.open(directory, BIG, NOW)
    try:
        assert lg.log_end_offset == 4
        assert lg.load_report.replayed_batches == 2
    finally:
        lg.close(NOW)
