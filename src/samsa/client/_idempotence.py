"""Idempotent producer bookkeeping as pure decisions (no I/O, no asyncio, time passed in).

Kafka's ``TransactionManager``/``TxnPartitionMap`` are the model: the sender asks this
module what a Produce answer means for a batch and applies the :class:`Decision`; the
sequences, the batches awaiting acknowledgement and the epoch bump (KIP-360) live here.

Per partition (:class:`PartitionSequences`): a batch gets its sequence once, when first
drained, and keeps it on every retry; ``pending`` holds the sequenced, unacknowledged
batches by sequence. A batch whose request failed without a definite answer goes back to
``pending`` untouched, and then the lowest-sequence unresolved batch is resent alone, only
when nothing else of the partition is in flight: a retry can neither overtake nor be
overtaken, so the broker sees every sequence of an epoch in order, without gaps.

Producer-wide (:class:`Idempotence`): the identity (producer id, epoch) and the epoch
bump. A batch that fails for good leaves a sequence gap, and OUT_OF_ORDER_SEQUENCE_NUMBER /
UNKNOWN_PRODUCER_ID for the next expected batch means the broker lost or diverged from our
state: either way the producer stops sending, waits for its in-flight requests, moves to
the next epoch (a new producer id when the epoch is exhausted or the broker refused our
bump) and renumbers the partitions that asked for it from 0. Inside a transaction the epoch
belongs to the coordinator: such errors make the transaction abortable instead.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from samsa.client._errors import FATAL_PRODUCER_ERRORS
from samsa.protocol.errors import ErrorCode

SEQ_MOD = 1 << 31  # sequences wrap at 2**31, as the broker's
MAX_EPOCH = 32767

# Errors after which the leader or the partition must be looked up again before a retry.
REFRESH_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NOT_ENOUGH_REPLICAS,
    }
)
_DIVERGED = frozenset({ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID})


class SequencedBatch(Protocol):
    """What this module reads and writes on a batch (``_accumulator.Batch`` has it)."""

    count: int
    created: float
    base_sequence: int
    producer_id: int
    epoch: int
    payload: Any
    in_flight: bool
    attempts: int
    retry_at: float

    def drop_first(self, n: int) -> None: ...


class Action(enum.Enum):
    SUCCEED = "succeed"  # written: complete the batch with the answer's offset
    DUPLICATE = "duplicate"  # written earlier (the broker recognised the retry): no offset
    RETRY = "retry"  # back to pending, untouched, resent in sequence order
    FAIL = "fail"  # the batch fails; its sequences leave a gap (see Decision.bump)
    ABORTABLE = "abortable"  # transactional: the batch fails, the transaction must abort
    FATAL = "fatal"  # the producer is finished (fenced, not authorised)
    IGNORE = "ignore"  # the batch was resolved meanwhile (expired, fatal): nothing to do


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    bump: bool = False  # bump the epoch (after in-flight requests) and renumber this partition
    new_id: bool = False  # the bump needs a new producer id (InitProducerId)
    refresh: bool = False  # refresh the partition's metadata before the retry
    fenced: bool = False  # FATAL because a newer producer owns the identity


SUCCEED = Decision(Action.SUCCEED)
DUPLICATE = Decision(Action.DUPLICATE)
RETRY = Decision(Action.RETRY)
IGNORE = Decision(Action.IGNORE)
FAIL = Decision(Action.FAIL)
FENCED = Decision(Action.FATAL, fenced=True)


def decide(
    code: int,
    retriable: bool,
    batch: SequencedBatch,
    ps: PartitionSequences,
    *,
    idempotent: bool,
    transactional: bool,
    bump_pending: bool,
    first_epoch: int,
) -> Decision:
    """What a Produce answer (``code``; ``retriable`` as the error says) means for ``batch``.

    ``bump_pending``: a bump is already requested (the first divergence asks for it; later
    answers of the same round only retry). ``first_epoch``: the epoch this producer started
    with (0, or a resumed state's): a batch of a *later* epoch at sequence 0 refused means
    the broker did not accept our local bump, so only a new producer id helps.
    """
    if not ps.is_pending(batch):
        return IGNORE
    if code == ErrorCode.NONE:
        return SUCCEED
    if code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
        return DUPLICATE
    if code in FATAL_PRODUCER_ERRORS:
        return FENCED if code == ErrorCode.PRODUCER_FENCED else Decision(Action.FATAL)
    if transactional:
        if code == ErrorCode.INVALID_PRODUCER_EPOCH:
            return FENCED  # the coordinator gave our transactional id a newer epoch
        if code in _DIVERGED:
            # No local bump: the epoch belongs to the coordinator; abort, then InitProducerId.
            return Decision(Action.ABORTABLE, bump=True)
    if code in _DIVERGED:
        if ps.first_pending() is batch and not bump_pending:
            rejected_bump = batch.base_sequence == 0 and 0 < batch.epoch != first_epoch
            return Decision(Action.RETRY, bump=True, new_id=rejected_bump)
        return RETRY  # a later batch of the same divergence: renumbered by the bump
    if code == ErrorCode.INVALID_PRODUCER_EPOCH:
        if batch.base_sequence == 0 and batch.epoch != first_epoch:
            return Decision(Action.RETRY, bump=not bump_pending, new_id=True)
        return FENCED
    refresh = code in REFRESH_ERRORS
    if retriable or (refresh and idempotent):
        return Decision(Action.RETRY, refresh=refresh) if refresh else RETRY
    return on_failure(ps, batch, idempotent=idempotent, transactional=transactional)


def on_lost(
    ps: PartitionSequences, batch: SequencedBatch, *, retriable: bool, idempotent: bool
) -> Decision:
    """The request carrying ``batch`` got no answer (connection lost, timeout)."""
    if not ps.is_pending(batch):
        return IGNORE
    if retriable or idempotent:
        return RETRY  # the sequence may have landed: only the same batch may go again
    return FAIL


def on_failure(
    ps: PartitionSequences, batch: SequencedBatch, *, idempotent: bool, transactional: bool
) -> Decision:
    """``batch`` fails for good (non-retriable error, delivery timeout): its sequences may
    or may not have landed, so its partition renumbers under a new epoch; a transaction
    aborts first (its epoch is bumped by the coordinator after the abort)."""
    if not ps.is_pending(batch):
        return IGNORE
    if transactional:
        return Decision(Action.ABORTABLE, bump=True)
    return Decision(Action.FAIL, bump=idempotent)


def backoff(attempts: int, base: float, cap: float) -> float:
    """Exponential retry backoff after ``attempts`` sends (as Java's retry.backoff.max.ms)."""
    return min(base * (2 ** max(0, attempts - 1)), cap)


class PartitionSequences:
    """One partition's sequences and its sequenced, unacknowledged batches."""

    __slots__ = (
        "epoch",
        "in_flight",
        "last_acked",
        "next_seq",
        "pending",
        "producer_id",
        "skip",
        "skip_known",
    )

    def __init__(self, producer_id: int, epoch: int, next_seq: int) -> None:
        self.pending: list[Any] = []  # sequenced, unacknowledged, by sequence
        self.in_flight = 0
        self.producer_id = producer_id
        self.epoch = epoch
        self.next_seq = next_seq
        self.last_acked = -1
        self.skip = 0  # records already written by a previous incarnation (resume)
        self.skip_known = True

    def is_pending(self, batch: SequencedBatch) -> bool:
        # identity, not __eq__: a batch is in pending at most once
        return any(b is batch for b in self.pending)

    def first_pending(self) -> SequencedBatch | None:
        return self.pending[0] if self.pending else None

    def reset(self, producer_id: int, epoch: int) -> None:
        """Renumber the unacknowledged batches from 0 under a new identity."""
        self.producer_id = producer_id
        self.epoch = epoch
        seq = 0
        for b in self.pending:
            b.base_sequence = seq
            b.producer_id = producer_id
            b.epoch = epoch
            b.payload = None  # its header changed: build the batch again
            seq = (seq + b.count) % SEQ_MOD
        self.next_seq = seq
        self.last_acked = -1
        self.skip = 0
        self.skip_known = True

    def unresolved(self) -> SequencedBatch | None:
        """The lowest-sequence pending batch not in flight: it must go before anything new."""
        for b in self.pending:
            if not b.in_flight:
                return b
        return None

    def retry_ready(self, batch: SequencedBatch, now: float) -> float | None:
        """None when ``batch`` (from :meth:`unresolved`) may go now, else when to look again
        (``inf``: when the partition's in-flight requests are answered)."""
        if self.in_flight:
            return float("inf")  # alone: nothing else of the partition in flight
        return batch.retry_at if batch.retry_at > now else None

    def assign(self, batch: SequencedBatch, idempotent: bool) -> None:
        """Give a newly drained batch its sequence (kept on every retry)."""
        if idempotent:
            batch.base_sequence = self.next_seq
            batch.producer_id, batch.epoch = self.producer_id, self.epoch
            self.next_seq = (self.next_seq + batch.count) % SEQ_MOD
        self.pending.append(batch)

    def skip_written(self, batch: SequencedBatch) -> bool:
        """Drop the records a previous incarnation wrote (resume); False if none is left."""
        k = min(self.skip, batch.count)
        batch.drop_first(k)
        self.skip -= k
        self.next_seq = (self.next_seq + k) % SEQ_MOD
        return batch.count > 0

    def sent(self, batch: SequencedBatch) -> None:
        batch.in_flight = True
        batch.attempts += 1
        self.in_flight += 1

    def landed(self, batch: SequencedBatch) -> None:
        """The request carrying ``batch`` finished (answered or not)."""
        batch.in_flight = False
        self.in_flight -= 1

    def acknowledged(self, batch: SequencedBatch) -> None:
        self.remove(batch)
        if batch.base_sequence >= 0:
            self.last_acked = (batch.base_sequence + batch.count - 1) % SEQ_MOD

    def remove(self, batch: SequencedBatch) -> bool:
        for i, b in enumerate(self.pending):
            if b is batch:
                del self.pending[i]
                return True
        return False

    def retry(self, batch: SequencedBatch, now: float, base: float, cap: float) -> None:
        batch.retry_at = now + backoff(batch.attempts, base, cap)

    def expired(self, now: float, timeout: float) -> list[Any]:
        """Pending batches not in flight older than ``timeout`` (delivery.timeout.ms)."""
        return [b for b in self.pending if not b.in_flight and now - b.created > timeout]


class Idempotence:
    """The producer's identity and its pending epoch bump (KIP-360)."""

    __slots__ = (
        "bump_partitions",
        "bump_requested",
        "epoch",
        "first_epoch",
        "new_id",
        "producer_id",
    )

    def __init__(self, producer_id: int = -1, epoch: int = -1, first_epoch: int = 0) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.first_epoch = first_epoch
        self.bump_partitions: set[Any] = set()
        self.bump_requested = False
        self.new_id = False

    def set_identity(self, producer_id: int, epoch: int) -> None:
        """Take the identity InitProducerId or EndTxn (TV2) answered; (-1, -1) forgets it.
        Partitions move to it when next drained (see :meth:`adopt`)."""
        self.producer_id, self.epoch = producer_id, epoch

    def require_new_id(self) -> None:
        """The next bump needs a new producer id: the broker refused our epoch."""
        self.new_id = True

    def request_bump(self, key: Any, *, new_id: bool = False) -> None:
        self.bump_partitions.add(key)
        self.bump_requested = True
        self.new_id = self.new_id or new_id

    def current(self, ps: PartitionSequences) -> bool:
        return (ps.producer_id, ps.epoch) == (self.producer_id, self.epoch)

    def local_bump(self) -> tuple[int, int] | None:
        """The identity after a local bump, or None when a new producer id is needed."""
        if self.new_id or self.epoch >= MAX_EPOCH:
            return None
        return self.producer_id, self.epoch + 1

    def bumped(
        self, producer_id: int, epoch: int, partitions: Iterable[tuple[Any, PartitionSequences]]
    ) -> None:
        """Take the new identity; renumber the partitions that asked for the bump (the
        others move to it when their in-flight batches are resolved, see :meth:`adopt`)."""
        self.producer_id, self.epoch = producer_id, epoch
        for key, ps in partitions:
            if key in self.bump_partitions:
                ps.reset(producer_id, epoch)
        self.bump_partitions.clear()
        self.bump_requested = False
        self.new_id = False

    def adopt(self, ps: PartitionSequences) -> bool:
        """Move a partition to the current identity once nothing of it is unresolved;
        False while old-epoch batches are pending."""
        if self.current(ps):
            return True
        if ps.pending:
            return False
        ps.reset(self.producer_id, self.epoch)
        return True


def sequences(ps: PartitionSequences) -> Iterator[tuple[int, int]]:
    """(first, last) sequence of each pending batch, in order (for tests and logs)."""
    for b in ps.pending:
        yield b.base_sequence, (b.base_sequence + b.count - 1) % SEQ_MOD
