"""Transactions: the producer's transaction states, coordinator requests, resumed transactions.

:class:`TransactionManager` (Kafka's) is the producer's state machine: the producer's
transactional methods delegate to it, and it reaches the producer only through
:class:`TransactionHost` (flush, ``drop_unsent``, fail, wake the sender) and the identity
through :class:`Idempotence`'s methods. Besides: the states and their legal transitions,
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
import contextlib
import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from samsa.client._accumulator import ProducerHost
from samsa.client._cluster import KEY_GROUP, KEY_TRANSACTION, Cluster
from samsa.client._config import PRODUCER, Config
from samsa.client._errors import (
    AbortableTransactionError,
    ClosedError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionStateError,
)
from samsa.client._idempotence import Idempotence
from samsa.client._retry import COORDINATOR_MOVED, deciding_code
from samsa.client._types import (
    ConsumerGroupMetadata,
    OffsetAndEpoch,
    PreparedTransaction,
    TopicPartition,
)
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
        self,
        transactional_id: str,
        timeout_ms: int,
        producer_id: int,
        epoch: int,
        *,
        two_phase: bool = False,
        keep_prepared: bool = False,
    ) -> tuple[int, int, int, tuple[int, int]]:
        """InitProducerId; (producer id, epoch) = (-1, -1) unless bumping (KIP-360).
        ``two_phase``/``keep_prepared``: KIP-939 (v6), which also answers the kept
        transaction's (producer id, epoch), (-1, -1) when none was open."""
        kip939 = {"enable2_pc": two_phase, "keep_prepared_txn": keep_prepared}
        resp, code = await self.call(
            KEY_TRANSACTION,
            transactional_id,
            ApiKey.INIT_PRODUCER_ID,
            (6, 6) if two_phase else (0, 5),
            "InitProducerIdRequest",
            lambda v: {
                "transactional_id": transactional_id,
                "transaction_timeout": timeout_ms,
                "producer_id": producer_id,
                "producer_epoch": epoch,
                **(kip939 if v >= 6 else {}),
            },
            lambda r: (int(r.error_code),),
        )
        ongoing = (
            int(getattr(resp, "ongoing_txn_producer_id", -1)),
            int(getattr(resp, "ongoing_txn_producer_epoch", -1)),
        )
        return code, int(resp.producer_id), int(resp.producer_epoch), ongoing

    async def transaction_version(self, transactional_id: str) -> int:
        """2 when the transaction coordinator offers transactions v2 (KIP-890 part 2): the
        finalized feature at level 2 and the request versions that carry it."""
        conn = await self.cluster.coordinator(KEY_TRANSACTION, transactional_id)
        level = conn.features.get("transaction.version", 0)
        ends = conn.api_versions.get(ApiKey.END_TXN, (0, 0))[1]
        produces = conn.api_versions.get(ApiKey.PRODUCE, (0, 0))[1]
        offsets = conn.api_versions.get(ApiKey.TXN_OFFSET_COMMIT, (0, 0))[1]
        return 2 if level >= 2 and ends >= 5 and produces >= 12 and offsets >= 5 else 1

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
        offsets: Mapping[TopicPartition, OffsetAndEpoch],
        group: ConsumerGroupMetadata,
        *,
        tv2: bool = False,
    ) -> int:
        by_topic: dict[str, list[tuple[int, OffsetAndEpoch]]] = {}
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
                                committed_offset=o.offset,
                                committed_leader_epoch=o.leader_epoch,
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
        # v5 (TV2) adds the group's offsets partition to the transaction: no AddOffsetsToTxn.
        _, code = await self.call(
            KEY_GROUP,
            group.group_id,
            ApiKey.TXN_OFFSET_COMMIT,
            (5, 5) if tv2 else (0, 3),
            "TxnOffsetCommitRequest",
            fields,
            codes,
        )
        return code

    async def end_txn(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        *,
        tv2: bool = False,
    ) -> tuple[int, int, int]:
        """EndTxn; (code, producer id, epoch). v5 (TV2) bumps the epoch and answers the
        identity for the next transaction; TV1 keeps it (returned unchanged)."""
        resp, code = await self.call(
            KEY_TRANSACTION,
            transactional_id,
            ApiKey.END_TXN,
            (5, 5) if tv2 else (0, 3),
            "EndTxnRequest",
            lambda v: {
                "transactional_id": transactional_id,
                "producer_id": producer_id,
                "producer_epoch": epoch,
                "committed": commit,
            },
            lambda r: (int(r.error_code),),
        )
        if tv2 and code == 0:
            return code, int(resp.producer_id), int(resp.producer_epoch)
        return code, producer_id, epoch


