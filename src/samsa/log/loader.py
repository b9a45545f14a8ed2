"""Opening a partition directory: find the segments, repair what a crash may have damaged,
rebuild the producer state.

Theory of operation
-------------------
What is on disk after a crash: every batch that ``append`` wrote is in the file (it reached the
kernel before the append returned), but only data below the *recovery point* is known to have
been fsynced; after a power loss the tail of any later segment may hold a torn batch, garbage or
zeros. Index files are written lazily and are never trusted over the log.

1. Where the partition stands: its recovery point and, after a clean stop, the log end offset
   it was closed at. A broker's partitions share their data directory's files, as Kafka's
   log dirs do (:class:`samsa.log.log.LogDir`): one ``recovery-point-offset-checkpoint`` of
   ``topic partition offset`` lines, and one ``clean-shutdown`` marker of the same format,
   written once every partition was closed, naming each partition closed cleanly and its log
   end offset. The marker is read and removed, durably, before any partition is opened: a
   crash from now on must not look clean. A partition the marker does not name (created since,
   or whose close failed) is recovered; one the checkpoint does not name is scanned from its
   first segment. A log opened on its own (a tool, a test) keeps both files in its own
   directory, in the one-offset format samsa 0.1.0 used for every partition; a broker
   still reads such files, takes the lower of the two recovery points (either is safe) and
   removes them once the data directory's checkpoint holds the partition.
2. A cleaning the crash interrupted is settled (Kafka's ``.cleaned``/``.swap`` recovery, see
   :mod:`samsa.log.cleaner`): a ``<base>-<end>.log.cleaned`` file is removed (the old segments
   are whole), a ``<base>-<end>.log.swap`` file was committed, so the segments of
   ``[base, end)`` are deleted and it becomes ``<base>.log``. Stray ``*.tmp`` files and
   indexes without a ``.log`` are removed; every ``<base>.log`` is opened (indexes are loaded
   lazily, and rebuilt if missing or corrupt).
3. Clean shutdown: the active segment (what recovery would scan: a clean close checkpoints
   the recovery point at the log end) has every batch's CRC-32C checked, read-only, and its
   tail is walked from its last index entry to find the log end offset; if a check fails or
   the end disagrees with the marker's, fall through to recovery (4).
4. Unclean: every segment from the one holding the recovery point on is scanned with CRC
   checks (Kafka's "unflushed segments"). At the first bad batch the segment is truncated
   there, with a warning that says how many bytes and why, and all later segments are deleted:
   the log stays a gap-free prefix of what was written. Scanned segments get fresh indexes.

   A bad batch after a *clean* shutdown is not a torn write but damage at rest. Kafka would
   not look (it trusts the marker); when its recovery finds one it truncates there, and so
   does this, loudly (an error naming the offsets dropped) rather than serve bytes that are
   not what was written or keep a hole in the log. The coordinators learn of the cut from
   :class:`LoadReport` and treat records past it as lost (see ``txn_runtime.load``).
5. Producer state: snapshots above the log end are deleted (they describe data that is gone),
   the newest readable snapshot at or below it is loaded (corrupt ones are skipped), and every
   batch with a producer id after the snapshot's offset is replayed, unvalidated, as the live
   append path would have applied it, after its CRC check: a batch that fails it is not
   believed (skipped, with an error). Without a snapshot the whole log is replayed.
"""

from __future__ import annotations

import logging
import os
import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from samsa.log.durable import fsync_dir, write_durably
from samsa.log.producer_state import (
    AppendOrigin,
    BatchAppend,
    EndTxnAppendInfo,
    ProducerAppendInfo,
    ProducerStateManager,
)
from samsa.log.segment import CorruptSegmentError, LogSegment
from samsa.log.snapshot import delete_snapshots_above, latest_valid_snapshot
from samsa.log.txn_index import AbortedTxn, TransactionIndex
from samsa.protocol.records import (
    TRANSACTIONAL_FLAG,
    ControlType,
    RecordBatchView,
    control_type_of,
    decode_records,
)

log = logging.getLogger(__name__)

