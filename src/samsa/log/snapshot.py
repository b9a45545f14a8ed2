"""Producer-state snapshot files.

A snapshot is named ``<20-digit offset>.snapshot`` after the ``map_end_offset`` it reflects, so
recovery loads the newest valid one and replays the log from that offset (rule 13). Unlike Kafka,
which keeps one batch per producer, samsa stores every retained batch (up to 5), so after a restart
every retry still in the window is recognised as a duplicate.

File layout, big-endian::

    header  magic b"SMPS" | version u16 | crc32c u32 of the body
    body    offset i64 | entry count u32 | entries
    entry   producer id i64 | epoch i16 | last timestamp i64 | coordinator epoch i32
            | current txn first offset i64 (-1: none) | batch count u8 | batches
    batch   first seq i32 | last seq i32 | first offset i64 | last offset i64 | timestamp i64

The body repeats the offset so a file renamed or copied to the wrong name is caught.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterable
from pathlib import Path

import crc32c

from samsa.log.durable import fsync_dir
from samsa.log.producer_state import NUM_BATCHES_TO_RETAIN, PACKED_BATCH, ProducerStateEntry

log = logging.getLogger(__name__)

SUFFIX = ".snapshot"
_MAGIC = b"SMPS"
_VERSION = 1
_NAME_RE = re.compile(r"^(\d{20})\.snapshot$")

_HEADER = struct.Struct(">4sHI")
_BODY_HEAD = struct.Struct(">qI")
_ENTRY = struct.Struct(">qhqiqB")
# Batches are stored as the entries hold them, so they are copied, never unpacked.
_BATCH = PACKED_BATCH


class CorruptSnapshotError(Exception):
    """A snapshot file that cannot be trusted (bad magic, version, CRC, or truncated)."""


def snapshot_path(directory: Path, offset: int) -> Path:
    if offset < 0:
        raise ValueError(f"snapshot offset must not be negative: {offset}")
    return Path(directory) / f"{offset:020d}{SUFFIX}"


def _encode(offset: int, entries: Iterable[ProducerStateEntry]) -> bytes:
    parts: list[bytes] = []
    count = 0
    for e in entries:
        nbatches = len(e.packed_batches) // _BATCH.size
        if nbatches > NUM_BATCHES_TO_RETAIN:
            raise ValueError(f"producer {e.producer_id} has {nbatches} batches (max 5)")
        txn = -1 if e.current_txn_first_offset is None else e.current_txn_first_offset
        try:
            parts.append(
                _ENTRY.pack(
                    e.producer_id,
                    e.epoch,
                    e.last_timestamp_ms,
                    e.coordinator_epoch,
                    txn,
                    nbatches,
                )
            )
        except struct.error as exc:
            raise ValueError(f"producer {e.producer_id} does not fit the format: {exc}") from exc
        parts.append(e.packed_batches)
        count += 1
    body = _BODY_HEAD.pack(offset, count) + b"".join(parts)
    return _HEADER.pack(_MAGIC, _VERSION, crc32c.crc32c(body)) + body


def write_snapshot(directory: Path, offset: int, entries: Iterable[ProducerStateEntry]) -> Path:
    """Write a snapshot atomically: a crash leaves either the old state or the complete file."""
    path = snapshot_path(directory, offset)
    data = _encode(offset, entries)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # without it a crash can resurrect or lose the file
    return path


def read_snapshot(path: Path) -> list[ProducerStateEntry]:
    """Decode a snapshot; raises CorruptSnapshotError if anything about it is off."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < _HEADER.size + _BODY_HEAD.size:
        raise CorruptSnapshotError(f"{path}: truncated ({len(data)} bytes, shorter than a header)")
    magic, version, crc = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC:
        raise CorruptSnapshotError(f"{path}: not a producer-state snapshot (magic {magic!r})")
    if version != _VERSION:
        raise CorruptSnapshotError(f"{path}: unsupported snapshot version {version}")
    body = memoryview(data)[_HEADER.size :]
    computed = crc32c.crc32c(body)
    if computed != crc:
        raise CorruptSnapshotError(
            f"{path}: CRC mismatch (stored {crc:#010x}, computed {computed:#010x}); "
            "the file is corrupt or truncated"
        )
    try:
        offset, count = _BODY_HEAD.unpack_from(body, 0)
        pos = _BODY_HEAD.size
        entries: list[ProducerStateEntry] = []
        for _ in range(count):
            pid, epoch, last_ts, coord_epoch, txn, nbatches = _ENTRY.unpack_from(body, pos)
            pos += _ENTRY.size
            if nbatches > NUM_BATCHES_TO_RETAIN:
                raise CorruptSnapshotError(f"{path}: producer {pid} has {nbatches} batches")
            end = pos + nbatches * _BATCH.size
            if end > len(body):
                raise CorruptSnapshotError(f"{path}: truncated batches of producer {pid}")
            entries.append(
                ProducerStateEntry.from_packed(
                    pid, epoch, body[pos:end], last_ts, coord_epoch, None if txn < 0 else txn
                )
            )
            pos = end
    except struct.error as exc:
        raise CorruptSnapshotError(f"{path}: truncated entry data ({exc})") from exc
    if pos != len(body):
        raise CorruptSnapshotError(f"{path}: {len(body) - pos} unexpected trailing bytes")
    m = _NAME_RE.match(path.name)
    if m is not None and int(m.group(1)) != offset:
        raise CorruptSnapshotError(f"{path}: file name does not match its offset {offset}")
    return entries


def list_snapshots(directory: Path) -> list[int]:
    """Offsets of the snapshot files in ``directory``, ascending (temporary files ignored)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _NAME_RE.match(n)) is not None)


def latest_valid_snapshot(
    directory: Path, at_or_below: int | None = None
) -> tuple[int, list[ProducerStateEntry]] | None:
    """The newest readable snapshot (optionally at or below an offset) and its entries.

    Corrupt snapshots on the way are deleted, so they are not tried again on the next start.
    """
    directory = Path(directory)
    for offset in reversed(list_snapshots(directory)):
        if at_or_below is not None and offset > at_or_below:
            continue
        path = snapshot_path(directory, offset)
        try:
            return offset, read_snapshot(path)
        except CorruptSnapshotError as exc:
            log.warning("deleting corrupt producer-state snapshot: %s", exc)
            path.unlink(missing_ok=True)
        except FileNotFoundError:
            continue  # deleted concurrently: try the next one
    return None


def _delete(directory: Path, offsets: Iterable[int]) -> None:
    deleted = False
    for offset in offsets:
        snapshot_path(directory, offset).unlink(missing_ok=True)
        deleted = True
    if deleted:
        fsync_dir(directory)


def delete_snapshots_above(directory: Path, offset: int) -> None:
    """Delete snapshots strictly above ``offset`` (after the log was truncated to it).

    Durable, since a snapshot of truncated data must not come back after a crash.
    """
    directory = Path(directory)
    _delete(directory, [o for o in list_snapshots(directory) if o > offset])


def delete_snapshots_below(directory: Path, offset: int, keep: int = 2) -> None:
    """Delete snapshots strictly below ``offset``, but never the ``keep`` newest snapshots.

    The newest ones survive even when they are old so that a corrupt latest snapshot still has a
    fallback.
    """
    directory = Path(directory)
    offsets = list_snapshots(directory)
    protected = set(offsets[-keep:]) if keep > 0 else set()
    _delete(directory, [o for o in offsets if o < offset and o not in protected])
