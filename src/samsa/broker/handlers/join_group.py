"""JoinGroup: a member joins (or rejoins) a group; answered when the join phase completes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import HandlerResult, Op, RequestContext, Res, authorized
from samsa.coordinator.group_coordinator import JoinRequest, JoinResult
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.JOIN_GROUP


def handle(broker: Broker, ctx: RequestContext, request: Any) -> HandlerResult:
    v = ctx.version
    if not authorized(broker, ctx, Op.READ, Res.GROUP, request.group_id):  # rule 33
        return _encode(v, JoinResult(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    session = _ms(request.session_timeout)
    req = JoinRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        client_id=ctx.header.client_id or "",
        client_host="/" + ctx.peer.rsplit(":", 1)[0],
        session_timeout_ms=session,
        # v0 has one timeout for both.
        rebalance_timeout_ms=_ms(getattr(request, "rebalance_timeout", session)),
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        require_known_member_id=v >= 4,
        skip_assignment=v >= 9,
    )
    result = broker.groups.join(req)
    if isinstance(result, JoinResult):
        return _encode(v, result)
    return _later(v, result)


async def _later(v: int, future: asyncio.Future[JoinResult]) -> bytes:
    return _encode(v, await future)


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def _encode(v: int, r: JoinResult) -> bytes:
    members = tuple(
        make(
            K,
            v,
            "JoinGroupResponseMember",
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            metadata=m.metadata,
        )
        for m in r.members
    )
    response = make(
        K,
        v,
        "JoinGroupResponse",
        throttle_time=0,
        error_code=r.error,
        generation_id=r.generation,
        protocol_type=r.protocol_type,
        # Before v7 the protocol name is not nullable.
        protocol_name=r.protocol_name if r.protocol_name is not None or v >= 7 else "",
        leader=r.leader,
        skip_assignment=r.skip_assignment,
        member_id=r.member_id,
        members=members,
    )
    return encode_response(K, v, response)
