"""Per-partition producer state: the bookkeeping behind idempotence and transactions.

Theory of operation
-------------------
Idempotent and transactional producers stamp every batch with a producer id, an epoch and a
sequence range. For each partition the broker keeps one :class:`ProducerStateEntry` per producer
id: its current epoch, the last :data:`NUM_BATCHES_TO_RETAIN` batches it wrote here (sequence range
-> offsets, oldest first), the timestamp of its last write and the first offset of its open
transaction on this partition, if any.

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


_PACKED = struct.Struct(">iiqqq")  # first seq, last seq, first offset, last offset, timestamp
_SEQS = struct.Struct(">ii")  # the first two fields alone: what the append path compares
_OFFSET = struct.Struct(">q")


class ProducerStateEntry:
    """One producer's state on one partition.

    The retained batches are packed into one ``bytearray`` (32 bytes each) rather than kept
    as five objects of five ints: a broker holds one entry per (producer, partition), and
    this cuts an entry to about a third of the memory. ``batches`` gives them as
    :class:`BatchMetadata`, oldest first.
    """

    __slots__ = (
        "_packed",
        "coordinator_epoch",
        "current_txn_first_offset",
        "epoch",
        "last_timestamp_ms",
        "producer_id",
    )

    def __init__(
        self,
        producer_id: int,
        epoch: int,
        batches: Iterable[BatchMetadata],
        last_timestamp_ms: int,  # max timestamp of the last batch written; drives expiry
        coordinator_epoch: int = -1,
        current_txn_first_offset: int | None = None,
    ) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self._packed = bytearray()
        for meta in batches:
            self.add_batch(meta)
        self.last_timestamp_ms = last_timestamp_ms
        self.coordinator_epoch = coordinator_epoch
        self.current_txn_first_offset = current_txn_first_offset

    @property
    def batches(self) -> list[BatchMetadata]:
        """The retained batches, oldest first (a fresh list)."""
        return [BatchMetadata(*fields) for fields in _PACKED.iter_unpack(self._packed)]

    def add_batch(self, meta: BatchMetadata) -> None:
        """Retain ``meta`` as the newest batch, forgetting the oldest beyond the window."""
        self._packed += _PACKED.pack(
            meta.first_seq, meta.last_seq, meta.first_offset, meta.last_offset, meta.timestamp_ms
        )
        excess = len(self._packed) - NUM_BATCHES_TO_RETAIN * _PACKED.size
        if excess > 0:
            del self._packed[:excess]

    def clear_batches(self) -> None:
        self._packed.clear()

    def find_batch(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with exactly this sequence range (rule 6), if any."""
        packed = self._packed
        # Newest first: a retry is most likely of a recent batch.
        for pos in range(len(packed) - _PACKED.size, -1, -_PACKED.size):
            if _SEQS.unpack_from(packed, pos) == (first_seq, last_seq):
                return BatchMetadata(*_PACKED.unpack_from(packed, pos))
        return None

    @property
    def first_seq(self) -> int:
        return _SEQS.unpack_from(self._packed, 0)[0] if self._packed else NO_SEQUENCE

    @property
    def last_seq(self) -> int:
        packed = self._packed
        return _SEQS.unpack_from(packed, len(packed) - _PACKED.size)[1] if packed else NO_SEQUENCE

    @property
    def first_offset(self) -> int:
        return _OFFSET.unpack_from(self._packed, 8)[0] if self._packed else -1

    @property
    def last_offset(self) -> int:
        packed = self._packed
        return _OFFSET.unpack_from(packed, len(packed) - _PACKED.size + 16)[0] if packed else -1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProducerStateEntry):
            return NotImplemented
        return (
            self.producer_id == other.producer_id
            and self.epoch == other.epoch
            and self._packed == other._packed
            and self.last_timestamp_ms == other.last_timestamp_ms
            and self.coordinator_epoch == other.coordinator_epoch
            and self.current_txn_first_offset == other.current_txn_first_offset
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaced

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(producer_id={self.producer_id}, epoch={self.epoch}, "
            f"batches={self.batches!r}, last_timestamp_ms={self.last_timestamp_ms}, "
            f"coordinator_epoch={self.coordinator_epoch}, "
            f"current_txn_first_offset={self.current_txn_first_offset})"
        )


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
    """Producer id -> :class:`ProducerStateEntry` for one partition."""

    def __init__(self, producer_id_expiration_ms: int = 86_400_000) -> None:
        self._expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        # producer id -> first offset of its open transaction here: the last stable offset is
        # the smallest of these, and it is asked on every read_committed fetch.
        self._ongoing: dict[int, int] = {}
        # The log offset the state reflects up to (exclusive): recovery replays the log from here.
        self.map_end_offset = 0

    def __len__(self) -> int:
        return len(self._producers)

    def __repr__(self) -> str:
        return (
            f"ProducerStateManager(producers={len(self._producers)}, "
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

        entry = self._producers.get(pid)
        if entry is None or entry.epoch == NO_PRODUCER_EPOCH:
            # Rule 5: new, expired or retention-removed producer: any first sequence starts it.
            return info

        if batch.epoch == entry.epoch:
            # Rule 6 runs before the sequence check: a retry of any retained batch is answered
            # with its original offsets. Only an exact (first, last) match counts. The next
            # expected batch (the common case) cannot be one: the retained batches are the
            # sequences just before it.
            expected = next_sequence(entry.last_seq, 1)  # NO_SEQUENCE -> 0
            if batch.first_seq != expected:
                meta = entry.find_batch(batch.first_seq, batch.last_seq)
                if meta is not None:
                    return Duplicate(meta.first_offset, meta.last_offset, meta.timestamp_ms)
                return Rejected(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"out of order sequence for producer {pid} epoch {batch.epoch}: got "
                    f"{batch.first_seq}, expected {expected}",
                )
        elif batch.epoch < entry.epoch:
            return Rejected(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {pid} epoch {batch.epoch} is older than the current epoch {entry.epoch}",
            )
        elif batch.first_seq != 0:
            # Rule 3 (KIP-360): a producer that bumped its own epoch restarts its sequences at 0.
            return Rejected(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {pid} new epoch {batch.epoch} (was {entry.epoch}) must start at "
                f"sequence 0, got {batch.first_seq}",
            )

        if entry.current_txn_first_offset is not None and not batch.is_transactional:
            return Rejected(
                ErrorCode.INVALID_TXN_STATE,
                f"non-transactional batch from producer {pid} while its transaction started at "
                f"offset {entry.current_txn_first_offset} is open",
            )
        return info

    def update(self, info: ProducerAppendInfo, first_offset: int, last_offset: int) -> None:
        """Record a batch that was appended to the log at ``[first_offset, last_offset]``."""
        if last_offset < first_offset:
            raise ValueError(f"last offset {last_offset} is below first offset {first_offset}")
        batch = info.batch
        meta = BatchMetadata(
            batch.first_seq, batch.last_seq, first_offset, last_offset, batch.max_timestamp_ms
        )
        entry = self._producers.get(info.producer_id)
        if entry is None:
            entry = ProducerStateEntry(
                info.producer_id, batch.epoch, [meta], batch.max_timestamp_ms
            )
            self._producers[info.producer_id] = entry
        else:
            if entry.epoch != batch.epoch:
                # Sequences restart with a new epoch, so the old ranges can never match again.
                # An open transaction stays open: only its marker closes it.
                entry.clear_batches()
                entry.epoch = batch.epoch
            entry.add_batch(meta)
            entry.last_timestamp_ms = batch.max_timestamp_ms
        if batch.is_transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = first_offset
            self._ongoing[info.producer_id] = first_offset
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
        entry = self._producers.get(producer_id)
        if entry is None:
            return info
        if epoch < entry.epoch:
            return Rejected(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"transaction marker for producer {producer_id} has epoch {epoch}, older than "
                f"the current epoch {entry.epoch}",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            return Rejected(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"transaction marker for producer {producer_id} from coordinator epoch "
                f"{coordinator_epoch}, older than {entry.coordinator_epoch}",
            )
        return info

    def complete_txn(
        self, info: EndTxnAppendInfo, marker_offset: int, timestamp_ms: int
    ) -> CompletedTxn | None:
        """Apply a marker written at ``marker_offset``; returns the transaction it closed, or
        None when the producer had no open transaction here (markers go to every partition of
        a transaction, and a retried one may find it already closed)."""
        entry = self._producers.get(info.producer_id)
        if entry is None:
            entry = ProducerStateEntry(info.producer_id, info.epoch, [], timestamp_ms)
            self._producers[info.producer_id] = entry
        elif entry.epoch != info.epoch:
            entry.clear_batches()  # sequences restart with the new epoch
            entry.epoch = info.epoch
        entry.coordinator_epoch = info.coordinator_epoch
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, timestamp_ms)
        first = entry.current_txn_first_offset
        entry.current_txn_first_offset = None
        self._ongoing.pop(info.producer_id, None)
        self.map_end_offset = marker_offset + 1
        if first is None:
            return None
        return CompletedTxn(info.producer_id, first, marker_offset, not info.commit)

    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest open transaction (the last stable offset), if any."""
        return min(self._ongoing.values()) if self._ongoing else None

    # -- queries --------------------------------------------------------------------------------

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        """The live entry (not a copy), or None for a producer unknown on this partition."""
        return self._producers.get(producer_id)

    def entries(self) -> list[ProducerStateEntry]:
        """All live entries, for snapshots and DescribeProducers."""
        return list(self._producers.values())

    # -- lifecycle ------------------------------------------------------------------------------

    def load(self, entries: Iterable[ProducerStateEntry], map_end_offset: int, now_ms: int) -> None:
        """Replace the state with ``entries`` (from a snapshot), dropping expired producers.

        Entries are copied so the manager never shares mutable state with its caller.
        """
        producers: dict[int, ProducerStateEntry] = {}
        for e in entries:
            if self._is_expired(e, now_ms):
                continue
            producers[e.producer_id] = ProducerStateEntry(
                e.producer_id,
                e.epoch,
                e.batches[-NUM_BATCHES_TO_RETAIN:],
                e.last_timestamp_ms,
                e.coordinator_epoch,
                e.current_txn_first_offset,
            )
        self._producers = producers
        self._reindex_ongoing()
        self.map_end_offset = map_end_offset

    def _reindex_ongoing(self) -> None:
        self._ongoing = {
            pid: e.current_txn_first_offset
            for pid, e in self._producers.items()
            if e.current_txn_first_offset is not None
        }

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Drop producers idle for the expiration time without an open transaction (rule 12)."""
        expired = [pid for pid, e in self._producers.items() if self._is_expired(e, now_ms)]
        for pid in expired:
            del self._producers[pid]
        return expired

    def remove_producers_below(self, log_start_offset: int) -> None:
        """Forget producers none of whose records survive below ``log_start_offset``.

        Their last write is gone, so their state cannot be rebuilt from the log either; dropping it
        now keeps a restarted broker and a running one in agreement (the producer is unknown).
        """
        gone = [pid for pid, e in self._producers.items() if e.last_offset < log_start_offset]
        for pid in gone:
            del self._producers[pid]
            self._ongoing.pop(pid, None)
        # Nothing below the log start can be replayed, so the state reflects at least up to it.
        self.map_end_offset = max(self.map_end_offset, log_start_offset)

    def truncate_and_reload(self, map_end_offset: int) -> None:
        """Forget everything and restart at ``map_end_offset`` (before a rebuild from the log)."""
        self._producers = {}
        self._ongoing = {}
        self.map_end_offset = map_end_offset

    def _is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        # An open transaction pins the producer: its marker must still find the entry.
        return (
            entry.current_txn_first_offset is None
            and now_ms - entry.last_timestamp_ms >= self._expiration_ms
        )