def txn_retry_timeout(c: Config) -> float:
    """How long a transactional coordinator request is retried: as long as the coordinator
    may keep the transaction open (``transaction.timeout.ms``), and not less than
    ``max.block.ms``. A commit whose answer was lost is thus resent until its outcome is
    known; the caller's own timeout still returns earlier (and the call can be repeated)."""
    return max(c.seconds("max.block.ms"), c.seconds("transaction.timeout.ms"))


def group_metadata(group: str | ConsumerGroupMetadata) -> ConsumerGroupMetadata:
    return ConsumerGroupMetadata(group) if isinstance(group, str) else group


def normalize_offsets(
    offsets: Mapping[TopicPartition, int | OffsetAndEpoch]
    | Mapping[tuple[str, int], int | OffsetAndEpoch],
) -> dict[TopicPartition, OffsetAndEpoch]:
    """Offsets by partition, each with its leader epoch (as Java's OffsetAndMetadata: a bare
    offset carries none, -1)."""
    return {
        TopicPartition(*tp): off if isinstance(off, OffsetAndEpoch) else OffsetAndEpoch(int(off))
        for tp, off in offsets.items()
    }


class TransactionHost(ProducerHost, Protocol):
    """The producer as its transaction manager sees it."""

    transactional_id: str | None
    config: Config
    cluster: Cluster

    @property
    def running(self) -> bool:
        """Started and not closed."""
        ...

    async def flush(self, timeout: float | None = None) -> None:
        """Until every record sent so far is acknowledged or failed."""

    def drop_unsent(self, err: BaseException) -> None:
        """Fail every record not sent yet."""


