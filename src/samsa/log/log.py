"""The partition log (Kafka's ``UnifiedLog``/``LocalLog`` for one partition directory).

Theory of operation
-------------------
A partition is a directory of segments ``<20-digit base offset>.log``, each with a sparse offset
index and time index, plus producer-state snapshots ``<offset>.snapshot``. Its recovery point
and, between a clean close and the next open, its clean-shutdown marker are kept, as in Kafka,
in files its data directory's partitions share (:class:`LogDir`); a log opened on its own keeps
them in its directory.

Append (event-loop thread): size check; producer-state ``prepare_update`` for batches with a
producer id, which may answer "duplicate" (original offsets, nothing written) or an error
(nothing written); roll to a new segment if the batch would overflow ``segment_bytes`` or the
int32 relative offsets (snapshotting producer state at the new base offset); one ``os.writev``
of the 8-byte base offset and the rest of the batch, untouched, so the batch is in the kernel
before ``append`` returns and survives ``kill -9``; index bookkeeping in memory; and only then
producer-state ``update``. A failed write is cut back off the file, so a batch is all or nothing.

Flush (any thread, usually a worker): under the lock it only notes the log end offset, the
segments written since the last flush and their pending index bytes; the fsyncs happen outside
the lock while appends go on. The recovery point becomes that offset. Its checkpoint only
matters at segment granularity (recovery rescans from the segment holding it), so it is written,
after syncing the indexes of the segments it moves past, only when it enters a new segment, and
after close: fsync-per-append costs one ``fdatasync``. A close with nothing appended since the
last flush fsyncs nothing (Kafka's ``flush`` skips such a log too), and writes no producer-state
snapshot if one is already at the log end.

Read (event-loop thread): the segment holding the offset is found by bisection on base offsets,
the batch holding it by the offset index plus a short header walk, the end by the byte budget,
``max_offset`` and the high watermark, rounded down to a batch boundary (or one whole batch if
``min_one_batch``); each segment's part is a single ``os.pread``.

Open runs :mod:`samsa.log.loader`: recovery of whatever was not known to be flushed, then
producer state from the newest valid snapshot plus the log after it.

Compaction (``cleanup.policy=compact``) is :mod:`samsa.log.cleaner`'s; the log only swaps the
cleaned segments in (:meth:`Log.replace_segments`), and refuses keyless records.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
import struct
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import crc32c

from samsa.log.durable import fsync_dir, write_durably
from samsa.log.index import INT32_MAX
from samsa.log.loader import (
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_FILE,
    LoadReport,
    SharedState,
    batch_append_of,
    complete_swap,
    load_log,
    read_offset_file,
    read_offsets_checkpoint,
    take_marker,
    write_clean_shutdown,
    write_offsets_checkpoint,
    write_recovery_point,
)
from samsa.log.producer_state import AppendOrigin, Duplicate, ProducerStateManager, Rejected
from samsa.log.segment import FileSlice, LogSegment, TimestampProbe
from samsa.log.snapshot import delete_snapshots_below, write_snapshot
from samsa.log.txn_index import AbortedTxn, TransactionIndex
from samsa.log.validator import CheckedBatch, check_client_batch
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    CRC_START,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_FLAG,
    ControlType,
    RecordBatchView,
    build_control_batch,
)

log = logging.getLogger(__name__)

# Kafka keeps the log start offset in a checkpoint file so DeleteRecords survives a restart:
# one per data directory (LogDir) in the recovery point's format, naming the partitions whose
# start is not their first segment's base; a log opened on its own keeps its own.
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
_ATTRIBUTES_AT = CRC_START  # the CRC-32C covers the batch from its attributes on
_MAX_TIMESTAMP_AT = CRC_START + 2 + 4 + 8  # attributes, lastOffsetDelta, baseTimestamp
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_JITTER = random.Random()  # segment.jitter.ms draws (not security relevant)
# A data directory's partition: what its shared checkpoint's "topic partition" lines can name.
_PARTITION_NAME = re.compile(r"^\S+-\d+$")


def with_log_append_time(batch: RecordBatchView, now_ms: int) -> RecordBatchView:
    """The batch as Kafka stores it under ``message.timestamp.type=LogAppendTime`` (rule 30): the
    timestamp-type bit set, the max timestamp the append time (which every record then
    shows), and the CRC recomputed; the records themselves are untouched."""
    data = bytearray(memoryview(batch.buf)[batch.pos : batch.pos + batch.size])
    _I16.pack_into(data, _ATTRIBUTES_AT, batch.attributes | TIMESTAMP_TYPE_FLAG)
    _I64.pack_into(data, _MAX_TIMESTAMP_AT, now_ms)
    _U32.pack_into(data, CRC_START - 4, crc32c.crc32c(memoryview(data)[CRC_START:]))
    return RecordBatchView(bytes(data))


def read_log_start_offset(directory: Path) -> int | None:
    return read_offset_file(directory / LOG_START_OFFSET_FILE)


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1_073_741_824  # log.segment.bytes
    index_interval_bytes: int = 4096
    # flush.messages / flush.ms (log.flush.interval.*): an append leaving this many records,
    # or records this old, unflushed makes an fsync due before the ack (rule 42).
    flush_interval_messages: int = 2**63 - 1
    flush_ms: int = 2**63 - 1
    producer_id_expiration_ms: int = 86_400_000
    max_message_bytes: int = 1_048_588  # message.max.bytes: larger batches get MESSAGE_TOO_LARGE
    # message.max.inflated.bytes: a client batch whose records inflate to more is refused
    # (MESSAGE_TOO_LARGE); bounds the CPU a decompression bomb can take (log/validator.py).
    max_inflated_bytes: int = 64 * 1024 * 1024
    retention_ms: int = 604_800_000  # log.retention.ms (168 hours); -1: keep forever
    retention_bytes: int = -1  # log.retention.bytes; -1: no size limit
    # cleanup.policy: "delete", "compact", "compact,delete" or "" (neither: the log is kept).
    cleanup_policy: str = "delete"
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = 2**63 - 1  # max.compaction.lag.ms
    delete_retention_ms: int = 86_400_000  # delete.retention.ms: how long tombstones stay
    segment_ms: int = 604_800_000  # segment.ms (log.roll.hours=168): roll an older segment
    # message.timestamp.type: "LogAppendTime" stamps each batch with the broker's clock.
    message_timestamp_type: str = "CreateTime"
    # compression.type: the codec batches are stored in ("producer": the batch's own), and
    # the KIP-390 levels a re-encode uses (rule 39, log/validator.py).
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    # min.insync.replicas: an acks=all Produce needs this many in-sync replicas; one here.
    min_insync_replicas: int = 1
    # segment.jitter.ms: each segment rolls up to a random share of this before segment.ms.
    segment_jitter_ms: int = 0
    # Kafka topic configs whose meaning is trivially true for one broker holding the only
    # replica, or that samsa's storage does not need: validated, kept, described (rule 43).
    unclean_leader_election_enable: bool = False
    leader_replication_throttled_replicas: str = ""
    follower_replication_throttled_replicas: str = ""
    message_downconversion_enable: bool = True
    preallocate: bool = False
    segment_index_bytes: int = 10_485_760
    file_delete_delay_ms: int = 60_000
    remote_storage_enable: bool = False
    # Tiered storage and share-group dead-letter keys: only Kafka's defaults are accepted.
    remote_copy_lag_ms: int = 0
    remote_copy_lag_bytes: int = -1
    remote_log_copy_disable: bool = False
    remote_log_delete_on_disable: bool = False
    errors_deadletterqueue_group_enable: bool = False
    max_decompressed_message_bytes: int = 2147483639  # per record, Kafka's; samsa: D-REC-2
    local_retention_ms: int = -2
    local_retention_bytes: int = -2
    # KIP-937: the CreateTime window around the broker's clock (rule 41); Kafka 4's defaults.
    message_timestamp_before_max_ms: int = 2**63 - 1
    message_timestamp_after_max_ms: int = 3_600_000

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy.split(",")


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode  # ErrorCode.NONE on success or duplicate
    base_offset: int = -1  # assigned base offset, or the ORIGINAL base offset of a duplicate
    last_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    duplicate: bool = False
    message: str | None = None
    # (batch index, message) per refused record (Kafka's RecordError): keyless records on a
    # compacted topic, timestamps out of the window
    record_errors: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ReadResult:
    chunks: list[bytes | FileSlice]  # whole batches, in order, for a Fetch response
    size: int  # total bytes
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int  # == high watermark until transactions exist


def release_chunks(chunks: Iterable[object]) -> None:
    """Unpin the :class:`FileSlice` items of a read's chunks (bytes need nothing)."""
    for chunk in chunks:
        if isinstance(chunk, FileSlice):
            chunk.release()


