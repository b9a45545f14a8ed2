"""One log segment: ``<base offset>.log`` (record batches, back to back, exactly as produced
except for the base offset) with its sparse ``.index`` and ``.timeindex``.

Appends go straight to the file descriptor with one ``os.writev`` (the new base offset, then
the batch after its first 8 bytes), so the bytes are in the kernel when ``append`` returns.
Reads use ``os.pread``. Batch boundaries are found by walking 61-byte headers from the
nearest index entry, in blocks, never by decoding records.

Descriptors: a segment's ``.log`` file is opened on first use and kept open in
:data:`SEGMENT_FILES`, a process-wide cache of at most ``capacity`` descriptors (the broker sizes
it from ``log.max.open.files`` and the descriptor limit); when it is full, the least recently
used file is closed (CLOCK: one flag set per use, no lock on the hot path). So segments of
inactive partitions hold no descriptor, and 10,000 partitions run under a 1,024-descriptor limit.
Index files are never held open (read whole, appended by path). Descriptors are opened and
evicted on the thread that appends to and reads the logs (the broker's event loop); a flush on
another thread pins the descriptor it syncs, so eviction cannot close it under the ``fdatasync``.
A :class:`FileSlice` (bytes a Fetch response sends with ``os.sendfile``) pins its segment's
descriptor too; closing a pinned segment (deletion) defers ``os.close`` to the last unpin, so
a descriptor number is never reused under a send.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import crc32c

from samsa.log.durable import fsync_file
from samsa.log.index import INT32_MAX, CorruptIndexError, OffsetIndex, TimeIndex
from samsa.log.txn_index import txn_index_path
from samsa.protocol.record_check import find_timestamp
from samsa.protocol.records import (
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    TIMESTAMP_TYPE_FLAG,
    InvalidBatchError,
    RecordBatchView,
    scan_batches,
    stored_prefix,
)

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

WALK_BLOCK = 16 * 1024  # bytes read at a time when walking batch headers
RECOVER_CHUNK = 8 * 1024 * 1024  # bytes read at a time when recovery checks CRCs
# A samsa broker is the only leader its partitions ever have, so its leader epoch never moves
# from the first one; every batch it appends carries it, as a Kafka leader stamps its own.
LEADER_EPOCH = 0
# ListOffsets by time reads at most this much of one batch's inflated records; past it (a
# batch stored before message.max.inflated.bytes existed) the batch's own offset answers.
TIMESTAMP_SEARCH_LIMIT = 64 * 1024 * 1024

# A probe whose batch is compressed or larger than this is searched in a worker thread: its
# records may inflate to message.max.inflated.bytes, seconds of work on the event loop.
HEAVY_PROBE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class TimestampProbe:
    """One stored batch that may hold the answer of a ListOffsets by time. ``search`` reads
    only these bytes (no segment, no index), so it may run in a worker thread while the log
    goes on appending."""

    base_offset: int
    min_delta: int  # records before this offset delta are below the log start
    max_timestamp: int
    batch: bytes | None  # None: LogAppendTime, the header answers

    @property
    def heavy(self) -> bool:
        if self.batch is None:
            return False
        return len(self.batch) > HEAVY_PROBE_BYTES or RecordBatchView(self.batch).compression != 0

    def search(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the batch's first record at or after the log start whose
        timestamp is >= ``timestamp``; None if there is none."""
        first = self.base_offset + max(self.min_delta, 0)
        if self.batch is None:
            return first, self.max_timestamp
        try:  # streamed, bounded: no Python object per record (protocol/record_check.py)
            hit = find_timestamp(
                RecordBatchView(self.batch), timestamp, self.min_delta, TIMESTAMP_SEARCH_LIMIT
            )
        except InvalidBatchError:  # unreadable (or inflating too far): the batch's own
            return first, self.max_timestamp
        return None if hit is None else (self.base_offset + hit[0], hit[1])


