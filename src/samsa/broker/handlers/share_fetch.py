"""ShareFetch (KIP-932): a share consumer's acknowledgements, then the records it acquires, in
its share session (``coordinator/share_group_sessions.py``); the share partitions decide what
it gets (``broker/share.py``). With nothing acquired the request waits up to ``max_wait`` for
new data, as Fetch does."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    Body,
    HandlerResult,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_names,
)
from samsa.broker.handlers.fetch import wait_for_data
from samsa.broker.share import ShareRead, share_clock
from samsa.coordinator.share_group import MAX_MEMBER_ID_LENGTH
from samsa.coordinator.share_group_sessions import SessionContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker
    from samsa.broker.topics import Partition

K = ApiKey.SHARE_FETCH
DEFAULT_MAX_RECORDS = 500  # a request asking for none (v0 semantics) gets the client default

Tp = tuple[uuid.UUID, int]


def topic_name(broker: Broker, topic_id: uuid.UUID | None) -> str | None:
    known = broker.topics.topics_by_id.get(topic_id) if topic_id is not None else None
    return known.name if known is not None else None


def acknowledge_all(
    broker: Broker, group_id: str, member_id: str, topics: Any, denied: frozenset[str]
) -> dict[Tp, ErrorCode]:
    """The request's acknowledgement batches, partition by partition (shared with
    ShareAcknowledge)."""
    errors: dict[Tp, ErrorCode] = {}
    for topic in topics:
        name = topic_name(broker, topic.topic_id)
        for part in topic.partitions:
            batches = part.acknowledgement_batches
            if not batches:
                continue
            tp = (topic.topic_id, part.partition_index)
            if name is None:
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_ID
            elif name in denied:
                errors[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            else:
                errors[tp] = broker.share_partitions.acknowledge(
                    (group_id, *tp),
                    member_id,
                    [(b.first_offset, b.last_offset, tuple(b.acknowledge_types)) for b in batches],
                )
    return errors


def denied_topics(broker: Broker, ctx: RequestContext, topics: Any) -> frozenset[str]:
    names = {n for t in topics if (n := topic_name(broker, t.topic_id)) is not None}
    return frozenset(names - authorized_names(broker, ctx, Op.READ, Res.TOPIC, names))


def handle(broker: Broker, ctx: RequestContext, request: Any) -> HandlerResult:
    group_id, member_id = request.group_id, request.member_id
    if not group_id or not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
        return _top_error(
            ctx.version, ErrorCode.INVALID_REQUEST, "GroupId and MemberId are required"
        )
    if not authorized(broker, ctx, Op.READ, Res.GROUP, group_id):
        return _top_error(ctx.version, ErrorCode.GROUP_AUTHORIZATION_FAILED)
    added = [(t.topic_id, p.partition_index) for t in request.topics for p in t.partitions]
    forgotten = [(t.topic_id, p) for t in request.forgotten_topics_data for p in t.partitions]
    session = broker.share_sessions.for_fetch(
        group_id, member_id, request.share_session_epoch, added, forgotten, ctx.peer
    )
    if session.error != ErrorCode.NONE:
        return _top_error(ctx.version, session.error)
    denied = denied_topics(broker, ctx, request.topics)
    acks = acknowledge_all(broker, group_id, member_id, request.topics, denied)
    if session.closing:
        broker.share_partitions.release_member(group_id, member_id)
        return _respond(broker, ctx.version, group_id, acks, {})
    reads, waitable = _read(broker, request, session, denied)
    wait_ms = int(request.max_wait.total_seconds() * 1000)
    acquired = any(r.acquired for r in reads.values())
    if acquired or wait_ms <= 0 or not waitable:
        return _respond(broker, ctx.version, group_id, acks, reads)
    return _long_poll(broker, ctx, request, session, denied, acks, waitable, wait_ms)


async def _long_poll(
    broker: Broker,
    ctx: RequestContext,
    request: Any,
    session: SessionContext,
    denied: frozenset[str],
    acks: dict[Tp, ErrorCode],
    partitions: list[Partition],
    wait_ms: int,
) -> Body:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    while True:
        await wait_for_data(partitions, deadline - loop.time())
        reads, partitions = _read(broker, request, session, denied)
        if any(r.acquired for r in reads.values()) or loop.time() >= deadline or not partitions:
            return _respond(broker, ctx.version, request.group_id, acks, reads)


def _read(
    broker: Broker, request: Any, session: SessionContext, denied: frozenset[str]
) -> tuple[dict[Tp, ShareRead], list[Partition]]:
    """Acquire for the member from every partition of its session, within the request's
    record and byte budgets."""
    assert session.session is not None
    s = session.session
    max_records = request.max_records if request.max_records > 0 else DEFAULT_MAX_RECORDS
    budget = request.max_bytes
    reads: dict[Tp, ShareRead] = {}
    found: list[Partition] = []
    now = share_clock()
    for tp in s.partitions:
        name = topic_name(broker, tp[0])
        partition = None if name is None else broker.topics.get_partition(name, tp[1])
        if name is None or partition is None:
            reads[tp] = ShareRead(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            continue
        if name in denied:
            reads[tp] = ShareRead(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            continue
        found.append(partition)
        if max_records <= 0 or budget <= 0:
            continue
        read = broker.share_partitions.fetch(
            (s.group_id, *tp), partition, s.member_id, max_records, budget, now
        )
        reads[tp] = read
        max_records -= read.count
        budget -= read.size
    return reads, found


def _respond(
    broker: Broker, v: int, group_id: str, acks: dict[Tp, ErrorCode], reads: dict[Tp, ShareRead]
) -> Body:
    by_topic: dict[uuid.UUID, list[Any]] = {}
    no_leader = make(K, v, "LeaderIdAndEpoch", leader_id=-1, leader_epoch=-1)
    for tp in dict.fromkeys([*acks, *reads]):
        read = reads.get(tp, ShareRead())
        if not read.acquired and read.error == ErrorCode.NONE and tp not in acks:
            continue  # nothing to say about it
        ack = acks.get(tp, ErrorCode.NONE)
        by_topic.setdefault(tp[0], []).append(
            make(
                K,
                v,
                "PartitionData",
                partition_index=tp[1],
                error_code=read.error,
                error_message=None,
                acknowledge_error_code=ack,
                acknowledge_error_message=None,
                current_leader=no_leader,
                records=b"".join(read.records),  # never null: the field is not nullable
                acquired_records=tuple(
                    make(
                        K,
                        v,
                        "AcquiredRecords",
                        first_offset=r.first_offset,
                        last_offset=r.last_offset,
                        delivery_count=r.delivery_count,
                    )
                    for r in read.acquired
                ),
            )
        )
    response = make(
        K,
        v,
        "ShareFetchResponse",
        throttle_time=0,
        error_code=ErrorCode.NONE,
        error_message=None,
        # the group's own lock duration, if it has one: the client times its acks by it
        acquisition_lock_timeout=broker.share_partitions.lock_duration_ms(group_id),
        responses=tuple(
            make(K, v, "ShareFetchableTopicResponse", topic_id=tid, partitions=tuple(parts))
            for tid, parts in by_topic.items()
        ),
        node_endpoints=(),
    )
    return encode_response(K, v, response)


def _top_error(v: int, error: ErrorCode, message: str | None = None) -> Body:
    response = make(
        K,
        v,
        "ShareFetchResponse",
        throttle_time=0,
        error_code=error,
        error_message=message,
        acquisition_lock_timeout=0,
        responses=(),
        node_endpoints=(),
    )
    return encode_response(K, v, response)
