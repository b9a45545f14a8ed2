"""Transaction states and per-transactional-id metadata (Kafka's ``TransactionMetadata``).

Theory of operation
-------------------
A transactional id owns one producer id and epoch and at most one transaction at a time.
Its life is a walk through :class:`TxnState`::

    Empty -> Ongoing -> PrepareCommit -> CompleteCommit -> Ongoing ...
                     -> PrepareAbort  -> CompleteAbort  -> Ongoing ...
             Ongoing -> PrepareEpochFence -> PrepareAbort   (fencing, timeout)
    Empty | CompleteCommit | CompleteAbort -> PrepareAbort   (TV2: an abort with nothing added)
    Empty | CompleteCommit | CompleteAbort -> Dead          (transactional id expiry)

Each state lists the states it may be entered from (``valid_previous``, as in Kafka); the
coordinator refuses any other transition, so a bug shows up as an error instead of a
corrupted transaction. PrepareEpochFence is, as in Kafka, a step the coordinator takes in
memory only: the epoch bump it stands for is written with the PrepareAbort record that
immediately follows it.

:class:`TxnMetadata` is what one ``__transaction_state`` record holds (plus
``last_producer_epoch``, which Kafka's record does not carry: it only serves a KIP-360 retry
to the coordinator that answered the original request).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from samsa.coordinator.txn_records import TransactionLogValue
from samsa.protocol.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID

MAX_EPOCH = 32767  # int16
# KIP-939: a two-phase-commit transaction has no timeout; Kafka records it as Integer.MAX_VALUE.
NO_TIMEOUT_MS = 2_147_483_647


class TxnState(enum.Enum):
    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    @property
    def id(self) -> int:
        return int(self.value[0])

    @property
    def display(self) -> str:
        """The name DescribeTransactions/ListTransactions use."""
        return str(self.value[1])

    @property
    def valid_previous(self) -> frozenset[TxnState]:
        return _VALID_PREVIOUS[self]

    @property
    def expiration_allowed(self) -> bool:
        """An id may expire only between transactions."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def is_prepare(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @classmethod
    def from_id(cls, state_id: int) -> TxnState:
        for s in cls:
            if s.id == state_id:
                return s
        raise ValueError(f"unknown transaction state id {state_id}")

    @classmethod
    def from_name(cls, name: str) -> TxnState | None:
        for s in cls:
            if s.display.lower() == name.lower():
                return s
        return None


S = TxnState
_VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    # TV2 (KIP-890 part 2): a client may abort with nothing added, since partitions join
    # implicitly and it cannot know whether any did.
    S.PREPARE_ABORT: frozenset(
        {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    ),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}


class IllegalTransition(Exception):
    """A transition the state machine does not allow (a coordinator bug)."""


TopicPartition = tuple[str, int]


def is_epoch_exhausted(epoch: int) -> bool:
    # One spare epoch is kept so a fence can still bump an exhausted producer (Kafka's rule).
    return epoch >= MAX_EPOCH - 1


@dataclass(slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[TopicPartition] = field(default_factory=set)
    start_timestamp_ms: int = -1
    last_update_timestamp_ms: int = -1
    previous_producer_id: int = NO_PRODUCER_ID  # before a producer-id rotation
    last_producer_epoch: int = NO_PRODUCER_EPOCH  # in memory only (KIP-360 retries)
    # KIP-890 part 2: 2 when the transaction is ended by a TV2 client (EndTxn v5), whose
    # completion bumps the epoch; the producer id it rotates to when that bump exhausts it.
    client_transaction_version: int = 0
    next_producer_id: int = NO_PRODUCER_ID

    def transition(self, to: TxnState) -> None:
        if self.state not in to.valid_previous:
            raise IllegalTransition(
                f"{self.transactional_id}: {self.state.display} -> {to.display} is not allowed"
            )
        self.state = to

    def to_value(self) -> TransactionLogValue:
        parts: tuple[tuple[str, tuple[int, ...]], ...] | None = None
        if self.state != TxnState.EMPTY:
            by_topic: dict[str, list[int]] = {}
            for topic, p in sorted(self.partitions):
                by_topic.setdefault(topic, []).append(p)
            parts = tuple((t, tuple(ps)) for t, ps in by_topic.items())
        return TransactionLogValue(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            transaction_timeout_ms=self.timeout_ms,
            status=self.state.id,
            partitions=parts,
            last_update_timestamp_ms=self.last_update_timestamp_ms,
            start_timestamp_ms=self.start_timestamp_ms,
            previous_producer_id=self.previous_producer_id,
            next_producer_id=self.next_producer_id,
            client_transaction_version=self.client_transaction_version,
        )

    @property
    def two_phase(self) -> bool:
        """A KIP-939 transaction: never aborted for its age."""
        return self.timeout_ms == NO_TIMEOUT_MS

    @classmethod
    def from_value(cls, transactional_id: str, value: TransactionLogValue) -> TxnMetadata:
        state = TxnState.from_id(value.status)
        parts: set[TopicPartition] = set()
        if state != TxnState.EMPTY and value.partitions:
            parts = {(t, p) for t, ps in value.partitions for p in ps}
        return cls(
            transactional_id=transactional_id,
            producer_id=value.producer_id,
            producer_epoch=value.producer_epoch,
            timeout_ms=value.transaction_timeout_ms,
            state=state,
            partitions=parts,
            start_timestamp_ms=value.start_timestamp_ms,
            last_update_timestamp_ms=value.last_update_timestamp_ms,
            previous_producer_id=value.previous_producer_id,
            client_transaction_version=value.client_transaction_version,
            next_producer_id=value.next_producer_id,
        )

    def copy(self) -> TxnMetadata:
        return TxnMetadata(
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
            self.timeout_ms,
            self.state,
            set(self.partitions),
            self.start_timestamp_ms,
            self.last_update_timestamp_ms,
            self.previous_producer_id,
            self.last_producer_epoch,
            self.client_transaction_version,
            self.next_producer_id,
        )
