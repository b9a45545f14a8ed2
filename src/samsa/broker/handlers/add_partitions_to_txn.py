"""AddPartitionsToTxn: add partitions to the producer's transaction.

v0-3 (the client form): every partition must exist; if one does not, nothing is added: it
gets UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED, as in Kafka.
Otherwise the coordinator's single answer (fencing, concurrent completion, ...) is every
partition's. v4+ is Kafka's batched form (several transactions, ``verify_only`` asks whether
the partitions are already in the transaction), which Kafka allows only to a principal with
ClusterAction; samsa's own produce verification is in-process and does not need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_names,
    outside_transaction,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ADD_PARTITIONS_TO_TXN


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if v >= 4:
        return _batched(broker, ctx, request)
    wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
    missing = {tp for tp in wanted if broker.topics.get_partition(*tp) is None}
    errors: dict[tuple[str, int], ErrorCode]
    # Rule 33: Write on the TransactionalId, and on every topic (else none is added).
    writable = authorized_names(broker, ctx, Op.WRITE, Res.TOPIC, {t for t, _ in wanted})
    denied = {tp for tp in wanted if tp[0] not in writable}
    txn_id = request.v3_and_below_transactional_id
    if not authorized(broker, ctx, Op.WRITE, Res.TRANSACTIONAL_ID, txn_id):
        errors = dict.fromkeys(wanted, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    elif denied:
        errors = {
            tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED
            if tp in denied
            else ErrorCode.OPERATION_NOT_ATTEMPTED
            for tp in wanted
        }
    elif missing:
        errors = {
            tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if tp in missing
            else ErrorCode.OPERATION_NOT_ATTEMPTED
            for tp in wanted
        }
    else:
        code = broker.transactions.add_partitions(
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            wanted,
        )
        errors = dict.fromkeys(wanted, code)
    results = _topic_results(v, wanted, errors)
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "AddPartitionsToTxnResponse",
            throttle_time=0,
            results_by_topic_v3_and_below=results,
        ),
    )


def _batched(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if not authorized(broker, ctx, Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER_NAME):
        top, results = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ()
    else:
        top, results = ErrorCode.NONE, tuple(_one_txn(broker, v, t) for t in request.transactions)
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "AddPartitionsToTxnResponse",
            throttle_time=0,
            error_code=top,
            results_by_transaction=results,
        ),
    )


def _one_txn(broker: Broker, v: int, txn: Any) -> Any:
    wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
    errors: dict[tuple[str, int], ErrorCode]
    if txn.verify_only:
        errors = {
            tp: _verified(
                broker.transactions.verify(
                    txn.transactional_id, txn.producer_id, txn.producer_epoch, tp
                )
            )
            for tp in wanted
        }
    elif any(broker.topics.get_partition(*tp) is None for tp in wanted):
        errors = {
            tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if broker.topics.get_partition(*tp) is None
            else ErrorCode.OPERATION_NOT_ATTEMPTED
            for tp in wanted
        }
    else:
        code = broker.transactions.add_partitions(
            txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted
        )
        errors = dict.fromkeys(wanted, code)
    return make(
        K,
        v,
        "AddPartitionsToTxnResult",
        transactional_id=txn.transactional_id,
        topic_results=_topic_results(v, wanted, errors),
    )


def _topic_results(
    v: int, wanted: list[tuple[str, int]], errors: dict[tuple[str, int], ErrorCode]
) -> tuple[Any, ...]:
    by_topic: dict[str, list[int]] = {}
    for topic, p in wanted:
        by_topic.setdefault(topic, []).append(p)
    return tuple(
        make(
            K,
            v,
            "AddPartitionsToTxnTopicResult",
            name=topic,
            results_by_partition=tuple(
                make(
                    K,
                    v,
                    "AddPartitionsToTxnPartitionResult",
                    partition_index=p,
                    partition_error_code=errors[(topic, p)],
                )
                for p in parts
            ),
        )
        for topic, parts in by_topic.items()
    )


def _verified(code: ErrorCode) -> ErrorCode:
    # Kafka's coordinator answers a verification as it answers the transactional APIs (a
    # stale epoch is PRODUCER_FENCED); the leader translates for the producer.
    if code == ErrorCode.INVALID_PRODUCER_EPOCH:
        return ErrorCode.PRODUCER_FENCED
    return outside_transaction(code, abortable=True)
