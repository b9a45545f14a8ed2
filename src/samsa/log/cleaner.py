"""Log compaction (Kafka's ``LogCleaner``): keep the last record of each key.

Theory of operation
-------------------
A compacted log has a *clean* head (already compacted: below the cleaner checkpoint, the
``cleaner-offset-checkpoint`` file of the partition directory) and a *dirty* tail. A cleaning
runs when the dirty share of the cleanable bytes reaches ``min.cleanable.dirty.ratio``, or when
a dirty record is older than ``max.compaction.lag.ms``. It only touches whole segments below
the *first uncleanable offset*: the active segment's base, the last stable offset (an open
transaction may still abort) and the first segment with records younger than
``min.compaction.lag.ms``, whichever is lowest.

1. Plan (the log's own thread): the segments, the aborted transactions from the transaction
   index, the last offset of each producer (:meth:`LogCleaner.plan`).
2. Build (any thread, only file I/O on paths of its own, throttled to
   ``log.cleaner.io.max.bytes.per.second``): the *offset map* (key hash -> last offset) over
   the dirty segments, at most ``log.cleaner.dedupe.buffer.size / 24`` keys (Kafka's entry
   size; segments that do not fit wait for the next cleaning); then every segment from the log
   start to the end of the map is rewritten, in groups of at most ``segment.bytes``, into
   ``<base>-<end>.log.cleaned``, which is fsynced and renamed to ``<base>-<end>.log.swap``:
   that rename is the commit point of the group (:meth:`LogCleaner.build`).
3. Swap (the log's own thread): the old segments of ``[base, end)`` are deleted and the swap
   file renamed to ``<base>.log`` (:meth:`samsa.log.log.Log.replace_segments`). A crash at any
   point leaves a ``.cleaned`` file (deleted at load: the old segments are whole) or a
   ``.swap`` file (the load finishes the swap), so a log has the old or the new segments.

What is kept (as Kafka's cleaner decides, batch by batch, record by record):
- A record whose key has a later offset in the map is dropped; keyless records are dropped.
- Batches keep their base offset, producer id, epoch and base sequence: offsets and sequence
  numbers keep their gaps. A batch all of whose records went is removed, except the last
  batch of a producer, kept empty (header only) so its sequence survives a restart.
- Records of aborted transactions are dropped. A transaction marker may go once a cleaning
  saw no batch of its transaction; it goes at its delete horizon (below).
- Delete horizon (KIP-534, as Kafka 3.1+): the first cleaning that keeps a batch holding
  tombstones (null values), or a marker that may go, rewrites it with a *delete horizon* of
  that cleaning's time plus ``delete.retention.ms``: the batch header's base timestamp holds
  it, the ``isDeleteHorizonSet`` attribute bit (0x40) says so, and record timestamp deltas
  are taken from it, so record timestamps are unchanged. The first cleaning at or after the
  horizon removes the tombstones and the marker. A consumer reading to the end within
  ``delete.retention.ms`` of the first cleaning therefore sees the delete.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import crc32c

from samsa.log.durable import fsync_dir, write_durably
from samsa.log.loader import cleaned_file, swap_file
from samsa.log.log import Log
from samsa.log.segment import RECOVER_CHUNK, LogSegment
from samsa.log.txn_index import AbortedTxn
from samsa.protocol.records import (
    HEADER_SIZE,
    MAGIC_V2,
    Record,
    RecordBatchView,
    compress,
    decode_records,
    encode_record,
)

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"
_CHECKPOINT_VERSION = 0
MAP_ENTRY_BYTES = 24  # Kafka's SkimpyOffsetMap: a 16-byte key hash and an 8-byte offset
_AFTER_CRC = struct.Struct(">hiqqqhii")
DELETE_HORIZON_FLAG = 0x40  # Kafka's isDeleteHorizonSet batch attribute (KIP-534)
_LONG_MAX = 2**63 - 1  # delete.retention.ms may be that: the horizon saturates
_BEFORE_CRC = struct.Struct(">qiibI")


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """Broker-wide cleaner settings (Kafka's ``log.cleaner.*``)."""

    dedupe_buffer_size: int = 134_217_728  # log.cleaner.dedupe.buffer.size
    io_max_bytes_per_second: float = 1.7976931348623157e308  # log.cleaner.io.max.bytes...

    @property
    def map_capacity(self) -> int:
        return max(1, self.dedupe_buffer_size // MAP_ENTRY_BYTES)


@dataclass(slots=True)
class CleanerStats:
    """What the cleanings of one cleaner did (for logs, metrics and tests)."""

    cleanings: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0
    batches_removed: int = 0


@dataclass(frozen=True, slots=True)
class _Source:
    segment: LogSegment
    base: int
    end: int  # the next segment's base offset
    size: int


@dataclass(slots=True)
class CleaningPlan:
    log: Log
    sources: list[_Source]
    first_dirty: int  # index in sources of the first dirty segment
    aborted: list[AbortedTxn]
    producer_last_offsets: dict[int, int]
    now_ms: int
    dirty_ratio: float
    swaps: list[tuple[list[_Source], Path, int, int]] = field(default_factory=list)
    kept_markers: set[int] = field(default_factory=set)  # offsets of the markers kept
    map_end: int = -1  # the cleaner checkpoint once the swaps are in


def read_cleaner_checkpoint(directory: Path) -> int:
    try:
        version, offset = (directory / CLEANER_CHECKPOINT_FILE).read_text().split("\n")[:2]
        return int(offset) if int(version) == _CHECKPOINT_VERSION else 0
    except (FileNotFoundError, ValueError):
        return 0


def _write_cleaner_checkpoint(directory: Path, offset: int) -> None:
    write_durably(directory / CLEANER_CHECKPOINT_FILE, f"{_CHECKPOINT_VERSION}\n{offset}\n")


class _Throttle:
    """Sleeps so that bytes counted stay under ``rate`` per second (Kafka's Throttler)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.done = 0

    def account(self, n: int) -> None:
        self.done += n
        if self.rate >= 1e300:
            return
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


def _batches(path: Path, size: int, throttle: _Throttle) -> Iterator[RecordBatchView]:
    """Whole batches of a segment file, read in chunks through a descriptor of our own (the
    segment file cache belongs to the log's thread)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pos = 0
        need = RECOVER_CHUNK
        while pos < size:
            buf = os.pread(fd, min(need, size - pos), pos)
            throttle.account(len(buf))
            rel = 0
            while len(buf) - rel >= HEADER_SIZE:
                view = RecordBatchView(buf, rel)
                if view.magic != MAGIC_V2 or view.size < HEADER_SIZE:
                    raise ValueError(f"{path}: no batch at byte {pos + rel}")
                if rel + view.size > len(buf):
                    break
                yield view
                rel += view.size
            if rel == 0:
                if len(buf) < HEADER_SIZE:
                    raise ValueError(f"{path}: torn batch at byte {pos}")
                need = RecordBatchView(buf).size
                continue
            pos += rel
            need = RECOVER_CHUNK
    finally:
        os.close(fd)


def _key_hash(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


class _Transactions:
    """Kafka's CleanedTransactionMetadata: which batches belong to aborted transactions, and
    which markers no longer guard any batch, as the batches are met in offset order."""

    def __init__(self, aborted: list[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda e: e.first_offset)
        self._next = 0
        self._aborted: set[int] = set()  # producers in an aborted transaction here
        self._seen: set[int] = set()  # producers with a batch of their current transaction seen

    def _consume(self, offset: int) -> None:
        pending = self._pending
        while self._next < len(pending) and pending[self._next].first_offset <= offset:
            self._aborted.add(pending[self._next].producer_id)
            self._next += 1

    def on_batch(self, view: RecordBatchView) -> bool:
        """True if the data batch is part of an aborted transaction."""
        self._consume(view.last_offset)
        if not view.is_transactional:
            return False
        self._seen.add(view.producer_id)
        return view.producer_id in self._aborted

    def on_marker(self, view: RecordBatchView) -> bool:
        """True if the marker may go: this pass saw no batch of its transaction (a batch
        kept, even empty, must keep its marker, or a replay would find it still open)."""
        self._consume(view.last_offset)
        pid = view.producer_id
        self._aborted.discard(pid)
        if pid in self._seen:
            self._seen.discard(pid)
            return False
        return True


def _rebuild(
    view: RecordBatchView, records: list[Record], delete_horizon: int | None = None
) -> bytes:
    """The batch with only ``records``: same base offset, producer, epoch, base sequence and
    last offset delta (so offsets and sequences keep their gaps); no records: header only.
    With ``delete_horizon``, that is the base timestamp, flagged (KIP-534), and the record
    timestamps are stored relative to it, so they read back unchanged."""
    attributes, base_timestamp = view.attributes, view.base_timestamp
    if delete_horizon is not None:
        attributes, base_timestamp = attributes | DELETE_HORIZON_FLAG, delete_horizon
    body = b"".join(
        encode_record(
            r.offset - view.base_offset,
            r.timestamp - base_timestamp,
            r.key,
            r.value,
            r.headers,
        )
        for r in records
    )
    if records and view.compression:
        body = compress(view.compression, body)
    after_crc = (
        _AFTER_CRC.pack(
            attributes,
            view.last_offset_delta,
            base_timestamp,
            view.max_timestamp,
            view.producer_id,
            view.producer_epoch,
            view.base_sequence,
            len(records),
        )
        + body
    )
    return (
        _BEFORE_CRC.pack(
            view.base_offset,
            len(after_crc) + 9,
            view.partition_leader_epoch,
            MAGIC_V2,
            crc32c.crc32c(after_crc),
        )
        + after_crc
    )


class CleanerStoppedError(Exception):
    """The cleaner was shut down in the middle of a cleaning (its output is discarded)."""


class LogCleaner:
    """Compacts logs: :meth:`clean` does one cleaning in the calling thread; the broker runs
    :meth:`plan` and :meth:`LogCleaner.finish` on its event loop and :meth:`build` in a worker."""

    def __init__(self, config: CleanerConfig | None = None) -> None:
        self.config = config or CleanerConfig()
        self.stats = CleanerStats()
        self._stopping = threading.Event()

    def shutdown(self) -> None:
        """Make a cleaning under way stop at its next batch (Kafka aborts it at shutdown)."""
        self._stopping.set()

    def _check_stop(self) -> None:
        if self._stopping.is_set():
            raise CleanerStoppedError("the log cleaner is shutting down")

    # -- 1. plan (the log's thread) -------------------------------------------------------------

    def plan(self, plog: Log, now_ms: int) -> CleaningPlan | None:
        """What a cleaning of ``plog`` would rewrite now, or None if it needs none."""
        cfg = plog.config
        segments = plog.segments
        if len(segments) < 2:
            return None
        # The first uncleanable offset: the active segment, open transactions, young records.
        limit = min(segments[-1].base_offset, plog.last_stable_offset)
        sources: list[_Source] = []
        for seg, nxt in pairwise(segments):
            if nxt.base_offset > limit:
                break
            if cfg.min_compaction_lag_ms > 0 and seg.max_timestamp > now_ms - (
                cfg.min_compaction_lag_ms
            ):
                break
            sources.append(_Source(seg, seg.base_offset, nxt.base_offset, seg.size))
        if not sources:
            return None
        checkpoint = max(read_cleaner_checkpoint(plog.directory), plog.log_start_offset)
        first_dirty = next((i for i, s in enumerate(sources) if s.end > checkpoint), len(sources))
        if first_dirty == len(sources):
            return None  # nothing dirty below the first uncleanable offset
        dirty = sum(s.size for s in sources[first_dirty:])
        total = sum(s.size for s in sources)
        ratio = dirty / total if total else 0.0
        overdue = cfg.max_compaction_lag_ms < 2**63 - 1 and self._first_timestamp(
            sources[first_dirty]
        ) <= now_ms - (cfg.max_compaction_lag_ms)
        if ratio < cfg.min_cleanable_dirty_ratio and not overdue:
            return None
        aborted = plog.txn_index.collect(sources[0].base, sources[-1].end)
        last_offsets = {e.producer_id: e.last_offset for e in plog.producer_state.entries()}
        return CleaningPlan(plog, sources, first_dirty, aborted, last_offsets, now_ms, ratio)

    @staticmethod
    def _first_timestamp(source: _Source) -> int:
        try:
            with open(source.segment.path, "rb") as f:
                header = f.read(HEADER_SIZE)
            first = RecordBatchView(header)
            # A delete horizon is no record's time: then the batch's newest record's (Kafka).
            if first.attributes & DELETE_HORIZON_FLAG:
                return first.max_timestamp
            return first.base_timestamp
        except (OSError, ValueError):
            return 2**63 - 1

    # -- 2. build (any thread) ------------------------------------------------------------------

    def build(self, plan: CleaningPlan) -> None:
        """Write the cleaned segments and commit each group as a ``.swap`` file."""
        throttle = _Throttle(self.config.io_max_bytes_per_second)
        offset_map, mapped = self._build_offset_map(plan, throttle)
        if mapped <= plan.first_dirty:
            log.warning(
                "%s: the offset map (log.cleaner.dedupe.buffer.size) cannot hold the keys of "
                "one segment; not cleaned",
                plan.log.directory,
            )
            return
        to_clean = plan.sources[:mapped]
        txns = _Transactions(plan.aborted)
        directory = plan.log.directory
        for group in self._groups(to_clean, plan.log.config.segment_bytes):
            base, end = group[0].base, group[-1].end
            cleaned = cleaned_file(directory, base, end)
            fd = os.open(cleaned, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                for source in group:
                    for view in _batches(source.segment.path, source.size, throttle):
                        self._check_stop()
                        self.stats.bytes_read += view.size
                        data = self._filter(plan, view, offset_map, txns)
                        if data:
                            os.write(fd, data)
                            throttle.account(len(data))
                            self.stats.bytes_written += len(data)
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                cleaned.unlink(missing_ok=True)
                raise
            os.close(fd)
            swap = swap_file(directory, base, end)
            os.rename(cleaned, swap)  # the commit point of this group
            fsync_dir(directory)
            plan.swaps.append((group, swap, base, end))
        plan.map_end = to_clean[-1].end

    def _build_offset_map(
        self, plan: CleaningPlan, throttle: _Throttle
    ) -> tuple[dict[bytes, int], int]:
        """Key hash -> last offset over the dirty segments that fit in the map; and the index
        of the first source not mapped."""
        capacity = self.config.map_capacity
        offset_map: dict[bytes, int] = {}
        first = plan.sources[plan.first_dirty].base
        txns = _Transactions([e for e in plan.aborted if e.last_offset >= first])
        mapped = plan.first_dirty
        for i in range(plan.first_dirty, len(plan.sources)):
            source = plan.sources[i]
            added: dict[bytes, int] = {}
            for view in _batches(source.segment.path, source.size, throttle):
                self._check_stop()
                if view.is_control:
                    txns.on_marker(view)
                    continue
                if txns.on_batch(view) or view.record_count == 0:
                    continue
                for record in decode_records(view):
                    if record.key is not None:
                        added[_key_hash(record.key)] = record.offset
            new_keys = sum(1 for k in added if k not in offset_map)
            if len(offset_map) + new_keys > capacity:
                break
            offset_map.update(added)
            mapped = i + 1
        return offset_map, mapped

    @staticmethod
    def _groups(sources: list[_Source], segment_bytes: int) -> Iterator[list[_Source]]:
        """Consecutive segments whose sizes add up to at most ``segment_bytes`` (at least one),
        with offsets that fit one segment's 32-bit relative offsets."""
        group: list[_Source] = []
        size = 0
        for s in sources:
            if group and (size + s.size > segment_bytes or s.end - group[0].base > 2**31 - 1):
                yield group
                group, size = [], 0
            group.append(s)
            size += s.size
        if group:
            yield group

    def _filter(
        self,
        plan: CleaningPlan,
        view: RecordBatchView,
        offset_map: dict[bytes, int],
        txns: _Transactions,
    ) -> bytes | None:
        """The batch as it is to be written to the cleaned segment, or None if it goes."""
        horizon = view.base_timestamp if view.attributes & DELETE_HORIZON_FLAG else None
        past_horizon = horizon is not None and horizon <= plan.now_ms
        new_horizon = plan.now_ms + plan.log.config.delete_retention_ms
        if view.is_control:
            if txns.on_marker(view):  # no batch of its transaction left: it goes at its horizon
                if past_horizon:
                    self.stats.batches_removed += 1
                    return None
                if horizon is None:
                    plan.kept_markers.add(view.base_offset)
                    return _rebuild(view, decode_records(view), min(new_horizon, _LONG_MAX))
            plan.kept_markers.add(view.base_offset)
            return view.to_bytes()
        aborted = txns.on_batch(view)
        if aborted or view.record_count == 0:
            records: list[Record] = []
            removed = view.record_count
        else:
            all_records = decode_records(view)
            records = [
                r
                for r in all_records
                if r.key is not None
                and offset_map.get(_key_hash(r.key), -1) <= r.offset
                and not (r.value is None and past_horizon)
            ]
            removed = len(all_records) - len(records)
        # Tombstones kept by their first cleaning get their delete horizon.
        stamp = horizon is None and any(r.value is None for r in records)
        if records and not removed and not stamp:
            return view.to_bytes()
        self.stats.records_removed += removed
        if records:
            return _rebuild(view, records, min(new_horizon, _LONG_MAX) if stamp else None)
        if view.producer_id >= 0 and plan.producer_last_offsets.get(view.producer_id) == (
            view.last_offset
        ):
            return _rebuild(view, [])  # the producer's last batch: its sequence must survive
        self.stats.batches_removed += 1
        return None

    # -- 3. swap (the log's thread) -------------------------------------------------------------

    def finish(self, plan: CleaningPlan) -> bool:
        """Swap the cleaned segments in; False if the log changed meanwhile (the swap files
        are then removed, as if the cleaning never happened)."""
        plog = plan.log
        done = True
        for group, swap, base, end in plan.swaps:
            old = [s.segment for s in group]
            if done and plog.replace_segments(old, swap, base, end, plan.kept_markers):
                continue
            done = False
            swap.unlink(missing_ok=True)
        if done and plan.map_end >= 0:
            _write_cleaner_checkpoint(plog.directory, plan.map_end)
            self.stats.cleanings += 1
            log.info(
                "%s: cleaned offsets %d-%d (dirty ratio %.2f) into %d segment(s)",
                plog.directory,
                plan.sources[0].base,
                plan.map_end,
                plan.dirty_ratio,
                len(plan.swaps),
            )
        return done

    def clean(self, plog: Log, now_ms: int) -> bool:
        """One whole cleaning of ``plog`` in the calling thread; True if it rewrote anything."""
        plan = self.plan(plog, now_ms)
        if plan is None:
            return False
        try:
            self.build(plan)
        finally:
            done = self.finish(plan)  # swaps already committed must be swapped in
        return done and plan.map_end >= 0
