"""Unit tests for samsa.log.segment: appends, header walks, index upkeep, recovery."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from samsa.log.segment import CorruptSegmentError, LogSegment, segment_file
from samsa.protocol.records import (
    NewRecord,
    RecordBatchView,
    base_offset_prefix,
    build_batch,
    iter_batches,
    validate_produce_batch,
)

BASE = 100
INTERVAL = 4096


def make_batch(records: int = 10, value_size: int = 100, ts: int = 1_000) -> bytes:
    return build_batch(
        [NewRecord(b"v" * value_size, key=b"k%d" % i, timestamp=ts + i) for i in range(records)]
    )


def fill(seg: LogSegment, count: int, records: int = 10, value_size: int = 100) -> list[bytes]:
    """Append ``count`` batches; return each as it must appear on disk."""
    stored = []
    offset = seg.next_offset
    assert offset is not None
    for i in range(count):
        raw = make_batch(records, value_size, ts=1_000 + 100 * i)
        view = validate_produce_batch(raw)
        seg.append(view, offset, offset + view.last_offset_delta)
        stored.append(base_offset_prefix(offset) + raw[8:])
        offset += records
    return stored


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[LogSegment]:
    s = LogSegment.create(tmp_path, BASE, INTERVAL)
    yield s
    s.close()


def test_files_are_named_after_the_base_offset(tmp_path: Path, seg: LogSegment) -> None:
    assert sorted(os.listdir(tmp_path)) == [
        "00000000000000000100.index",
        "00000000000000000100.log",
        "00000000000000000100.timeindex",
    ]
    assert segment_file(tmp_path, 7, ".log").name == "00000000000000000007.log"


def test_append_writes_through_to_the_file_with_the_offset_assigned(seg: LogSegment) -> None:
    stored = fill(seg, 3)
    # No flush and no close: another reader of the file sees every byte already.
    with open(seg.path, "rb") as f:
        assert f.read() == b"".join(stored)
    assert seg.size == sum(map(len, stored))
    assert seg.next_offset == BASE + 30
    assert seg.read(0, len(stored[0])) == stored[0]


def test_offset_index_gets_an_entry_per_interval(seg: LogSegment) -> None:
    stored = fill(seg, 40)
    size = len(stored[0])
    # Kafka's rule: a batch is indexed once more than INTERVAL bytes were written since the
    # previous entry (the first batch never is: the segment start is implied).
    every = INTERVAL // size + 1
    positions = list(seg.offset_index._positions)
    assert positions == [j * size for j in range(every, 40, every)]
    # Each entry names the last offset of the batch starting at its position.
    last_offset, position = seg.offset_index.last_entry()  # type: ignore[misc]
    assert last_offset == BASE + (position // size) * 10 + 9
    assert seg.time_index.last_entry() == (1_000 + 100 * (position // size) + 9, last_offset)


def test_translate_finds_the_batch_containing_an_offset(seg: LogSegment) -> None:
    stored = fill(seg, 40)
    size = len(stored[0])
    for offset in range(BASE, BASE + 400, 7):
        found = seg.translate(offset)
        assert found is not None
        pos, view = found
        assert pos == (offset - BASE) // 10 * size
        assert view.base_offset <= offset <= view.last_offset
    before = seg.translate(BASE - 50)  # before the segment: its first batch
    assert before is not None and before[0] == 0
    assert seg.translate(BASE + 400) is None


def test_boundary_at_or_below(seg: LogSegment) -> None:
    stored = fill(seg, 40)
    size = len(stored[0])
    assert seg.boundary_at_or_below(0, size - 1) == 0
    assert seg.boundary_at_or_below(0, size) == size
    assert seg.boundary_at_or_below(size, 10 * size + 5) == 10 * size
    assert seg.boundary_at_or_below(3 * size, 3 * size + 1) == 3 * size
    assert seg.boundary_at_or_below(0, 10**9) == seg.size


def test_find_offset_by_timestamp_looks_inside_batches(seg: LogSegment) -> None:
    fill(seg, 40)  # batch i holds timestamps 1000 + 100 i .. + 9
    assert seg.max_timestamp == 1_000 + 3_900 + 9
    assert seg.find_offset_by_timestamp(0, BASE) == (BASE, 1_000)
    assert seg.find_offset_by_timestamp(3_005, BASE) == (BASE + 205, 3_005)
    assert seg.find_offset_by_timestamp(3_050, BASE) == (BASE + 210, 3_100)
    assert seg.find_offset_by_timestamp(10**9, BASE) is None
    # Never below the start offset (the log start).
    assert seg.find_offset_by_timestamp(0, BASE + 15) == (BASE + 15, 1_105)


def test_reopened_segment_loads_its_indexes(tmp_path: Path, seg: LogSegment) -> None:
    fill(seg, 40)
    seg.write_pending(seg.take_pending())
    entries = seg.offset_index.last_entry()
    seg.close()
    again = LogSegment.open(tmp_path, BASE, INTERVAL)
    try:
        assert again.next_offset is None  # unknown until the tail is walked
        assert again.offset_index.last_entry() is None  # lazily loaded
        assert again.translate(BASE + 333) is not None
        assert again.offset_index.last_entry() == entries
        assert again.load_tail()
        assert again.next_offset == BASE + 400
    finally:
        again.close()


def test_corrupt_index_is_rebuilt_on_first_use(
    tmp_path: Path, seg: LogSegment, caplog: pytest.LogCaptureFixture
) -> None:
    fill(seg, 40)
    seg.write_pending(seg.take_pending())
    good = seg.offset_index.path.read_bytes()
    seg.close()
    # Structurally fine but pointing at the wrong place: the last entry is checked.
    bad = bytearray(good)
    bad[-1] ^= 0x01
    seg.offset_index.path.write_bytes(bytes(bad))
    again = LogSegment.open(tmp_path, BASE, INTERVAL)
    try:
        with caplog.at_level(logging.WARNING, logger="samsa.log.segment"):
            assert again.translate(BASE + 250) is not None
        assert "rebuilding the indexes" in caplog.text
        assert again.offset_index.path.read_bytes() == good
    finally:
        again.close()


def test_missing_time_index_is_rebuilt(tmp_path: Path, seg: LogSegment) -> None:
    fill(seg, 40)
    seg.seal()
    seg.write_pending(seg.take_pending())
    seg.close()
    seg.time_index.path.unlink()
    again = LogSegment.open(tmp_path, BASE, INTERVAL)
    try:
        assert again.max_timestamp == 1_000 + 3_900 + 9
        assert again.time_index.path.exists()
    finally:
        again.close()


def test_recover_keeps_a_clean_segment_whole(seg: LogSegment) -> None:
    stored = fill(seg, 40)
    index_before = (seg.offset_index.last_entry(), len(seg.offset_index))
    outcome = seg.recover(BASE)
    assert outcome.problem is None
    assert outcome.truncated_bytes == 0
    assert outcome.batches == 40
    assert seg.size == sum(map(len, stored))
    assert seg.next_offset == BASE + 400
    assert (seg.offset_index.last_entry(), len(seg.offset_index)) == index_before


@pytest.mark.parametrize(
    "tail",
    [
        os.urandom(3000),
        b"\x00" * 5000,
        b"\x00" * 20,
    ],
    ids=["garbage", "zeros", "short-zeros"],
)
def test_recover_cuts_a_damaged_tail(seg: LogSegment, tail: bytes) -> None:
    stored = fill(seg, 5)
    with open(seg.path, "ab") as f:
        f.write(tail)
    outcome = seg.recover(BASE)
    assert outcome.problem is not None
    assert outcome.truncated_bytes == len(tail)
    assert seg.path.read_bytes() == b"".join(stored)
    assert seg.next_offset == BASE + 50


def test_recover_refuses_offsets_going_backwards(seg: LogSegment) -> None:
    stored = fill(seg, 2)
    with open(seg.path, "ab") as f:
        f.write(stored[0])  # a valid batch, but with an offset already used
    outcome = seg.recover(BASE)
    assert outcome.problem is not None and "offset" in outcome.problem
    assert seg.size == len(stored[0]) * 2


def test_recover_reads_in_chunks(monkeypatch: pytest.MonkeyPatch, seg: LogSegment) -> None:
    # Chunks smaller than a batch and not aligned with batches must not look like damage.
    monkeypatch.setattr("samsa.log.segment.RECOVER_CHUNK", 1000)
    stored = fill(seg, 30)
    outcome = seg.recover(BASE)
    assert outcome.problem is None
    assert outcome.batches == 30
    assert seg.size == sum(map(len, stored))


def test_walk_reports_outside_damage(seg: LogSegment) -> None:
    fill(seg, 3)
    with open(seg.path, "ab") as f:
        f.write(b"\xff" * 100)
    seg.size += 100
    with pytest.raises(CorruptSegmentError):
        list(seg.iter_batches_from(BASE))


def test_failed_write_is_cut_back_off(monkeypatch: pytest.MonkeyPatch, seg: LogSegment) -> None:
    stored = fill(seg, 2)
    raw = make_batch()
    view = validate_produce_batch(raw)

    def half_writev(fd: int, buffers: list[bytes]) -> int:
        data = b"".join(bytes(b) for b in buffers)
        return os.write(fd, data[: len(data) // 2])

    def full_disk(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "writev", half_writev)
    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError):
        seg.append(view, BASE + 20, BASE + 29)
    monkeypatch.undo()
    assert seg.path.read_bytes() == b"".join(stored)
    assert seg.size == sum(map(len, stored))
    seg.append(view, BASE + 20, BASE + 29)
    assert [v.base_offset for v in iter_batches(seg.path.read_bytes())] == [100, 110, 120]


def test_delete_removes_all_three_files(tmp_path: Path, seg: LogSegment) -> None:
    fill(seg, 1)
    seg.delete()
    assert os.listdir(tmp_path) == []


def test_header_view_reads_offsets_from_disk(seg: LogSegment) -> None:
    fill(seg, 3)
    views = list(seg.iter_batches_from(BASE + 10))
    assert [v.base_offset for v in views] == [BASE + 10, BASE + 20]
    assert all(isinstance(v, RecordBatchView) for v in views)
