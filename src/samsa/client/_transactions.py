"""Transactions: the producer's transaction states, coordinator requests, resumed transactions.

The producer (``_producer.py``) drives the state machine; this module holds what does not
touch its batches: the states and their legal transitions (Kafka's ``TransactionManager``),
how each coordinator error is classified, the request loop to a coordinator (found with
FindCoordinator, re-found on NOT_COORDINATOR or a lost connection, retried on
CONCURRENT_TRANSACTIONS and load errors until ``transaction.timeout.ms``, see
``txn_retry_timeout``), and :class:`AsyncResumedTransaction`, which ends a
transaction opened by another process from its (transactional id, producer id, epoch).

Why a resumed transaction can be ended at all: Kafka's coordinator authenticates
AddOffsetsToTxn and EndTxn by transactional id + producer id + epoch only, not by connection
or client, so any process holding the current triple may add the group's offsets and commit
or abort. If the triple is no longer current (another InitProducerId fenced it, or the
coordinator aborted the transaction after ``transaction.timeout.ms`` and bumped the epoch)
the answer is PRODUCER_FENCED / INVALID_PRODUCER_EPOCH and the transaction is lost: the
caller gets :class:`ProducerFencedError`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from samsa.client._cluster import KEY_GROUP, KEY_TRANSACTION, Cluster
from samsa.client._config import PRODUCER, Config
from samsa.client._errors import (
    AbortableTransactionError,
    KafkaError,
    ProducerFencedError,
    TransactionStateError,
)
from samsa.client._retry import COORDINATOR_MOVED, deciding_code
from samsa.client._types import ConsumerGroupMetadata, PreparedTransaction, TopicPartition
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

log = logging.getLogger("samsa.client.transactions")

E = ErrorCode


class TransactionState(enum.Enum):
    UNINITIALIZED = "Uninitialized"
    INITIALIZING = "Initializing"
    READY = "Ready"
    IN_TRANSACTION = "InTransaction"
    COMMITTING = "Committing"
    ABORTING = "Aborting"
    PREPARED = "Prepared"  # flushed and handed to another process (prepare_transaction)
    ABORTABLE_ERROR = "AbortableError"
    FATAL_ERROR = "FatalError"


S = TransactionState
# target state -> states it may be entered from (FATAL_ERROR from anywhere)
_SOURCES: dict[TransactionState, frozenset[TransactionState]] = {
    S.INITIALIZING: frozenset({S.UNINITIALIZED}),
    S.READY: frozenset({S.INITIALIZING, S.COMMITTING, S.ABORTING}),
    S.IN_TRANSACTION: frozenset({S.READY}),
    # again from itself: a commit or abort that failed with a timeout is simply repeated
    # (EndTxn with the same result is idempotent at the coordinator)
    S.COMMITTING: frozenset({S.IN_TRANSACTION, S.PREPARED, S.COMMITTING}),
    S.ABORTING: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR, S.PREPARED, S.ABORTING}),
    S.PREPARED: frozenset({S.IN_TRANSACTION}),
    S.ABORTABLE_ERROR: frozenset({S.IN_TRANSACTION, S.COMMITTING, S.ABORTABLE_ERROR}),
}


def check_transition(current: TransactionState, target: TransactionState, what: str) -> None:
    if target is S.FATAL_ERROR:
        return
    if current not in _SOURCES[target]:
        raise TransactionStateError(f"{what}: not allowed in transaction state {current.value}")


# Coordinator answers that mean "ask again": after a backoff, or after finding the
# coordinator again. OPERATION_NOT_ATTEMPTED marks partitions skipped because another one
# of the same request failed; they go again with it.
RETRY = frozenset(
    {
        E.COORDINATOR_LOAD_IN_PROGRESS,
        E.CONCURRENT_TRANSACTIONS,
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.OPERATION_NOT_ATTEMPTED,
        E.REQUEST_TIMED_OUT,
        E.UNSTABLE_OFFSET_COMMIT,
    }
)
REFIND = COORDINATOR_MOVED
FENCED = frozenset({E.PRODUCER_FENCED, E.INVALID_PRODUCER_EPOCH, E.TRANSACTION_COORDINATOR_FENCED})
# The coordinator no longer knows this producer id: the transaction can only be aborted,
# and the next one needs a new epoch (KIP-360).
NEEDS_BUMP = frozenset({E.UNKNOWN_PRODUCER_ID, E.INVALID_PRODUCER_ID_MAPPING})
ABORTABLE_ADD = frozenset({E.TOPIC_AUTHORIZATION_FAILED, E.TRANSACTION_ABORTABLE})
ABORTABLE_OFFSETS = frozenset(
    {
        E.GROUP_AUTHORIZATION_FAILED,
        E.TRANSACTION_ABORTABLE,
        E.UNKNOWN_MEMBER_ID,  # the consumer was fenced by a rebalance: its offsets are stale
        E.ILLEGAL_GENERATION,
        E.FENCED_INSTANCE_ID,
    }
)


class Outcome(enum.Enum):
    OK = 0
    ABORTABLE = 1
    ABORTABLE_BUMP = 2  # abortable, and the epoch must be bumped after the abort
    FATAL = 3


def classify(
    code: int, what: str, abortable: frozenset[int] = frozenset()
) -> tuple[Outcome, KafkaError | None]:
    """How a transactional request's final error code affects the transaction."""
    if code == 0:
        return Outcome.OK, None
    if code in FENCED:
        return Outcome.FATAL, ProducerFencedError(code, f"{what}: fenced by a newer producer")
    if code in NEEDS_BUMP:
        return Outcome.ABORTABLE_BUMP, AbortableTransactionError(code, what)
    if code in abortable:
        return Outcome.ABORTABLE, AbortableTransactionError(code, what)
    return Outcome.FATAL, KafkaError(code, what)


