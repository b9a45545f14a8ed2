"""DeleteGroups: remove groups without members, and their offsets (tombstones)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized_names
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DELETE_GROUPS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    # Rule 33: Delete on each group.
    names = list(request.groups_names)
    deletable = authorized_names(broker, ctx, Op.DELETE, Res.GROUP, names)
    errors = broker.groups.delete_groups([g for g in names if g in deletable])
    errors |= {g: ErrorCode.GROUP_AUTHORIZATION_FAILED for g in names if g not in deletable}
    results = tuple(
        make(K, v, "DeletableGroupResult", group_id=gid, error_code=errors[gid])
        for gid in request.groups_names
    )
    return encode_response(
        K, v, make(K, v, "DeleteGroupsResponse", throttle_time=0, results=results)
    )
