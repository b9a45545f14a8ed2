"""ConsumerGroupHeartbeat (KIP-848): a consumer-protocol member joins, heartbeats, reconciles
its assignment or leaves; the group coordinator decides (``consumer_group_coordinator.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized, authorized_names
from samsa.coordinator.consumer_group_coordinator import ConsumerHeartbeat, ConsumerHeartbeatResult
from samsa.coordinator.consumer_group_records import Assignment
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.CONSUMER_GROUP_HEARTBEAT


def _owned(request: Any) -> Assignment | None:
    if request.topic_partitions is None:
        return None
    owned: Assignment = {}
    for tp in request.topic_partitions:
        if tp.topic_id is not None and tp.partitions:
            owned[tp.topic_id] = owned.get(tp.topic_id, frozenset()) | frozenset(tp.partitions)
    return owned


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    timeout = request.rebalance_timeout
    req = ConsumerHeartbeat(
        group_id=request.group_id,
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=round(timeout.total_seconds() * 1000) if timeout is not None else -1,
        subscribed_topic_names=(
            None
            if request.subscribed_topic_names is None
            else tuple(request.subscribed_topic_names)
        ),
        # librdkafka sends an empty regex along with topic names: no regex.
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None) or None,
        server_assignor=request.server_assignor,
        owned=_owned(request),
        client_id=ctx.header.client_id or "",
        client_host="/" + ctx.peer.rsplit(":", 1)[0],
        # Kafka 4.0: a regex resolves only to topics the member may Describe.
        describable=(
            None
            if broker.authorizer is None
            else frozenset(
                authorized_names(broker, ctx, Op.DESCRIBE, Res.TOPIC, broker.topics.topics)
            )
        ),
    )
    refused = refusal(broker, ctx, req.group_id, req.subscribed_topic_names or ())
    if refused is not None:
        result = ConsumerHeartbeatResult(*refused)
    else:
        result = broker.groups.consumer_heartbeat(req)
    return heartbeat_response(K, v, "ConsumerGroupHeartbeatResponse", result)


def refusal(
    broker: Broker, ctx: RequestContext, group_id: str, names: Iterable[str]
) -> tuple[ErrorCode, str | None] | None:
    """Rule 33, as Kafka's KafkaApis: Read on the group, Describe on the topics subscribed
    to (shared with ShareGroupHeartbeat)."""
    names = set(names)
    if not authorized(broker, ctx, Op.READ, Res.GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, None
    if len(authorized_names(broker, ctx, Op.DESCRIBE, Res.TOPIC, names)) < len(names):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED, "not authorized to describe a subscribed topic"
    return None


def heartbeat_response(k: int, v: int, name: str, result: Any) -> Body:
    """A Consumer- or ShareGroupHeartbeat response from the coordinator's result."""
    assignment = None
    if result.assignment is not None:
        assignment = make(
            k,
            v,
            "Assignment",
            topic_partitions=tuple(
                make(k, v, "TopicPartitions", topic_id=tid, partitions=tuple(sorted(parts)))
                for tid, parts in sorted(result.assignment.items(), key=lambda kv: kv[0].bytes)
            ),
        )
    ok = result.error == ErrorCode.NONE
    response = make(
        k,
        v,
        name,
        throttle_time=0,
        error_code=result.error,
        error_message=result.message,
        # As Kafka: an error carries no member id, epoch or interval.
        member_id=result.member_id if ok else None,
        member_epoch=result.member_epoch if ok else 0,
        heartbeat_interval=result.heartbeat_interval_ms if ok else 0,
        assignment=assignment,
    )
    return encode_response(k, v, response)
