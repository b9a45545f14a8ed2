"""OffsetFetch: a group's committed offsets (v0-7 one group; v8+ a batch of groups; v10
names topics by id, an unknown id answered UNKNOWN_TOPIC_ID).

Partitions without a committed offset answer -1 with no error, as Kafka does. With
transactional offsets still pending (their transaction undecided), ``require_stable``
(v7+) gets UNSTABLE_OFFSET_COMMIT for the partition; without it the last committed offset.
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
    authorized_names,
    resolve_topic_ids,
    topic_id_of,
    unknown_id,
)
from samsa.coordinator.offsets import FetchedOffset
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.OFFSET_FETCH


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if v < 8:
        stable = getattr(request, "require_stable", False)
        if not authorized(broker, ctx, Op.READ, Res.GROUP, request.group_id):  # rule 33
            error = ErrorCode.GROUP_AUTHORIZATION_FAILED
        else:  # COORDINATOR_LOAD_IN_PROGRESS while the group loads
            error = broker.groups.validate_fetch(request.group_id, None, -1)
        fetched = [] if error else _fetch(broker, ctx, request.group_id, request.topics, stable)
        topic_cls, part_cls = "OffsetFetchResponseTopic", "OffsetFetchResponsePartition"
        response = make(
            K,
            v,
            "OffsetFetchResponse",
            throttle_time=0,
            error_code=error,
            topics=_topics(v, fetched, topic_cls, part_cls),
        )
        return encode_response(K, v, response)
    groups = []
    for g in request.groups:
        if not authorized(broker, ctx, Op.READ, Res.GROUP, g.group_id):  # rule 33
            error = ErrorCode.GROUP_AUTHORIZATION_FAILED
        else:
            # v9+: a consumer-protocol member fetches with its member epoch (KIP-848).
            error = broker.groups.validate_fetch(
                g.group_id, getattr(g, "member_id", None), getattr(g, "member_epoch", -1)
            )
        topics = g.topics
        if v >= 10 and topics is not None:  # topics by id (KIP-516)
            topics = resolve_topic_ids(broker, topics)
        fetched = [] if error else _fetch(broker, ctx, g.group_id, topics, request.require_stable)
        groups.append(
            make(
                K,
                v,
                "OffsetFetchResponseGroup",
                group_id=g.group_id,
                error_code=error,
                topics=_topics(
                    v,
                    fetched,
                    "OffsetFetchResponseTopics",
                    "OffsetFetchResponsePartitions",
                    _topic_ids(broker, fetched, topics) if v >= 10 else None,
                ),
            )
        )
    return encode_response(
        K, v, make(K, v, "OffsetFetchResponse", throttle_time=0, groups=tuple(groups))
    )


def _fetch(
    broker: Broker, ctx: RequestContext, group_id: str, topics: Any, require_stable: bool = False
) -> list[FetchedOffset]:
    no_id = [
        FetchedOffset(t.name, p, -1, -1, "", ErrorCode.UNKNOWN_TOPIC_ID)
        for t in topics or ()
        if unknown_id(t)
        for p in t.partition_indexes
    ]
    if no_id:
        topics = [t for t in topics if not unknown_id(t)]
    wanted = None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]
    # Rule 33: Describe on each topic; an all-topics answer leaves the others out.
    if wanted is None:
        fetched = broker.groups.fetch_offsets(group_id, None, require_stable)
        allowed = authorized_names(broker, ctx, Op.DESCRIBE, Res.TOPIC, {f.topic for f in fetched})
        return [f for f in fetched if f.topic in allowed]
    allowed = authorized_names(broker, ctx, Op.DESCRIBE, Res.TOPIC, {t for t, _ in wanted})
    fetched = broker.groups.fetch_offsets(
        group_id, [w for w in wanted if w[0] in allowed], require_stable
    )
    denied = [
        FetchedOffset(t, p, -1, -1, "", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        for t, parts in wanted
        if t not in allowed
        for p in parts
    ]
    return fetched + denied + no_id


def _topic_ids(
    broker: Broker, fetched: list[FetchedOffset], asked: Any
) -> dict[str, uuid.UUID | None]:
    """v10: the id of each topic answered (an unknown one as asked; else its topic's). A
    topic deleted meanwhile has none and is left out."""
    ids: dict[str, uuid.UUID | None] = {t.name: t.topic_id for t in asked or ()}
    for f in fetched:
        if f.topic not in ids and (topic_id := topic_id_of(broker, f.topic)) is not None:
            ids[f.topic] = topic_id
    return ids


def _topics(
    v: int,
    fetched: list[FetchedOffset],
    topic_cls: str,
    part_cls: str,
    ids: dict[str, uuid.UUID | None] | None = None,
) -> tuple[Any, ...]:
    by_topic: dict[str, list[FetchedOffset]] = {}
    for f in fetched:
        if ids is None or f.topic in ids:  # v10: a deleted topic has no id to answer with
            by_topic.setdefault(f.topic, []).append(f)
    return tuple(
        make(
            K,
            v,
            topic_cls,
            name=name,
            topic_id=ids[name] if ids is not None else None,
            partitions=tuple(
                make(
                    K,
                    v,
                    part_cls,
                    partition_index=f.partition,
                    committed_offset=f.offset,
                    committed_leader_epoch=f.leader_epoch,
                    metadata=f.metadata,
                    error_code=f.error,
                )
                for f in parts
            ),
        )
        for name, parts in by_topic.items()
    )
