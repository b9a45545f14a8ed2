"""The transaction coordinator's operations, as a pure state machine over :class:`TxnMetadata`.

Theory of operation
-------------------
Each operation (``init_producer_id``, ``add_partitions``, ``end_txn``, ``complete``, ``tick``)
takes the request and ``now_ms`` and returns a :class:`TxnOutcome`: the ``__transaction_state``
records to write, the typed response, and the marker jobs to run once the records are durable.
An operation never changes state itself: it computes the transactional id's *next* metadata
on a copy and emits it as a record; the runtime (``txn_runtime.py``, over the generic
``runtime.py``) appends the records and then ``replay``\\s them, the only way state changes
(docs/semantics.md, rule 26). A coordinator rebuilt by replaying the
topic therefore holds the same durable state as the one that wrote it, and start-up is
exactly that replay (``begin_load``/``replay``/``end_load``).

Ending a transaction is three steps (rule 16): the Prepare{Commit,Abort} record (after which
the decision is final and the client is answered), a COMMIT/ABORT marker on every partition
of the transaction (a :class:`MarkerJob` the runtime carries out), then ``complete`` writes
Complete{Commit,Abort}. While a transaction is in a Prepare state the id is busy: its
requests get CONCURRENT_TRANSACTIONS and the client retries. A coordinator that restarts
with an id in a Prepare state finds its job in ``pending_marker_jobs`` and finishes it.

Fencing (rule 10): every InitProducerId bumps the epoch. An Ongoing transaction of the old
instance is first aborted at a bumped epoch (PrepareEpochFence -> PrepareAbort, the bump
written with the PrepareAbort record so markers carry it and every partition fences the old
epoch); the caller gets CONCURRENT_TRANSACTIONS and its retry bumps the epoch again. Timed
out transactions (rule 18) take the same path from ``tick``.

Lost state (rule 10 after damage): when start-up finds that a ``__transaction_state`` record
may be missing (recovery cut the partition's tail, or replay skipped a batch that failed its
CRC), the transactional ids whose newest surviving record precedes the damage may have moved
on in the lost record: a bump, a rotation to a new producer id, a new transaction. Bumping
such an id by one at the next InitProducerId could hand the new instance the very epoch the
lost record gave the previous one, which would then not be fenced. So
:meth:`fence_lost_state` moves each of them to the top epoch (``MAX_EPOCH``), past anything
an instance can hold (InitProducerId never hands out more than ``MAX_EPOCH - 1``): every
request of any earlier instance is fenced, an open transaction is aborted with markers at that
epoch (which fence the producer id on every partition they reach), and the next InitProducerId
finds the epoch exhausted and rotates to a fresh producer id from the durable allocator, one
never handed out before. A producer id that only the lost record knew is unknown here, so its
requests get INVALID_PRODUCER_ID_MAPPING.

Transactions v2 (KIP-890 part 2, rule 36): a TV2 client (EndTxn v5) gets a bumped epoch at
every commit and abort. The Prepare record carries ``epoch + 1`` (and
``client_transaction_version`` 2), so the markers fence the finished transaction's epoch on
every partition, and EndTxn answers with the identity the client uses next. When the bump
reaches the top epoch, the Prepare record also names a fresh ``next_producer_id`` and the
Complete record rotates to it at epoch 0. A retry of an EndTxn whose answer was lost carries
the epoch before the bump and is recognised. Partitions join implicitly: Produce v12 and
TxnOffsetCommit v5 call ``add_partitions`` themselves (``implicit``), so a TV2 client may also
abort a transaction to which nothing was added.

Two-phase commit (KIP-939, rule 37): InitProducerId with ``enable_2pc`` records the timeout
as ``NO_TIMEOUT_MS``, which ``timed_out`` never aborts; with ``keep_prepared_txn`` an Ongoing
transaction is kept (its epoch bumped, fencing the previous instance) and its identity before
the bump is returned, so the new instance can commit or abort what the old one prepared, also
after a coordinator restart (the Ongoing record replays like any other).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from samsa.coordinator.offsets_records import partition_for
from samsa.coordinator.ports import StoredBatch
from samsa.coordinator.runtime import Outcome
from samsa.coordinator.transaction import (
    MAX_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_TIMEOUT_MS,
    TopicPartition,
    TxnMetadata,
    TxnState,
    is_epoch_exhausted,
)
from samsa.coordinator.txn_records import (
    TransactionLogValue,
    TxnRecordFormatError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from samsa.protocol.errors import ErrorCode

E = ErrorCode
S = TxnState
R = TypeVar("R")

log = logging.getLogger("samsa.coordinator.txn")

TXN_TOPIC = "__transaction_state"


@dataclass(frozen=True, slots=True)
class TxnConfig:
    num_partitions: int = 50  # transaction.state.log.num.partitions
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    id_expiration_ms: int = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms
    abort_timed_out_interval_ms: int = 10_000  # ...abort.timed.out.transaction.cleanup.interval.ms
    remove_expired_interval_ms: int = 3_600_000  # ...remove.expired.transaction.cleanup.interval.ms
    coordinator_epoch: int = 0  # one broker: the state partitions never change leader


@dataclass(frozen=True, slots=True)
class TxnRecord:
    transactional_id: str
    value: TransactionLogValue | None  # None: tombstone
    # Not in Kafka's record: a live coordinator remembers it for KIP-360 retries.
    last_producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class MarkerJob:
    """Write COMMIT/ABORT markers to ``partitions`` and then complete the transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class InitPidResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    # KIP-939 keep_prepared_txn: the kept transaction's identity (-1: none was ongoing).
    ongoing_producer_id: int = NO_PRODUCER_ID
    ongoing_producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class EndTxnResult:
    error: ErrorCode
    # TV2: the identity for the client's next transaction (-1 on error).
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class TxnDescription:
    transactional_id: str
    error: ErrorCode
    state: str = ""
    timeout_ms: int = 0
    start_timestamp_ms: int = 0  # Kafka's default for an unknown id (-1: not started)
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class TxnListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass
class TxnOutcome(Outcome[TxnRecord, R]):
    """An :class:`~samsa.coordinator.runtime.Outcome` with the marker jobs to start once its
    records are written."""

    markers: list[MarkerJob] = field(default_factory=list)