def first_error(codes: Iterable[int]) -> int:
    """The code that decides a multi-partition answer: a real error before a retriable one."""
    return deciding_code(codes, RETRY)


class TxnChannel:
    """Requests to the coordinator of a transactional id or of a consumer group."""

    def __init__(self, cluster: Cluster, *, timeout: float) -> None:
        self.cluster = cluster
        self.timeout = timeout

    def forget(self, key_type: int, key: str) -> None:
        self.cluster.forget_coordinator(key_type, key)

    async def call(
        self,
        key_type: int,
        key: str,
        api_key: int,
        versions: tuple[int, int],
        cls: str,
        fields: Callable[[int], dict[str, Any]],
        codes: Callable[[Any], Iterable[int]],
    ) -> tuple[Any, int]:
        """Send until the answer is final; returns (response, deciding error code).

        Connection failures, NOT_COORDINATOR and the codes in RETRY are retried, with
        backoff, until ``timeout`` seconds have passed (then KafkaTimeoutError). Every
        request here is idempotent at the coordinator (adding what is already added, or
        ending a transaction that already ended the same way, succeeds; one still ending
        answers CONCURRENT_TRANSACTIONS), so resending after an unknown outcome is safe
        and cannot turn a commit into an abort or the reverse.
        """
        return await self.cluster.coordinator_call(
            key_type,
            key,
            api_key,
            versions,
            cls,
            fields,
            codes,
            retry_codes=RETRY,
            timeout=self.timeout,
        )

    # --- the transactional requests ----------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, epoch: int
    ) -> tuple[int, int, int]:
        """InitProducerId; (producer id, epoch) = (-1, -1) unless bumping (KIP-360)."""
        resp, code = await self.call(
            KEY_TRANSACTION,
            transactional_id,
            ApiKey.INIT_PRODUCER_ID,
            (0, 5),
            "InitProducerIdRequest",
            lambda v: {
                "transactional_id": transactional_id,
                "transaction_timeout": timeout_ms,
                "producer_id": producer_id,
                "producer_epoch": epoch,
            },
            lambda r: (int(r.error_code),),
        )
        return code, int(resp.producer_id), int(resp.producer_epoch)

    async def add_partitions(
        self, transactional_id: str, producer_id: int, epoch: int, tps: list[TopicPartition]
    ) -> int:
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)

        def fields(v: int) -> dict[str, Any]:
            return {
                "v3_and_below_transactional_id": transactional_id,
                "v3_and_below_producer_id": producer_id,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": tuple(
                    make_request(
                        ApiKey.ADD_PARTITIONS_TO_TXN,
                        v,
                        "AddPartitionsToTxnTopic",
                        name=t,
                        partitions=tuple(ps),
                    )
                    for t, ps in by_topic.items()
                ),
            }

        def codes(r: Any) -> list[int]:
            return [
                int(p.partition_error_code)
                for t in r.results_by_topic_v3_and_below
                for p in t.results_by_partition
            ]

        # v4+ is the brokers' batched form (KIP-890); clients speak v3 and below.
        _, code = await self.call(
            KEY_TRANSACTION,
            transactional_id,
            ApiKey.ADD_PARTITIONS_TO_TXN,
            (0, 3),
            "AddPartitionsToTxnRequest",
            fields,
            codes,
        )
        return code

    async def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group_id: str
    ) -> int:
        _, code = await self.call(
            KEY_TRANSACTION,
            transactional_id,
            ApiKey.ADD_OFFSETS_TO_TXN,
            (0, 3),
            "AddOffsetsToTxnRequest",
            lambda v: {
                "transactional_id": transactional_id,
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "group_id": group_id,
            },
            lambda r: (int(r.error_code),),
        )
        return code

    async def txn_offset_commit(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        offsets: Mapping[TopicPartition, int],
        group: ConsumerGroupMetadata,
    ) -> int:
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp, off in offsets.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, off))

        def fields(v: int) -> dict[str, Any]:
            return {
                "transactional_id": transactional_id,
                "group_id": group.group_id,
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "generation_id": group.generation_id,
                "member_id": group.member_id,
                "group_instance_id": group.group_instance_id,
                "topics": tuple(
                    make_request(
                        ApiKey.TXN_OFFSET_COMMIT,
                        v,
                        "TxnOffsetCommitRequestTopic",
                        name=t,
                        partitions=tuple(
                            make_request(
                                ApiKey.TXN_OFFSET_COMMIT,
                                v,
                                "TxnOffsetCommitRequestPartition",
                                partition_index=p,
                                committed_offset=o,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            )
                            for p, o in ps
                        ),
                    )
                    for t, ps in by_topic.items()
                ),
            }

        def codes(r: Any) -> list[int]:
            return [int(p.error_code) for t in r.topics for p in t.partitions]

        # To the group's coordinator, not the transaction's: the offsets are staged in the
        # group until the transaction's marker reaches the offsets partition.
        _, code = await self.call(
            KEY_GROUP,
            group.group_id,
            ApiKey.TXN_OFFSET_COMMIT,
            (0, 3),
            "TxnOffsetCommitRequest",
            fields,
            codes,
        )
        return code

    async def end_txn(
        self, transactional_id: str, producer_id: int, epoch: int, commit: bool
    ) -> int:
        # v5 would opt into KIP-890 part 2 (an epoch bump at every commit); this is TV1.
        _, code = await self.call(
            KEY_TRANSACTION,
            transactional_id,
            ApiKey.END_TXN,
            (0, 3),
            "EndTxnRequest",
            lambda v: {
                "transactional_id": transactional_id,
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "committed": commit,
            },
            lambda r: (int(r.error_code),),
        )
        return code


