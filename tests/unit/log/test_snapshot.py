"""Unit tests for samsa.log.snapshot: producer state survives a restart through its snapshots
(docs/semantics.md, rule 13)."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

from samsa.log.producer_state import (
    BatchAppend,
    BatchMetadata,
    Duplicate,
    ProducerAppendInfo,
    ProducerStateEntry,
    ProducerStateManager,
    next_sequence,
)
from samsa.log.snapshot import (
    CorruptSnapshotError,
    delete_snapshots_above,
    delete_snapshots_below,
    latest_valid_snapshot,
    list_snapshots,
    read_snapshot,
    snapshot_path,
    write_snapshot,
)

NOW = 1_700_000_000_000


def make_entries() -> list[ProducerStateEntry]:
    """Three producers: 5 batches with wrapped sequences, an open txn, and no batches at all."""
    seqs = [next_sequence(2**31 - 5, 2 * i) for i in range(5)]  # the 4th batch wraps
    five = [
        BatchMetadata(s, next_sequence(s, 1), 10 * i, 10 * i + 1, NOW + i)
        for i, s in enumerate(seqs)
    ]
    return [
        ProducerStateEntry(2**62, 32767, five, NOW + 4),
        ProducerStateEntry(7, 0, [BatchMetadata(0, 9, 100, 109, -1)], -1, 12, 100),
        ProducerStateEntry(8, 3, [], NOW, -1, None),
    ]


def test_snapshot_path_is_zero_padded(tmp_path: Path) -> None:
    assert snapshot_path(tmp_path, 42).name == "00000000000000000042.snapshot"
    with pytest.raises(ValueError):
        snapshot_path(tmp_path, -1)


def test_round_trip(tmp_path: Path) -> None:
    entries = make_entries()
    path = write_snapshot(tmp_path, 110, entries)
    assert path == snapshot_path(tmp_path, 110)
    assert read_snapshot(path) == entries
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_round_trip_through_manager_keeps_all_five_batches(tmp_path: Path) -> None:
    psm = ProducerStateManager()
    offset = 0
    for pid in range(3):
        for seq in range(8):
            info = psm.prepare_update(BatchAppend(pid, 1, seq, seq, NOW + seq), NOW)
            assert isinstance(info, ProducerAppendInfo)
            psm.update(info, offset, offset)
            offset += 1
    write_snapshot(tmp_path, psm.map_end_offset, psm.entries())

    restored = ProducerStateManager()
    found = latest_valid_snapshot(tmp_path)
    assert found is not None
    restored.load(found[1], found[0], NOW)
    assert restored.map_end_offset == 24
    assert restored.entries() == psm.entries()
    for pid in range(3):
        for seq in range(3, 8):  # every retained batch is still recognised after a "restart"
            dup = restored.prepare_update(BatchAppend(pid, 1, seq, seq, NOW), NOW)
            assert dup == Duplicate(pid * 8 + seq, pid * 8 + seq, NOW + seq)


def test_empty_snapshot(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path, 0, [])
    assert read_snapshot(path) == []


def test_every_corrupt_byte_is_detected(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path, 5, make_entries())
    data = path.read_bytes()
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x40
        path.write_bytes(bytes(bad))
        with pytest.raises(CorruptSnapshotError):
            read_snapshot(path)


def test_crc_error_message(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path, 5, make_entries())
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError, match="CRC mismatch"):
        read_snapshot(path)


def test_truncated_file_is_detected(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path, 5, make_entries())
    data = path.read_bytes()
    for n in range(len(data)):
        path.write_bytes(data[:n])
        with pytest.raises(CorruptSnapshotError):
            read_snapshot(path)


def test_bad_version_and_magic(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path, 5, make_entries())
    data = bytearray(path.read_bytes())
    data[5] = 9  # version low byte
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSnapshotError, match="version 9"):
        read_snapshot(path)
    path.write_bytes(b"XXXX" + bytes(data[4:]))
    with pytest.raises(CorruptSnapshotError, match="magic"):
        read_snapshot(path)


def test_renamed_snapshot_is_rejected(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path, 5, make_entries())
    moved = path.rename(snapshot_path(tmp_path, 6))
    with pytest.raises(CorruptSnapshotError, match="does not match"):
        read_snapshot(moved)


def test_list_snapshots_ignores_other_files(tmp_path: Path) -> None:
    for offset in (30, 4, 1000):
        write_snapshot(tmp_path, offset, [])
    (tmp_path / "00000000000000000050.snapshot.tmp").write_bytes(b"partial")
    (tmp_path / "00000000000000000000.log").write_bytes(b"")
    assert list_snapshots(tmp_path) == [4, 30, 1000]
    assert list_snapshots(tmp_path / "missing") == []


def test_latest_valid_snapshot_falls_back_and_deletes_corrupt(tmp_path: Path) -> None:
    entries = make_entries()
    write_snapshot(tmp_path, 10, entries[:1])
    write_snapshot(tmp_path, 20, entries[:2])
    newest = write_snapshot(tmp_path, 30, entries)
    newest.write_bytes(newest.read_bytes()[:-3])
    assert latest_valid_snapshot(tmp_path) == (20, entries[:2])
    assert list_snapshots(tmp_path) == [10, 20]
    assert latest_valid_snapshot(tmp_path, at_or_below=19) == (10, entries[:1])
    assert latest_valid_snapshot(tmp_path, at_or_below=9) is None
    assert list_snapshots(tmp_path) == [10, 20]  # ones above the bound are not touched


def test_latest_valid_snapshot_none(tmp_path: Path) -> None:
    assert latest_valid_snapshot(tmp_path) is None
    write_snapshot(tmp_path, 10, []).write_bytes(b"")
    assert latest_valid_snapshot(tmp_path) is None
    assert list_snapshots(tmp_path) == []


def test_delete_snapshots_above(tmp_path: Path) -> None:
    for offset in (10, 20, 30):
        write_snapshot(tmp_path, offset, [])
    delete_snapshots_above(tmp_path, 20)
    assert list_snapshots(tmp_path) == [10, 20]
    delete_snapshots_above(tmp_path, 5)
    assert list_snapshots(tmp_path) == []


def test_delete_snapshots_below_keeps_newest(tmp_path: Path) -> None:
    for offset in (10, 20, 30, 40, 50):
        write_snapshot(tmp_path, offset, [])
    delete_snapshots_below(tmp_path, 30)
    assert list_snapshots(tmp_path) == [30, 40, 50]
    delete_snapshots_below(tmp_path, 100)
    assert list_snapshots(tmp_path) == [40, 50]
    delete_snapshots_below(tmp_path, 100, keep=1)
    assert list_snapshots(tmp_path) == [50]
    delete_snapshots_below(tmp_path, 100, keep=0)
    assert list_snapshots(tmp_path) == []


def test_write_overwrites_same_offset(tmp_path: Path) -> None:
    entries = make_entries()
    write_snapshot(tmp_path, 7, entries)
    write_snapshot(tmp_path, 7, entries[1:])
    assert read_snapshot(snapshot_path(tmp_path, 7)) == entries[1:]


def test_a_batch_count_beyond_the_file_is_corrupt(tmp_path: Path) -> None:
    # A body whose CRC matches (so not damage on disk) but whose last entry claims more batches
    # than follow: a clear CorruptSnapshotError, the one error recovery falls back on.
    path = write_snapshot(tmp_path, 5, make_entries())
    data = bytearray(path.read_bytes())
    data[-1] = 1  # the last entry has no batches; its count byte ends the file
    body = bytes(data[10:])
    path.write_bytes(bytes(data[:6]) + struct.pack(">I", crc32c.crc32c(body)) + body)
    with pytest.raises(CorruptSnapshotError, match="truncated batches of producer 8"):
        read_snapshot(path)
