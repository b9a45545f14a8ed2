"""OffsetCommit: store a group's positions, fenced by generation (per-partition errors);
v10 names the topics by id.

As Kafka, a partition of an unknown topic, or one past a topic's last, is answered
UNKNOWN_TOPIC_OR_PARTITION before the group coordinator sees the commit, so it is not kept;
those answers come first in the response, as in Kafka's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_names,
    partition_errors,
    refused_first,
    resolve_topic_ids,
    topic_id_of,
    unknown_id,
    unknown_partitions,
)
from samsa.coordinator.group_coordinator import OffsetToCommit
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.OFFSET_COMMIT


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    # v10 names topics by id (KIP-516); an id no topic has is UNKNOWN_TOPIC_ID, refused
    # before the coordinator as an unknown partition is.
    request_topics = resolve_topic_ids(broker, request.topics) if v >= 10 else request.topics
    no_id = {
        (t.name, p.partition_index) for t in request_topics if unknown_id(t) for p in t.partitions
    }
    offsets = [
        OffsetToCommit(
            topic=t.name,
            partition=p.partition_index,
            offset=p.committed_offset,
            leader_epoch=getattr(p, "committed_leader_epoch", -1),
            metadata=p.committed_metadata,
            topic_id=topic_id_of(broker, t.name),
        )
        for t in request_topics
        for p in t.partitions
        if (t.name, p.partition_index) not in no_id
    ]
    # Rule 33: Read on the group, Read on each topic.
    if not authorized(broker, ctx, Op.READ, Res.GROUP, request.group_id):
        refused = {(o.topic, o.partition): ErrorCode.GROUP_AUTHORIZATION_FAILED for o in offsets}
        refused.update(dict.fromkeys(no_id, ErrorCode.UNKNOWN_TOPIC_ID))
        topics = partition_errors(K, v, "OffsetCommit", request_topics, refused)
        return encode_response(
            K, v, make(K, v, "OffsetCommitResponse", throttle_time=0, topics=topics)
        )
    readable = authorized_names(broker, ctx, Op.READ, Res.TOPIC, {o.topic for o in offsets})
    denied = {(o.topic, o.partition) for o in offsets if o.topic not in readable}
    unknown = unknown_partitions(broker, ((o.topic, o.partition) for o in offsets)) - denied
    offsets = [o for o in offsets if (o.topic, o.partition) not in denied | unknown]
    errors: dict[tuple[str, int], ErrorCode] = {}
    if offsets:  # as Kafka, a commit of refused partitions alone never reaches the group
        errors = dict(
            broker.groups.commit(
                request.group_id,
                request.generation_id_or_member_epoch,
                request.member_id,
                getattr(request, "group_instance_id", None),
                offsets,
            )
        )
    errors.update(dict.fromkeys(denied, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
    errors.update(dict.fromkeys(unknown, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
    errors.update(dict.fromkeys(no_id, ErrorCode.UNKNOWN_TOPIC_ID))
    refused = denied | unknown | no_id
    topics = refused_first(K, v, "OffsetCommit", request_topics, errors, refused)
    return encode_response(K, v, make(K, v, "OffsetCommitResponse", throttle_time=0, topics=topics))