def txn_retry_timeout(c: Config) -> float:
    """How long a transactional coordinator request is retried: as long as the coordinator
    may keep the transaction open (``transaction.timeout.ms``), and not less than
    ``max.block.ms``. A commit whose answer was lost is thus resent until its outcome is
    known; the caller's own timeout still returns earlier (and the call can be repeated)."""
    return max(c.seconds("max.block.ms"), c.seconds("transaction.timeout.ms"))


def group_metadata(group: str | ConsumerGroupMetadata) -> ConsumerGroupMetadata:
    return ConsumerGroupMetadata(group) if isinstance(group, str) else group


def normalize_offsets(
    offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int],
) -> dict[TopicPartition, int]:
    return {TopicPartition(*tp): int(off) for tp, off in offsets.items()}


class AsyncResumedTransaction:
    """A transaction opened by another producer, finished here from its identity.

    Only what needs no sequence numbers can be done: add a group's offsets
    (``send_offsets_to_transaction``), then ``commit()`` or ``abort()``. Records cannot be
    added: their sequences belong to the producer that opened the transaction.
    """

    def __init__(
        self,
        config: Mapping[str, Any] | None,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        *,
        started: bool = True,
    ) -> None:
        given = {
            k: v for k, v in (config or {}).items() if k.replace("_", ".") != "transactional.id"
        }
        c = Config(PRODUCER, given)
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.epoch = epoch
        self.started = started
        timeout = txn_retry_timeout(c)
        self.cluster = Cluster.from_config(c, api_timeout=timeout)
        self._channel = TxnChannel(self.cluster, timeout=timeout)
        self._done: bool | None = None  # the outcome once ended (True: committed)
        self._lock = asyncio.Lock()

    @classmethod
    def from_prepared(
        cls, config: Mapping[str, Any] | None, prepared: PreparedTransaction
    ) -> AsyncResumedTransaction:
        return cls(
            config,
            prepared.transactional_id,
            prepared.producer_id,
            prepared.epoch,
            started=prepared.started,
        )

    async def start(self) -> None:
        await self.cluster.refresh([])

    async def __aenter__(self) -> AsyncResumedTransaction:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.cluster.close()

    def _raise(self, code: int, what: str, abortable: frozenset[int] = frozenset()) -> None:
        _, err = classify(code, what, abortable)
        if err is not None:
            raise err

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int],
        group: str | ConsumerGroupMetadata,
    ) -> None:
        """Add ``offsets`` (next offset to read, per partition) of ``group`` to the transaction."""
        if self._done is not None:
            raise TransactionStateError("the transaction has already ended")
        meta = group_metadata(group)
        async with self._lock:
            ids = (self.transactional_id, self.producer_id, self.epoch)
            code = await self._channel.add_offsets(*ids, meta.group_id)
            self._raise(code, "AddOffsetsToTxn", ABORTABLE_OFFSETS)
            self.started = True
            code = await self._channel.txn_offset_commit(*ids, normalize_offsets(offsets), meta)
            self._raise(code, "TxnOffsetCommit", ABORTABLE_OFFSETS)

    async def commit(self) -> None:
        await self._end(True)

    async def abort(self) -> None:
        await self._end(False)

    async def _end(self, commit: bool) -> None:
        async with self._lock:
            if self._done is not None:
                if self._done != commit:
                    raise TransactionStateError(
                        f"the transaction was already {'committed' if self._done else 'aborted'}"
                    )
                return
            if self.started:
                code = await self._channel.end_txn(
                    self.transactional_id, self.producer_id, self.epoch, commit
                )
                self._raise(code, "EndTxn")
            self._done = commit
