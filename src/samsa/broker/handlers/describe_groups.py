"""DescribeGroups: state, protocol and members (metadata and assignment when Stable)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_operations,
)
from samsa.coordinator.group_coordinator import GroupDescription
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_GROUPS
NO_OPERATIONS = -(2**31)  # authorized operations were not asked for


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    groups = []
    for gid in request.groups:
        if authorized(broker, ctx, Op.DESCRIBE, Res.GROUP, gid):  # rule 33
            d = broker.groups.describe_group(gid)
        else:
            d = GroupDescription(gid, ErrorCode.GROUP_AUTHORIZATION_FAILED, "", "", "")
        error, message = d.error, None
        if v >= 6 and d.state == "Dead":
            # v6 (KIP-1043) says so instead of describing a Dead group.
            error, message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {gid} not found."
        members = tuple(
            make(
                K,
                v,
                "DescribedGroupMember",
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata,
                member_assignment=m.assignment,
            )
            for m in d.members
        )
        groups.append(
            make(
                K,
                v,
                "DescribedGroup",
                error_code=error,
                error_message=message,
                group_id=gid,
                group_state=d.state,
                protocol_type=d.protocol_type,
                protocol_data=d.protocol,
                members=members,
                authorized_operations=authorized_operations(broker, ctx, Res.GROUP, gid)
                if getattr(request, "include_authorized_operations", False)
                and error != ErrorCode.GROUP_AUTHORIZATION_FAILED
                else NO_OPERATIONS,
            )
        )
    return encode_response(
        K, v, make(K, v, "DescribeGroupsResponse", throttle_time=0, groups=tuple(groups))
    )
