"""ConsumerGroupDescribe (KIP-848): epochs, assignor and members of consumer-protocol groups,
with each member's current and target assignment."""

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
from samsa.coordinator.consumer_group_coordinator import ConsumerGroupDescription
from samsa.coordinator.consumer_group_records import Assignment
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.CONSUMER_GROUP_DESCRIBE
NO_OPERATIONS = -(2**31)  # authorized operations were not asked for
HIDDEN_TOPICS = "The group has described topic(s) that the client is not authorized to describe."


def assignment_of(k: int, v: int, assignment: Assignment, names: dict[Any, str]) -> Any:
    """A described member's assignment, topics by id and name (shared with
    ShareGroupDescribe)."""
    return make(
        k,
        v,
        "Assignment",
        topic_partitions=tuple(
            make(
                k,
                v,
                "TopicPartitions",
                topic_id=tid,
                topic_name=names.get(tid, ""),
                partitions=tuple(sorted(parts)),
            )
            for tid, parts in sorted(assignment.items(), key=lambda kv: kv[0].bytes)
        ),
    )


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    names = {t.topic_id: t.name for t in broker.topics.topics.values()}
    groups = []
    for gid in request.group_ids:
        if authorized(broker, ctx, Op.DESCRIBE, Res.GROUP, gid):  # rule 33
            d = broker.groups.describe_consumer_group(gid)
        else:
            d = ConsumerGroupDescription(gid, ErrorCode.GROUP_AUTHORIZATION_FAILED)
        # As Kafka's KafkaApis: a group whose members hold or are to get a topic the caller
        # may not Describe is answered TOPIC_AUTHORIZATION_FAILED, its members left out.
        used = {names.get(tid, "") for m in d.members for tid in (*m.assignment, *m.target)}
        if len(authorized_names(broker, ctx, Op.DESCRIBE, Res.TOPIC, used)) < len(used):
            d = ConsumerGroupDescription(gid, ErrorCode.TOPIC_AUTHORIZATION_FAILED, HIDDEN_TOPICS)
        members = tuple(
            make(
                K,
                v,
                "Member",
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                member_epoch=m.member_epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=m.subscribed_topic_names,
                subscribed_topic_regex=m.subscribed_topic_regex or "",  # Kafka's "" for none
                assignment=assignment_of(K, v, m.assignment, names),
                target_assignment=assignment_of(K, v, m.target, names),
                member_type=0 if m.classic else 1,  # a classic member: online migration
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
                group_state=d.state if d.error == ErrorCode.NONE else "",  # as Kafka
                group_epoch=d.group_epoch,
                assignment_epoch=d.assignment_epoch,
                assignor_name=d.assignor,
                members=members,
                authorized_operations=NO_OPERATIONS,
            )
        )
    response = make(K, v, "ConsumerGroupDescribeResponse", throttle_time=0, groups=tuple(groups))
    return encode_response(K, v, response)