class TransactionCoordinator:
    def __init__(self, config: TxnConfig, allocate_producer_id: Callable[[], int]) -> None:
        self.config = config
        self._allocate = allocate_producer_id
        self.txns: dict[str, TxnMetadata] = {}
        self._next_timeout_check_ms: int | None = None
        self._next_expiry_check_ms: int | None = None
        # Loading, per partition being loaded: ids with a record so far, and those whose
        # newest record may have been lost (damage after their last surviving record).
        self._seen: dict[int, set[str]] = {}
        self._uncertain: dict[int, set[str]] = {}

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.num_partitions)

    # == the shard of a CoordinatorRuntime ========================================================

    topic = TXN_TOPIC

    @property
    def num_partitions(self) -> int:
        return self.config.num_partitions

    def use_partitions(self, num_partitions: int) -> None:
        self.config = dataclasses.replace(self.config, num_partitions=num_partitions)

    def partition_of(self, record: TxnRecord) -> int:
        return self.partition_for(record.transactional_id)

    def serialize(self, record: TxnRecord) -> tuple[bytes, bytes | None]:
        value = None if record.value is None else encode_value(record.value)
        return encode_key(record.transactional_id), value

    def load_batch(self, partition: int, batch: StoredBatch, now_ms: int) -> Iterable[None]:
        for key, value in zip(batch.keys, batch.values, strict=True):
            if key is None:
                continue
            try:
                record = TxnRecord(decode_key(key), decode_value(value))
            except (TxnRecordFormatError, ValueError) as exc:
                log.error("a %s record is unreadable, not applied: %s", TXN_TOPIC, exc)
                self.load_damaged(partition, str(exc))
                continue
            self._apply(record, loading=True)
            self._seen.setdefault(partition, set()).add(record.transactional_id)
            self._uncertain.get(partition, set()).discard(record.transactional_id)  # newer
        return ()

    def load_held(self, partition: int, now_ms: int) -> Iterable[None]:
        """Nothing is held back: each record is applied as it is read."""
        return ()

    def load_damaged(self, partition: int, what: str) -> None:
        self._uncertain.setdefault(partition, set()).update(self._seen.get(partition, ()))

    def write_failed(self, records: Sequence[TxnRecord], error: ErrorCode) -> None:
        """Nothing to undo: state changes only by replay."""

    # == InitProducerId ===========================================================================

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected: tuple[int, int] | None,
        now_ms: int,
        *,
        enable_2pc: bool = False,
        keep_prepared: bool = False,
    ) -> TxnOutcome[Any]:
        """``expected`` is KIP-360's (producer id, epoch) of InitProducerId v3+, or None.
        ``enable_2pc``/``keep_prepared``: KIP-939 (InitProducerId v6)."""
        if not transactional_id or (keep_prepared and not enable_2pc):
            return TxnOutcome([], InitPidResult(E.INVALID_REQUEST))
        if enable_2pc:
            timeout_ms = NO_TIMEOUT_MS  # the transaction waits for its external decision
        elif not 0 < timeout_ms <= self.config.max_timeout_ms:
            return TxnOutcome([], InitPidResult(E.INVALID_TRANSACTION_TIMEOUT))
        meta = self.txns.get(transactional_id)
        if meta is None:
            # Only a base to compute the first record from: it exists once that is replayed.
            meta = TxnMetadata(
                transactional_id,
                self._allocate(),
                NO_PRODUCER_EPOCH,
                timeout_ms,
                S.EMPTY,
                last_update_timestamp_ms=now_ms,
            )
        if expected is not None and not _is_valid_producer_id(meta, expected):
            return TxnOutcome([], InitPidResult(E.PRODUCER_FENCED))
        if meta.state.is_prepare:
            return TxnOutcome([], InitPidResult(E.CONCURRENT_TRANSACTIONS))
        if meta.state == S.ONGOING and keep_prepared:
            return self._keep_prepared(meta, expected, now_ms)
        if meta.state == S.ONGOING:
            # Abort the old instance's transaction at a bumped epoch first; the client retries
            # and its retry bumps again (possibly rotating the producer id if exhausted).
            outcome = self._fence_and_abort(meta, now_ms)
            outcome.response = InitPidResult(E.CONCURRENT_TRANSACTIONS)
            return outcome
        new = meta.copy()
        if is_epoch_exhausted(meta.producer_epoch) and (
            expected is None or expected[1] == meta.producer_epoch
        ):
            new.producer_id = self._allocate()
            new.producer_epoch = 0
            new.previous_producer_id = meta.producer_id
            new.last_producer_epoch = (
                meta.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
            )
        else:
            bumped = meta.producer_epoch + 1
            new.previous_producer_id = NO_PRODUCER_ID
            if expected is None:
                new.producer_epoch, new.last_producer_epoch = bumped, NO_PRODUCER_EPOCH
            elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == meta.producer_epoch:
                new.producer_epoch, new.last_producer_epoch = bumped, meta.producer_epoch
            elif expected[1] == meta.last_producer_epoch:
                # A retry of a bump whose answer was lost: the current epoch again.
                new.last_producer_epoch = meta.last_producer_epoch
            else:
                return TxnOutcome([], InitPidResult(E.PRODUCER_FENCED))
        new.transition(S.EMPTY)
        new.timeout_ms = timeout_ms
        new.partitions = set()
        new.start_timestamp_ms = -1
        new.last_update_timestamp_ms = now_ms
        new.client_transaction_version = 0
        new.next_producer_id = NO_PRODUCER_ID
        return TxnOutcome(
            [self._record(new)], InitPidResult(E.NONE, new.producer_id, new.producer_epoch)
        )

    def _keep_prepared(
        self, meta: TxnMetadata, expected: tuple[int, int] | None, now_ms: int
    ) -> TxnOutcome[Any]:
        """KIP-939: a new instance takes over the Ongoing (prepared) transaction. The epoch is
        bumped, so the previous instance is fenced, and the transaction stays open for the
        new one to commit or abort; the answer names the identity it was prepared under."""
        if expected is not None and expected != (meta.producer_id, meta.producer_epoch):
            return TxnOutcome([], InitPidResult(E.PRODUCER_FENCED))
        if meta.producer_epoch >= MAX_EPOCH - 2:
            # No epoch left to bump and still end it with a TV2 bump: abort it instead.
            outcome = self._fence_and_abort(meta, now_ms)
            outcome.response = InitPidResult(E.CONCURRENT_TRANSACTIONS)
            return outcome
        new = meta.copy()
        new.producer_epoch = meta.producer_epoch + 1
        new.last_producer_epoch = NO_PRODUCER_EPOCH
        new.timeout_ms = NO_TIMEOUT_MS
        new.last_update_timestamp_ms = now_ms
        return TxnOutcome(
            [self._record(new)],
            InitPidResult(
                E.NONE,
                new.producer_id,
                new.producer_epoch,
                meta.producer_id,
                meta.producer_epoch,
            ),
        )

    # == AddPartitionsToTxn / AddOffsetsToTxn =====================================================

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        now_ms: int,
        *,
        implicit: bool = False,
    ) -> TxnOutcome[Any]:
        """Response: one error code for every partition of the request. ``implicit``: a TV2
        Produce v12 / TxnOffsetCommit v5 adding its own partition (KIP-890 part 2)."""
        meta = self._producer_txn(transactional_id, producer_id, producer_epoch)
        if isinstance(meta, ErrorCode):
            return TxnOutcome([], meta)
        if meta.state.is_prepare:
            return TxnOutcome([], E.CONCURRENT_TRANSACTIONS)
        if meta.state == S.PREPARE_EPOCH_FENCE:
            return TxnOutcome([], E.CONCURRENT_TRANSACTIONS)
        wanted = set(partitions)
        if meta.state == S.ONGOING and wanted <= meta.partitions:
            return TxnOutcome([], E.NONE)  # nothing new: no record
        new = meta.copy()
        if meta.state != S.ONGOING:
            new.start_timestamp_ms = now_ms
            new.client_transaction_version = 2 if implicit else 0
        elif implicit:
            new.client_transaction_version = 2
        new.transition(S.ONGOING)
        new.partitions |= wanted
        new.previous_producer_id = NO_PRODUCER_ID
        new.last_update_timestamp_ms = now_ms
        return TxnOutcome([self._record(new)], E.NONE)

    # == EndTxn ===================================================================================

    def end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        now_ms: int,
        *,
        tv2: bool = False,
    ) -> TxnOutcome[Any]:
        """Response: the error code (TV1), or with ``tv2`` (EndTxn v5, KIP-890 part 2) an
        :class:`EndTxnResult` carrying the identity for the next transaction."""
        if tv2:
            return self._end_txn_v2(transactional_id, producer_id, producer_epoch, commit, now_ms)
        return self._end_txn_v1(transactional_id, producer_id, producer_epoch, commit, now_ms)

    def _end_txn_v1(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        now_ms: int,
    ) -> TxnOutcome[Any]:
        meta = self._producer_txn(transactional_id, producer_id, producer_epoch)
        if isinstance(meta, ErrorCode):
            return TxnOutcome([], meta)
        state = meta.state
        if state == S.ONGOING:
            return self._prepare_end(meta, commit, meta.producer_epoch, now_ms)
        if state == S.COMPLETE_COMMIT:
            return TxnOutcome([], E.NONE if commit else E.INVALID_TXN_STATE)
        if state == S.COMPLETE_ABORT:
            return TxnOutcome([], E.INVALID_TXN_STATE if commit else E.NONE)
        if state == S.PREPARE_COMMIT:
            return TxnOutcome([], E.CONCURRENT_TRANSACTIONS if commit else E.INVALID_TXN_STATE)
        if state == S.PREPARE_ABORT:
            return TxnOutcome([], E.INVALID_TXN_STATE if commit else E.CONCURRENT_TRANSACTIONS)
        return TxnOutcome([], E.INVALID_TXN_STATE)  # Empty (nothing to end)

    def _end_txn_v2(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        now_ms: int,
    ) -> TxnOutcome[Any]:
        """TV2's EndTxn: every commit and abort bumps the epoch (Kafka's rules for a retry:
        the epoch before the bump, or the last epoch of the producer id rotated away from)."""
        meta = self.txns.get(transactional_id)
        if meta is None:
            return TxnOutcome([], EndTxnResult(E.INVALID_PRODUCER_ID_MAPPING))
        state = meta.state
        retry_on_overflow = (
            meta.previous_producer_id == producer_id
            and producer_epoch == MAX_EPOCH - 1
            and meta.producer_epoch == 0
        )
        retry_on_bump = meta.producer_epoch == producer_epoch + 1
        if state.is_prepare:
            valid_epoch = retry_on_bump
        elif state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            valid_epoch = (
                retry_on_bump or retry_on_overflow or producer_epoch == meta.producer_epoch
            )
        else:
            valid_epoch = producer_epoch == meta.producer_epoch
        if meta.producer_id != producer_id and not retry_on_overflow:
            return TxnOutcome([], EndTxnResult(E.INVALID_PRODUCER_ID_MAPPING))
        if not valid_epoch or meta.producer_epoch >= MAX_EPOCH:
            return TxnOutcome([], EndTxnResult(E.PRODUCER_FENCED))
        is_retry = retry_on_bump or retry_on_overflow
        current = EndTxnResult(E.NONE, meta.producer_id, meta.producer_epoch)
        if state == S.ONGOING:
            return self._prepare_end_v2(meta, commit, now_ms)
        if state == S.PREPARE_COMMIT:
            return TxnOutcome(
                [], EndTxnResult(E.CONCURRENT_TRANSACTIONS if commit else E.INVALID_TXN_STATE)
            )
        if state == S.PREPARE_ABORT:
            return TxnOutcome(
                [], EndTxnResult(E.INVALID_TXN_STATE if commit else E.CONCURRENT_TRANSACTIONS)
            )
        if state == S.COMPLETE_COMMIT and commit:
            return TxnOutcome([], current if is_retry else EndTxnResult(E.INVALID_TXN_STATE))
        if state == S.COMPLETE_ABORT and not commit and is_retry:
            return TxnOutcome([], current)
        if commit or (state == S.COMPLETE_COMMIT and is_retry):
            return TxnOutcome([], EndTxnResult(E.INVALID_TXN_STATE))
        # An abort with nothing added (Empty, or after a completed transaction).
        return self._prepare_end_v2(meta, commit, now_ms)

    def _prepare_end_v2(self, meta: TxnMetadata, commit: bool, now_ms: int) -> TxnOutcome[Any]:
        next_pid = NO_PRODUCER_ID
        if is_epoch_exhausted(meta.producer_epoch):
            next_pid = self._allocate()  # the bump reaches the top epoch: rotate at completion
        if meta.state != S.ONGOING:
            meta = meta.copy()
            meta.partitions = set()
            meta.start_timestamp_ms = now_ms  # nothing was added: it starts and ends now
        outcome = self._prepare_end(
            meta, commit, meta.producer_epoch + 1, now_ms, tv2=True, next_producer_id=next_pid
        )
        if next_pid != NO_PRODUCER_ID:
            outcome.response = EndTxnResult(E.NONE, next_pid, 0)
        else:
            outcome.response = EndTxnResult(E.NONE, meta.producer_id, meta.producer_epoch + 1)
        return outcome

    def _prepare_end(
        self,
        meta: TxnMetadata,
        commit: bool,
        epoch: int,
        now_ms: int,
        *,
        tv2: bool = False,
        next_producer_id: int = NO_PRODUCER_ID,
    ) -> TxnOutcome[Any]:
        new = meta.copy()
        new.transition(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
        new.producer_epoch = epoch
        new.previous_producer_id = NO_PRODUCER_ID
        new.next_producer_id = next_producer_id
        if tv2:
            new.client_transaction_version = 2
        new.last_update_timestamp_ms = now_ms
        return TxnOutcome([self._record(new)], E.NONE, [_job(new)])

    def _fence_and_abort(
        self, meta: TxnMetadata, now_ms: int, *, epoch: int | None = None
    ) -> TxnOutcome[Any]:
        new = meta.copy()
        new.transition(S.PREPARE_EPOCH_FENCE)  # in memory only, as in Kafka
        if epoch is None:
            # TV2 bumps twice, as Kafka does (the fence, then the abort's own bump), so the
            # fenced client's EndTxn cannot pass for a retry of this abort (that is epoch + 1)
            # and gets PRODUCER_FENCED. At the int16 ceiling the epoch cannot grow; the abort
            # still goes through.
            bump = 2 if meta.client_transaction_version >= 2 else 1
            epoch = min(meta.producer_epoch + bump, MAX_EPOCH)
        new.last_producer_epoch = NO_PRODUCER_EPOCH  # no retry may resurrect the old epoch
        return self._prepare_end(new, False, epoch, now_ms)

    def complete(self, job: MarkerJob, now_ms: int) -> TxnOutcome[Any]:
        """All markers of ``job`` are written: Complete{Commit,Abort}."""
        meta = self.txns.get(job.transactional_id)
        want = S.PREPARE_COMMIT if job.commit else S.PREPARE_ABORT
        if (
            meta is None
            or meta.state != want
            or meta.producer_id != job.producer_id
            or meta.producer_epoch != job.producer_epoch
        ):
            return TxnOutcome([], E.NONE)  # already completed (a duplicate job)
        new = meta.copy()
        new.transition(S.COMPLETE_COMMIT if job.commit else S.COMPLETE_ABORT)
        new.partitions = set()
        new.last_update_timestamp_ms = now_ms
        if meta.next_producer_id != NO_PRODUCER_ID:
            # TV2: the bump reached the top epoch; the client already holds the new id.
            new.previous_producer_id = meta.producer_id
            new.producer_id = meta.next_producer_id
            new.producer_epoch = 0
            new.next_producer_id = NO_PRODUCER_ID
        return TxnOutcome([self._record(new)], E.NONE)

    def fence_lost_state(self, transactional_ids: Iterable[str], now_ms: int) -> TxnOutcome[Any]:
        """Records (and marker jobs) fencing every instance of ids whose newest state record
        may have been lost (see the module docstring): the top epoch, and an abort of an
        open transaction. A decided one (Prepare*) keeps its decision; its markers go out at
        the top epoch."""
        outcome = TxnOutcome([], None)
        for tid in transactional_ids:
            meta = self.txns.get(tid)
            if meta is None or meta.state == S.PREPARE_EPOCH_FENCE:
                continue  # unknown: its next InitProducerId gets a fresh id anyway
            if meta.producer_epoch == MAX_EPOCH and meta.state != S.ONGOING:
                continue  # fenced already (a restart before its producer id rotated)
            if meta.state == S.ONGOING:
                fenced = self._fence_and_abort(meta, now_ms, epoch=MAX_EPOCH)
                outcome.records += fenced.records
                outcome.markers += fenced.markers
                continue
            new = meta.copy()
            new.producer_epoch = MAX_EPOCH
            new.last_producer_epoch = NO_PRODUCER_EPOCH  # no KIP-360 retry gets the old epoch
            new.last_update_timestamp_ms = now_ms
            outcome.records.append(self._record(new))
            if new.state.is_prepare:
                outcome.markers.append(_job(new))
        return outcome

    def pending_marker_jobs(self) -> list[MarkerJob]:
        """Transactions decided but not completed (after a restart: finish them)."""
        return [_job(m) for m in self.txns.values() if m.state.is_prepare]

    # == produce / TxnOffsetCommit verification (rule 19) ==========================================

    def verify(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        partition: TopicPartition,
    ) -> ErrorCode:
        """May this transactional batch be written to ``partition``? Only if the producer is
        current and the partition is part of its Ongoing transaction (KIP-890 part 1)."""
        meta = self.txns.get(transactional_id) if transactional_id else None
        if meta is None or meta.producer_id != producer_id:
            return E.INVALID_PRODUCER_ID_MAPPING
        if producer_epoch != meta.producer_epoch:
            return E.INVALID_PRODUCER_EPOCH
        if meta.state != S.ONGOING or partition not in meta.partitions:
            return E.INVALID_TXN_STATE
        return E.NONE

    # == admin ====================================================================================

    def describe(self, transactional_ids: Iterable[str]) -> list[TxnDescription]:
        out = []
        for tid in transactional_ids:
            meta = self.txns.get(tid)
            if meta is None:
                out.append(TxnDescription(tid, E.TRANSACTIONAL_ID_NOT_FOUND))
                continue
            out.append(
                TxnDescription(
                    tid,
                    E.NONE,
                    meta.state.display,
                    meta.timeout_ms,
                    meta.start_timestamp_ms,
                    meta.producer_id,
                    meta.producer_epoch,
                    tuple(sorted(meta.partitions)),
                )
            )
        return out

    def list(
        self,
        states: Iterable[str] = (),
        producer_ids: Iterable[int] = (),
        duration_ms: int = -1,
        pattern: str | None = None,
        now_ms: int = 0,
    ) -> tuple[ErrorCode, list[str], list[TxnListing]]:
        """(error, unknown state filters, listings). Filters combine with AND; a duration
        keeps transactions running for longer than it (never one that has not started); a
        pattern must match the whole id."""
        unknown = [s for s in states if TxnState.from_name(s) is None]
        wanted = {st for s in states if (st := TxnState.from_name(s)) is not None}
        pids = set(producer_ids)
        regex = None
        if pattern:
            try:
                regex = re.compile(pattern)
            except re.error:
                return E.INVALID_REGULAR_EXPRESSION, unknown, []
        out = []
        for tid, m in sorted(self.txns.items()):
            if states and m.state not in wanted:
                continue
            if pids and m.producer_id not in pids:
                continue
            if duration_ms >= 0 and (
                m.start_timestamp_ms < 0 or now_ms - m.start_timestamp_ms <= duration_ms
            ):
                continue
            if regex is not None and regex.fullmatch(tid) is None:
                continue
            out.append(TxnListing(tid, m.producer_id, m.state.display))
        return E.NONE, unknown, out

    # == timers ===================================================================================

    def tick(self, now_ms: int) -> TxnOutcome[Any]:
        """Abort transactions past their timeout (rule 18) and expire idle transactional ids."""
        cfg = self.config
        outcome = TxnOutcome([], None)
        if self._next_timeout_check_ms is None or now_ms >= self._next_timeout_check_ms:
            self._next_timeout_check_ms = now_ms + cfg.abort_timed_out_interval_ms
            for meta in self.timed_out(now_ms):
                fenced = self._fence_and_abort(meta, now_ms)
                outcome.records += fenced.records
                outcome.markers += fenced.markers
        if self._next_expiry_check_ms is None or now_ms >= self._next_expiry_check_ms:
            self._next_expiry_check_ms = now_ms + cfg.remove_expired_interval_ms
            for meta in list(self.txns.values()):
                if (
                    meta.state.expiration_allowed
                    and meta.last_update_timestamp_ms + cfg.id_expiration_ms <= now_ms
                ):
                    meta.copy().transition(S.DEAD)  # checks the transition is legal
                    outcome.records.append(TxnRecord(meta.transactional_id, None))
        return outcome

    def timed_out(self, now_ms: int) -> list[TxnMetadata]:
        return [
            m
            for m in self.txns.values()
            if m.state == S.ONGOING
            and not m.two_phase  # KIP-939: only its external decision ends it
            and m.start_timestamp_ms + m.timeout_ms < now_ms
        ]

    # == replay ===================================================================================

    def begin_load(self, partition: int) -> None:
        self._seen[partition], self._uncertain[partition] = set(), set()

    def end_load(self, partition: int, now_ms: int = 0) -> list[TxnRecord]:
        """``partition`` is loaded: the records fencing its ids whose newest record may have
        been lost (rule 26), for the runtime to write and flush before serving it. Their
        marker jobs are resumed by ``pending_marker_jobs`` like any other."""
        self._seen.pop(partition, None)
        uncertain = self._uncertain.pop(partition, set())
        if not uncertain:
            return []
        records = self.fence_lost_state(sorted(uncertain), now_ms).records
        if records:
            fenced = [r.transactional_id for r in records]
            log.error(
                "%s may have lost records: fencing %d transactional id(s) at the top epoch, "
                "so their next InitProducerId gets a fresh producer id: %s",
                TXN_TOPIC,
                len(fenced),
                ", ".join(fenced[:20]) + (" ..." if len(fenced) > 20 else ""),
            )
        return records

    def replay(self, record: TxnRecord, now_ms: int = 0, offset: int | None = None) -> None:
        """Apply one ``__transaction_state`` record: the only way state changes."""
        self._apply(record, loading=False)

    def _apply(self, record: TxnRecord, *, loading: bool) -> None:
        """``loading``: a stored record of start-up (KIP-360's last epoch is not kept)."""
        tid = record.transactional_id
        if record.value is None:
            self.txns.pop(tid, None)  # Dead: the id expired
            return
        meta = TxnMetadata.from_value(tid, record.value)
        if not loading:
            meta.last_producer_epoch = record.last_producer_epoch
        self.txns[tid] = meta

    def durable_state(self) -> dict[str, tuple[Any, ...]]:
        """What the log must rebuild: everything but the in-memory KIP-360 retry epoch."""
        return {
            tid: (
                m.producer_id,
                m.producer_epoch,
                m.timeout_ms,
                m.state,
                tuple(sorted(m.partitions)),
                m.start_timestamp_ms,
                m.last_update_timestamp_ms,
                m.previous_producer_id,
                m.client_transaction_version,
                m.next_producer_id,
            )
            for tid, m in sorted(self.txns.items())
        }

    # == helpers ==================================================================================

    def _producer_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> TxnMetadata | ErrorCode:
        """The id's metadata if the request comes from its current producer, else the error."""
        meta = self.txns.get(transactional_id)
        if (
            meta is not None
            and meta.state.is_prepare
            and (producer_id, producer_epoch) == (meta.next_producer_id, 0)
        ):
            return E.CONCURRENT_TRANSACTIONS  # TV2 rotation under way: the new id waits
        if meta is None or meta.producer_id != producer_id:
            return E.INVALID_PRODUCER_ID_MAPPING
        if producer_epoch != meta.producer_epoch:
            return E.PRODUCER_FENCED
        return meta

    @staticmethod
    def _record(meta: TxnMetadata) -> TxnRecord:
        return TxnRecord(meta.transactional_id, meta.to_value(), meta.last_producer_epoch)


def _job(meta: TxnMetadata) -> MarkerJob:
    return MarkerJob(
        meta.transactional_id,
        meta.producer_id,
        meta.producer_epoch,
        meta.state == S.PREPARE_COMMIT,
        tuple(sorted(meta.partitions)),
    )


def _is_valid_producer_id(meta: TxnMetadata, expected: tuple[int, int]) -> bool:
    """KIP-360: a request naming a producer id/epoch is only served for the current producer
    id, a fresh id (no epoch yet), or the id just rotated away from at an exhausted epoch (a
    retry of the rotation)."""
    pid, epoch = expected
    return (
        meta.producer_epoch == NO_PRODUCER_EPOCH
        or pid == meta.producer_id
        or (pid == meta.previous_producer_id and is_epoch_exhausted(epoch))
    )
