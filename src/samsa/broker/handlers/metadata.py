"""Metadata: brokers (just us), topics and partitions (we lead them all); auto-creation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
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
        topics = [_topic(v, node, t) for t in broker.topics.topics.values()]
    else:
        auto = v < 4 or request.allow_auto_topic_creation
        for req in request.topics:
            topics.append(_lookup(broker, v, req, auto))
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
        cluster_authorized_operations=-2147483648,
        error_code=ErrorCode.NONE,  # v13+ (KIP-1102)
    )
    return encode_response(K, v, response)


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


def _topic(v: int, node: int, topic: Topic) -> Any:
    partitions = tuple(
        make(
            K,
            v,
            "MetadataResponsePartition",
            error_code=ErrorCode.NONE,
            partition_index=p.index,
            leader_id=node,
            leader_epoch=0,
            replica_nodes=(node,),
            isr_nodes=(node,),
            offline_replicas=(),
        )
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