class OffsetOutOfRangeError(Exception):
    """A fetch offset below the log start or above the log end (OFFSET_OUT_OF_RANGE)."""


class Log:
    """One partition's log. Appends and reads belong to one thread; ``flush`` may run on
    another."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        now_ms: int,
        log_dir: LogDir | None = None,
        shared: SharedState | None = None,
        checkpointed_start: int | None = None,
    ) -> None:
        loaded = load_log(
            directory,
            index_interval_bytes=config.index_interval_bytes,
            producer_id_expiration_ms=config.producer_id_expiration_ms,
            now_ms=now_ms,
            shared=shared if log_dir is not None else None,
        )
        self.directory = directory
        # Owner of the shared checkpoint and marker; None: this log's own files (see close).
        self._log_dir = log_dir
        self.config = config
        self.producer_state: ProducerStateManager = loaded.producer_state
        self.txn_index: TransactionIndex = loaded.txn_index
        self.log_end_offset = loaded.log_end_offset
        # DeleteRecords may have moved the start past the first segment's base (KIP-107): the
        # data directory's checkpoint or (samsa 0.1.0's layout, moved by LogDir.end_load) this
        # log's own file. The higher is the safer: a start never moves back.
        own_start = read_log_start_offset(directory)
        self.own_start_file = log_dir is not None and own_start is not None
        checkpointed = max(own_start or 0, checkpointed_start or 0)
        self.log_start_offset = max(
            loaded.log_start_offset, min(checkpointed, loaded.log_end_offset)
        )
        self.recovery_point = loaded.recovery_point
        self.unflushed_messages = 0
        self.unflushed_since_ms: int | None = None  # when the oldest unflushed append came
        self.load_report: LoadReport = loaded.report
        self._segments = loaded.segments
        self._bases = [s.base_offset for s in self._segments]
        self._active = self._segments[-1]
        # segment.ms: when the active segment was opened, and its first batch's max
        # timestamp (None: not looked up yet), Kafka's rollingBasedTimestamp.
        self._active_since = now_ms
        self._active_first_ts: int | None = None
        self._roll_jitter = self._new_roll_jitter()
        self._dirty = [s for s in self._segments if s.dirty]
        self._dir_dirty = loaded.created_segment
        # Base of the segment holding the checkpointed recovery point (see flush).
        self._checkpoint_base = self._segment_base(self.recovery_point)
        # The offset of a producer-state snapshot known to be on disk at the log end, if any.
        self._snapshot_end = (
            loaded.log_end_offset
            if loaded.report.snapshot_offset == loaded.log_end_offset
            else None
        )
        self._lock = threading.Lock()  # append/roll vs. flush bookkeeping
        self._flush_lock = threading.Lock()  # one flush at a time; close waits for it
        self._closed = False

    @classmethod
    def open(cls, directory: Path, config: LogConfig, now_ms: int) -> Log:
        """Open or create the log in ``directory``, recovering it if needed."""
        return cls(Path(directory), config, now_ms)

    @property
    def high_watermark(self) -> int:
        return self.log_end_offset  # single broker, no replication

    @property
    def last_stable_offset(self) -> int:
        """First offset of the earliest open transaction, else the high watermark (rule 17)."""
        first = self.producer_state.first_unstable_offset()
        return self.log_end_offset if first is None else first

    def aborted_transactions(
        self, start_offset: int, upper_bound_offset: int
    ) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping the range."""
        return [
            (e.producer_id, e.first_offset)
            for e in self.txn_index.collect(start_offset, upper_bound_offset)
        ]

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments)

    @property
    def size(self) -> int:
        """Bytes of record batches in the segments (as Kafka's UnifiedLog.size)."""
        return sum(s.size for s in self._segments)

    def __repr__(self) -> str:
        return (
            f"Log({self.directory}, start={self.log_start_offset}, end={self.log_end_offset}, "
            f"segments={len(self._segments)})"
        )

    # -- append ---------------------------------------------------------------------------------

    def append(
        self,
        batch: RecordBatchView,
        now_ms: int,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        checked: CheckedBatch | None = None,
    ) -> AppendResult:
        """Append one batch. A ``CLIENT`` batch (one that passed ``validate_produce_batch``)
        has its records checked (``checked``: already done, off the event loop, by
        ``check_client_batch``) and is judged against its producer's state; a
        ``COORDINATOR`` batch is not."""
        if self._closed:
            return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message="log is closed")
        append_time = -1
        if origin is AppendOrigin.CLIENT and not batch.is_control:
            if checked is None:
                checked = check_client_batch(batch, self.config, now_ms, self.directory.name)
            if checked.error != ErrorCode.NONE:
                return AppendResult(
                    checked.error,
                    log_start_offset=self.log_start_offset,
                    message=checked.message,
                    record_errors=checked.record_errors,
                )
            batch = checked.batch  # rule 39: in the topic's codec
        if self.config.log_append_time and not batch.is_control:
            batch = with_log_append_time(batch, now_ms)
            append_time = now_ms
        size = batch.batch_length + LOG_OVERHEAD
        if size > self.config.max_message_bytes:
            return self._too_large(size)
        info = None
        if batch.producer_id >= 0 and not batch.is_control:
            outcome = self.producer_state.prepare_update(batch_append_of(batch), now_ms, origin)
            if type(outcome) is Duplicate:
                # Kafka answers a duplicate with its original offsets and stored timestamp.
                return AppendResult(
                    ErrorCode.NONE,
                    outcome.first_offset,
                    outcome.last_offset,
                    outcome.timestamp_ms,
                    self.log_start_offset,
                    duplicate=True,
                )
            if type(outcome) is Rejected:
                return AppendResult(
                    outcome.error, log_start_offset=self.log_start_offset, message=outcome.message
                )
            info = outcome
        written = self._write(batch, size, now_ms)
        if isinstance(written, AppendResult):
            return written
        base, last = written
        if info is not None:
            self.producer_state.update(info, base, last)
        return AppendResult(ErrorCode.NONE, base, last, append_time, self.log_start_offset)

    def _too_large(self, size: int) -> AppendResult:
        return AppendResult(
            ErrorCode.MESSAGE_TOO_LARGE,
            log_start_offset=self.log_start_offset,
            message=f"batch of {size} bytes exceeds {self.config.max_message_bytes}",
        )

    def _write(
        self, batch: RecordBatchView, size: int, now_ms: int
    ) -> tuple[int, int] | AppendResult:
        """Assign offsets and write the batch to the active segment (rolling if needed)."""
        with self._lock:
            if self._closed:  # closed while the batch was being validated
                return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message="log is closed")
            base = self.log_end_offset
            last = base + batch.last_offset_delta
            seg = self._active
            try:
                if seg.size and (
                    seg.size + size > self.config.segment_bytes
                    or last - seg.base_offset > INT32_MAX
                    or self._waited_for_roll(seg, batch, now_ms)
                    > self.config.segment_ms - self._roll_jitter
                ):
                    seg = self._roll(base, now_ms)
                seg.append(batch, base, last)
            except OSError as exc:
                log.error("append to %s failed: %s", self.directory, exc)
                return AppendResult(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    log_start_offset=self.log_start_offset,
                    message=f"append failed: {exc}",
                )
            if not seg.dirty:
                seg.dirty = True
                self._dirty.append(seg)
            self.log_end_offset = last + 1
            self.unflushed_messages += batch.record_count
            if self.unflushed_since_ms is None:
                self.unflushed_since_ms = now_ms
        return base, last

    def append_end_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        now_ms: int,
    ) -> AppendResult:
        """Write a COMMIT or ABORT control batch for the producer's transaction (rule 16) and
        close it here: the last stable offset moves past it, and an aborted one is recorded in
        the aborted-transaction index for read_committed fetches."""
        if self._closed:
            return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message="log is closed")
        info = self.producer_state.prepare_end_txn(
            producer_id, producer_epoch, coordinator_epoch, commit
        )
        if isinstance(info, Rejected):
            return AppendResult(
                info.error, log_start_offset=self.log_start_offset, message=info.message
            )
        data = build_control_batch(
            ControlType.COMMIT if commit else ControlType.ABORT,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            now_ms=now_ms,
        )
        batch = RecordBatchView(data)
        written = self._write(batch, len(data), now_ms)
        if isinstance(written, AppendResult):
            return written
        base, _ = written
        completed = self.producer_state.complete_txn(info, base, now_ms)
        if completed is not None and completed.is_aborted:
            first_unstable = self.producer_state.first_unstable_offset()
            self.txn_index.append(
                self._active.base_offset,
                AbortedTxn(
                    producer_id,
                    completed.first_offset,
                    completed.last_offset,
                    base + 1 if first_unstable is None else first_unstable,
                ),
            )
        return AppendResult(ErrorCode.NONE, base, base, -1, self.log_start_offset)

    def _waited_for_roll(self, seg: LogSegment, batch: RecordBatchView, now_ms: int) -> int:
        """Kafka's ``timeWaitedForRoll`` (rule 29): how far the incoming batch's timestamp is
        past the active segment's first batch (or, with no timestamp there, how long the
        segment has been open); above ``segment.ms`` the append rolls."""
        if self._active_first_ts is None:
            first = next(seg.iter_batches_from(seg.base_offset), None)
            self._active_first_ts = first.max_timestamp if first is not None else -1
        if self._active_first_ts >= 0:
            return batch.max_timestamp - self._active_first_ts
        return now_ms - self._active_since

    def _new_roll_jitter(self) -> int:
        """How much sooner than segment.ms the new active segment rolls: as Kafka, a random
        share of ``segment.jitter.ms`` (below segment.ms), so partitions made together do not
        all roll at once."""
        jitter = min(self.config.segment_jitter_ms, self.config.segment_ms)
        return _JITTER.randrange(jitter) if jitter > 0 else 0

    def _roll(self, base_offset: int, now_ms: int) -> LogSegment:
        """Start a new active segment at ``base_offset`` (called under the lock)."""
        old = self._active
        seg = LogSegment.create(self.directory, base_offset, self.config.index_interval_bytes)
        old.seal()
        if not old.dirty:  # its sealing time-index entry still has to reach the file
            old.dirty = True
            self._dirty.append(old)
        self._segments.append(seg)
        self._bases.append(base_offset)
        self._active = seg
        self._active_since = now_ms
        self._active_first_ts = None
        self._roll_jitter = self._new_roll_jitter()
        self._dir_dirty = True
        try:
            write_snapshot(self.directory, base_offset, self.producer_state.entries())
        except OSError:
            # Only an optimisation for recovery, which falls back to an older snapshot.
            log.exception("cannot write the producer-state snapshot of %s", seg.path)
        log.info("rolled %s to a new segment at offset %d", self.directory, base_offset)
        return seg

    # -- read -----------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool = True,
        max_offset: int | None = None,
        zero_copy_min: int = 0,
        whole_batches: bool = True,
    ) -> ReadResult:
        """Whole batches from the one containing ``offset``: at most ``max_bytes`` (but one
        whole batch anyway if ``min_one_batch``, KIP-74), none holding offsets at or past
        ``max_offset`` or the high watermark. With ``zero_copy_min``, a run of batches of at
        least that many bytes comes as a pinned :class:`FileSlice` (for ``os.sendfile``)
        instead of bytes; the caller must release every slice.

        ``whole_batches=False`` reads as Kafka's LogSegment.read answers a Fetch: the bytes
        of one segment from that batch, cut at ``max_bytes`` even inside a batch (clients
        drop a partial last batch), so that a Fetch's size, its ``min_bytes`` test and
        what its later partitions may still take are Kafka's."""
        log_start = self.log_start_offset
        end = self.log_end_offset
        if offset < log_start or offset > end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{log_start}, {end}] of {self.directory}"
            )
        limit = end if max_offset is None else min(max_offset, end)
        chunks: list[bytes | FileSlice] = []
        total = 0
        try:
            if offset < limit:
                segments = self._segments
                bases = self._bases
                count = len(segments)
                i = max(bisect_right(bases, offset) - 1, 0)
                target = offset
                budget = max_bytes
                while i < count:
                    seg = segments[i]
                    if seg.base_offset >= limit:
                        break
                    found = seg.translate(target)
                    i += 1
                    if found is None:
                        if i < count:
                            target = bases[i]
                        continue
                    start, first = found
                    # Batches holding `limit` or later offsets are left out.
                    last = seg is self._active and limit >= end
                    if (i < count and bases[i] <= limit) or last:
                        stop = seg.size
                    else:
                        at_limit = seg.translate(limit)
                        stop = at_limit[0] if at_limit is not None else seg.size
                    if start >= stop:
                        break
                    want = start + max(budget, 0)
                    if not whole_batches:
                        if min_one_batch and not chunks:
                            want = max(want, start + first.size)
                        n = min(stop, want) - start
                        if n > 0:
                            chunks.append(self._read_run(seg, start, n, zero_copy_min))
                            total += n
                        break
                    stop_at = stop if want >= stop else seg.boundary_at_or_below(start, want)
                    if stop_at == start:
                        if not (min_one_batch and not chunks):
                            break
                        stop_at = start + first.size
                    n = stop_at - start
                    chunks.append(self._read_run(seg, start, n, zero_copy_min))
                    total += n
                    budget -= n
                    if stop_at < seg.size or budget <= 0 or i >= count:
                        break
                    target = bases[i]
        except BaseException:
            release_chunks(chunks)  # a later segment failed: unpin the slices taken
            raise
        return ReadResult(chunks, total, end, log_start, self.last_stable_offset)

    def bytes_to_end(self, offset: int, max_offset: int | None = None) -> int | None:
        """What Kafka's DelayedFetch counts for a parked Fetch at ``offset``: the bytes from
        the batch holding it to the high watermark (or ``max_offset``) when both are in one
        segment, 0 when there is nothing, None when ``offset`` is past that end or in an older
        segment than it (Kafka answers such a Fetch at once: the size is not worth measuring
        across files)."""
        limit = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        if offset > limit:
            return None
        if offset == limit:
            return 0
        bases = self._bases
        i = max(bisect_right(bases, offset) - 1, 0)
        if bisect_right(bases, limit) - 1 > i:
            return None
        seg = self._segments[i]
        found = seg.translate(offset)
        if found is None:
            return 0
        at_limit = seg.translate(limit)
        return (at_limit[0] if at_limit is not None else seg.size) - found[0]

    @staticmethod
    def _read_run(seg: LogSegment, start: int, n: int, zero_copy_min: int) -> bytes | FileSlice:
        if zero_copy_min and n >= zero_copy_min:
            return seg.read_slice(start, n)
        return seg.read(start, n)

    def verified_batches(self, on_damage: Callable[[str], None]) -> Iterator[RecordBatchView]:
        """Every whole batch from the log start whose CRC-32C matches, in order; damage is
        skipped and reported (:meth:`LogSegment.verified_batches`). For replays at start-up."""
        for seg in list(self._segments):
            yield from seg.verified_batches(on_damage)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """ListOffsets by time: (offset, timestamp) of the first record whose timestamp is
        >= ``timestamp_ms``, or None. Special values (-1 latest, -2 earliest) are the
        caller's to handle."""
        for probe in self.timestamp_probes(timestamp_ms):
            found = probe.search(timestamp_ms)
            if found is not None:
                return found
        return None

    def timestamp_probes(self, timestamp_ms: int) -> Iterator[TimestampProbe]:
        """The batches :meth:`offset_for_timestamp` searches, in order, to be searched by the
        caller (the broker searches heavy ones in a worker thread) until the first hit."""
        for seg in list(self._segments):
            if seg.max_timestamp >= timestamp_ms:
                yield from seg.timestamp_probes(timestamp_ms, self.log_start_offset)

    @property
    def max_timestamp(self) -> int:
        """The largest record timestamp in the log, -1 if it has none. ListOffsets
        MAX_TIMESTAMP (KIP-734) answers the first record at or after it, the earliest on ties."""
        return max((seg.max_timestamp for seg in list(self._segments)), default=-1)

    # -- durability and lifecycle ---------------------------------------------------------------

    def flush_due(self, now_ms: int) -> bool:
        """Whether what is appended must be fsynced now (rule 42): ``flush.messages`` records
        or more are unflushed, or the oldest unflushed append is ``flush.ms`` old."""
        if not self.unflushed_messages:
            return False
        cfg = self.config
        since = self.unflushed_since_ms
        return self.unflushed_messages >= cfg.flush_interval_messages or (
            since is not None and now_ms - since >= cfg.flush_ms
        )

    def _segment_base(self, offset: int) -> int:
        i = bisect_right(self._bases, offset) - 1
        return self._bases[max(i, 0)]

    def flush(self) -> None:
        """fsync everything appended so far and advance the recovery point to it."""
        with self._flush_lock:
            if self._closed:
                return
            self._flush_locked(closing=False)

    def _flush_locked(self, *, closing: bool) -> None:
        with self._lock:
            target = self.log_end_offset
            work = [(seg, seg.take_pending()) for seg in self._dirty]
            for seg, _ in work:
                seg.dirty = False
            self._dirty = []
            dir_dirty = self._dir_dirty
            self._dir_dirty = False
            self.unflushed_messages = 0
            self.unflushed_since_ms = None
            segments = list(self._segments)
            bases = list(self._bases)
        for seg, pending in work:
            seg.write_pending(pending)
            seg.fsync_data()
        if dir_dirty:
            fsync_dir(self.directory)  # new segment files must not vanish in a crash
        new_base = bases[max(bisect_right(bases, target) - 1, 0)]
        if closing or new_base != self._checkpoint_base:
            # Recovery will no longer rescan the segments below new_base: their indexes too
            # must be durable before the checkpoint says so.
            for seg in segments:
                if seg.index_unsynced and (seg.base_offset < new_base or closing):
                    seg.fsync_indexes()
            # Published only now: a shared checkpoint written by any thread reads it.
            self.recovery_point = target
            self._checkpoint_base = new_base
            if closing:
                return  # the checkpoint is written once the log is closed (see close)
            if self._log_dir is None:
                write_recovery_point(self.directory, target)
            else:
                self._log_dir.checkpoint()
        self.recovery_point = target

    def close(self, now_ms: int) -> None:
        """Flush what is not on disk yet, snapshot producer state at the log end, close the
        files. A log of a :class:`LogDir` leaves its recovery point and clean-shutdown marker
        to :meth:`LogDir.close`, written once for all its logs; a log opened on its own
        writes them in its directory."""
        with self._flush_lock:
            if self._closed:
                return
            with self._lock:
                self._closed = True  # no appends from here on
                active = self._active
                active.seal()  # as Kafka does: the time index records the max timestamp
                if not active.dirty:  # (a dirty one's index bytes go with its flush)
                    active.write_pending(active.take_pending())
            # Nothing appended since the last flush: nothing to sync, as Kafka's flush skips
            # such a log. What sealing or creating a segment wrote without records needs no
            # fsync either: a clean open checks the active segment, rebuilding bad indexes.
            if self._dirty or self.recovery_point != self.log_end_offset:
                self._flush_locked(closing=True)
            end = self.log_end_offset
            # As Kafka's takeSnapshot: none if one is at the log end already, or the segments
            # hold nothing to replay.
            if end not in (self._snapshot_end, self._segments[0].base_offset):
                write_snapshot(self.directory, end, self.producer_state.entries())
                self._snapshot_end = end
                delete_snapshots_below(self.directory, end)
            if self._log_dir is None:
                write_recovery_point(self.directory, end)
                write_clean_shutdown(self.directory, end)
            self._close_files()

    def _close_files(self) -> None:
        with self._lock:
            self._closed = True
            for seg in self._segments:
                seg.close()

    def delete(self) -> None:
        """Close without flushing and remove the partition directory."""
        with self._flush_lock:
            self._close_files()
        if self._log_dir is not None:
            self._log_dir.forget(self)
        shutil.rmtree(self.directory, ignore_errors=True)

    def apply_retention(self, now_ms: int) -> int:
        """Kafka's time, size and log-start-offset retention: delete the oldest segments,
        never the active one, whose newest record is older than ``retention_ms``, or while the
        rest of the log is still at least ``retention_bytes``, or that lie wholly below the log
        start offset. Returns how many segments went."""
        if not self._flush_lock.acquire(blocking=False):
            return 0  # a flush is using the segments: the next check does it
        try:
            if self._closed:
                return 0
            cfg = self.config
            with self._lock:
                total = sum(seg.size for seg in self._segments)
                doomed: list[LogSegment] = []
                for i, seg in enumerate(self._segments[:-1]):
                    newest = seg.max_timestamp
                    too_old = cfg.retention_ms >= 0 and 0 <= newest < now_ms - cfg.retention_ms
                    too_big = cfg.retention_bytes >= 0 and total - seg.size >= cfg.retention_bytes
                    # Wholly below the log start offset (left by a crash during DeleteRecords).
                    below_start = self._bases[i + 1] <= self.log_start_offset
                    if not (too_old or too_big or below_start):
                        break
                    doomed.append(seg)
                    total -= seg.size
                if not doomed:
                    return 0
                del self._segments[: len(doomed)]
                del self._bases[: len(doomed)]
                self._dirty = [seg for seg in self._dirty if seg not in doomed]
                # Never below where DeleteRecords moved it.
                self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
            for seg in doomed:
                seg.delete()
            fsync_dir(self.directory)
            # Producers with no record left are unknown again (rule 5), as after a restart.
            self.producer_state.remove_producers_below(self.log_start_offset)
            delete_snapshots_below(self.directory, self.log_start_offset)
            log.info(
                "%s: retention deleted %d segment(s); log start offset now %d",
                self.directory,
                len(doomed),
                self.log_start_offset,
            )
            return len(doomed)
        finally:
            self._flush_lock.release()

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords (KIP-107, rule 31): move the log start offset up to ``offset`` (at most the
        high watermark: the caller checks), durably, then delete the segments wholly below
        it, never the active one. Producer state is left to the usual expiration, as in
        Kafka. Returns the log start offset; OSError if the checkpoint cannot be written.

        Kafka answers once the start has moved in memory and checkpoints it every minute, so
        a crash can bring deleted records back (up to the first segment left). samsa answers
        once the checkpoint is durable; a log of a :class:`LogDir` has its data directory's
        written, once for all the partitions of a request under
        :meth:`LogDir.grouped_log_starts`."""
        log_dir = self._log_dir
        with self._flush_lock:
            if self._closed:
                raise OSError(f"log {self.directory} is closed")
            if offset <= self.log_start_offset:
                return self.log_start_offset
            if log_dir is None:
                # The checkpoint first: after a crash the start offset is never below it again.
                write_durably(self.directory / LOG_START_OFFSET_FILE, f"0\n{offset}\n")
            with self._lock:
                self.log_start_offset = offset
            if log_dir is None:
                self._delete_segments_below_start(offset)
                return offset
        log_dir.log_start_moved(self)
        return offset

    def delete_segments_below_start(self) -> None:
        """Delete the segments wholly below the log start offset, once it is checkpointed."""
        with self._flush_lock:
            if not self._closed:
                self._delete_segments_below_start(self.log_start_offset)

    def _delete_segments_below_start(self, offset: int) -> None:
        with self._lock:
            n = 0
            while n + 1 < len(self._segments) and self._bases[n + 1] <= offset:
                n += 1
            doomed = self._segments[:n]
            del self._segments[:n]
            del self._bases[:n]
            self._dirty = [seg for seg in self._dirty if seg not in doomed]
        for seg in doomed:
            seg.delete()
        if doomed:
            # No directory fsync: the start is checkpointed, so segments a crash brings back
            # lie below it, unread, and retention deletes them (below_start).
            delete_snapshots_below(self.directory, self._bases[0])
        log.info(
            "%s: records before %d deleted (%d segment(s)); log start offset now %d",
            self.directory,
            offset,
            len(doomed),
            offset,
        )

    def replace_segments(
        self, old: list[LogSegment], swap: Path, base: int, end: int, kept_markers: set[int]
    ) -> bool:
        """Swap a cleaned segment (``swap``, committed by the cleaner) in for the segments
        ``old`` holding ``[base, end)``, where only the transaction markers at
        ``kept_markers`` are left; False, touching nothing, if they are no longer the log's
        (closed, deleted by retention)."""
        with self._flush_lock:
            if self._closed:
                return False
            with self._lock:
                at = next((i for i, s in enumerate(self._segments) if s is old[0]), -1)
                if at < 0 or self._segments[at : at + len(old)] != old or old[-1] is self._active:
                    return False
                for seg in old:
                    seg.close()
                complete_swap(self.directory, swap, base, end)
                seg = LogSegment.open(self.directory, base, self.config.index_interval_bytes)
                seg.rebuild_indexes()
                self._segments[at : at + len(old)] = [seg]
                self._bases[at : at + len(old)] = [base]
                self._dirty = [s for s in self._dirty if s not in old]
                self.txn_index.drop_range(base, end, self._bases, kept_markers)
            return True

    def remove_expired_producers(self, now_ms: int) -> None:
        expired = self.producer_state.remove_expired_producers(now_ms)
        if expired:
            log.info("%s: expired %d producer(s)", self.directory, len(expired))


class LogDir:
    """The files a data directory's partitions share, as a Kafka log dir's: one recovery-point
    checkpoint for all of them (Kafka's ``recovery-point-offset-checkpoint`` format), one
    clean-shutdown marker, so a clean stop of N idle partitions writes two small files, not 2N
    (what the loader makes of them: :mod:`samsa.log.loader`), and one log-start-offset
    checkpoint (see :meth:`sync_log_starts`).

    :meth:`begin_load` takes the marker (read, then durably removed) and reads the checkpoint;
    the partitions found are opened with :meth:`open_log`, and :meth:`end_load` forgets what
    the files said of the partitions not opened and rewrites the checkpoint. From then on it
    is rewritten whenever a log's recovery point enters a new segment (flush, in the flushing
    thread), and by :meth:`close` once the logs are closed, followed by the marker. A log's
    recovery point is only published once what it covers is durable, so a checkpoint written
    by any thread at any time is safe to recover from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._logs: dict[str, Log] = {}
        self._lock = threading.Lock()  # one checkpoint write at a time; guards _logs
        # What the files said at start-up, for the partitions not opened yet (None: loaded).
        self._loading: dict[str, SharedState] | None = None
        # The names the checkpoint on disk holds: a new partition of one of them must not
        # inherit the recovery point of the partition it replaces.
        self._on_disk: set[str] = set()
        # The log-start-offset checkpoint: what it said at start-up (for the partitions not
        # opened yet), the names it holds, the logs whose start moved since it was written,
        # and how deep we are in grouped_log_starts.
        self._starts_loading: dict[str, int] = {}
        self._starts_read: dict[str, int] = {}
        self._starts_on_disk: set[str] = set()
        self._moved: dict[str, Log] = {}
        self._grouped = 0

    def begin_load(self) -> None:
        # Before any partition is opened: a crash from now on must not look clean.
        clean = take_marker(self.path / CLEAN_SHUTDOWN_FILE, read_offsets_checkpoint) or {}
        points = read_offsets_checkpoint(self.path / RECOVERY_POINT_FILE)
        self._on_disk = set(points)
        starts = read_offsets_checkpoint(self.path / LOG_START_OFFSET_FILE)
        self._starts_read, self._starts_loading = starts, dict(starts)
        self._starts_on_disk = set(starts)
        self._loading = {
            name: SharedState(points.get(name), clean.get(name))
            for name in points.keys() | clean.keys()
        }

    def end_load(self) -> None:
        """Start-up is over: nothing the files said applies to a partition made from now on,
        and the checkpoint holds exactly the open partitions. Then the recovery-point and
        log-start files of samsa 0.1.0's layout, now in the checkpoints, are removed."""
        self._loading = None
        self._starts_loading = {}
        self.checkpoint()
        with self._lock:
            migrated = [plog for plog in self._logs.values() if plog.load_report.own_files]
            starts = [plog for plog in self._logs.values() if plog.own_start_file]
        if starts or self._log_starts() != self._starts_read:
            self.checkpoint_log_starts()
        self._starts_read = {}
        for plog in migrated:
            # Not fsynced: should the file come back, the loader takes the lower point.
            (plog.directory / RECOVERY_POINT_FILE).unlink(missing_ok=True)
        for plog in starts:
            # Nor this: should it come back, its start is at most the checkpoint's.
            (plog.directory / LOG_START_OFFSET_FILE).unlink(missing_ok=True)
            plog.own_start_file = False
        if migrated or starts:
            log.info(
                "%s: %d partitions' checkpoints moved to the directory's",
                self.path,
                len({plog.directory.name for plog in migrated + starts}),
            )

    def open_log(self, directory: Path, config: LogConfig, now_ms: int) -> Log:
        """Open (or create) the partition in ``directory``, a ``<topic>-<partition>`` child
        of this data directory."""
        name = directory.name
        if directory.parent != self.path or not _PARTITION_NAME.match(name):
            raise ValueError(f"{directory} is not a <topic>-<partition> directory of {self.path}")
        loading = self._loading
        shared = loading.pop(name, None) if loading is not None else None
        start = self._starts_loading.pop(name, None)
        plog = Log(directory, config, now_ms, self, shared or SharedState(), start)
        with self._lock:
            self._logs[name] = plog
            stale = loading is None and name in self._on_disk
            stale_start = loading is None and name in self._starts_on_disk
        if stale:
            self.checkpoint()
        if stale_start:
            self.checkpoint_log_starts()
        return plog

    def forget(self, plog: Log) -> None:
        """``plog`` is gone (deleted): later checkpoints leave it out."""
        with self._lock:
            if self._logs.get(plog.directory.name) is plog:
                del self._logs[plog.directory.name]
                self._moved.pop(plog.directory.name, None)

    def checkpoint(self) -> None:
        """Write every open log's recovery point, durably (OSError if that fails)."""
        with self._lock:
            points = {name: plog.recovery_point for name, plog in self._logs.items()}
            write_offsets_checkpoint(self.path / RECOVERY_POINT_FILE, points)
            self._on_disk = set(points)

    # -- the log start offsets ------------------------------------------------------------

    def log_start_moved(self, plog: Log) -> None:
        """``plog``'s start moved up (DeleteRecords): checkpointed before this returns, or,
        under :meth:`grouped_log_starts`, when the group ends."""
        with self._lock:
            self._moved[plog.directory.name] = plog
        if not self._grouped:
            self.sync_log_starts()

    @contextmanager
    def grouped_log_starts(self) -> Iterator[None]:
        """Starts moved inside are checkpointed together on the way out (OSError if that
        fails): one write for a DeleteRecords of any number of partitions. Only for code that
        answers nobody before leaving (a handler on the event loop)."""
        self._grouped += 1
        try:
            yield
        finally:
            self._grouped -= 1
            if not self._grouped and self._moved:
                self.sync_log_starts()

    def sync_log_starts(self) -> None:
        """Write the checkpoint durably, then delete the segments the moved starts left
        wholly below them (in that order: after a crash a start never moves back)."""
        with self._lock:
            moved, self._moved = self._moved, {}
        try:
            self.checkpoint_log_starts()
        except OSError:
            with self._lock:
                self._moved = moved | self._moved  # tried again by the next write or close
            raise
        for plog in moved.values():
            plog.delete_segments_below_start()

    def _log_starts(self) -> dict[str, int]:
        # Every log started past 0, not only those past their first segment (Kafka's
        # filter): segments deleted below a start are not fsynced away (see Log).
        return {n: plog.log_start_offset for n, plog in self._logs.items() if plog.log_start_offset}

    def checkpoint_log_starts(self) -> None:
        """Write every open log's start offset (those past 0), durably (OSError if that
        fails)."""
        with self._lock:
            starts = self._log_starts()
            write_offsets_checkpoint(self.path / LOG_START_OFFSET_FILE, starts)
            self._starts_on_disk = set(starts)

    def close(self, closed: list[Log]) -> None:
        """After the logs are closed: the checkpoints, then the marker naming ``closed``, the
        logs closed cleanly, with their log end offsets (only those are opened as clean)."""
        self.checkpoint()
        if self._moved:  # a start whose checkpoint failed
            self.checkpoint_log_starts()
        write_offsets_checkpoint(
            self.path / CLEAN_SHUTDOWN_FILE,
            {plog.directory.name: plog.log_end_offset for plog in closed},
        )
