"""DeleteShareGroupOffsets (KIP-932): an empty share group forgets its share partitions of
the topics named (``kafka-share-groups --delete-offsets``)."""

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

K = ApiKey.DELETE_SHARE_GROUP_OFFSETS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    gid = request.group_id
    error = empty_share_group_error(broker, ctx, gid, Op.DELETE, must_exist=True)
    topics = []
    for t in request.topics if error == ErrorCode.NONE else ():
        topic = broker.topics.topics.get(t.topic_name)
        if topic is None:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        else:
            code = broker.share_partitions.delete(gid, topic.topic_id)
        topics.append(
            make(
                K,
                v,
                "DeleteShareGroupOffsetsResponseTopic",
                topic_name=t.topic_name,
                topic_id=topic.topic_id if topic is not None else None,
                error_code=code,
                error_message=None,
            )
        )
    return offsets_response(K, v, "DeleteShareGroupOffsetsResponse", error, topics)
