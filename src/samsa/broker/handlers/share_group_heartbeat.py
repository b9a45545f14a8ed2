"""ShareGroupHeartbeat (KIP-932): a share consumer joins, heartbeats or leaves its share
group; the group coordinator decides (``coordinator/share_group.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized, authorized_names
from samsa.coordinator.share_group import ShareHeartbeat, ShareHeartbeatResult
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.SHARE_GROUP_HEARTBEAT


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    names = request.subscribed_topic_names
    req = ShareHeartbeat(
        group_id=request.group_id,
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        rack_id=request.rack_id,
        subscribed_topic_names=None if names is None else tuple(names),
        client_id=ctx.header.client_id or "",
        client_host="/" + ctx.peer.rsplit(":", 1)[0],
    )
    # As Kafka's KafkaApis: Read on the group, Describe on the topics subscribed to.
    if not authorized(broker, ctx, Op.READ, Res.GROUP, req.group_id):
        result = ShareHeartbeatResult(ErrorCode.GROUP_AUTHORIZATION_FAILED)
    elif len(authorized_names(broker, ctx, Op.DESCRIBE, Res.TOPIC, names or ())) < len(
        set(names or ())
    ):
        result = ShareHeartbeatResult(
            ErrorCode.TOPIC_AUTHORIZATION_FAILED, "not authorized to describe a subscribed topic"
        )
    else:
        result = broker.groups.share_heartbeat(req)
    assignment = None
    if result.assignment is not None:
        assignment = make(
            K,
            v,
            "Assignment",
            topic_partitions=tuple(
                make(K, v, "TopicPartitions", topic_id=tid, partitions=tuple(sorted(parts)))
                for tid, parts in sorted(result.assignment.items(), key=lambda kv: kv[0].bytes)
            ),
        )
    ok = result.error == ErrorCode.NONE
    response = make(
        K,
        v,
        "ShareGroupHeartbeatResponse",
        throttle_time=0,
        error_code=result.error,
        error_message=result.message,
        # As Kafka: an error carries no member id, epoch or interval.
        member_id=result.member_id if ok else None,
        member_epoch=result.member_epoch if ok else 0,
        heartbeat_interval=result.heartbeat_interval_ms if ok else 0,
        assignment=assignment,
    )
    return encode_response(K, v, response)
