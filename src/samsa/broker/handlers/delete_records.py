"""DeleteRecords (KIP-107): move each partition's log start offset up; answer the new one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DELETE_RECORDS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    topics = []
    for t in request.topics:
        parts = []
        deletable = authorized(broker, ctx, Op.DELETE, Res.TOPIC, t.name)  # rule 33
        for p in t.partitions:
            code, low = (
                broker.topics.delete_records(t.name, p.partition_index, p.offset)
                if deletable
                else (ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1)
            )
            parts.append(
                make(
                    K,
                    v,
                    "DeleteRecordsPartitionResult",
                    partition_index=p.partition_index,
                    low_watermark=low,
                    error_code=code,
                )
            )
        topics.append(make(K, v, "DeleteRecordsTopicResult", name=t.name, partitions=tuple(parts)))
    return encode_response(
        K, v, make(K, v, "DeleteRecordsResponse", throttle_time=0, topics=tuple(topics))
    )
