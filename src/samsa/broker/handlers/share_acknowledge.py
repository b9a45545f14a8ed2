"""ShareAcknowledge (KIP-932): a share consumer accepts, releases or rejects records it
acquired, in its share session, without fetching more; epoch -1 closes the session and gives
back what the member still holds."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.handlers.share_fetch import acknowledge_all, denied_topics
from samsa.coordinator.share_group import MAX_MEMBER_ID_LENGTH
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.SHARE_ACKNOWLEDGE


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    group_id, member_id = request.group_id, request.member_id
    if not group_id or not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
        return _respond(v, ErrorCode.INVALID_REQUEST, {})
    if not authorized(broker, ctx, Op.READ, Res.GROUP, group_id):
        return _respond(v, ErrorCode.GROUP_AUTHORIZATION_FAILED, {})
    session = broker.share_sessions.for_acknowledge(
        group_id, member_id, request.share_session_epoch
    )
    if session.error != ErrorCode.NONE:
        return _respond(v, session.error, {})
    denied = denied_topics(broker, ctx, request.topics)
    acks = acknowledge_all(broker, group_id, member_id, request.topics, denied)
    if session.closing:
        broker.share_partitions.release_member(group_id, member_id)
    return _respond(v, ErrorCode.NONE, acks)


def _respond(v: int, error: ErrorCode, acks: dict[tuple[uuid.UUID, int], ErrorCode]) -> Body:
    by_topic: dict[uuid.UUID, list[Any]] = {}
    no_leader = make(K, v, "LeaderIdAndEpoch", leader_id=-1, leader_epoch=-1)
    for (tid, p), ack in acks.items():
        by_topic.setdefault(tid, []).append(
            make(
                K,
                v,
                "PartitionData",
                partition_index=p,
                error_code=ack,
                error_message=None,
                current_leader=no_leader,
            )
        )
    response = make(
        K,
        v,
        "ShareAcknowledgeResponse",
        throttle_time=0,
        error_code=error,
        error_message=None,
        responses=tuple(
            make(K, v, "ShareAcknowledgeTopicResponse", topic_id=tid, partitions=tuple(parts))
            for tid, parts in by_topic.items()
        ),
        node_endpoints=(),
    )
    return encode_response(K, v, response)