# The same names serve the data directory's shared files (offsets of many partitions) and
# those of a log opened on its own, in its directory (one offset).
RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
_CHECKPOINT_VERSION = 0
_SEGMENT_FILE_RE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")
# A cleaning's output for the segments of [base, end) (see samsa.log.cleaner): ".cleaned" while
# written, ".swap" once complete (the commit point).
_CLEANER_FILE_RE = re.compile(r"^(\d{20})-(\d{20})\.log\.(cleaned|swap)$")


@dataclass(slots=True)
class LoadReport:
    """What opening the log did (for logs, metrics and tests)."""

    clean_shutdown: bool = False  # a clean-shutdown marker was found
    verified_segments: int = 0  # checked read-only after a clean shutdown (the active one)
    recovered_segments: int = 0  # segments scanned with CRC checks
    truncated_bytes: int = 0
    deleted_segments: int = 0
    snapshot_offset: int | None = None  # producer-state snapshot loaded, if any
    replayed_batches: int = 0  # producer batches replayed after the snapshot
    corrupt_batches: int = 0  # batches the producer-state replay did not believe
    # The directory held a recovery point or marker of its own (samsa 0.1.0's layout).
    own_files: bool = False

    @property
    def lost_records(self) -> bool:
        """Did opening cut records off the log (whatever the shutdown)?"""
        return self.truncated_bytes > 0 or self.deleted_segments > 0


@dataclass(slots=True)
class LoadedLog:
    segments: list[LogSegment]
    log_start_offset: int
    log_end_offset: int
    recovery_point: int
    producer_state: ProducerStateManager
    txn_index: TransactionIndex
    report: LoadReport = field(default_factory=LoadReport)
    created_segment: bool = False  # a new segment file whose directory entry is not yet synced


# -- small durable files ------------------------------------------------------------------------


def read_offset_file(path: Path) -> int | None:
    """The offset in a ``version\\noffset\\n`` file; None if missing or unreadable."""
    try:
        lines = path.read_text().split("\n")
        if int(lines[0]) != _CHECKPOINT_VERSION:
            raise ValueError(f"version {lines[0]}")
        offset = int(lines[1])
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        return offset
    except FileNotFoundError:
        return None
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None


@dataclass(frozen=True, slots=True)
class SharedState:
    """What the data directory's files say of one partition; None where they do not name it."""

    recovery_point: int | None = None
    clean_end: int | None = None  # the log end offset the clean-shutdown marker vouches for


def read_offsets_checkpoint(path: Path) -> dict[str, int]:
    """Kafka's offset checkpoint file (version ``0``, a count, ``topic partition offset``
    lines) as {partition directory name: offset}; empty if missing. An unreadable one (a torn
    write cannot make one: see :func:`write_offsets_checkpoint`) is ignored with a warning,
    which only costs recovery scans."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return {}
    try:
        if not lines or int(lines[0]) != _CHECKPOINT_VERSION:
            raise ValueError(f"version {lines[0] if lines else 'missing'}")
        count = int(lines[1]) if len(lines) > 1 else -1
        if count != len(lines) - 2:
            raise ValueError(f"{len(lines) - 2} entries where the count line says {count}")
        offsets: dict[str, int] = {}
        for line in lines[2:]:
            topic, partition, offset = line.split(" ")
            if int(partition) < 0 or int(offset) < 0:
                raise ValueError(f"negative number in {line!r}")
            offsets[f"{topic}-{int(partition)}"] = int(offset)
        return offsets
    except ValueError as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return {}


def write_offsets_checkpoint(path: Path, offsets: dict[str, int]) -> None:
    """Replace ``path`` with ``offsets`` (keyed by ``<topic>-<partition>``) in Kafka's format:
    written to a ``.tmp``, fsynced, renamed, the directory fsynced, so a crash leaves the old
    file or the new one."""
    lines = [str(_CHECKPOINT_VERSION), str(len(offsets))]
    for name, offset in offsets.items():
        topic, _, partition = name.rpartition("-")
        lines.append(f"{topic} {partition} {offset}")
    write_durably(path, "\n".join(lines) + "\n")


def write_recovery_point(directory: Path, offset: int) -> None:
    write_durably(directory / RECOVERY_POINT_FILE, f"{_CHECKPOINT_VERSION}\n{offset}\n")


def write_clean_shutdown(directory: Path, log_end_offset: int) -> None:
    write_durably(directory / CLEAN_SHUTDOWN_FILE, f"{_CHECKPOINT_VERSION}\n{log_end_offset}\n")


_T = TypeVar("_T")


def take_marker(path: Path, read: Callable[[Path], _T]) -> _T | None:
    """A clean-shutdown marker's contents (``read``), the marker then durably removed: a crash
    from now on must not look clean. None if there is no marker."""
    if not path.exists():
        return None
    contents = read(path)
    path.unlink()
    fsync_dir(path.parent)
    return contents


def _take_clean_shutdown(directory: Path) -> int | None:
    """The log end offset a log's own marker recorded, if it was closed cleanly."""
    return take_marker(directory / CLEAN_SHUTDOWN_FILE, read_offset_file)


