"""ListOffsets: earliest (-2), latest (-1), and first offset at or after a timestamp."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized_names
from samsa.protocol.constants import EARLIEST, LATEST, READ_COMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.LIST_OFFSETS
log = logging.getLogger("samsa.list_offsets")
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5  # v9+
EARLIEST_PENDING_UPLOAD = -6  # v11+
# The first version that may ask for each special timestamp; older ones get UNSUPPORTED_VERSION
# for the partition, as from Kafka.
SINCE_VERSION = {MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9, EARLIEST_PENDING_UPLOAD: 11}


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    topics = []
    # Rule 33: Describe on each topic.
    allowed = authorized_names(
        broker, ctx, Op.DESCRIBE, Res.TOPIC, {t.name for t in request.topics}
    )
    for topic in request.topics:
        parts = []
        for req in topic.partitions:
            try:
                if topic.name not in allowed:
                    code, ts, offset = ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1
                elif v < SINCE_VERSION.get(req.timestamp, 0):
                    code, ts, offset = ErrorCode.UNSUPPORTED_VERSION, -1, -1
                else:
                    code, ts, offset = _lookup(
                        broker, topic.name, req.partition_index, req.timestamp, read_committed
                    )
            except OSError as exc:  # an index that cannot be read
                log.error("ListOffsets of %s-%d: %s", topic.name, req.partition_index, exc)
                code, ts, offset = ErrorCode.KAFKA_STORAGE_ERROR, -1, -1
            parts.append(
                make(
                    K,
                    v,
                    "ListOffsetsPartitionResponse",
                    partition_index=req.partition_index,
                    error_code=code,
                    timestamp=ts,
                    offset=offset,
                    # One leader epoch, 0 (D-FETCH-1); -1 where no offset is answered, as Kafka.
                    leader_epoch=0 if offset >= 0 else -1,
                )
            )
        topics.append(
            make(K, v, "ListOffsetsTopicResponse", name=topic.name, partitions=tuple(parts))
        )
    return encode_response(
        K, v, make(K, v, "ListOffsetsResponse", throttle_time=0, topics=tuple(topics))
    )


def _lookup(
    broker: Broker, topic: str, index: int, timestamp: int, read_committed: bool
) -> tuple[ErrorCode, int, int]:
    if broker.offline is not None:
        return ErrorCode.KAFKA_STORAGE_ERROR, -1, -1
    partition = broker.topics.get_partition(topic, index)
    if partition is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1
    plog = partition.log
    if timestamp == EARLIEST:
        return ErrorCode.NONE, -1, plog.log_start_offset
    if timestamp == LATEST:
        return (
            ErrorCode.NONE,
            -1,
            plog.last_stable_offset if read_committed else plog.high_watermark,
        )
    if timestamp == EARLIEST_LOCAL:
        return ErrorCode.NONE, -1, plog.log_start_offset  # no tiered storage: local == all
    if timestamp == MAX_TIMESTAMP:
        found = plog.max_timestamp_offset()
        return (ErrorCode.NONE, *found) if found else (ErrorCode.NONE, -1, -1)
    if timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        return ErrorCode.NONE, -1, -1  # as Kafka answers without tiered storage
    if timestamp < 0:
        return ErrorCode.UNSUPPORTED_VERSION, -1, -1
    hit = plog.offset_for_timestamp(timestamp)
    if hit is None:
        return ErrorCode.NONE, -1, -1
    offset, ts = hit
    return ErrorCode.NONE, ts, offset
