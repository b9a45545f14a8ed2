"""Heartbeat: a member is alive; the answer says whether a rebalance is under way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.HEARTBEAT


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if not authorized(broker, ctx, Op.READ, Res.GROUP, request.group_id):  # rule 33
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    else:
        error = broker.groups.heartbeat(
            request.group_id,
            request.generation_id,
            request.member_id,
            getattr(request, "group_instance_id", None),
        )
    return encode_response(K, v, make(K, v, "HeartbeatResponse", throttle_time=0, error_code=error))