# -- producer state -----------------------------------------------------------------------------


def batch_append_of(view: RecordBatchView) -> BatchAppend:
    """The producer-state view of a batch header."""
    return BatchAppend(
        view.producer_id,
        view.producer_epoch,
        view.base_sequence,
        view.last_sequence,
        view.max_timestamp,
        bool(view.attributes & TRANSACTIONAL_FLAG),
    )


def _load_producer_state(
    directory: Path,
    segments: list[LogSegment],
    log_start_offset: int,
    log_end_offset: int,
    expiration_ms: int,
    now_ms: int,
    report: LoadReport,
    txn_index: TransactionIndex,
) -> ProducerStateManager:
    state = ProducerStateManager(expiration_ms)
    delete_snapshots_above(directory, log_end_offset)
    snapshot = latest_valid_snapshot(directory, at_or_below=log_end_offset)
    if snapshot is not None and snapshot[0] >= log_start_offset:
        start, entries = snapshot
        state.load(entries, start, now_ms)
        report.snapshot_offset = start
    else:
        start = log_start_offset
        state.truncate_and_reload(start)
    # Aborted-transaction entries from `start` on are rebuilt by the replay below.
    txn_index.load([s.base_offset for s in segments], below=start)
    if start < log_end_offset:
        first = max(bisect_right([s.base_offset for s in segments], start) - 1, 0)
        try:
            for seg in segments[first:]:
                for view in seg.iter_batches_from(max(start, seg.base_offset), whole=True):
                    if view.producer_id < 0 or view.base_offset < start:
                        continue
                    if not view.crc_is_valid():
                        # Below the recovery point (recovery would have cut it): its producer
                        # id, epoch and sequences cannot be believed.
                        log.error(
                            "%s: not replaying the producer state of the batch at offsets "
                            "%d-%d: CRC-32C mismatch",
                            directory,
                            view.base_offset,
                            view.last_offset,
                        )
                        report.corrupt_batches += 1
                        continue
                    if view.is_control:
                        replay_marker(state, txn_index, seg.base_offset, view)
                        report.replayed_batches += 1
                        continue
                    info = state.prepare_update(
                        batch_append_of(view), now_ms, AppendOrigin.RECOVERY
                    )
                    if isinstance(info, ProducerAppendInfo):
                        state.update(info, view.base_offset, view.last_offset)
                        report.replayed_batches += 1
        except CorruptSegmentError as exc:
            # Below the recovery point the log is trusted; if it is damaged anyway, serve what
            # is readable rather than refuse to open the partition.
            log.error("producer state replay stopped early in %s: %s", directory, exc)
    state.map_end_offset = log_end_offset
    state.remove_expired_producers(now_ms)
    if log_start_offset > 0:
        # Retention removed the head of the log: producers with no record left are unknown.
        state.remove_producers_below(log_start_offset)
    return state


