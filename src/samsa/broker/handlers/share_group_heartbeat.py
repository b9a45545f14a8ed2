"""ShareGroupHeartbeat (KIP-932): a share consumer joins, heartbeats or leaves its share
group; the group coordinator decides (``coordinator/share_group.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
from samsa.broker.handlers.consumer_group_heartbeat import heartbeat_response, refusal
from samsa.coordinator.share_group import ShareHeartbeat, ShareHeartbeatResult
from samsa.protocol.messages import ApiKey

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
    refused = refusal(broker, ctx, req.group_id, names or ())
    if refused is not None:
        result = ShareHeartbeatResult(*refused)
    else:
        result = broker.groups.share_heartbeat(req)
    return heartbeat_response(K, v, "ShareGroupHeartbeatResponse", result)
