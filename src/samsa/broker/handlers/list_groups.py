"""ListGroups: every group this coordinator knows (v4+ filter by state, v5+ by type)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.LIST_GROUPS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    groups = tuple(
        make(
            K,
            v,
            "ListedGroup",
            group_id=gid,
            protocol_type=ptype,
            group_state=state,
            group_type="classic",  # every group here speaks the classic protocol
        )
        for gid, ptype, state in broker.groups.list_groups(
            list(getattr(request, "states_filter", ()) or ())
        )
        if not types or "classic" in types
    )
    return encode_response(
        K,
        v,
        make(K, v, "ListGroupsResponse", throttle_time=0, error_code=ErrorCode.NONE, groups=groups),
    )
