"""LeaveGroup: members leave (v0-2 one member; v3+ a batch, possibly by instance id)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.LEAVE_GROUP


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if v < 3:
        leaving: list[tuple[str, str | None]] = [(request.member_id, None)]
    else:
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    if not authorized(broker, ctx, Op.READ, Res.GROUP, request.group_id):  # rule 33
        top, results = ErrorCode.GROUP_AUTHORIZATION_FAILED, []
    else:
        top, results = broker.groups.leave(request.group_id, leaving)
    if v < 3 and top == ErrorCode.NONE and results:
        top = results[0][2]  # one member: its error is the response's
    members: tuple[Any, ...] = ()
    if v >= 3:
        members = tuple(
            make(K, v, "MemberResponse", member_id=m, group_instance_id=i, error_code=e)
            for m, i, e in results
        )
    return encode_response(
        K,
        v,
        make(K, v, "LeaveGroupResponse", throttle_time=0, error_code=top, members=members),
    )
