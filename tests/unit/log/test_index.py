"""Unit tests for samsa.log.index: sparse offset and time indexes and their files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from samsa.log.index import CorruptIndexError, OffsetIndex, TimeIndex

BASE = 1000


def offset_index(tmp_path: Path, entries: list[tuple[int, int]]) -> OffsetIndex:
    index = OffsetIndex(tmp_path / "x.index", BASE)
    for offset, position in entries:
        index.append(offset, position)
    return index


def test_offset_index_lookup_finds_the_last_entry_at_or_below(tmp_path: Path) -> None:
    index = offset_index(tmp_path, [(1009, 4200), (1019, 8500), (1029, 12800)])
    assert index.lookup(1000) == 0  # before the first entry: the segment start
    assert index.lookup(1008) == 0
    assert index.lookup(1009) == 4200
    assert index.lookup(1018) == 4200
    assert index.lookup(1019) == 8500
    assert index.lookup(10**9) == 12800
    assert index.last_entry() == (1029, 12800)
    assert len(index) == 3


def test_offset_index_floor_position(tmp_path: Path) -> None:
    index = offset_index(tmp_path, [(1009, 4200), (1019, 8500)])
    assert index.floor_position(100) == 0
    assert index.floor_position(4200) == 4200
    assert index.floor_position(8499) == 4200
    assert index.floor_position(9000) == 8500


def test_empty_offset_index(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", BASE)
    assert index.lookup(5000) == 0
    assert index.last_entry() is None


def test_offset_index_file_is_kafka_layout_and_round_trips(tmp_path: Path) -> None:
    index = offset_index(tmp_path, [(1009, 4200), (1019, 8500)])
    index.rewrite()  # creates the file, drops pending
    index.append(1029, 12800)
    index.write_pending(index.take_pending())
    raw = (tmp_path / "x.index").read_bytes()
    assert raw == struct.pack(">iiiiii", 9, 4200, 19, 8500, 29, 12800)
    assert index.take_pending() == b""
    loaded = OffsetIndex.load(tmp_path / "x.index", BASE, segment_size=20000)
    assert loaded.last_entry() == (1029, 12800)
    assert loaded.lookup(1020) == 8500


def test_offset_index_rewrite_replaces_the_file(tmp_path: Path) -> None:
    (tmp_path / "x.index").write_bytes(b"junk")
    index = offset_index(tmp_path, [(1009, 4200)])
    index.rewrite()
    assert (tmp_path / "x.index").read_bytes() == struct.pack(">ii", 9, 4200)


@pytest.mark.parametrize(
    ("raw", "segment_size"),
    [
        (b"\x00" * 7, 10_000),  # not whole entries
        (struct.pack(">iiii", 9, 4200, 9, 8500), 10_000),  # offsets not increasing
        (struct.pack(">iiii", 9, 4200, 19, 4200), 10_000),  # positions not increasing
        (struct.pack(">ii", 9, 4200), 4000),  # beyond the segment
        (struct.pack(">ii", -5, 0), 10_000),  # negative relative offset
    ],
)
def test_corrupt_offset_index_is_refused(tmp_path: Path, raw: bytes, segment_size: int) -> None:
    (tmp_path / "x.index").write_bytes(raw)
    with pytest.raises(CorruptIndexError):
        OffsetIndex.load(tmp_path / "x.index", BASE, segment_size)


def test_missing_index_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        OffsetIndex.load(tmp_path / "nope.index", BASE, 100)
    with pytest.raises(FileNotFoundError):
        TimeIndex.load(tmp_path / "nope.timeindex", BASE)


def test_time_index_only_grows(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", BASE)
    index.maybe_append(-1, 1000)  # no timestamp: nothing to index
    index.maybe_append(500, 1004)
    index.maybe_append(500, 1009)  # not larger: skipped
    index.maybe_append(400, 1010)  # smaller: skipped
    index.maybe_append(900, 1019)
    assert len(index) == 2
    assert index.last_entry() == (900, 1019)
    assert index.lookup(100) == BASE  # nothing at or below: from the segment start
    assert index.lookup(500) == 1004
    assert index.lookup(899) == 1004
    assert index.lookup(10**12) == 1019


def test_time_index_file_round_trips(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "x.timeindex", BASE)
    index.maybe_append(500, 1004)
    index.write_pending(index.take_pending())
    index.maybe_append(900, 1019)
    index.write_pending(index.take_pending())
    raw = (tmp_path / "x.timeindex").read_bytes()
    assert raw == struct.pack(">qiqi", 500, 4, 900, 19)
    loaded = TimeIndex.load(tmp_path / "x.timeindex", BASE)
    assert loaded.last_entry() == (900, 1019)
    index.rewrite()
    assert (tmp_path / "x.timeindex").read_bytes() == raw


@pytest.mark.parametrize(
    "raw",
    [
        b"\x01" * 13,
        struct.pack(">qiqi", 900, 4, 500, 19),  # timestamps decreasing
        struct.pack(">qiqi", 500, 19, 900, 4),  # offsets decreasing
        struct.pack(">qi", 500, -1),
    ],
)
def test_corrupt_time_index_is_refused(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "x.timeindex").write_bytes(raw)
    with pytest.raises(CorruptIndexError):
        TimeIndex.load(tmp_path / "x.timeindex", BASE)
