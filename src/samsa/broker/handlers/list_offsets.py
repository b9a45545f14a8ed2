"""ListOffsets: earliest (-2), latest (-1), and first offset at or after a timestamp."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import (
    Body,
    HandlerResult,
    Op,
    RequestContext,
    Res,
    authorized_names,
)
from samsa.protocol.constants import EARLIEST, LATEST, READ_COMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker
    from samsa.log.log import Log

K = ApiKey.LIST_OFFSETS
log = logging.getLogger("samsa.list_offsets")
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5  # v9+
EARLIEST_PENDING_UPLOAD = -6  # v11+
# The first version that may ask for each special timestamp; older ones get UNSUPPORTED_VERSION
# for the partition, as from Kafka.
SINCE_VERSION = {MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9, EARLIEST_PENDING_UPLOAD: 11}


def handle(broker: Broker, ctx: RequestContext, request: Any) -> HandlerResult:
    v = ctx.version
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    # Rule 33: Describe on each topic.
    allowed = authorized_names(
        broker, ctx, Op.DESCRIBE, Res.TOPIC, {t.name for t in request.topics}
    )
    answers: list[tuple[str, list[tuple[int, Answer | Search]]]] = []
    searches = False
    for topic in request.topics:
        parts: list[tuple[int, Answer | Search]] = []
        for req in topic.partitions:
            if topic.name not in allowed:
                got: Answer | Search = (ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1, -1)
            elif v < SINCE_VERSION.get(req.timestamp, 0):
                got = (ErrorCode.UNSUPPORTED_VERSION, -1, -1)
            else:
                try:
                    got = _lookup(broker, topic.name, req.partition_index, req.timestamp,
                                  read_committed)  # fmt: skip
                except OSError as exc:  # an index that cannot be read
                    got = _storage_error(topic.name, req.partition_index, exc)
                searches = searches or isinstance(got, Search)
            parts.append((req.partition_index, got))
        answers.append((topic.name, parts))
    if not searches:
        return _response(v, answers)  # type: ignore[arg-type]

    async def searched() -> Body:
        # Searches run one after another: each may hold a checker thread for a while.
        done = []
        for name, parts in answers:
            found = []
            for index, got in parts:
                if isinstance(got, Search):
                    got = await _search(broker, name, index, got)
                found.append((index, got))
            done.append((name, found))
        return _response(v, done)

    return searched()


Answer = tuple[ErrorCode, int, int]  # error, timestamp, offset


@dataclass(frozen=True)
class Search:
    """A partition whose answer needs its records searched by time (Broker.offset_for_timestamp)."""

    log: Log
    timestamp: int


def _storage_error(topic: str, index: int, exc: OSError) -> Answer:
    log.error("ListOffsets of %s-%d: %s", topic, index, exc)
    return ErrorCode.KAFKA_STORAGE_ERROR, -1, -1


async def _search(broker: Broker, topic: str, index: int, search: Search) -> Answer:
    try:
        hit = await broker.offset_for_timestamp(search.log, search.timestamp)
    except OSError as exc:
        return _storage_error(topic, index, exc)
    if hit is None:
        return ErrorCode.NONE, -1, -1
    offset, ts = hit
    return ErrorCode.NONE, ts, offset


def _response(v: int, answers: list[tuple[str, list[tuple[int, Answer]]]]) -> Body:
    topics = []
    for name, parts in answers:
        made = [
            make(
                K,
                v,
                "ListOffsetsPartitionResponse",
                partition_index=index,
                error_code=code,
                timestamp=ts,
                offset=offset,
                # One leader epoch, 0 (D-FETCH-1); -1 where no offset is answered, as Kafka.
                leader_epoch=0 if offset >= 0 else -1,
            )
            for index, (code, ts, offset) in parts
        ]
        topics.append(make(K, v, "ListOffsetsTopicResponse", name=name, partitions=tuple(made)))
    return encode_response(
        K, v, make(K, v, "ListOffsetsResponse", throttle_time=0, topics=tuple(topics))
    )


def _lookup(
    broker: Broker, topic: str, index: int, timestamp: int, read_committed: bool
) -> Answer | Search:
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
        # KIP-734: the earliest record holding the log's largest timestamp.
        newest = plog.max_timestamp
        return Search(plog, newest) if newest >= 0 else (ErrorCode.NONE, -1, -1)
    if timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        return ErrorCode.NONE, -1, -1  # as Kafka answers without tiered storage
    if timestamp < 0:
        return ErrorCode.UNSUPPORTED_VERSION, -1, -1
    return Search(plog, timestamp)
