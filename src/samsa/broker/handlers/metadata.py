"""Metadata: brokers (just us), topics and partitions (we lead them all); auto-creation."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_operations,
)
from samsa.broker.topics import Topic, TopicError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.METADATA


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    host, port = ctx.advertised or broker.config.advertised
    node = broker.node_id
    topics: list[Any] = []
    if request.topics is None or (v == 0 and not request.topics):
        topics = [
            _topic(v, node, t)
            for t in broker.topics.topics.values()
            if authorized(broker, ctx, Op.DESCRIBE, Res.TOPIC, t.name)  # rule 33
        ]
    else:
        auto = v < 4 or request.allow_auto_topic_creation
        for req in request.topics:
            topics.append(_authorized_lookup(broker, ctx, v, req, auto))
    # KIP-430: what the principal may do, when asked for (Kafka's rules for the two fields).
    if getattr(request, "include_topic_authorized_operations", False):
        topics = [
            dataclasses.replace(
                t, topic_authorized_operations=authorized_operations(broker, ctx, Res.TOPIC, t.name)
            )
            if t.name is not None and t.error_code != ErrorCode.TOPIC_AUTHORIZATION_FAILED
            else t
            for t in topics
        ]
    cluster_ops = -(2**31)  # not asked for
    if getattr(request, "include_cluster_authorized_operations", False):
        cluster_ops = (
            authorized_operations(broker, ctx, Res.CLUSTER, CLUSTER_NAME)
            if authorized(broker, ctx, Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME)
            else 0
        )
    response = make(
        K,
        v,
        "MetadataResponse",
        throttle_time=0,
        brokers=(
            make(K, v, "MetadataResponseBroker", node_id=node, host=host, port=port, rack=None),
        ),
        cluster_id=broker.cluster_id,
        controller_id=node,
        topics=tuple(topics),
        cluster_authorized_operations=cluster_ops,
        error_code=ErrorCode.NONE,  # v13+ (KIP-1102)
    )
    return encode_response(K, v, response)


def _authorized_lookup(
    broker: Broker, ctx: RequestContext, v: int, req: Any, auto_create: bool
) -> Any:
    """Rule 33: Describe on the topic; creating it needs Create on the cluster or topic."""
    if broker.authorizer is None:
        return _lookup(broker, v, req, auto_create)
    denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    if req.name is None:
        found = broker.topics.topics_by_id.get(getattr(req, "topic_id", None))
        if found is not None and not authorized(broker, ctx, Op.DESCRIBE, Res.TOPIC, found.name):
            return _error(v, None, req.topic_id, denied)
        return _lookup(broker, v, req, auto_create)
    if not authorized(broker, ctx, Op.DESCRIBE, Res.TOPIC, req.name):
        return _error(v, req.name, None, denied)
    if (
        auto_create
        and broker.config.auto_create_topics_enable
        and req.name not in broker.topics.topics
        and not authorized(broker, ctx, Op.CREATE, Res.CLUSTER, CLUSTER_NAME)
        and not authorized(broker, ctx, Op.CREATE, Res.TOPIC, req.name)
    ):
        return _error(v, req.name, None, denied)
    return _lookup(broker, v, req, auto_create)


def _lookup(broker: Broker, v: int, req: Any, auto_create: bool) -> Any:
    name = req.name
    topic_id = getattr(req, "topic_id", None)
    if name is None and topic_id is not None:
        found = broker.topics.topics_by_id.get(topic_id)
        if found is None:
            return _error(v, None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID)
        return _topic(v, broker.node_id, found)
    assert name is not None
    topic = broker.topics.topics.get(name)
    if topic is None and auto_create and broker.config.auto_create_topics_enable:
        try:
            broker.create_topic(name)
        except TopicError as exc:
            return _error(v, name, None, exc.code)
        topic = broker.topics.topics[name]
    if topic is None:
        return _error(v, name, None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    return _topic(v, broker.node_id, topic)


def _error(v: int, name: str | None, topic_id: Any, code: ErrorCode) -> Any:
    import uuid

    return make(
        K,
        v,
        "MetadataResponseTopic",
        error_code=code,
        name=name,
        topic_id=topic_id or uuid.UUID(int=0),
        is_internal=False,
        partitions=(),
        topic_authorized_operations=-2147483648,
    )


def partition_facts(node: int, index: int) -> dict[str, Any]:
    """One partition as Metadata and DescribeTopicPartitions report it: this broker holds its
    one replica, which leads (epoch 0, never re-elected), is in sync and is never offline."""
    return {
        "error_code": ErrorCode.NONE,
        "partition_index": index,
        "leader_id": node,
        "leader_epoch": 0,
        "replica_nodes": (node,),
        "isr_nodes": (node,),
        "offline_replicas": (),
    }


def _topic(v: int, node: int, topic: Topic) -> Any:
    partitions = tuple(
        make(K, v, "MetadataResponsePartition", **partition_facts(node, p.index))
        for p in topic.partitions
    )
    return make(
        K,
        v,
        "MetadataResponseTopic",
        error_code=ErrorCode.NONE,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.internal,
        partitions=partitions,
        topic_authorized_operations=-2147483648,
    )
