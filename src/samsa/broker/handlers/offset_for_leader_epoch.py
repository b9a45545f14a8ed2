"""OffsetForLeaderEpoch: where a leader epoch ended, so that a consumer can check that its
position (and the epoch it read it in) still lies in the log (KIP-320).

A samsa broker is the only leader its partitions ever have: one epoch (``LEADER_EPOCH``),
started at the log's start. As Kafka's leader answers from its epoch cache: the current epoch
ends at the log end offset; an epoch after it is unknown (-1, -1); one before it ends where
the current one starts. A ``current_leader_epoch`` newer than ours is UNKNOWN_LEADER_EPOCH, an
older one FENCED_LEADER_EPOCH (per partition, as Kafka answers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized_names
from samsa.log.segment import LEADER_EPOCH
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.OFFSET_FOR_LEADER_EPOCH
UNDEFINED = -1


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    # Rule 33: Describe on each topic.
    allowed = authorized_names(
        broker, ctx, Op.DESCRIBE, Res.TOPIC, {t.topic for t in request.topics}
    )
    topics = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            if topic.topic in allowed:
                code, epoch, end = _end_of_epoch(broker, topic.topic, p)
            else:
                code, epoch, end = ErrorCode.TOPIC_AUTHORIZATION_FAILED, UNDEFINED, UNDEFINED
            parts.append(
                make(K, v, "EpochEndOffset", error_code=code, partition=p.partition,
                     leader_epoch=epoch, end_offset=end)
            )  # fmt: skip
        topics.append(
            make(K, v, "OffsetForLeaderTopicResult", topic=topic.topic, partitions=tuple(parts))
        )
    return encode_response(
        K, v, make(K, v, "OffsetForLeaderEpochResponse", throttle_time=0, topics=tuple(topics))
    )


def _end_of_epoch(broker: Broker, topic: str, p: Any) -> tuple[ErrorCode, int, int]:
    if broker.offline is not None:
        return ErrorCode.KAFKA_STORAGE_ERROR, UNDEFINED, UNDEFINED
    partition = broker.topics.get_partition(topic, p.partition)
    if partition is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNDEFINED, UNDEFINED
    if p.current_leader_epoch > LEADER_EPOCH:
        return ErrorCode.UNKNOWN_LEADER_EPOCH, UNDEFINED, UNDEFINED
    if 0 <= p.current_leader_epoch < LEADER_EPOCH:
        return ErrorCode.FENCED_LEADER_EPOCH, UNDEFINED, UNDEFINED
    wanted = p.leader_epoch
    if wanted == UNDEFINED or wanted > LEADER_EPOCH:
        return ErrorCode.NONE, UNDEFINED, UNDEFINED
    if wanted == LEADER_EPOCH:
        return ErrorCode.NONE, LEADER_EPOCH, partition.log.log_end_offset
    return ErrorCode.NONE, wanted, partition.log.log_start_offset  # ended where ours began
