"""Sparse per-segment indexes: offset -> file position (``.index``) and timestamp -> offset
(``.timeindex``), with Kafka's file layouts.

Both are kept whole in memory (two typed arrays, searched with ``bisect``) and mirrored to their
file by appending: new entries collect in a pending buffer that the log's flush writes out, so
the append path never makes a system call for an index. Index files are derived data: a missing,
stale or corrupt one is rebuilt from its segment, never trusted over the log.

Offset index entry (8 bytes): relative offset int32 | position int32. As in Kafka, the offset
is the *last* offset of the batch that starts at ``position``.

Time index entry (12 bytes): timestamp int64 | relative offset int32. The timestamp is the
largest seen so far in the segment, the offset the last offset of the batch that carried it;
entries are only added when the timestamp grows, so timestamps are strictly increasing.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from itertools import pairwise
from pathlib import Path

INT32_MAX = 2**31 - 1

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_LITTLE = sys.byteorder == "little"


class CorruptIndexError(Exception):
    """An index file that cannot be trusted; the segment's indexes must be rebuilt."""


def _strictly_increasing(values: array) -> bool:
    return all(a < b for a, b in pairwise(values))


def _write_file(path: Path, data: bytes, *, append: bool) -> None:
    with open(path, "ab" if append else "wb") as f:
        f.write(data)


class _Index:
    """What both indexes share: the file, the segment's base offset, the entries' offsets
    (relative to it) and the entries not yet written to the file."""

    ENTRY_SIZE: int

    __slots__ = ("_offsets", "_pending", "base_offset", "path")

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._offsets = array("i")  # relative to base_offset
        self._pending = bytearray()  # entries not yet written to the file

    @classmethod
    def _read(cls, path: Path) -> bytes:
        """The file's bytes; raises FileNotFoundError or CorruptIndexError."""
        raw = path.read_bytes()
        if len(raw) % cls.ENTRY_SIZE:
            raise CorruptIndexError(
                f"{path.name}: size {len(raw)} is not a multiple of {cls.ENTRY_SIZE}"
            )
        return raw

    def __len__(self) -> int:
        return len(self._offsets)

    def take_pending(self) -> bytes:
        data = bytes(self._pending)
        self._pending.clear()
        return data

    def write_pending(self, data: bytes) -> None:
        if data:
            _write_file(self.path, data, append=True)


class OffsetIndex(_Index):
    """Relative offset -> byte position of one segment."""

    ENTRY_SIZE = _OFFSET_ENTRY.size

    __slots__ = ("_positions",)

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        self._positions = array("i")

    @classmethod
    def load(cls, path: Path, base_offset: int, segment_size: int) -> OffsetIndex:
        """Read ``path``; raises FileNotFoundError or CorruptIndexError."""
        raw = cls._read(path)
        flat = array("i", raw)
        if _LITTLE:
            flat.byteswap()
        index = cls(path, base_offset)
        index._offsets = flat[0::2]
        index._positions = flat[1::2]
        if flat:
            if index._offsets[0] < 0 or index._positions[0] < 0:
                raise CorruptIndexError(f"{path.name}: negative first entry")
            if index._positions[-1] >= segment_size:
                raise CorruptIndexError(
                    f"{path.name}: position {index._positions[-1]} beyond the segment "
                    f"({segment_size} bytes)"
                )
            if not (
                _strictly_increasing(index._offsets) and _strictly_increasing(index._positions)
            ):
                raise CorruptIndexError(f"{path.name}: entries are not increasing")
        return index

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        self._offsets.append(rel)
        self._positions.append(position)
        self._pending += _OFFSET_ENTRY.pack(rel, position)

    def lookup(self, offset: int) -> int:
        """Position of the last entry whose offset is <= ``offset`` (0 if there is none): a
        batch boundary at or before the batch holding ``offset``."""
        i = bisect_right(self._offsets, offset - self.base_offset)
        return self._positions[i - 1] if i else 0

    def lookup_entry(self, offset: int) -> tuple[int, int] | None:
        """(absolute offset, position) of the last entry whose offset is <= ``offset``. The
        caller checks it against the log (:meth:`LogSegment._walk_indexed`): an entry that
        does not name the batch at its position means the index must be rebuilt."""
        i = bisect_right(self._offsets, offset - self.base_offset)
        return (self.base_offset + self._offsets[i - 1], self._positions[i - 1]) if i else None

    def floor_position(self, position: int) -> int:
        """The largest indexed batch position <= ``position`` (0 if there is none)."""
        i = bisect_right(self._positions, position)
        return self._positions[i - 1] if i else 0

    def floor_entry(self, position: int) -> tuple[int, int] | None:
        """(absolute offset, position) of the entry with the largest position <= ``position``."""
        i = bisect_right(self._positions, position)
        return (self.base_offset + self._offsets[i - 1], self._positions[i - 1]) if i else None

    def first_entry(self) -> tuple[int, int] | None:
        """(absolute offset, position) of the first entry."""
        if not self._offsets:
            return None
        return self.base_offset + self._offsets[0], self._positions[0]

    def last_entry(self) -> tuple[int, int] | None:
        """(absolute offset, position) of the last entry."""
        if not self._offsets:
            return None
        return self.base_offset + self._offsets[-1], self._positions[-1]

    def rewrite(self) -> None:
        """Replace the file with the in-memory entries (after a rebuild)."""
        flat = array("i", bytes(8 * len(self._offsets)))
        flat[0::2] = self._offsets
        flat[1::2] = self._positions
        if _LITTLE:
            flat.byteswap()
        self._pending.clear()
        _write_file(self.path, flat.tobytes(), append=False)


class TimeIndex(_Index):
    """Max timestamp so far -> relative offset of one segment."""

    ENTRY_SIZE = _TIME_ENTRY.size

    __slots__ = ("_timestamps",)

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        self._timestamps = array("q")

    @classmethod
    def load(cls, path: Path, base_offset: int) -> TimeIndex:
        """Read ``path``; raises FileNotFoundError or CorruptIndexError."""
        raw = cls._read(path)
        index = cls(path, base_offset)
        for ts, rel in _TIME_ENTRY.iter_unpack(raw):
            index._timestamps.append(ts)
            index._offsets.append(rel)
        if index._offsets:
            if index._offsets[0] < 0:
                raise CorruptIndexError(f"{path.name}: negative offset")
            if not _strictly_increasing(index._timestamps) or any(
                a > b for a, b in pairwise(index._offsets)
            ):
                raise CorruptIndexError(f"{path.name}: entries are not increasing")
        return index

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add an entry if ``timestamp`` is larger than the last one (Kafka's rule)."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        if timestamp < 0:
            return  # no timestamp (-1): nothing to find by time
        rel = offset - self.base_offset
        self._timestamps.append(timestamp)
        self._offsets.append(rel)
        self._pending += _TIME_ENTRY.pack(timestamp, rel)

    def lookup(self, timestamp: int) -> int:
        """Offset of the last entry whose timestamp is <= ``timestamp``, else the base offset.
        Every batch before that offset's batch has only smaller timestamps."""
        i = bisect_right(self._timestamps, timestamp)
        return self.base_offset + self._offsets[i - 1] if i else self.base_offset

    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, absolute offset) of the last entry."""
        if not self._timestamps:
            return None
        return self._timestamps[-1], self.base_offset + self._offsets[-1]

    def rewrite(self) -> None:
        self._pending.clear()
        _write_file(
            self.path,
            b"".join(
                _TIME_ENTRY.pack(ts, rel)
                for ts, rel in zip(self._timestamps, self._offsets, strict=True)
            ),
            append=False,
        )
