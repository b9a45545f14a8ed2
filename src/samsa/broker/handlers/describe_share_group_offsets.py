"""DescribeShareGroupOffsets (KIP-932): each share partition's start offset (SPSO) and lag
for the groups named, as ``kafka-share-groups --describe`` shows them: -1 for a partition the
group has no state for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS


def share_group_error(
    broker: Broker, group_id: str, *, must_be_empty: bool, must_exist: bool = False
) -> ErrorCode:
    """NON_EMPTY_GROUP for a group with members when the call needs it empty (shared by the
    three admin calls). As Kafka, a group unknown is described as one without state and may
    have its offsets set (which makes its share state); ``must_exist``: GROUP_ID_NOT_FOUND
    for a group with neither members nor share state."""
    d = broker.groups.describe_share_group(group_id)
    unknown = d.error == ErrorCode.GROUP_ID_NOT_FOUND
    if must_exist and unknown and not broker.share_partitions.has_state(group_id):
        return ErrorCode.GROUP_ID_NOT_FOUND
    if d.error not in (ErrorCode.NONE, ErrorCode.GROUP_ID_NOT_FOUND):
        return d.error
    if must_be_empty and d.members:
        return ErrorCode.NON_EMPTY_GROUP
    return ErrorCode.NONE


def empty_share_group_error(
    broker: Broker, ctx: RequestContext, group_id: str, op: Op, *, must_exist: bool = False
) -> ErrorCode:
    """The group-level answer of an alter or delete of share-group offsets: ``op`` on the
    group first (rule 33), then the group must be empty (:func:`share_group_error`)."""
    if not authorized(broker, ctx, op, Res.GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    return share_group_error(broker, group_id, must_be_empty=True, must_exist=must_exist)


def offsets_response(key: ApiKey, v: int, cls: str, error: ErrorCode, topics: list[Any]) -> Body:
    """The envelope the alter and delete calls answer in: the group's error, then per topic."""
    response = make(key, v, cls, throttle_time=0, error_code=error, error_message=None,
                    responses=tuple(topics))  # fmt: skip
    return encode_response(key, v, response)


def _partition(broker: Broker, v: int, group_id: str, name: str, index: int) -> Any:
    topic = broker.topics.topics.get(name)
    sp = None if topic is None else broker.share_partitions.get((group_id, topic.topic_id, index))
    part = None if topic is None else broker.topics.get_partition(name, index)
    if topic is None or part is None:
        error, start, lag = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1
    elif sp is None:
        error, start, lag = ErrorCode.NONE, -1, -1
    else:
        hw = part.log.high_watermark
        error, start = ErrorCode.NONE, sp.start_offset
        lag = max(0, hw - sp.start_offset - sp.finished_in_flight())
    return make(
        K,
        v,
        "DescribeShareGroupOffsetsResponsePartition",
        partition_index=index,
        start_offset=start,
        leader_epoch=0 if start >= 0 else -1,
        lag=lag,
        error_code=error,
        error_message=None,
    )


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    groups = []
    for g in request.groups:
        gid = g.group_id
        if not authorized(broker, ctx, Op.DESCRIBE, Res.GROUP, gid):
            error = ErrorCode.GROUP_AUTHORIZATION_FAILED
        else:
            error = share_group_error(broker, gid, must_be_empty=False)
        topics = []
        if error == ErrorCode.NONE:
            if g.topics is None:  # every topic the group has state for
                wanted: dict[str, list[int]] = {}
                by_id = broker.topics.topics_by_id
                for _g, tid, p in broker.share_partitions.keys_of(gid):
                    if tid in by_id:
                        wanted.setdefault(by_id[tid].name, []).append(p)
            else:
                wanted = {t.topic_name: list(t.partitions) for t in g.topics}
            for name, parts in wanted.items():
                topic = broker.topics.topics.get(name)
                topics.append(
                    make(
                        K,
                        v,
                        "DescribeShareGroupOffsetsResponseTopic",
                        topic_name=name,
                        topic_id=topic.topic_id if topic is not None else None,
                        partitions=tuple(
                            _partition(broker, v, gid, name, p) for p in sorted(parts)
                        ),
                    )
                )
        groups.append(
            make(
                K,
                v,
                "DescribeShareGroupOffsetsResponseGroup",
                group_id=gid,
                topics=tuple(topics),
                error_code=error,
                error_message=None,
            )
        )
    response = make(
        K, v, "DescribeShareGroupOffsetsResponse", throttle_time=0, groups=tuple(groups)
    )
    return encode_response(K, v, response)