def replay_marker(
    state: ProducerStateManager,
    txn_index: TransactionIndex,
    segment_base: int,
    view: RecordBatchView,
) -> None:
    """Apply a transaction marker found in the log, as the live path applied it."""
    try:
        commit = control_type_of(view) == ControlType.COMMIT
        coordinator_epoch = _coordinator_epoch_of(view)
    except ValueError as exc:
        log.error("unreadable control batch at offset %d: %s", view.base_offset, exc)
        return
    info = EndTxnAppendInfo(view.producer_id, view.producer_epoch, coordinator_epoch, commit)
    completed = state.complete_txn(info, view.base_offset, view.max_timestamp)
    if completed is not None and completed.is_aborted:
        lso = state.first_unstable_offset()
        txn_index.append(
            segment_base,
            AbortedTxn(
                completed.producer_id,
                completed.first_offset,
                completed.last_offset,
                view.base_offset + 1 if lso is None else lso,
            ),
        )


def _coordinator_epoch_of(view: RecordBatchView) -> int:
    (record,) = decode_records(view)
    if record.value is None or len(record.value) < 6:
        raise ValueError("control record without a coordinator epoch")
    return int.from_bytes(record.value[2:6], "big", signed=True)


# -- segments -----------------------------------------------------------------------------------


def cleaned_file(directory: Path, base: int, end: int) -> Path:
    return directory / f"{base:020d}-{end:020d}.log.cleaned"


def swap_file(directory: Path, base: int, end: int) -> Path:
    return directory / f"{base:020d}-{end:020d}.log.swap"


def complete_swap(directory: Path, swap: Path, base: int, end: int) -> None:
    """Replace the segments of ``[base, end)`` by the swap file: their files go (the ``.log``
    last, so an index never outlives its log), then the swap becomes ``<base>.log``. Safe to
    redo after a crash at any point of it (Kafka's ``.swap`` recovery)."""
    doomed = []
    for name in os.listdir(directory):
        m = _SEGMENT_FILE_RE.match(name)
        if m is not None and base <= int(m.group(1)) < end:
            doomed.append((m.group(2) == "log", name))
    for _, name in sorted(doomed):
        (directory / name).unlink(missing_ok=True)
    os.replace(swap, directory / f"{base:020d}.log")
    fsync_dir(directory)


def _finish_cleanings(directory: Path) -> None:
    """A ``.cleaned`` file is a cleaning cut short (the old segments are whole): removed. A
    ``.swap`` file is a committed one: its swap is completed."""
    swaps = []
    for name in os.listdir(directory):
        m = _CLEANER_FILE_RE.match(name)
        if m is None:
            continue
        if m.group(3) == "cleaned":
            log.info("removing unfinished cleaner output %s/%s", directory, name)
            (directory / name).unlink(missing_ok=True)
        else:
            swaps.append((int(m.group(1)), int(m.group(2)), name))
    for base, end, name in sorted(swaps):
        log.info("completing the swap of cleaned segment %s/%s", directory, name)
        complete_swap(directory, directory / name, base, end)


def _list_segments(directory: Path) -> list[int]:
    """Base offsets of the ``.log`` files; removes temporary files and orphaned indexes."""
    _finish_cleanings(directory)
    logs: set[int] = set()
    indexes: list[tuple[int, str]] = []
    for name in os.listdir(directory):
        if name.endswith(".tmp"):
            log.info("removing leftover temporary file %s/%s", directory, name)
            (directory / name).unlink(missing_ok=True)
            continue
        m = _SEGMENT_FILE_RE.match(name)
        if m is None:
            continue
        if m.group(2) == "log":
            logs.add(int(m.group(1)))
        else:
            indexes.append((int(m.group(1)), name))
    for base, name in indexes:
        if base not in logs:
            log.warning("removing orphaned index %s/%s", directory, name)
            (directory / name).unlink(missing_ok=True)
    return sorted(logs)


