"""Produce: validate each partition's batch, append it, answer with offsets (topics by
name, by id from v13).

Partitions are independent (rule 7): each gets its own error code. With acks=0 nothing is
sent back; with acks=1 or -1 the response waits for the fsync round when
``log.flush.interval.messages`` says the append must be flushed (there are no followers,
so -1 and 1 are the same durability otherwise).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    HandlerResult,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_names,
    outside_transaction,
    resolve_topic_ids,
    throttle,
    unknown_id,
)
from samsa.broker.quotas import PRODUCE
from samsa.log.log import AppendResult
from samsa.protocol.errors import ErrorCode
from samsa.protocol.hotpath import ProducePartitionResult, encode_produce_response
from samsa.protocol.records import (
    HEADER_SIZE,
    InvalidBatchError,
    RecordBatchView,
    validate_produce_batch,
)

if TYPE_CHECKING:
    from samsa.broker.broker import Broker
    from samsa.log.log import Log

# One broker, replication factor 1: the leader is the whole in-sync replica set.
_IN_SYNC_REPLICAS = 1
VALID_ACKS = (-1, 0, 1)
# v13: each answered topic's id by the name the handler used for it (None before v13).
TopicIds = dict[str, uuid.UUID | None] | None


def handle(broker: Broker, ctx: RequestContext, request: Any) -> HandlerResult:
    # Rule 33 (Kafka's checks): Write on each topic; a transactional batch needs Write on its
    # TransactionalId. A topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION, never
    # created here: as in Kafka, only Metadata auto-creates, which clients ask first.
    txn_id = request.transactional_id
    txn_ok = txn_id is not None and authorized(broker, ctx, Op.WRITE, Res.TRANSACTIONAL_ID, txn_id)
    # v13 names topics by id (KIP-516): an id no topic has is UNKNOWN_TOPIC_ID, never created.
    by_id = ctx.version >= 13
    request_topics = resolve_topic_ids(broker, request.topic_data) if by_id else request.topic_data
    writable = authorized_names(
        broker, ctx, Op.WRITE, Res.TOPIC,
        {t.name for t in request_topics if not unknown_id(t)},
    )  # fmt: skip
    owner = ctx.principal if broker.authorizer is not None else None
    to_flush: set[Log] = set()
    results: list[tuple[str, list[Any]]] = []
    waiting = False
    # A transactional batch without a (permitted) transactional id refuses the whole request,
    # before any batch is validated, as Kafka.
    txn_refused = not txn_ok and _has_transactional_batch(request)
    for topic in request_topics:
        partitions: list[Any] = []
        for pdata in topic.partition_data:
            result: Any
            if unknown_id(topic):
                result = ProducePartitionResult(pdata.index, ErrorCode.UNKNOWN_TOPIC_ID)
            elif txn_refused:
                result = ProducePartitionResult(
                    pdata.index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                )
            elif topic.name not in writable:
                result = ProducePartitionResult(pdata.index, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            else:
                result = _append_one(
                    broker,
                    topic.name,
                    pdata,
                    to_flush,
                    txn_id if txn_ok else None,
                    owner,
                    implicit_add=ctx.version >= 12,
                    abortable=ctx.version >= 11,
                    acks=request.acks,
                )
                waiting = waiting or not isinstance(result, ProducePartitionResult)
            partitions.append(result)
        results.append((topic.name, partitions))
    ids = {t.name: t.topic_id for t in request_topics} if by_id else None
    # producer_byte_rate: the request's bytes, appended whatever the throttle (as Kafka).
    throttle_ms = throttle(broker, ctx, PRODUCE, ctx.size) if ctx.size else 0
    if waiting:  # a batch is being checked in a worker thread (Broker.append)
        return _when_appended(
            broker, ctx.version, request.acks, to_flush, results, throttle_ms, ids
        )
    return _respond(broker, ctx.version, request.acks, to_flush, results, throttle_ms, ids)


async def _when_appended(
    broker: Broker,
    version: int,
    acks: int,
    to_flush: set[Log],
    results: list[tuple[str, list[Any]]],
    throttle_ms: int,
    ids: TopicIds,
) -> Any:
    for _name, partitions in results:
        for i, result in enumerate(partitions):
            if not isinstance(result, ProducePartitionResult):
                partitions[i] = await result
    out = _respond(broker, version, acks, to_flush, results, throttle_ms, ids)
    return await out if asyncio.iscoroutine(out) else out


def _respond(
    broker: Broker,
    version: int,
    acks: int,
    to_flush: set[Log],
    results: list[tuple[str, list[ProducePartitionResult]]],
    throttle_ms: int = 0,
    ids: TopicIds = None,
) -> HandlerResult:
    flushed: list[tuple[int, int, Log]] = []  # (topic, partition) positions awaiting a flush
    if to_flush:
        for t, (name, partitions) in enumerate(results):
            for p, result in enumerate(partitions):
                part = broker.topics.get_partition(name, result.index)
                if result.error_code == ErrorCode.NONE and part is not None:
                    if part.log in to_flush:
                        flushed.append((t, p, part.log))
    broker.metrics.produced(results)
    if acks == 0:
        for plog in to_flush:
            broker.flush(plog)  # a failure takes the data directory offline; nobody to tell
        return None
    if not to_flush:
        return _encode(version, results, throttle_ms, ids)
    return _after_flush(broker, version, to_flush, results, flushed, throttle_ms, ids)


def _encode(
    version: int,
    results: list[tuple[str, list[ProducePartitionResult]]],
    throttle_ms: int,
    ids: TopicIds,
) -> bytes:
    if ids is None:
        return encode_produce_response(version, results, throttle_ms)
    return encode_produce_response(version, [(ids[n], parts) for n, parts in results], throttle_ms)


async def _after_flush(
    broker: Broker,
    version: int,
    logs: set[Log],
    results: list[tuple[str, list[ProducePartitionResult]]],
    flushed: list[tuple[int, int, Log]],
    throttle_ms: int,
    ids: TopicIds,
) -> bytes:
    order = list(logs)
    outcomes = await asyncio.gather(*(broker.flush(plog) for plog in order))
    failed = {plog: exc for plog, exc in zip(order, outcomes, strict=True) if exc is not None}
    for t, p, plog in flushed:
        exc = failed.get(plog)
        if exc is not None:
            # Appended but not known to be on disk: the client must not count it as written.
            ok = results[t][1][p]
            results[t][1][p] = ProducePartitionResult(
                ok.index,
                ErrorCode.KAFKA_STORAGE_ERROR,
                log_start_offset=ok.log_start_offset,
                error_message=f"fsync failed: {exc}",
            )
    return _encode(version, results, throttle_ms, ids)


def _append_one(
    broker: Broker,
    topic: str,
    pdata: Any,
    to_flush: set[Log],
    transactional_id: str | None = None,
    owner: str | None = None,
    implicit_add: bool = False,
    acks: int = 1,
    abortable: bool = False,
) -> ProducePartitionResult | Awaitable[ProducePartitionResult]:
    index = pdata.index
    partition = broker.partition_or_error(topic, index)
    if isinstance(partition, ErrorCode):
        return ProducePartitionResult(index, partition)
    if acks not in VALID_ACKS:
        # Nothing is appended: Kafka refuses the partitions it would write to.
        return ProducePartitionResult(
            index, ErrorCode.INVALID_REQUIRED_ACKS, error_message=f"acks {acks} is not -1, 0 or 1"
        )
    records = pdata.records
    if records is None:
        return ProducePartitionResult(index, ErrorCode.INVALID_RECORD, error_message="no records")
    try:
        batch = validate_produce_batch(records)
    except InvalidBatchError as exc:
        # Kafka's LogValidator refusals carry the partition's log start offset.
        start = partition.log.log_start_offset if exc.by_validator else -1
        return ProducePartitionResult(
            index, exc.code, log_start_offset=start, error_message=str(exc)
        )
    auth = broker.authorizer
    if owner is not None and auth is not None and batch.producer_id >= 0:
        # Rule 33: a producer id is bound to the principal that got it.
        if not auth.producer_owner_ok(batch.producer_id, owner):
            code = (
                ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                if batch.is_transactional
                else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            )
            return ProducePartitionResult(
                index, code, error_message="producer id belongs to another principal"
            )
    if batch.is_transactional and implicit_add and transactional_id is not None:
        # Rule 36 (KIP-890 part 2): Produce v12 adds its partition to the transaction itself.
        code = _implicit_add(broker, transactional_id, batch, (topic, index))
        if code != ErrorCode.NONE:
            return ProducePartitionResult(
                index, code, error_message=f"transactional batch refused: {code.name}"
            )
    if batch.is_transactional:
        # Rule 19 (KIP-890 part 1): only into a partition of the producer's open transaction.
        code = (
            broker.transactions.verify(
                transactional_id, batch.producer_id, batch.producer_epoch, (topic, index)
            )
            if transactional_id is not None
            else ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )
        code = _retriable_for_every_client(outside_transaction(code, abortable))
        if code != ErrorCode.NONE:
            return ProducePartitionResult(
                index, code, error_message=f"transactional batch refused: {code.name}"
            )
    plog = partition.log
    if acks == -1 and plog.config.min_insync_replicas > _IN_SYNC_REPLICAS:
        # Rule 39: as Kafka's leader, refuse before appending anything.
        return ProducePartitionResult(
            index,
            ErrorCode.NOT_ENOUGH_REPLICAS,
            log_start_offset=plog.log_start_offset,
            error_message=(
                f"the in-sync replicas ({_IN_SYNC_REPLICAS}) are fewer than "
                f"min.insync.replicas ({plog.config.min_insync_replicas})"
            ),
        )
    appended = broker.append(partition, batch)
    if isinstance(appended, AppendResult):
        return _outcome(broker, plog, index, appended, to_flush)
    return _then(broker, plog, index, appended, to_flush)


async def _then(
    broker: Broker, plog: Log, index: int, appended: Awaitable[AppendResult], to_flush: set[Log]
) -> ProducePartitionResult:
    return _outcome(broker, plog, index, await appended, to_flush)


def _outcome(
    broker: Broker, plog: Log, index: int, result: AppendResult, to_flush: set[Log]
) -> ProducePartitionResult:
    if result.error != ErrorCode.NONE:
        return ProducePartitionResult(
            index,
            result.error,
            log_start_offset=plog.log_start_offset,
            error_message=result.message,
            record_errors=result.record_errors,
        )
    # Wait for the fsync round when this append made one due; with fsync-per-message, also
    # for a duplicate, whose original append may still be waiting for its round.
    if plog.unflushed_messages and (
        broker.needs_flush(plog)
        or (
            result.duplicate
            and (plog.config.flush_interval_messages <= 1 or not plog.config.flush_ms)
        )
    ):
        to_flush.add(plog)
    return ProducePartitionResult(
        index, ErrorCode.NONE, result.base_offset, result.log_append_time, plog.log_start_offset
    )


def _implicit_add(
    broker: Broker, transactional_id: str, batch: Any, tp: tuple[str, int]
) -> ErrorCode:
    code = broker.transactions.add_partitions(
        transactional_id, batch.producer_id, batch.producer_epoch, [tp], implicit=True
    )
    # As Kafka answers a producer: a fenced epoch is INVALID_PRODUCER_EPOCH.
    if code == ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return _retriable_for_every_client(code)


# Kafka's ReplicaManager: a transaction coordinator that could not verify the partition (busy
# completing the previous transaction, loading, moved, unreachable) is answered with an error
# every producer retries without refreshing metadata.
_COORDINATOR_BUSY = frozenset(
    {
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
    }
)


def _retriable_for_every_client(code: ErrorCode) -> ErrorCode:
    return ErrorCode.NOT_ENOUGH_REPLICAS if code in _COORDINATOR_BUSY else code


def _has_transactional_batch(request: Any) -> bool:
    for topic in request.topic_data:
        for pdata in topic.partition_data:
            records = pdata.records
            if records is not None and len(records) >= HEADER_SIZE:
                if RecordBatchView(records, 0).is_transactional:
                    return True
    return False
