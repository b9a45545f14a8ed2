"""CreatePartitions: a topic's partition count only grows (INVALID_PARTITIONS otherwise)."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.topics import TopicError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.CREATE_PARTITIONS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    counts = Counter(t.name for t in request.topics)
    results = []
    for t in request.topics:
        code, message = ErrorCode.NONE, None
        try:
            if counts[t.name] > 1:
                raise TopicError(ErrorCode.INVALID_REQUEST, "topic named twice in one request")
            if not authorized(broker, ctx, Op.ALTER, Res.TOPIC, t.name):  # rule 33
                raise TopicError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "not authorized to Alter")
            _check_assignments(broker, t)
            broker.topics.add_partitions(
                t.name, t.count, int(time.time() * 1000), request.validate_only
            )
        except TopicError as exc:
            code, message = exc.code, str(exc)
        results.append(
            make(
                K,
                v,
                "CreatePartitionsTopicResult",
                name=t.name,
                error_code=code,
                error_message=message,
            )
        )
    return encode_response(
        K, v, make(K, v, "CreatePartitionsResponse", throttle_time=0, results=tuple(results))
    )


def _check_assignments(broker: Broker, t: Any) -> None:
    """Manual assignments may only name this broker, one replica per new partition."""
    if t.assignments is None:
        return
    topic = broker.topics.topics.get(t.name)
    added = t.count - len(topic.partitions) if topic is not None else 0
    if len(t.assignments) != added or any(
        list(a.broker_ids) != [broker.node_id] for a in t.assignments
    ):
        raise TopicError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"each of the {max(added, 0)} new partitions must be assigned to broker "
            f"{broker.node_id} alone",
        )
