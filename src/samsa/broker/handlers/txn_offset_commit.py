"""TxnOffsetCommit: stage a transaction's consumer offsets; the commit marker on the group's
``__consumer_offsets`` partition makes them visible, an abort drops them (rule 15). As in
Kafka, a plain OffsetCommit appended after the staged offsets (before the marker) is newer
and stays: the commit replaces only offsets earlier in the log (``coordinator/offsets.py``).
v5 is transactions v2 (rule 36): the group's offsets partition joins the transaction here,
without AddOffsetsToTxn. A partition of an unknown topic, or past a topic's last, is answered
UNKNOWN_TOPIC_OR_PARTITION first and not staged, as in Kafka."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_names,
    outside_transaction,
    partition_errors,
    refused_first,
    topic_id_of,
    unknown_partitions,
)
from samsa.coordinator.offsets import OFFSETS_TOPIC, OffsetToCommit
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.TXN_OFFSET_COMMIT


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    offsets = [
        OffsetToCommit(
            t.name,
            p.partition_index,
            p.committed_offset,
            getattr(p, "committed_leader_epoch", -1),
            p.committed_metadata,
            topic_id_of(broker, t.name),
        )
        for t in request.topics
        for p in t.partitions
    ]
    # Rule 33: Write on the TransactionalId, Read on the group, Read on each topic.
    if not authorized(broker, ctx, Op.WRITE, Res.TRANSACTIONAL_ID, request.transactional_id):
        return _refused(v, request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not authorized(broker, ctx, Op.READ, Res.GROUP, request.group_id):
        return _refused(v, request, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    readable = authorized_names(broker, ctx, Op.READ, Res.TOPIC, {o.topic for o in offsets})
    denied = {(o.topic, o.partition) for o in offsets if o.topic not in readable}
    unknown = unknown_partitions(broker, ((o.topic, o.partition) for o in offsets)) - denied
    offsets = [o for o in offsets if (o.topic, o.partition) not in denied | unknown]
    errors: dict[tuple[str, int], ErrorCode] = {}
    if offsets:  # as Kafka, refused partitions alone neither join nor reach the transaction
        if v >= 5:
            code = broker.transactions.add_partitions(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                [(OFFSETS_TOPIC, broker.groups.coordinator.partition_for(request.group_id))],
                implicit=True,
            )
            if code != ErrorCode.NONE:
                return _refused(v, request, code)
        errors = dict(
            broker.groups.commit_transactional(
                request.transactional_id,
                request.group_id,
                request.producer_id,
                request.producer_epoch,
                getattr(request, "generation_id", -1),
                getattr(request, "member_id", ""),
                getattr(request, "group_instance_id", None),
                offsets,
            )
        )
    errors = {tp: outside_transaction(e, v >= 4) for tp, e in errors.items()}
    errors.update(dict.fromkeys(denied, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
    errors.update(dict.fromkeys(unknown, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
    topics = refused_first(K, v, "TxnOffsetCommit", request.topics, errors, denied | unknown)
    return encode_response(
        K, v, make(K, v, "TxnOffsetCommitResponse", throttle_time=0, topics=topics)
    )


def _refused(v: int, request: Any, code: ErrorCode) -> Body:
    errors = {(t.name, p.partition_index): code for t in request.topics for p in t.partitions}
    topics = partition_errors(K, v, "TxnOffsetCommit", request.topics, errors)
    return encode_response(
        K, v, make(K, v, "TxnOffsetCommitResponse", throttle_time=0, topics=topics)
    )