def _recover(
    directory: Path,
    segments: list[LogSegment],
    recovery_point: int,
    report: LoadReport,
    *,
    after_clean: bool = False,
) -> None:
    """Scan the segments that may hold unflushed data; truncate at the first bad batch."""
    first = max(bisect_right([s.base_offset for s in segments], recovery_point) - 1, 0)
    min_offset = segments[first].base_offset
    for i in range(first, len(segments)):
        seg = segments[i]
        log.info("recovering segment %s (%d bytes)", seg.path, seg.size)
        outcome = seg.recover(min_offset)
        seg.dirty = True  # not known to be fsynced: the next flush must sync it
        report.recovered_segments += 1
        if outcome.problem is not None:
            dropped = sum(s.size for s in segments[i + 1 :]) + outcome.truncated_bytes
            log.log(
                logging.ERROR if after_clean else logging.WARNING,
                "truncated %d bytes from %s at byte %d, offset %d (%d good batches kept; "
                "%d bytes dropped in all): %s%s",
                outcome.truncated_bytes,
                seg.path,
                outcome.valid_bytes,
                seg.next_offset,
                outcome.batches,
                dropped,
                outcome.problem,
                " after a clean shutdown: damage at rest, not a torn write" if after_clean else "",
            )
            report.truncated_bytes += outcome.truncated_bytes
            for later in segments[i + 1 :]:
                log.warning("deleting segment %s, which follows a corrupt one", later.path)
                later.delete()
                report.deleted_segments += 1
            del segments[i + 1 :]
            # Make the cut durable now: otherwise a crash could bring the damage (or the
            # deleted segments, after a gap) back.
            seg.fsync_data()
            fsync_dir(directory)
            return
        if i < len(segments) - 1:
            seg.seal()
        assert seg.next_offset is not None
        min_offset = seg.next_offset


def load_log(
    directory: Path,
    *,
    index_interval_bytes: int,
    producer_id_expiration_ms: int,
    now_ms: int,
    shared: SharedState | None = None,
) -> LoadedLog:
    """Open (creating if needed) the partition directory and return its recovered state.
    ``shared``: what the data directory's files say of it (None: a log opened on its own,
    whose files are in its directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    report = LoadReport()
    own_clean = _take_clean_shutdown(directory)
    own_point = read_offset_file(directory / RECOVERY_POINT_FILE)
    if shared is None:
        clean_leo, checkpoint = own_clean, own_point or 0
    else:
        report.own_files = own_clean is not None or own_point is not None
        clean_leo = shared.clean_end if shared.clean_end is not None else own_clean
        # Each was true when written: the lower one is safe whichever is newer.
        known = [p for p in (shared.recovery_point, own_point) if p is not None]
        checkpoint = min(known, default=0)
    report.clean_shutdown = clean_leo is not None
    segments: list[LogSegment] = []
    try:
        for base in _list_segments(directory):
            segments.append(LogSegment.open(directory, base, index_interval_bytes))
        needs_recovery = clean_leo is None
        if not needs_recovery and segments:
            active = segments[-1]
            report.verified_segments += 1
            _, _, problem = active.check_crcs(active.base_offset)
            if problem is not None:
                log.error("%s: damaged after a clean shutdown: %s", active.path, problem)
                needs_recovery = True
            elif not active.load_tail():
                needs_recovery = True
            elif active.next_offset != clean_leo:
                log.warning(
                    "%s: log end offset %s differs from the clean-shutdown marker's %s",
                    directory,
                    active.next_offset,
                    clean_leo,
                )
                needs_recovery = True
            if needs_recovery:
                log.warning("%s: clean shutdown marker found but the log needs recovery", directory)
        if needs_recovery and segments:
            _recover(directory, segments, checkpoint, report, after_clean=clean_leo is not None)
        elif segments:
            log.info("%s: clean shutdown, skipping recovery (CRCs checked)", directory)
        created = False
        if not segments:
            segments.append(LogSegment.create(directory, 0, index_interval_bytes))
            created = True
        active = segments[-1]
        assert active.next_offset is not None
        log_end_offset = active.next_offset
        log_start_offset = segments[0].base_offset
        recovery_point = log_end_offset if not needs_recovery else min(checkpoint, log_end_offset)
        txn_index = TransactionIndex(directory)
        producer_state = _load_producer_state(
            directory,
            segments,
            log_start_offset,
            log_end_offset,
            producer_id_expiration_ms,
            now_ms,
            report,
            txn_index,
        )
    except BaseException:
        for seg in segments:
            seg.close()
        raise
    return LoadedLog(
        segments,
        log_start_offset,
        log_end_offset,
        recovery_point,
        producer_state,
        txn_index,
        report,
        created,
    )
