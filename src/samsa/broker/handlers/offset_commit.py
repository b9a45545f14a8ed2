"""OffsetCommit: store a group's positions, fenced by generation (per-partition errors)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext, partition_errors
from samsa.coordinator.group_coordinator import OffsetToCommit
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.OFFSET_COMMIT


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    offsets = [
        OffsetToCommit(
            topic=t.name,
            partition=p.partition_index,
            offset=p.committed_offset,
            leader_epoch=getattr(p, "committed_leader_epoch", -1),
            metadata=p.committed_metadata,
        )
        for t in request.topics
        for p in t.partitions
    ]
    errors = broker.groups.commit(
        request.group_id,
        request.generation_id_or_member_epoch,
        request.member_id,
        getattr(request, "group_instance_id", None),
        offsets,
    )
    topics = partition_errors(K, v, "OffsetCommit", request.topics, errors)
    return encode_response(K, v, make(K, v, "OffsetCommitResponse", throttle_time=0, topics=topics))
