"""The aborted-transaction index: ``<base offset>.txnindex`` beside each segment.

A read_committed consumer must drop the records of aborted transactions. The broker does
not filter them out of the batches it returns; it sends, with each fetched range, the list
of aborted transactions (producer id, first offset) overlapping it, and the client skips
that producer's records from the first offset until it meets the ABORT marker.

Each entry is Kafka's: version int16 (0), producer id int64, first offset int64, last
offset int64 (the marker's), last stable offset int64, 34 bytes. An entry lives in the
segment that holds its marker, so the transactions overlapping ``[start, end)`` are in the
segments from the one holding ``start`` on. The entries of a partition are few (one per
aborted transaction), so all of them are kept in memory, sorted by marker offset, and the
files are only read at start-up and appended to.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

TXN_INDEX_SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")
_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def txn_index_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{TXN_INDEX_SUFFIX}"


def read_txn_index(path: Path) -> list[AbortedTxn]:
    """Entries of one file; a torn last entry (a crash mid-append) is ignored."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for pos in range(0, len(data) - _ENTRY.size + 1, _ENTRY.size):
        version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
        if version != _VERSION or first > last:
            break  # garbage: keep what came before it
        out.append(AbortedTxn(pid, first, last, lso))
    return out


class TransactionIndex:
    """All aborted transactions of one partition, backed by per-segment files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._entries: list[AbortedTxn] = []  # sorted by last_offset
        self._lasts: list[int] = []

    def load(self, segment_bases: list[int], below: int) -> None:
        """Read the files of ``segment_bases``, keeping entries whose marker is below
        ``below``: entries at or above it are rebuilt by replaying the log from there."""
        entries: list[AbortedTxn] = []
        for base in segment_bases:
            entries.extend(e for e in read_txn_index(txn_index_path(self.directory, base)))
        entries.sort(key=lambda e: e.last_offset)
        self._entries = [e for e in entries if e.last_offset < below]
        self._lasts = [e.last_offset for e in self._entries]
        if len(self._entries) != len(entries):
            self._rewrite(segment_bases)

    def _rewrite(self, segment_bases: list[int]) -> None:
        """Make the files hold exactly the in-memory entries (after truncation)."""
        for i, base in enumerate(segment_bases):
            upper = segment_bases[i + 1] if i + 1 < len(segment_bases) else None
            kept = [
                e
                for e in self._entries
                if e.last_offset >= base and (upper is None or e.last_offset < upper)
            ]
            path = txn_index_path(self.directory, base)
            if not kept:
                path.unlink(missing_ok=True)
                continue
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(b"".join(_pack(e) for e in kept))
            os.replace(tmp, path)

    def drop_range(
        self, start: int, end: int, segment_bases: list[int], kept_markers: set[int]
    ) -> None:
        """Forget the entries whose markers in ``[start, end)`` the cleaner removed, and
        rewrite the files (the new segment's file, which the swap removed, included)."""
        kept = [
            e
            for e in self._entries
            if not start <= e.last_offset < end or e.last_offset in kept_markers
        ]
        self._entries = kept
        self._lasts = [e.last_offset for e in kept]
        self._rewrite(segment_bases)

    def append(self, segment_base: int, entry: AbortedTxn) -> None:
        """Record an aborted transaction whose marker is in the segment ``segment_base``."""
        fd = os.open(
            txn_index_path(self.directory, segment_base),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
            0o644,
        )
        try:
            os.write(fd, _pack(entry))
        finally:
            os.close(fd)
        self._entries.append(entry)
        self._lasts.append(entry.last_offset)

    def collect(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping ``[start_offset, upper_bound_offset)``."""
        i = bisect_left(self._lasts, start_offset)
        return [e for e in self._entries[i:] if e.first_offset < upper_bound_offset]

    def __len__(self) -> int:
        return len(self._entries)


def _pack(e: AbortedTxn) -> bytes:
    return _ENTRY.pack(_VERSION, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
