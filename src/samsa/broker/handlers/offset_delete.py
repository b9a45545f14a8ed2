"""OffsetDelete: drop a group's offsets for topics it no longer subscribes to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext, partition_errors
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.OFFSET_DELETE


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    wanted = [(t.name, [p.partition_index for p in t.partitions]) for t in request.topics]
    top, errors = broker.groups.delete_offsets(request.group_id, wanted)
    topics: tuple[Any, ...] = ()
    if top == ErrorCode.NONE:
        topics = partition_errors(K, v, "OffsetDelete", request.topics, errors)
    return encode_response(
        K, v, make(K, v, "OffsetDeleteResponse", error_code=top, throttle_time=0, topics=topics)
    )
