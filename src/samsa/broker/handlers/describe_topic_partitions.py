"""DescribeTopicPartitions (KIP-966): topics and their partitions, a page at a time.

As Kafka's broker answers (``DescribeTopicPartitionsRequestHandler`` and the metadata cache):
no topic named means every topic the principal may Describe (the others silently left out);
named topics the principal may not Describe get 29 (TOPIC_AUTHORIZATION_FAILED) with the zero
topic id and no partitions, listed after the others; a named topic that does not exist gets 3
(UNKNOWN_TOPIC_OR_PARTITION), or 17 (INVALID_TOPIC_EXCEPTION) when its name is illegal. Topics
come in name order, from the cursor's topic on (the cursor's partition index applies to that
topic, every later one starts at 0); at most ``min(response_partition_limit, 2000)``
partitions are given (2000 is Kafka's ``max.request.partition.size.limit``), and when the limit
cuts the answer ``next_cursor`` names the first topic and partition left out. A cursor whose
topic is not among the named topics is refused with 42 (INVALID_REQUEST) for every named
topic. Each partition is what Metadata gives (one replica, the leader, in sync), with empty
eligible and last-known leader replicas (ELR: nothing is ever out of sync). Every described
topic carries the principal's authorized operations (KIP-430), which v0 always reports.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_operations,
)
from samsa.broker.handlers.metadata import partition_facts
from samsa.broker.topics import INTERNAL_TOPICS, TopicError, validate_topic_name
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_TOPIC_PARTITIONS
# Kafka's broker cap on partitions per response (max.request.partition.size.limit default).
MAX_PARTITIONS = 2000
_ZERO_ID = uuid.UUID(int=0)
_NOT_ASKED = -(2**31)


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    cursor = request.cursor
    start_topic = cursor.topic_name if cursor is not None else ""
    every = not request.topics
    names = set(broker.topics.topics) if every else {t.name for t in request.topics}
    names = {n for n in names if n >= start_topic}
    if cursor is not None and not every and cursor.topic_name not in names:
        refused = tuple(_topic_error(v, t.name, ErrorCode.INVALID_REQUEST) for t in request.topics)
        return _response(v, refused, None)
    allowed: list[str] = []
    denied: list[Any] = []
    for name in sorted(names):
        if authorized(broker, ctx, Op.DESCRIBE, Res.TOPIC, name):
            allowed.append(name)
        elif not every:  # the zero id: do not disclose whether the topic exists
            denied.append(_topic_error(v, name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
    remaining = min(MAX_PARTITIONS, int(request.response_partition_limit))
    topics: list[Any] = []
    next_cursor = None
    for name in allowed:
        if remaining == 0:  # the previous topics are complete: the next page starts here
            next_cursor = make(K, v, "Cursor", topic_name=name, partition_index=0)
            break
        if remaining < 0:
            break
        topic = broker.topics.topics.get(name)
        ops = authorized_operations(broker, ctx, Res.TOPIC, name)
        if topic is None:
            if not every:
                topics.append(_topic_error(v, name, _missing(name), ops))
            continue
        first = cursor.partition_index if cursor is not None and name == start_topic else 0
        upper = min(len(topic.partitions), first + remaining)
        parts = tuple(
            make(
                K,
                v,
                "DescribeTopicPartitionsResponsePartition",
                **partition_facts(broker.node_id, i),
                eligible_leader_replicas=(),
                last_known_elr=(),
            )
            for i in range(max(first, 0), upper)
        )
        topics.append(
            make(
                K,
                v,
                "DescribeTopicPartitionsResponseTopic",
                error_code=ErrorCode.NONE,
                name=name,
                topic_id=topic.topic_id,
                is_internal=topic.internal,
                partitions=parts,
                topic_authorized_operations=ops,
            )
        )
        if upper < len(topic.partitions):
            next_cursor = make(K, v, "Cursor", topic_name=name, partition_index=upper)
            break
        remaining -= len(parts)
    return _response(v, (*topics, *denied), next_cursor)


def _missing(name: str) -> ErrorCode:
    try:
        validate_topic_name(name)
    except TopicError as exc:
        return exc.code
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def _topic_error(v: int, name: str, code: ErrorCode, ops: int = _NOT_ASKED) -> Any:
    return make(
        K,
        v,
        "DescribeTopicPartitionsResponseTopic",
        error_code=code,
        name=name,
        topic_id=_ZERO_ID,
        is_internal=code != ErrorCode.TOPIC_AUTHORIZATION_FAILED and name in INTERNAL_TOPICS,
        partitions=(),
        topic_authorized_operations=ops,
    )


def _response(v: int, topics: tuple[Any, ...], next_cursor: Any) -> Body:
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "DescribeTopicPartitionsResponse",
            throttle_time=0,
            topics=topics,
            next_cursor=next_cursor,
        ),
    )
