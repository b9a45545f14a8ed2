"""DeleteTopics, by name or (v6) by topic id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.topics import TopicError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DELETE_TOPICS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if v >= 6:
        targets = [(t.name, t.topic_id) for t in request.topics]
    else:
        targets = [(name, None) for name in request.topic_names]
    results = []
    for name, topic_id in targets:
        if name is None and topic_id is not None:
            found = broker.topics.topics_by_id.get(topic_id)
            name = found.name if found else None
        code, message = ErrorCode.NONE, None
        if name is None:
            code, message = ErrorCode.UNKNOWN_TOPIC_ID, f"unknown topic id {topic_id}"
        elif not authorized(broker, ctx, Op.DELETE, Res.TOPIC, name):  # rule 33
            code, message = ErrorCode.TOPIC_AUTHORIZATION_FAILED, "not authorized to Delete it"
            if topic_id is not None and not authorized(broker, ctx, Op.DESCRIBE, Res.TOPIC, name):
                name = None  # as Kafka: an id's name is not told to who may not Describe it
        else:
            try:
                broker.topics.delete(name)
            except TopicError as exc:
                code, message = exc.code, str(exc)
        results.append(
            make(
                K,
                v,
                "DeletableTopicResult",
                name=name,
                topic_id=topic_id,
                error_code=code,
                error_message=message,
            )
        )
    return encode_response(
        K, v, make(K, v, "DeleteTopicsResponse", throttle_time=0, responses=tuple(results))
    )
