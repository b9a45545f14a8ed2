"""OffsetDelete: drop a group's offsets for topics it no longer subscribes to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_names,
    partition_errors,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.OFFSET_DELETE


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    # Rule 33 (as Kafka): Delete on the group, Read on each topic.
    readable = authorized_names(broker, ctx, Op.READ, Res.TOPIC, {t.name for t in request.topics})
    wanted = [
        (t.name, [p.partition_index for p in t.partitions])
        for t in request.topics
        if t.name in readable
    ]
    if not authorized(broker, ctx, Op.DELETE, Res.GROUP, request.group_id):
        top, errors = ErrorCode.GROUP_AUTHORIZATION_FAILED, {}
    else:
        top, errors = broker.groups.delete_offsets(request.group_id, wanted)
        for t in request.topics:
            if t.name not in readable:
                for p in t.partitions:
                    errors[(t.name, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    topics: tuple[Any, ...] = ()
    if top == ErrorCode.NONE:
        topics = partition_errors(K, v, "OffsetDelete", request.topics, errors)
    return encode_response(
        K, v, make(K, v, "OffsetDeleteResponse", error_code=top, throttle_time=0, topics=topics)
    )