# The header fields a CRC check needs: base offset, batch length, partition leader epoch,
# magic, crc, attributes, last offset delta (one unpack instead of the whole 61 bytes).
_CHECK_HEADER = struct.Struct(">qiibIhi")


def segment_file(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:020d}{suffix}"


DEFAULT_MAX_OPEN_FILES = 16_384  # log.max.open.files


class SegmentFileCache:
    """At most ``capacity`` open segment descriptors; the least recently used one is closed
    when another must be opened (CLOCK approximation of LRU: ``LogSegment._ref`` is set on
    every use, and eviction gives a referenced file a second chance)."""

    def __init__(self, capacity: int = DEFAULT_MAX_OPEN_FILES) -> None:
        self.capacity = max(1, capacity)
        self._open: OrderedDict[LogSegment, None] = OrderedDict()
        self._lock = threading.Lock()
        self.opens = 0  # descriptors opened (first use or reopen), for tests and benchmarks
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._open)

    def resize(self, capacity: int) -> None:
        with self._lock:
            self.capacity = max(1, capacity)
            self._make_room(0)

    def open(self, seg: LogSegment) -> int:
        """Open ``seg``'s file (it is closed), closing the least recently used if full."""
        with self._lock:
            if seg._fd >= 0:
                return seg._fd
            self._make_room(1)
            flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
            try:
                fd = os.open(seg.path, flags)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._open:
                    raise
                # Out of descriptors (connections took them): give back half of ours, once.
                log.warning(
                    "out of file descriptors opening %s; closing %d cached segment files",
                    seg.path,
                    len(self._open) // 2 + 1,
                )
                self._evict(len(self._open) // 2 + 1)
                fd = os.open(seg.path, flags)
            self.opens += 1
            seg._fd = fd
            self._open[seg] = None
            return fd

    def adopt(self, seg: LogSegment, fd: int) -> None:
        """Track a descriptor opened by ``LogSegment.create``."""
        with self._lock:
            self._make_room(1)
            seg._fd = fd
            self._open[seg] = None

    def pin(self, seg: LogSegment) -> int:
        """The open descriptor of ``seg``, which eviction will not close until ``unpin``; -1
        if it is closed (for use from a thread other than the logs' own)."""
        with self._lock:
            if seg._fd >= 0:
                seg._pins += 1
            return seg._fd

    def unpin(self, seg: LogSegment) -> None:
        with self._lock:
            seg._pins -= 1
            if not seg._pins and seg._orphan_fds:
                fds, seg._orphan_fds = seg._orphan_fds, []
                for fd in fds:
                    os.close(fd)

    def pin_open(self, seg: LogSegment) -> int:
        """Open ``seg``'s file if needed and pin it, for a :class:`FileSlice` (logs' thread)."""
        while True:
            fd = seg._file()
            with self._lock:
                # Closed in between by another thread (the cleaner swapping segments)? Again.
                if seg._fd == fd:
                    seg._pins += 1
                    return fd

    def close(self, seg: LogSegment) -> None:
        with self._lock:
            self._open.pop(seg, None)
            fd, seg._fd = seg._fd, -1
            if fd >= 0:
                if seg._pins:
                    # A FileSlice still sends from it (the segment was deleted or closed
                    # meanwhile): the last unpin closes it, so its number is never reused
                    # under a sendfile.
                    seg._orphan_fds.append(fd)
                else:
                    os.close(fd)

    def _make_room(self, n: int) -> None:
        excess = len(self._open) + n - self.capacity
        if excess > 0:
            self._evict(excess)

    def _evict(self, count: int) -> None:
        # Two passes at most: the first clears every reference flag it passes.
        lru = self._open
        budget = 2 * len(lru)
        while count > 0 and lru and budget > 0:
            budget -= 1
            seg = next(iter(lru))
            if seg._ref or seg._pins:
                seg._ref = False
                lru.move_to_end(seg)
                continue
            del lru[seg]
            fd, seg._fd = seg._fd, -1
            os.close(fd)
            self.evictions += 1
            count -= 1


SEGMENT_FILES = SegmentFileCache()


class FileSlice:
    """``size`` bytes at ``position`` of a segment's file, for a Fetch response to send with
    ``os.sendfile`` instead of reading them into Python (Kafka's ``FileRecords.writeTo``).
    The segment's descriptor stays pinned (not evicted, not closed, even if the segment is
    deleted) until :meth:`release`, which the writer must call once, sent or not."""

    __slots__ = ("fd", "position", "segment", "size")

    def __init__(self, segment: LogSegment, position: int, size: int) -> None:
        self.segment: LogSegment | None = segment
        self.fd = SEGMENT_FILES.pin_open(segment)
        self.position = position
        self.size = size

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The bytes, copied (for a connection that cannot sendfile, e.g. TLS)."""
        data = os.pread(self.fd, self.size, self.position)
        if len(data) != self.size:
            raise CorruptSegmentError(
                f"short read of {self.size} bytes at {self.position} (got {len(data)})"
            )
        return data

    def release(self) -> None:
        seg, self.segment = self.segment, None
        if seg is not None:
            SEGMENT_FILES.unpin(seg)

    def __repr__(self) -> str:
        return f"FileSlice({self.segment!r}, {self.position}, {self.size})"


class CorruptSegmentError(Exception):
    """Bytes that are not a batch where a batch must start (only after outside damage)."""


@dataclass(frozen=True, slots=True)
class RecoveryOutcome:
    valid_bytes: int
    truncated_bytes: int
    batches: int
    problem: str | None  # why bytes were cut off, if any were


class LogSegment:
    __slots__ = (
        "_fd",
        "_indexes_loaded",
        "_max_timestamp",
        "_offset_of_max_timestamp",
        "_orphan_fds",
        "_pins",
        "_ref",
        "base_offset",
        "bytes_since_last_index_entry",
        "directory",
        "dirty",
        "index_interval_bytes",
        "index_unsynced",
        "next_offset",
        "offset_index",
        "path",
        "size",
        "time_index",
    )

    def __init__(
        self, directory: Path, base_offset: int, size: int, index_interval_bytes: int
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.path = segment_file(directory, base_offset, LOG_SUFFIX)
        self._fd = -1  # open only while SEGMENT_FILES holds it
        self._ref = False
        self._pins = 0
        self._orphan_fds: list[int] = []  # closed while pinned: closed at the last unpin
        self.size = size
        self.index_interval_bytes = index_interval_bytes
        self.offset_index = OffsetIndex(
            segment_file(directory, base_offset, INDEX_SUFFIX), base_offset
        )
        self.time_index = TimeIndex(
            segment_file(directory, base_offset, TIME_INDEX_SUFFIX), base_offset
        )
        self._indexes_loaded = False
        self.next_offset: int | None = None  # known once the tail was walked, recovered or appended
        self._max_timestamp = -1
        self._offset_of_max_timestamp = base_offset
        self.bytes_since_last_index_entry = 0
        self.dirty = False  # appended since the last fsync (owned by Log, under its lock)
        self.index_unsynced = False  # index files written since their last fsync

    # -- opening and closing --------------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> LogSegment:
        path = segment_file(directory, base_offset, LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        seg = cls(directory, base_offset, 0, index_interval_bytes)
        SEGMENT_FILES.adopt(seg, fd)
        seg.offset_index.rewrite()  # empty files, so the directory always has all three
        seg.time_index.rewrite()
        seg._indexes_loaded = True
        seg.next_offset = base_offset
        seg.index_unsynced = True
        return seg

    @classmethod
    def open(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> LogSegment:
        """Open an existing segment; its file is opened and its indexes loaded on first use."""
        size = segment_file(directory, base_offset, LOG_SUFFIX).stat().st_size
        return cls(directory, base_offset, size, index_interval_bytes)

    def _file(self) -> int:
        """The descriptor of the ``.log`` file, opened through the cache if it is closed."""
        fd = self._fd
        if fd < 0:
            return SEGMENT_FILES.open(self)  # unreferenced until used again: goes first
        self._ref = True
        return fd

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    def close(self) -> None:
        SEGMENT_FILES.close(self)

    def delete(self) -> None:
        self.close()
        for p in (self.path, self.offset_index.path, self.time_index.path):
            p.unlink(missing_ok=True)
        txn_index_path(self.directory, self.base_offset).unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size})"

    # -- appending ------------------------------------------------------------------------------

    def append(self, batch: RecordBatchView, base_offset: int, last_offset: int) -> None:
        """Write ``batch`` at the end with its base offset and leader epoch stamped; indexes it
        if due."""
        pos = self.size
        start = batch.pos
        size = batch.batch_length + LOG_OVERHEAD
        try:
            prefix = stored_prefix(base_offset, batch.batch_length, LEADER_EPOCH)
            written = os.writev(
                self._file(), (prefix, memoryview(batch.buf)[start + len(prefix) : start + size])
            )
            if written != size:
                self._write_rest(batch, base_offset, written)
        except OSError:
            self._undo_write(pos)
            raise
        self._note_batch(pos, size, last_offset, batch.max_timestamp)

    def _write_rest(self, batch: RecordBatchView, base_offset: int, written: int) -> None:
        # Short writes on regular files are rare (a full disk); finish or fail the batch whole.
        prefix = stored_prefix(base_offset, batch.batch_length, LEADER_EPOCH)
        data = prefix + bytes(
            memoryview(batch.buf)[batch.pos + len(prefix) : batch.pos + batch.size]
        )
        while written < len(data):
            n = os.write(self._file(), data[written:])
            if n <= 0:
                raise OSError(f"no progress writing to {self.path}")
            written += n

    def _undo_write(self, pos: int) -> None:
        # A batch is on disk whole or not at all: cut whatever part of it reached the file.
        try:
            os.ftruncate(self._file(), pos)
        except OSError:
            log.exception("cannot truncate %s back to %d after a failed append", self.path, pos)

    def _note_batch(self, pos: int, size: int, last_offset: int, max_timestamp: int) -> None:
        """Index bookkeeping for a batch at ``pos`` (Kafka's rule: an entry once more than
        ``index_interval_bytes`` were written since the previous one)."""
        if max_timestamp > self._max_timestamp:
            self._max_timestamp = max_timestamp
            self._offset_of_max_timestamp = last_offset
        if self.bytes_since_last_index_entry > self.index_interval_bytes:
            self.offset_index.append(last_offset, pos)
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            self.bytes_since_last_index_entry = size
        else:
            self.bytes_since_last_index_entry += size
        self.size = pos + size
        self.next_offset = last_offset + 1

    def seal(self) -> None:
        """The segment stops being active: record its max timestamp in the time index."""
        self._ensure_indexes()
        self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)

    # -- flushing -------------------------------------------------------------------------------

    def take_pending(self) -> tuple[bytes, bytes]:
        """Index bytes not yet written (taken under the log's lock)."""
        return self.offset_index.take_pending(), self.time_index.take_pending()

    def write_pending(self, pending: tuple[bytes, bytes]) -> None:
        if pending[0] or pending[1]:
            self.offset_index.write_pending(pending[0])
            self.time_index.write_pending(pending[1])
            self.index_unsynced = True

    def fsync_data(self) -> None:
        """fdatasync the ``.log`` file; safe from a thread other than the log's own."""
        fd = SEGMENT_FILES.pin(self)
        if fd >= 0:
            try:
                os.fdatasync(fd)
            finally:
                SEGMENT_FILES.unpin(self)
            return
        # Closed by the cache: the written data is in the page cache, and a descriptor of our
        # own syncs it just as well (without touching the cache from this thread).
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def fsync_indexes(self) -> None:
        fsync_file(self.offset_index.path)
        fsync_file(self.time_index.path)
        self.index_unsynced = False

    # -- reading --------------------------------------------------------------------------------

    def read_slice(self, position: int, size: int) -> FileSlice:
        """Like :meth:`read`, but the bytes stay in the file until sent (a pinned slice)."""
        if position + size > self.size:
            raise CorruptSegmentError(
                f"{self.path}: slice of {size} bytes at {position} past the end ({self.size})"
            )
        return FileSlice(self, position, size)

    def read(self, position: int, size: int) -> bytes:
        data = os.pread(self._file(), size, position)
        if len(data) != size:
            raise CorruptSegmentError(
                f"{self.path}: short read of {size} bytes at {position} (got {len(data)})"
            )
        return data

    def _walk(self, start: int, end: int | None = None) -> Iterator[tuple[int, RecordBatchView]]:
        """(position, header view) of each batch from ``start`` (a batch boundary) to ``end``."""
        end = self.size if end is None else end
        pos = start
        block = b""
        block_start = start
        while pos < end:
            rel = pos - block_start
            if rel + HEADER_SIZE > len(block):
                block_start, rel = pos, 0
                block = os.pread(self._file(), max(HEADER_SIZE, min(WALK_BLOCK, end - pos)), pos)
                if len(block) < HEADER_SIZE:
                    raise CorruptSegmentError(f"{self.path}: torn batch header at byte {pos}")
            view = RecordBatchView(block, rel)
            if view.magic != MAGIC_V2 or view.batch_length < MIN_BATCH_LENGTH:
                raise CorruptSegmentError(f"{self.path}: no batch header at byte {pos}")
            if pos + view.size > end:
                raise CorruptSegmentError(f"{self.path}: torn batch at byte {pos}")
            yield pos, view
            pos += view.size

    def _walk_indexed(self, offset: int) -> Iterator[tuple[int, RecordBatchView]]:
        """``_walk`` from the index entry at or below ``offset``. The entry must name the batch
        that starts at its position; one that does not (a damaged index file: Kafka would
        read from the middle of a batch) gets the indexes rebuilt from the log, with a
        warning, and the walk starts from the rebuilt entry instead of failing every read of
        the range. Only the first batch is compared: no extra read."""
        self._ensure_indexes()
        entry = self.offset_index.lookup_entry(offset)
        if entry is None:
            yield from self._walk(0)
            return
        walk = self._walk(entry[1])
        try:
            first = next(walk, None)
        except CorruptSegmentError:
            first = None
        if first is not None and first[1].last_offset == entry[0]:
            yield first
            yield from walk
            return
        self._rebuild_off_boundary(entry)
        yield from self._walk(self.offset_index.lookup(offset))

    def _rebuild_off_boundary(self, entry: tuple[int, int]) -> None:
        log.warning(
            "rebuilding the indexes of %s: the entry for offset %d points at byte %d, "
            "which is not the start of that batch",
            self.path,
            entry[0],
            entry[1],
        )
        self.rebuild_indexes()

    def _is_batch_at(self, entry: tuple[int, int]) -> bool:
        """Does the batch at ``entry``'s position end at its offset (one header read)?"""
        offset, pos = entry
        header = os.pread(self._file(), HEADER_SIZE, pos)
        if len(header) < HEADER_SIZE:
            return False
        view = RecordBatchView(header)
        return (
            view.magic == MAGIC_V2
            and view.batch_length >= MIN_BATCH_LENGTH
            and view.last_offset == offset
        )

    def translate(self, offset: int) -> tuple[int, RecordBatchView] | None:
        """Position and header of the first batch whose last offset is >= ``offset`` (the batch
        containing it, or the next one), or None if the segment ends before ``offset``."""
        for pos, view in self._walk_indexed(offset):
            if view.base_offset + view.last_offset_delta >= offset:
                return pos, view
        return None

    def boundary_at_or_below(self, start: int, limit: int) -> int:
        """The last batch boundary in ``[start, limit]``; ``start`` must be a boundary."""
        if limit >= self.size:
            return self.size
        self._ensure_indexes()
        pos = start
        entry = self.offset_index.floor_entry(limit)
        if entry is not None and entry[1] > start:
            if not self._is_batch_at(entry):
                self._rebuild_off_boundary(entry)
                entry = self.offset_index.floor_entry(limit)
            pos = max(start, entry[1] if entry is not None else 0)
        for p, view in self._walk(pos):
            if p + view.size > limit:
                return p
        return self.size

    def iter_batches_from(self, offset: int, *, whole: bool = False) -> Iterator[RecordBatchView]:
        """Headers of the batches from the one containing ``offset`` to the end; with
        ``whole``, views over whole batches (for a CRC check)."""
        found = self.translate(offset)
        if found is None:
            return
        for pos, view in self._walk(found[0]):
            if (whole or view.is_control) and view.pos + view.size > len(view.buf):
                # Markers are decoded (their record says COMMIT or ABORT): give the whole batch.
                view = RecordBatchView(self.read(pos, view.size))
            yield view

    @property
    def max_timestamp(self) -> int:
        self._ensure_indexes()
        return self._max_timestamp

    def find_offset_by_timestamp(self, timestamp: int, start_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``start_offset`` whose timestamp
        is >= ``timestamp`` (Kafka's ListOffsets semantics), or None."""
        for probe in self.timestamp_probes(timestamp, start_offset):
            hit = probe.search(timestamp)
            if hit is not None:
                return hit
        return None

    def timestamp_probes(self, timestamp: int, start_offset: int) -> Iterator[TimestampProbe]:
        """The batches that may hold the first record at or after ``start_offset`` whose
        timestamp is >= ``timestamp``, in order, each read whole (bounded by the batch size).
        The time index skips to the first candidate; the caller searches each probe, and
        stops at the first hit."""
        self._ensure_indexes()
        from_offset = max(self.time_index.lookup(timestamp), start_offset)
        for pos, view in self._walk_indexed(from_offset):
            if view.max_timestamp < timestamp or view.last_offset < start_offset:
                continue
            base = view.base_offset
            if view.attributes & TIMESTAMP_TYPE_FLAG:
                # LogAppendTime: every record carries the batch's timestamp.
                yield TimestampProbe(base, start_offset - base, view.max_timestamp, None)
                return
            yield TimestampProbe(
                base, start_offset - base, view.max_timestamp, self.read(pos, view.size)
            )

    # -- indexes: loading and rebuilding --------------------------------------------------------

    def _ensure_indexes(self) -> None:
        if self._indexes_loaded:
            return
        try:
            offset_index = OffsetIndex.load(self.offset_index.path, self.base_offset, self.size)
            time_index = TimeIndex.load(self.time_index.path, self.base_offset)
            self._check_entries(offset_index)
        except FileNotFoundError as exc:
            reason = f"missing {Path(exc.filename or '?').name}"
        except CorruptIndexError as exc:
            reason = str(exc)
        else:
            self.offset_index = offset_index
            self.time_index = time_index
            self._indexes_loaded = True
            last_time = time_index.last_entry()
            if last_time is not None:
                self._max_timestamp, self._offset_of_max_timestamp = last_time
            return
        log.warning("rebuilding the indexes of %s: %s", self.path, reason)
        self.rebuild_indexes()

    def _check_entries(self, index: OffsetIndex) -> None:
        # Kafka's sanityCheck, and more: a structurally sound index may still point anywhere,
        # so its first and last entries must name real batch boundaries (two preads). An
        # entry in between that is off is caught when a lookup lands on it (_walk_indexed).
        for name, entry in (("first", index.first_entry()), ("last", index.last_entry())):
            if entry is not None and not self._is_batch_at(entry):
                raise CorruptIndexError(
                    f"{index.path.name}: {name} entry ({entry[0]} at byte {entry[1]}) "
                    "is not a batch of the log"
                )

    def _reset_indexes(self) -> None:
        self.offset_index = OffsetIndex(self.offset_index.path, self.base_offset)
        self.time_index = TimeIndex(self.time_index.path, self.base_offset)
        self._indexes_loaded = True
        self._max_timestamp = -1
        self._offset_of_max_timestamp = self.base_offset
        self.bytes_since_last_index_entry = 0
        self.next_offset = self.base_offset

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from the batch headers (no CRC check: the data is trusted)."""
        self._reset_indexes()
        size = self.size
        try:
            for pos, view in self._walk(0, size):
                self._note_batch(pos, view.size, view.last_offset, view.max_timestamp)
        except CorruptSegmentError as exc:
            log.error("indexes of %s only cover its first %d bytes: %s", self.path, self.size, exc)
        self.size = size
        self.offset_index.rewrite()
        self.time_index.rewrite()
        self.fsync_indexes()

    def load_tail(self) -> bool:
        """Find the next offset by walking from the last index entry to the end of the file
        (a clean open of the active segment). False if the tail is not whole batches."""
        self._ensure_indexes()
        last = self.offset_index.last_entry()
        start = last[1] if last is not None else 0
        next_offset = self.base_offset
        since = 0
        try:
            for pos, view in self._walk(start):
                next_offset = view.base_offset + view.last_offset_delta + 1
                since = pos + view.size - start
                if view.max_timestamp > self._max_timestamp:
                    self._max_timestamp = view.max_timestamp
                    self._offset_of_max_timestamp = next_offset - 1
        except CorruptSegmentError as exc:
            log.warning("tail of %s is damaged: %s", self.path, exc)
            return False
        self.next_offset = next_offset
        self.bytes_since_last_index_entry = since
        return True

    def verified_batches(self, on_damage: Callable[[str], None]) -> Iterator[RecordBatchView]:
        """Views over the whole batches of the segment whose CRC-32C matches, walked by byte
        position (offsets outside the CRC cannot send the walk astray). A batch that fails
        its check is skipped; bytes that are not a batch end the walk of this segment. Each
        is reported to ``on_damage`` where it happens. For whole-partition replays."""
        end = self.size
        pos = 0
        need = RECOVER_CHUNK
        while pos < end:
            buf = self.read(pos, min(need, end - pos))
            rel = 0
            while len(buf) - rel >= HEADER_SIZE:
                view = RecordBatchView(buf, rel)
                if (
                    view.magic != MAGIC_V2
                    or view.batch_length < MIN_BATCH_LENGTH
                    or (pos + rel + view.size > end)
                ):
                    on_damage(
                        f"{self.path}: no batch header at byte {pos + rel}: "
                        f"bytes {pos + rel}-{end} skipped"
                    )
                    return
                if rel + view.size > len(buf):
                    break
                if view.crc_is_valid():
                    yield view
                else:
                    on_damage(
                        f"{self.path}: the batch at byte {pos + rel} (offsets {view.base_offset}-"
                        f"{view.last_offset}) fails its CRC-32C check"
                    )
                rel += view.size
            if rel == 0:  # a batch larger than the read: read it whole
                need = RecordBatchView(buf).size if len(buf) >= HEADER_SIZE else HEADER_SIZE
                continue
            pos += rel
            need = RECOVER_CHUNK

    def check_crcs(self, min_offset: int) -> tuple[int, int, str | None]:
        """Check every batch as :meth:`recover` does (header, offsets, CRC-32C) without
        changing anything: (bytes of whole valid batches from the start, their count, the
        first problem or None). What a clean start runs on the active segment."""
        file_size = os.fstat(self._file()).st_size
        expected = max(min_offset, self.base_offset)
        pos = 0
        need = RECOVER_CHUNK
        batches = 0
        while pos < file_size:
            buf = os.pread(self._file(), min(need, file_size - pos), pos)
            mv = memoryview(buf)
            end = len(buf)
            rel = 0
            problem: str | None = None
            while end - rel >= HEADER_SIZE:
                base, length, _, magic, crc, _, delta = _CHECK_HEADER.unpack_from(buf, rel)
                if magic != MAGIC_V2 or length < MIN_BATCH_LENGTH:
                    problem = "invalid batch header"
                    break
                size = length + LOG_OVERHEAD
                if rel + size > end:
                    break  # cut by the end of this read
                if base < expected or delta < 0:
                    problem = f"offset {base} below expected {expected}"
                elif base + delta - self.base_offset > INT32_MAX:
                    problem = f"offset {base + delta} too far from base {self.base_offset}"
                elif crc32c.crc32c(mv[rel + CRC_START : rel + size]) != crc:
                    problem = "CRC mismatch"
                if problem is not None:
                    break
                expected = base + delta + 1
                batches += 1
                rel += size
            if problem is not None:
                return pos + rel, batches, f"{problem} at byte {pos + rel}"
            if rel == 0 and pos + end >= file_size:
                what = "torn batch header" if end < HEADER_SIZE else "torn batch"
                return pos, batches, f"{what} at byte {pos}"
            if rel == 0:  # one batch larger than a read: read it whole
                need = _CHECK_HEADER.unpack_from(buf, 0)[1] + LOG_OVERHEAD
                continue
            pos += rel
            need = RECOVER_CHUNK
        return pos, batches, None

    def recover(self, min_offset: int) -> RecoveryOutcome:
        """Check every batch (CRC included), cut the file after the last good one and rebuild
        the indexes. ``min_offset``: the first batch may not start below it."""
        self._reset_indexes()
        file_size = os.fstat(self._file()).st_size
        expected = max(min_offset, self.base_offset)
        pos = 0
        need = 0
        batches = 0
        problem: str | None = None
        while pos < file_size:
            buf = os.pread(self._file(), min(max(RECOVER_CHUNK, need), file_size - pos), pos)
            result = scan_batches(buf)
            bad: tuple[int, str] | None = None
            for view in result.batches:
                last = view.base_offset + view.last_offset_delta
                if view.base_offset < expected:
                    bad = (view.pos, f"offset {view.base_offset} below expected {expected}")
                elif last - self.base_offset > INT32_MAX:
                    bad = (view.pos, f"offset {last} too far from base {self.base_offset}")
                if bad is not None:
                    break
                self._note_batch(pos + view.pos, view.size, last, view.max_timestamp)
                expected = last + 1
                batches += 1
            if bad is not None:
                problem = f"{bad[1]} at byte {pos + bad[0]}"
                pos += bad[0]
                break
            valid = result.valid_bytes
            if result.problem is None:
                pos += valid
                need = 0
                continue
            if pos + len(buf) < file_size:
                # Maybe the batch is only cut by the end of this chunk: read on from it.
                rest = len(buf) - valid
                if rest < HEADER_SIZE:
                    pos += valid
                    need = 0
                    continue
                view = RecordBatchView(buf, valid)
                if (
                    view.magic == MAGIC_V2
                    and view.batch_length >= MIN_BATCH_LENGTH
                    and (valid + view.size > len(buf))
                ):
                    pos += valid
                    need = view.size
                    continue
            reason = result.problem.rsplit(" at byte ", 1)[0]
            pos += valid
            problem = f"{reason} at byte {pos}"
            break
        truncated = file_size - pos
        if truncated:
            os.ftruncate(self._file(), pos)
        self.size = pos
        self.offset_index.rewrite()
        self.time_index.rewrite()
        self.index_unsynced = True
        return RecoveryOutcome(pos, truncated, batches, problem)
