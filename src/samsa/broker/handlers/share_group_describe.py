"""ShareGroupDescribe (KIP-932): epochs, assignor and members of share groups, with each
member's assignment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_names,
)
from samsa.broker.handlers.consumer_group_describe import (
    HIDDEN_TOPICS,
    NO_OPERATIONS,
    assignment_of,
)
from samsa.coordinator.share_group import ShareGroupDescription
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.SHARE_GROUP_DESCRIBE


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    names = {t.topic_id: t.name for t in broker.topics.topics.values()}
    groups = []
    for gid in request.group_ids:
        if authorized(broker, ctx, Op.DESCRIBE, Res.GROUP, gid):
            d = broker.groups.describe_share_group(gid)
        else:
            d = ShareGroupDescription(gid, ErrorCode.GROUP_AUTHORIZATION_FAILED)
        used = {names.get(tid, "") for m in d.members for tid in m.assignment}
        if len(authorized_names(broker, ctx, Op.DESCRIBE, Res.TOPIC, used)) < len(used):
            d = ShareGroupDescription(gid, ErrorCode.TOPIC_AUTHORIZATION_FAILED, HIDDEN_TOPICS)
        members = tuple(
            make(
                K,
                v,
                "Member",
                member_id=m.member_id,
                rack_id=m.rack_id,
                member_epoch=m.member_epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=m.subscribed_topic_names,
                assignment=assignment_of(K, v, m.assignment, names),
            )
            for m in d.members
        )
        groups.append(
            make(
                K,
                v,
                "DescribedGroup",
                error_code=d.error,
                error_message=d.message,
                group_id=gid,
                group_state=d.state if d.error == ErrorCode.NONE else "",
                group_epoch=d.group_epoch,
                assignment_epoch=d.assignment_epoch,
                assignor_name=d.assignor if d.error == ErrorCode.NONE else "",
                members=members,
                authorized_operations=NO_OPERATIONS,
            )
        )
    response = make(K, v, "ShareGroupDescribeResponse", throttle_time=0, groups=tuple(groups))
    return encode_response(K, v, response)
