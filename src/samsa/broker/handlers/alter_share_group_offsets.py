"""AlterShareGroupOffsets (KIP-932): set the start offset of an empty share group's share
partitions (``kafka-share-groups --reset-offsets``); the in-flight states are dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext
from samsa.broker.handlers.describe_share_group_offsets import (
    empty_share_group_error,
    offsets_response,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ALTER_SHARE_GROUP_OFFSETS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    gid = request.group_id
    error = empty_share_group_error(broker, ctx, gid, Op.READ)
    topics = []
    for t in request.topics if error == ErrorCode.NONE else ():
        topic = broker.topics.topics.get(t.topic_name)
        parts = []
        for p in t.partitions:
            part = broker.topics.get_partition(t.topic_name, p.partition_index)
            if topic is None or part is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif not part.log.log_start_offset <= p.start_offset <= part.log.high_watermark:
                code = ErrorCode.INVALID_REQUEST  # not an offset of the partition
            else:
                key = (gid, topic.topic_id, p.partition_index)
                code = broker.share_partitions.alter_start(key, p.start_offset)
            parts.append(
                make(
                    K,
                    v,
                    "AlterShareGroupOffsetsResponsePartition",
                    partition_index=p.partition_index,
                    error_code=code,
                    error_message=None,
                )
            )
        topics.append(
            make(
                K,
                v,
                "AlterShareGroupOffsetsResponseTopic",
                topic_name=t.topic_name,
                topic_id=topic.topic_id if topic is not None else None,
                partitions=tuple(parts),
            )
        )
    return offsets_response(K, v, "AlterShareGroupOffsetsResponse", error, topics)