class TransactionManager:
    """The transactional producer's state machine and coordinator requests (Kafka's
    ``TransactionManager``; see ``_producer``'s module docstring for the protocol). It
    holds which partitions are in the open transaction, why it must abort, and whether the
    abort must bump the epoch; it acts on the producer's batches only through its host
    (flush, failing what is not sent yet)."""

    def __init__(self, host: TransactionHost, idem: Idempotence) -> None:
        self.host = host
        self.idem = idem
        self.transactional_id = host.transactional_id
        c = host.config
        self.timeout_ms = c.int("transaction.timeout.ms")
        self.two_phase = c.bool("transaction.two.phase.commit.enable")  # KIP-939
        self.tv2 = False  # transactions v2 (KIP-890 part 2), decided at init
        self.state = TransactionState.UNINITIALIZED
        self.channel = TxnChannel(host.cluster, timeout=txn_retry_timeout(c))
        self.lock = asyncio.Lock()  # one coordinator request at a time, in order
        self.added: set[TopicPartition] = set()  # partitions in the open transaction
        self.new: set[TopicPartition] = set()  # to add before their first batch
        self._add_task: asyncio.Task[None] | None = None
        self.started = False  # the coordinator knows the transaction (EndTxn needed)
        self.error: KafkaError | None = None  # why the transaction must abort
        self.bump = False  # abort must be followed by an epoch bump (KIP-360)
        self.op: tuple[str, asyncio.Task[Any]] | None = None  # resumable after a timeout

    async def init_transactions(self, timeout: float | None = None) -> None:
        """See :meth:`AsyncProducer.init_transactions`."""

        def start() -> None:
            self.require_txn("init_transactions")
            self.transition(TransactionState.INITIALIZING, "init_transactions")

        await self.run_op("init_transactions", start, self.init, timeout)

    def begin_transaction(self) -> None:
        """See :meth:`AsyncProducer.begin_transaction`."""
        self.require_txn("begin_transaction")
        if self.op is not None:
            raise TransactionStateError(f"begin_transaction: {self.op[0]} is unfinished")
        self.transition(TransactionState.IN_TRANSACTION, "begin_transaction")
        self.added.clear()
        self.new.clear()
        self.started = False
        self.error = None

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndEpoch]
        | Mapping[tuple[str, int], int | OffsetAndEpoch],
        group: str | ConsumerGroupMetadata,
        timeout: float | None = None,
    ) -> None:
        """See :meth:`AsyncProducer.send_offsets_to_transaction`."""
        offs = normalize_offsets(offsets)
        meta = group_metadata(group)

        def start() -> None:
            self.require_txn("send_offsets_to_transaction")
            self.require_open("send_offsets_to_transaction")

        await self.run_op(
            "send_offsets_to_transaction",
            start,
            lambda: self.send_offsets(offs, meta),
            timeout,
        )

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """See :meth:`AsyncProducer.commit_transaction`."""

        def start() -> None:
            self.require_txn("commit_transaction")
            if self.state is TransactionState.ABORTABLE_ERROR:
                raise self.send_error()
            self.transition(TransactionState.COMMITTING, "commit_transaction")

        await self.run_op("commit_transaction", start, lambda: self.end(True), timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """See :meth:`AsyncProducer.abort_transaction`."""

        def start() -> None:
            self.require_txn("abort_transaction")
            self.transition(TransactionState.ABORTING, "abort_transaction")

        await self.run_op("abort_transaction", start, lambda: self.end(False), timeout)

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTransaction:
        """See :meth:`AsyncProducer.prepare_transaction`."""

        def start() -> None:
            self.require_txn("prepare_transaction")
            self.require_open("prepare_transaction")

        result: PreparedTransaction = await self.run_op(
            "prepare_transaction", start, self.prepare, timeout
        )
        return result

    def require_txn(self, what: str) -> None:
        if self.transactional_id is None:
            raise TransactionStateError(f"{what}: the producer has no transactional.id")
        self._raise_fatal()
        if not self.host.running:
            raise ClosedError(f"{what}: producer is not running")

    def require_open(self, what: str) -> None:
        if self.state is TransactionState.ABORTABLE_ERROR:
            raise self.send_error()
        if self.state is not TransactionState.IN_TRANSACTION:
            raise TransactionStateError(f"{what}: no open transaction ({self.state.value})")

    def send_error(self) -> BaseException:
        fatal = self.host.fatal_error
        if fatal is not None:
            return fatal
        if self.state is TransactionState.ABORTABLE_ERROR:
            cause = self.error
            code = getattr(cause, "code", ErrorCode.UNKNOWN_SERVER_ERROR)
            return AbortableTransactionError(code, f"the transaction must be aborted: {cause}")
        return TransactionStateError(
            f"no open transaction (state {self.state.value}): call begin_transaction()"
        )

    def _raise_fatal(self) -> None:
        fatal = self.host.fatal_error
        if fatal is not None:
            raise fatal

    def enter_fatal(self) -> None:
        """The producer failed (fenced, ...): every transactional call raises."""
        self.state = TransactionState.FATAL_ERROR

    def admission_error(self) -> BaseException | None:
        """None while records may join the transaction (open, or committing: sent
        before the commit), else why not."""
        if self.state in (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING):
            return None
        return self.send_error()

    def enlist(self, tp: TopicPartition) -> None:
        """A partition gets a record: add it to the transaction unless it is in it."""
        if tp not in self.added:
            self.add_partition(tp)

    def includes(self, tp: TopicPartition) -> bool:
        """The partition is in the open transaction (the sender holds its batches until)."""
        return tp in self.added

    def aborting_with_bump(self) -> bool:
        return self.state is TransactionState.ABORTING and self.bump

    def transition(self, target: TransactionState, what: str) -> None:
        self._raise_fatal()
        check_transition(self.state, target, what)
        log.debug("transaction state %s -> %s", self.state.value, target.value)
        self.state = target

    async def run_op(
        self,
        name: str,
        start: Callable[[], None],
        make: Callable[[], Any],
        timeout: float | None,
    ) -> Any:
        """Run one transactional operation as a task that outlives a caller's timeout, so
        that calling the same method again waits for it instead of starting over (as
        Kafka's producer does); any other transactional call meanwhile is refused."""
        op = self.op
        if op is not None and op[0] != name:
            raise TransactionStateError(f"{name}: {op[0]} is unfinished; call it again first")
        if op is None:
            start()
            task = asyncio.get_running_loop().create_task(make())
            # retrieved here if nobody awaits it again after a timeout
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            op = self.op = (name, task)
        task = op[1]
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            raise KafkaTimeoutError(f"{name} is still running; call it again to wait") from None
        finally:
            if task.done() and self.op is op:
                self.op = None

    def check(self, code: int, what: str, abortable: frozenset[int] = frozenset()) -> None:
        """Apply a coordinator's final answer to the state machine; raise if it failed."""
        outcome, err = classify(code, what, abortable)
        if err is None:
            return
        if outcome is Outcome.FATAL:
            self.host.fail_fatal(err)
        else:
            self.fail(err, bump=outcome is Outcome.ABORTABLE_BUMP)
        raise err

    def fail(self, err: BaseException, *, bump: bool) -> None:
        """The open transaction cannot commit any more: fail what is not sent yet."""
        if bump:
            self.bump = True
        if self.state not in (
            TransactionState.IN_TRANSACTION,
            TransactionState.COMMITTING,
            TransactionState.ABORTABLE_ERROR,
        ):
            return  # aborting already (or fatal): nothing to change
        if self.error is None:
            self.error = err
        if self.state is not TransactionState.ABORTABLE_ERROR:
            log.warning("transaction must abort: %s", err)
            self.state = TransactionState.ABORTABLE_ERROR
        self.new.clear()
        self.host.drop_unsent(self.send_error())

    def add_partition(self, tp: TopicPartition) -> None:
        if self.tv2:  # Produce v12 adds the partition with its first batch
            self.added.add(tp)
            self.started = True
            self.host.wake()
            return
        self.new.add(tp)
        if self._add_task is None or self._add_task.done():
            self._add_task = self.host.spawn(self._add_partitions())

    async def _add_partitions(self) -> None:
        """AddPartitionsToTxn for partitions about to get their first batch; the sender
        holds those batches until their partition is in the transaction."""
        assert self.transactional_id is not None
        active = (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING)
        try:
            while self.new and self.state in active:
                async with self.lock:
                    # re-checked under the lock: an abort may have run while we waited
                    if not self.new or self.state not in active:
                        return
                    tps = sorted(self.new)
                    code = await self.channel.add_partitions(
                        self.transactional_id, self.idem.producer_id, self.idem.epoch, tps
                    )
                    if code == 0:
                        self.added.update(tps)
                        self.new.difference_update(tps)
                        self.started = True
                        self.host.wake()
                        continue
                with contextlib.suppress(KafkaError):
                    self.check(code, "AddPartitionsToTxn", ABORTABLE_ADD)
                return
        except KafkaError as exc:
            # The coordinator stayed unreachable: it may or may not have added them, so
            # the abort must bump the epoch, which ends whatever it holds (rule 10).
            self.fail(exc, bump=True)
        finally:
            self.host.wake()

    async def init(self, producer_id: int = -1, epoch: int = -1) -> None:
        """InitProducerId for the transactional id; with (producer id, epoch) it is the
        KIP-360 bump of our own current epoch, refused (PRODUCER_FENCED) if we are stale."""
        assert self.transactional_id is not None
        try:
            code, pid, ep, _ = await self.channel.init_producer_id(
                self.transactional_id,
                self.timeout_ms,
                producer_id,
                epoch,
                two_phase=self.two_phase,
            )
            if not code:
                version = await self.channel.transaction_version(self.transactional_id)
                self.tv2 = version >= 2
        except KafkaError:
            if self.state is TransactionState.INITIALIZING and producer_id < 0:
                self.state = TransactionState.UNINITIALIZED  # may be called again
            raise
        if code:
            _, err = classify(code, "InitProducerId")
            assert err is not None
            if not isinstance(err, ProducerFencedError):
                err = KafkaError(code, "InitProducerId")
            self.host.fail_fatal(err)
            raise err
        # Partitions renumber from 0 under the new identity when next drained.
        self.idem.set_identity(pid, ep)
        self.bump = False
        log.info("transactional id %s: producer id %d epoch %d", self.transactional_id, pid, ep)
        if self.state is TransactionState.INITIALIZING:
            self.state = TransactionState.READY

    async def send_offsets(
        self, offsets: dict[TopicPartition, OffsetAndEpoch], meta: ConsumerGroupMetadata
    ) -> None:
        assert self.transactional_id is not None
        ids = (self.transactional_id, self.idem.producer_id, self.idem.epoch)
        async with self.lock:
            try:
                if not self.tv2:  # TV2: TxnOffsetCommit v5 adds the offsets partition
                    code = await self.channel.add_offsets(*ids, meta.group_id)
                    self.check(code, "AddOffsetsToTxn", ABORTABLE_OFFSETS)
                self.started = True
                code = await self.channel.txn_offset_commit(*ids, offsets, meta, tv2=self.tv2)
                self.check(code, "TxnOffsetCommit", ABORTABLE_OFFSETS)
            except KafkaTimeoutError as exc:
                self.fail(exc, bump=True)  # unknown outcome: see _txn_add_partitions
                raise

    async def prepare(self) -> PreparedTransaction:
        assert self.transactional_id is not None
        await self.host.flush()
        self._raise_fatal()
        if self.state is not TransactionState.IN_TRANSACTION:
            raise self.send_error()
        async with self.lock:  # no AddPartitionsToTxn still on its way
            self.transition(TransactionState.PREPARED, "prepare_transaction")
        return PreparedTransaction(
            self.transactional_id, self.idem.producer_id, self.idem.epoch, self.started
        )

    async def end(self, commit: bool) -> None:
        """Commit or abort: flush (commit) or drop what is unsent (abort), EndTxn, then
        the epoch bump an earlier failure asked for."""
        assert self.transactional_id is not None
        if not commit:
            self.new.clear()
            self.host.drop_unsent(TransactionAbortedError())
        # Batches already sent must be resolved first: an unresolved one could land in the
        # next transaction, and sequences must stay known (unless the epoch changes).
        await self.host.flush()
        self._raise_fatal()
        if commit and self.state is not TransactionState.COMMITTING:
            raise self.send_error()  # a batch or partition failed during the flush
        async with self.lock:
            cause = getattr(self.error, "code", 0)
            unknown_id = cause == ErrorCode.INVALID_PRODUCER_ID_MAPPING
            # The coordinator refuses EndTxn for a transaction it never heard of (Empty),
            # and for a producer id it does not know: then only the bump is left.
            # TV2: EndTxn's own bump is the one an abortable error asks for (an abort
            # with nothing added is allowed); TV1 needs InitProducerId for it (KIP-360).
            tv2_bump = self.tv2 and not commit and self.bump
            if (self.started or tv2_bump) and not unknown_id:
                code, pid, ep = await self.channel.end_txn(
                    self.transactional_id,
                    self.idem.producer_id,
                    self.idem.epoch,
                    commit,
                    tv2=self.tv2,
                )
                self.check(code, "EndTxn")
                # TV2: the epoch moved on (sequences restart under the new identity).
                self.idem.set_identity(pid, ep)
            if not commit and self.bump and not (tv2_bump and not unknown_id):
                await self.init(self.idem.producer_id, self.idem.epoch)
            self.bump = False
        self.added.clear()
        self.new.clear()
        self.started = False
        self.error = None
        self.state = TransactionState.READY


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
        # KIP-939: take the prepared transaction over with InitProducerId keep_prepared_txn
        # (fencing its producer) instead of ending it under the identity it was prepared with.
        self.two_phase = c.bool("transaction.two.phase.commit.enable")
        self.tv2 = False
        self._gone = False  # 2PC: the prepared transaction is no longer open
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
        if self.two_phase:
            await self._take_over()

    async def _take_over(self) -> None:
        code, pid, epoch, ongoing = await self._channel.init_producer_id(
            self.transactional_id,
            60_000,  # not used for a 2PC transaction (no timeout)
            -1,
            -1,
            two_phase=True,
            keep_prepared=True,
        )
        self._raise(code, "InitProducerId")
        if self.started and ongoing != (self.producer_id, self.epoch):
            # Ended meanwhile (or never prepared under this identity): not ours to decide.
            self._gone = True
            log.warning(
                "transaction of %s prepared as %s is no longer open (open: %s)",
                self.transactional_id,
                (self.producer_id, self.epoch),
                ongoing,
            )
        self.producer_id, self.epoch = pid, epoch
        self.tv2 = await self._channel.transaction_version(self.transactional_id) >= 2

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
        if self._gone:
            raise ProducerFencedError(
                ErrorCode.PRODUCER_FENCED, "the transaction is no longer open"
            )
        async with self._lock:
            ids = (self.transactional_id, self.producer_id, self.epoch)
            if not self.tv2:  # TV2: TxnOffsetCommit v5 adds the offsets partition
                code = await self._channel.add_offsets(*ids, meta.group_id)
                self._raise(code, "AddOffsetsToTxn", ABORTABLE_OFFSETS)
            self.started = True
            code = await self._channel.txn_offset_commit(
                *ids, normalize_offsets(offsets), meta, tv2=self.tv2
            )
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
            if self._gone and commit:
                raise ProducerFencedError(
                    ErrorCode.PRODUCER_FENCED, "the prepared transaction is no longer open"
                )
            if self.started and not self._gone:
                code, _, _ = await self._channel.end_txn(
                    self.transactional_id, self.producer_id, self.epoch, commit, tv2=self.tv2
                )
                self._raise(code, "EndTxn")
            self._done = commit
