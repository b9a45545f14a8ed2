"""SyncGroup: the leader hands in the assignment; every member receives its own."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import HandlerResult, Op, RequestContext, Res, authorized
from samsa.coordinator.group_coordinator import SyncResult
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.SYNC_GROUP


def handle(broker: Broker, ctx: RequestContext, request: Any) -> HandlerResult:
    v = ctx.version
    if not authorized(broker, ctx, Op.READ, Res.GROUP, request.group_id):  # rule 33
        return _encode(v, SyncResult(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    result = broker.groups.sync(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
        getattr(request, "protocol_type", None),
        getattr(request, "protocol_name", None),
        {a.member_id: bytes(a.assignment) for a in request.assignments},
    )
    if isinstance(result, SyncResult):
        return _encode(v, result)
    return _later(v, result)


async def _later(v: int, future: asyncio.Future[SyncResult]) -> bytes:
    return _encode(v, await future)


def _encode(v: int, r: SyncResult) -> bytes:
    response = make(
        K,
        v,
        "SyncGroupResponse",
        throttle_time=0,
        error_code=r.error,
        protocol_type=r.protocol_type,
        protocol_name=r.protocol_name,
        assignment=r.assignment,
    )
    return encode_response(K, v, response)
