"""Per-partition producer state: the bookkeeping behind idempotence and transactions.

Theory of operation
-------------------
Idempotent and transactional producers stamp every batch with a producer id, an epoch and a
sequence range. For each partition the broker keeps, per producer id, its current epoch, the last
:data:`NUM_BATCHES_TO_RETAIN` batches it wrote here (sequence range -> offsets, oldest first), the
timestamp of its last write and the first offset of its open transaction on this partition, if
any: packed into one row (see "Packed rows" below), handed out as :class:`ProducerStateEntry`.

Appending is split in two so that state only reflects batches that really reached the log (rule 8):

1. :meth:`ProducerStateManager.prepare_update` checks the batch against the entry *without touching
   it* and answers :class:`Duplicate` (a retry of a retained batch: reply with its original offsets
   and write nothing), :class:`Rejected` (the error code for this partition), or a
   :class:`ProducerAppendInfo`.
2. The caller appends the batch to the log and then calls :meth:`ProducerStateManager.update` with
   the offsets it got, which records the batch.

Client batches are checked in Kafka's order: duplicate detection first (rule 6), then the epoch
(47, rule 2), then the sequence (45, rules 3-5), then the transaction state (48). Recovery replays
batch headers from the log as :attr:`AppendOrigin.RECOVERY`: the log is the truth, so nothing is
checked; nor is a batch a coordinator writes (:attr:`AppendOrigin.COORDINATOR`).

A producer is forgotten when it has been idle for ``producer_id_expiration_ms`` without an open
transaction (rule 12, :meth:`~ProducerStateManager.remove_expired_producers`, also applied by
:meth:`~ProducerStateManager.load`), or when retention removed all of its records
(:meth:`~ProducerStateManager.remove_producers_below`). Either way it then counts as unknown, and
its next batch is accepted with any sequence (rule 5). As in Kafka, "idle" is measured from the max
timestamp of the producer's last batch.

This module is pure: no I/O and no clock (time comes in as ``now_ms``). Persisting the state is
:mod:`samsa.log.snapshot`'s job; :attr:`ProducerStateManager.map_end_offset` says which log offset
the state reflects, so recovery knows where to resume replaying the log.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import NO_PRODUCER_EPOCH, NO_SEQUENCE

NUM_BATCHES_TO_RETAIN = 5


class AppendOrigin(Enum):
    """Where an append comes from (Kafka's ``AppendOrigin``): only a client's batch is judged
    against the producer's state (docs/semantics.md, rules 2-6); the others are the truth."""

    CLIENT = "client"  # a producer's batch, through Produce
    COORDINATOR = "coordinator"  # a coordinator writing its internal topic (or a marker)
    RECOVERY = "recovery"  # a batch already in the log, replayed when the log is opened


_MAX_SEQUENCE = 2**31 - 1  # sequences are int32 and wrap to 0 after this


def next_sequence(seq: int, increment: int) -> int:
    """``seq + increment``, wrapping from 2**31-1 to 0 as the Java producer does."""
    if seq > _MAX_SEQUENCE - increment:
        return increment - (_MAX_SEQUENCE - seq) - 1
    return seq + increment


def last_sequence_of(first_seq: int, last_offset_delta: int) -> int:
    """The last sequence of a batch starting at ``first_seq`` (NO_SEQUENCE stays NO_SEQUENCE)."""
    if first_seq == NO_SEQUENCE:
        return NO_SEQUENCE
    return next_sequence(first_seq, last_offset_delta)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp_ms: int  # the batch's max timestamp (or log-append time)


PACKED_BATCH = struct.Struct(">iiqqq")  # a BatchMetadata packed: its fields in order


class ProducerStateEntry:
    """One producer's state on one partition, as a value: what snapshots, DescribeProducers and
    :meth:`ProducerStateManager.load` exchange. The manager keeps its state packed (below) and
    hands out copies, so changing one changes nothing; only the manager's methods do.

    The batches stay packed by :data:`PACKED_BATCH` (the snapshot file's layout too), so that a
    snapshot of many producers is written and read without an object per batch; ``batches``
    unpacks them.
    """

    __slots__ = (
        "coordinator_epoch",
        "current_txn_first_offset",
        "epoch",
        "last_timestamp_ms",
        "packed_batches",
        "producer_id",
    )

    def __init__(
        self,
        producer_id: int,
        epoch: int,
        batches: Iterable[BatchMetadata],  # oldest first
        last_timestamp_ms: int,  # max timestamp of the last batch written; drives expiry
        coordinator_epoch: int = -1,
        current_txn_first_offset: int | None = None,
    ) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.packed_batches = b"".join(
            PACKED_BATCH.pack(
                b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp_ms
            )
            for b in batches
        )
        self.last_timestamp_ms = last_timestamp_ms
        self.coordinator_epoch = coordinator_epoch
        self.current_txn_first_offset = current_txn_first_offset

    @classmethod
    def from_packed(
        cls,
        producer_id: int,
        epoch: int,
        packed_batches: bytes,
        last_timestamp_ms: int,
        coordinator_epoch: int = -1,
        current_txn_first_offset: int | None = None,
    ) -> ProducerStateEntry:
        """An entry whose batches are already packed by :data:`PACKED_BATCH`."""
        if len(packed_batches) % PACKED_BATCH.size:
            raise ValueError(f"{len(packed_batches)} bytes are not whole packed batches")
        entry = cls.__new__(cls)  # not __init__, which would pack batches
        entry.producer_id = producer_id
        entry.epoch = epoch
        entry.packed_batches = bytes(packed_batches)
        entry.last_timestamp_ms = last_timestamp_ms
        entry.coordinator_epoch = coordinator_epoch
        entry.current_txn_first_offset = current_txn_first_offset
        return entry

    @property
    def batches(self) -> tuple[BatchMetadata, ...]:
        """The retained batches, oldest first."""
        return tuple(BatchMetadata(*f) for f in PACKED_BATCH.iter_unpack(self.packed_batches))

    def _oldest(self) -> tuple[int, int, int, int, int]:
        fields: tuple[int, int, int, int, int] = PACKED_BATCH.unpack_from(self.packed_batches)
        return fields

    def _newest(self) -> tuple[int, int, int, int, int]:
        pos = len(self.packed_batches) - PACKED_BATCH.size
        fields: tuple[int, int, int, int, int] = PACKED_BATCH.unpack_from(self.packed_batches, pos)
        return fields

    @property
    def first_seq(self) -> int:
        return self._oldest()[0] if self.packed_batches else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        return self._newest()[1] if self.packed_batches else NO_SEQUENCE

    @property
    def first_offset(self) -> int:
        return self._oldest()[2] if self.packed_batches else -1

    @property
    def last_offset(self) -> int:
        return self._newest()[3] if self.packed_batches else -1

    def _fields(self) -> tuple[int, int, bytes, int, int, int | None]:
        return (
            self.producer_id,
            self.epoch,
            self.packed_batches,
            self.last_timestamp_ms,
            self.coordinator_epoch,
            self.current_txn_first_offset,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateEntry):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # its fields may be set

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(producer_id={self.producer_id}, epoch={self.epoch}, "
            f"batches={list(self.batches)!r}, last_timestamp_ms={self.last_timestamp_ms}, "
            f"coordinator_epoch={self.coordinator_epoch}, "
            f"current_txn_first_offset={self.current_txn_first_offset})"
        )


# Packed rows
# -----------
# A broker holds an entry per (producer, partition), so the manager keeps each as one immutable
# ``bytes`` rather than objects (ints above 256 are objects of their own, 32 bytes each). A row
# has one of two shapes, told apart by its length:
#
# - full: a head (epoch, coordinator epoch, last timestamp), then the retained batches, oldest
#   first, 32 bytes each: 14 + 32n bytes;
# - single: exactly one batch, no coordinator epoch, and the last timestamp the batch's own, as
#   after a producer's first batch (most producers on most partitions): 30 bytes, with the last
#   offset as a delta, which fits a 64-byte CPython object where the full shape needs 80.
_HEAD = struct.Struct(">hiq")  # epoch, coordinator epoch, last timestamp
_BATCH = PACKED_BATCH  # first seq, last seq, first offset, last offset, timestamp
_SINGLE = struct.Struct(">hiiqiq")  # epoch, first seq, last seq, first offset, delta, timestamp
_EPOCH = struct.Struct(">h")  # a row's first field, in both shapes
_SEQS = struct.Struct(">ii")  # a batch's first two fields: what duplicate detection compares
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_OFFSET_DELTA = struct.Struct(">qi")
# Where the single shape keeps its last sequence, its first offset (and delta), its timestamp.
_SINGLE_LAST_SEQ_AT, _SINGLE_OFFSET_AT, _SINGLE_TIMESTAMP_AT = 6, 10, 22
_HEAD_COORDINATOR_EPOCH_AT, _HEAD_TIMESTAMP_AT = 2, 6
_MAX_DELTA = 2**31 - 1
# A full row keeps this many bytes of its batches when one more is added.
_KEPT_BATCHES = (NUM_BATCHES_TO_RETAIN - 1) * _BATCH.size


def _join(epoch: int, coordinator_epoch: int, last_timestamp_ms: int, batches: bytes) -> bytes:
    """A row of these fields (``batches`` packed by ``_BATCH``), in the single shape if it can."""
    if len(batches) == _BATCH.size and coordinator_epoch == -1:
        first_seq, last_seq, first_offset, last_offset, ts = _BATCH.unpack(batches)
        if ts == last_timestamp_ms and 0 <= last_offset - first_offset <= _MAX_DELTA:
            return _SINGLE.pack(
                epoch, first_seq, last_seq, first_offset, last_offset - first_offset, ts
            )
    return _HEAD.pack(epoch, coordinator_epoch, last_timestamp_ms) + batches


def _split(row: bytes) -> tuple[int, int, int, bytes]:
    """The epoch, coordinator epoch, last timestamp and ``_BATCH``-packed batches of a row."""
    if len(row) == _SINGLE.size:
        epoch, first_seq, last_seq, first_offset, delta, ts = _SINGLE.unpack(row)
        return (
            epoch,
            -1,
            ts,
            _BATCH.pack(first_seq, last_seq, first_offset, first_offset + delta, ts),
        )
    epoch, coordinator_epoch, last_timestamp_ms = _HEAD.unpack_from(row)
    return epoch, coordinator_epoch, last_timestamp_ms, row[_HEAD.size :]


def _row_of(entry: ProducerStateEntry) -> bytes:
    batches = entry.packed_batches[-NUM_BATCHES_TO_RETAIN * _BATCH.size :]
    return _join(entry.epoch, entry.coordinator_epoch, entry.last_timestamp_ms, batches)


def _entry_of(producer_id: int, row: bytes, txn_first_offset: int | None) -> ProducerStateEntry:
    epoch, coordinator_epoch, last_timestamp_ms, batches = _split(row)
    return ProducerStateEntry.from_packed(
        producer_id, epoch, batches, last_timestamp_ms, coordinator_epoch, txn_first_offset
    )


# The append path reads these straight from the row, without splitting it.


def _last_seq(row: bytes) -> int:
    n = len(row)
    if n == _SINGLE.size:
        seq: int = _INT.unpack_from(row, _SINGLE_LAST_SEQ_AT)[0]
    elif n > _HEAD.size:
        seq = _INT.unpack_from(row, n - _BATCH.size + 4)[0]
    else:
        seq = NO_SEQUENCE
    return seq


def _last_offset(row: bytes) -> int:
    n = len(row)
    if n == _SINGLE.size:
        first, delta = _OFFSET_DELTA.unpack_from(row, _SINGLE_OFFSET_AT)
        return int(first + delta)
    if n > _HEAD.size:
        offset: int = _LONG.unpack_from(row, n - _BATCH.size + 16)[0]
        return offset
    return -1


def _last_timestamp(row: bytes) -> int:
    at = _SINGLE_TIMESTAMP_AT if len(row) == _SINGLE.size else _HEAD_TIMESTAMP_AT
    ts: int = _LONG.unpack_from(row, at)[0]
    return ts


def _find_batch(row: bytes, first_seq: int, last_seq: int) -> tuple[int, int, int] | None:
    """(first offset, last offset, timestamp) of the retained batch with exactly this sequence
    range (rule 6), if any."""
    batches = _split(row)[3]
    # Newest first: a retry is most likely of a recent batch.
    for pos in range(len(batches) - _BATCH.size, -1, -_BATCH.size):
        if _SEQS.unpack_from(batches, pos) == (first_seq, last_seq):
            found: tuple[int, int, int] = _BATCH.unpack_from(batches, pos)[2:]
            return found
    return None


@dataclass(frozen=True, slots=True)
class BatchAppend:
    """The batch-header fields that matter to producer state."""

    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int
    max_timestamp_ms: int
    is_transactional: bool = False


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retry of a retained batch: answer success with these original offsets, write nothing."""

    first_offset: int
    last_offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class Rejected:
    error: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class ProducerAppendInfo:
    """A batch that passed validation and may be appended; apply it with ``update`` afterwards.

    It carries the batch rather than a precomputed entry: ``update`` derives the new state from the
    entry as it is when the append completed, so the manager is never left holding a stale copy.
    """

    producer_id: int
    batch: BatchAppend


@dataclass(frozen=True, slots=True)
class EndTxnAppendInfo:
    """A validated transaction marker (COMMIT or ABORT) not yet applied: Kafka's
    ``appendEndTxnMarker`` split in two like batches are."""

    producer_id: int
    epoch: int
    coordinator_epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker closed on this partition: its data spans
    ``[first_offset, last_offset]``, the marker being at ``last_offset``."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


class ProducerStateManager:
    """Producer id -> its state on one partition, as a packed row."""

    def __init__(self, producer_id_expiration_ms: int = 86_400_000) -> None:
        self._expiration_ms = producer_id_expiration_ms
        self._rows: dict[int, bytes] = {}
        # producer id -> first offset of its open transaction here: the one record of it. The
        # last stable offset is the smallest of these, asked on every read_committed fetch.
        self._ongoing: dict[int, int] = {}
        # The log offset the state reflects up to (exclusive): recovery replays the log from here.
        self.map_end_offset = 0

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return (
            f"ProducerStateManager(producers={len(self._rows)}, "
            f"map_end_offset={self.map_end_offset})"
        )

    # -- the append path ------------------------------------------------------------------------

    def prepare_update(
        self, batch: BatchAppend, now_ms: int, origin: AppendOrigin = AppendOrigin.CLIENT
    ) -> Duplicate | Rejected | ProducerAppendInfo:
        """Validate ``batch`` against the producer's state without changing anything.

        ``now_ms`` is accepted for symmetry with the rest of the log API; validation does not
        depend on it, because expiry only happens through ``remove_expired_producers`` and
        ``load`` (as in Kafka, where a not yet swept producer still gets duplicate detection).
        """
        pid = batch.producer_id
        if pid < 0:
            # Batches without a producer id carry no producer state; passing one here is a bug.
            raise ValueError(f"batch has no producer id ({pid})")
        info = ProducerAppendInfo(pid, batch)
        if origin is not AppendOrigin.CLIENT:
            return info
        if batch.first_seq < 0 or batch.last_seq < 0:
            return Rejected(
                ErrorCode.INVALID_RECORD,
                f"producer {pid} sent a batch with a negative sequence "
                f"({batch.first_seq}..{batch.last_seq})",
            )

        row = self._rows.get(pid)
        if row is None:
            return info  # rule 5: a new, expired or retention-removed producer starts anywhere
        epoch: int = _EPOCH.unpack_from(row)[0]
        if epoch == NO_PRODUCER_EPOCH:
            return info

        if batch.epoch == epoch:
            # Rule 6 runs before the sequence check: a retry of any retained batch is answered
            # with its original offsets. Only an exact (first, last) match counts. The next
            # expected batch (the common case) cannot be one: the retained batches are the
            # sequences just before it.
            expected = next_sequence(_last_seq(row), 1)  # NO_SEQUENCE -> 0
            if batch.first_seq != expected:
                found = _find_batch(row, batch.first_seq, batch.last_seq)
                if found is not None:
                    return Duplicate(*found)
                return Rejected(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"out of order sequence for producer {pid} epoch {batch.epoch}: got "
                    f"{batch.first_seq}, expected {expected}",
                )
        elif batch.epoch < epoch:
            return Rejected(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {pid} epoch {batch.epoch} is older than the current epoch {epoch}",
            )
        elif batch.first_seq != 0:
            # Rule 3 (KIP-360): a producer that bumped its own epoch restarts its sequences at 0.
            return Rejected(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid} new epoch {batch.epoch} (was {epoch}) must start at "
                f"sequence 0, got {batch.first_seq}",
            )

        txn_first = self._ongoing.get(pid)
        if txn_first is not None and not batch.is_transactional:
            return Rejected(
                ErrorCode.INVALID_TXN_STATE,
                f"non-transactional batch from producer {pid} while its transaction started at "
                f"offset {txn_first} is open",
            )
        return info

    def update(self, info: ProducerAppendInfo, first_offset: int, last_offset: int) -> None:
        """Record a batch that was appended to the log at ``[first_offset, last_offset]``."""
        if last_offset < first_offset:
            raise ValueError(f"last offset {last_offset} is below first offset {first_offset}")
        batch = info.batch
        pid = info.producer_id
        row = self._rows.get(pid)
        ts = batch.max_timestamp_ms
        new = _BATCH.pack(batch.first_seq, batch.last_seq, first_offset, last_offset, ts)
        if (
            row is not None
            and len(row) > _SINGLE.size
            and _EPOCH.unpack_from(row)[0] == batch.epoch
        ):
            # The steady state: a full row with batches gets one more, the oldest beyond the
            # window dropped, in one copy.
            coordinator_epoch = _INT.unpack_from(row, _HEAD_COORDINATOR_EPOCH_AT)[0]
            kept = row[max(_HEAD.size, len(row) - _KEPT_BATCHES) :]
            self._rows[pid] = b"".join((_HEAD.pack(batch.epoch, coordinator_epoch, ts), kept, new))
        else:
            coordinator_epoch = -1
            kept = b""
            if row is not None:
                epoch, coordinator_epoch, _, batches = _split(row)
                # Sequences restart with a new epoch, so the old ranges can never match again.
                # An open transaction stays open: only its marker closes it.
                if epoch == batch.epoch:
                    kept = batches
            self._rows[pid] = _join(batch.epoch, coordinator_epoch, ts, kept + new)
        if batch.is_transactional and pid not in self._ongoing:
            self._ongoing[pid] = first_offset
        self.map_end_offset = last_offset + 1

    # -- transaction markers --------------------------------------------------------------------

    def prepare_end_txn(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        commit: bool,
    ) -> EndTxnAppendInfo | Rejected:
        """Check a COMMIT/ABORT marker from the transaction coordinator without applying it.

        A marker may carry a newer epoch than the partition has seen (the coordinator bumped it
        to fence a zombie); an older epoch or an older coordinator epoch is refused. (Recovery
        applies the markers it finds in the log without this check: ``loader.replay_marker``.)
        """
        info = EndTxnAppendInfo(producer_id, epoch, coordinator_epoch, commit)
        row = self._rows.get(producer_id)
        if row is None:
            return info
        current_epoch, current_coordinator_epoch = _split(row)[:2]
        if epoch < current_epoch:
            return Rejected(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"transaction marker for producer {producer_id} has epoch {epoch}, older than "
                f"the current epoch {current_epoch}",
            )
        if coordinator_epoch < current_coordinator_epoch:
            return Rejected(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"transaction marker for producer {producer_id} from coordinator epoch "
                f"{coordinator_epoch}, older than {current_coordinator_epoch}",
            )
        return info

    def complete_txn(
        self, info: EndTxnAppendInfo, marker_offset: int, timestamp_ms: int
    ) -> CompletedTxn | None:
        """Apply a marker written at ``marker_offset``; returns the transaction it closed, or
        None when the producer had no open transaction here (markers go to every partition of
        a transaction, and a retried one may find it already closed)."""
        pid = info.producer_id
        row = self._rows.get(pid)
        batches = b""
        if row is not None:
            epoch, _, last_timestamp_ms, kept = _split(row)
            timestamp_ms = max(last_timestamp_ms, timestamp_ms)
            if epoch == info.epoch:  # else sequences restart with the new epoch
                batches = kept
        self._rows[pid] = _join(info.epoch, info.coordinator_epoch, timestamp_ms, batches)
        first = self._ongoing.pop(pid, None)
        self.map_end_offset = marker_offset + 1
        if first is None:
            return None
        return CompletedTxn(pid, first, marker_offset, not info.commit)

    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest open transaction (the last stable offset), if any."""
        return min(self._ongoing.values()) if self._ongoing else None

    # -- queries --------------------------------------------------------------------------------

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        """The producer's state (a copy), or None for a producer unknown on this partition."""
        row = self._rows.get(producer_id)
        if row is None:
            return None
        return _entry_of(producer_id, row, self._ongoing.get(producer_id))

    def entries(self) -> list[ProducerStateEntry]:
        """Every producer's state (copies), for snapshots and DescribeProducers."""
        ongoing = self._ongoing
        return [_entry_of(pid, row, ongoing.get(pid)) for pid, row in self._rows.items()]

    # -- lifecycle ------------------------------------------------------------------------------

    def load(self, entries: Iterable[ProducerStateEntry], map_end_offset: int, now_ms: int) -> None:
        """Replace the state with ``entries`` (from a snapshot), dropping expired producers."""
        rows: dict[int, bytes] = {}
        ongoing: dict[int, int] = {}
        for e in entries:
            txn_first = e.current_txn_first_offset
            if txn_first is None and self._expired(e.last_timestamp_ms, now_ms):
                continue
            rows[e.producer_id] = _row_of(e)
            if txn_first is not None:
                ongoing[e.producer_id] = txn_first
        self._rows = rows
        self._ongoing = ongoing
        self.map_end_offset = map_end_offset

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Drop producers idle for the expiration time without an open transaction (rule 12)."""
        ongoing = self._ongoing
        expired = [
            pid
            for pid, row in self._rows.items()
            if pid not in ongoing and self._expired(_last_timestamp(row), now_ms)
        ]
        for pid in expired:
            del self._rows[pid]
        return expired

    def remove_producers_below(self, log_start_offset: int) -> None:
        """Forget producers none of whose records survive below ``log_start_offset``.

        Their last write is gone, so their state cannot be rebuilt from the log either; dropping it
        now keeps a restarted broker and a running one in agreement (the producer is unknown).
        """
        gone = [pid for pid, row in self._rows.items() if _last_offset(row) < log_start_offset]
        for pid in gone:
            del self._rows[pid]
            self._ongoing.pop(pid, None)
        # Nothing below the log start can be replayed, so the state reflects at least up to it.
        self.map_end_offset = max(self.map_end_offset, log_start_offset)

    def truncate_and_reload(self, map_end_offset: int) -> None:
        """Forget everything and restart at ``map_end_offset`` (before a rebuild from the log)."""
        self._rows = {}
        self._ongoing = {}
        self.map_end_offset = map_end_offset

    def _expired(self, last_timestamp_ms: int, now_ms: int) -> bool:
        # (An open transaction pins the producer, its marker must still find it: callers check.)
        return now_ms - last_timestamp_ms >= self._expiration_ms
