"""AddPartitionsToTxn (v0-3, the client form): add partitions to the producer's transaction.

Every partition must exist; if one does not, nothing is added: it gets
UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED, as in Kafka. Otherwise the
coordinator's single answer (fencing, concurrent completion, ...) is every partition's.
The broker-to-broker batched form (v4+, KIP-890 verification) is not served: clients only
send v0-3, and produce verification is done in-process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized, authorized_names
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ADD_PARTITIONS_TO_TXN


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
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
    by_topic: dict[str, list[int]] = {}
    for topic, p in wanted:
        by_topic.setdefault(topic, []).append(p)
    results = tuple(
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
