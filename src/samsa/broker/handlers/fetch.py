"""Fetch: record bytes straight from the log, with long polling, as Kafka's ReplicaManager.

Each partition gets what Kafka's LogSegment.read gives: the bytes of one segment from the
fetch offset's batch, up to the partition's limit or what is left of ``max_bytes`` (cut inside
a batch if need be, the first batch whole). On connections that can (plain sockets), reads of
``ZERO_COPY_MIN`` bytes or more stay in the segment files as pinned slices that the server
sends with ``os.sendfile``; other record bytes go from ``os.pread`` into the response pieces
without another copy. A request short of ``min_bytes`` is parked unless Kafka's DelayedFetch
would complete it (:func:`_can_complete`); it waits (up to ``max_wait``) for an append to any
of its partitions, checks again and, once complete, reads again. Fetch sessions (KIP-227,
broker/fetch_session.py):
incremental requests fetch every partition of their session and are answered with the
partitions that have news only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable, Sequence, Sized
from typing import TYPE_CHECKING, Any

from samsa.broker.fetch_session import FetchSessionCache, SessionContext, TopicKey
from samsa.broker.handlers._base import (
    HandlerResult,
    Op,
    RequestContext,
    Res,
    authorized_names,
    throttle,
)
from samsa.broker.quotas import FETCH
from samsa.log.log import OffsetOutOfRangeError, release_chunks
from samsa.log.segment import CorruptSegmentError
from samsa.protocol.constants import READ_COMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.hotpath import FetchPartitionResult, encode_fetch_response

if TYPE_CHECKING:
    from samsa.broker.broker import Broker
    from samsa.broker.topics import Partition

log = logging.getLogger("samsa.fetch")


# Runs of batches at least this big are sent from the file (os.sendfile) on connections that
# can; smaller ones are copied: one pread costs less than pinning plus a sendfile call.
ZERO_COPY_MIN = 16 * 1024


def handle(broker: Broker, ctx: RequestContext, request: Any) -> HandlerResult:
    zero_copy_min = ZERO_COPY_MIN if ctx.zero_copy else 0
    sessions = broker.fetch_sessions
    sctx = sessions.new_context(ctx.version, request, _now_ms())
    if sctx.error:
        return encode_fetch_response(ctx.version, [], error_code=sctx.error)
    # Rule 33 on every fetch, of a session's partitions too (as Kafka's fetch context).
    denied = _unreadable(broker, ctx, _keys(sctx))
    results, size, partitions, errors = _read_all(
        broker, request, sctx.topics, zero_copy_min, denied
    )
    wait_ms = int(request.max_wait.total_seconds() * 1000)
    if (
        size >= request.min_bytes
        or wait_ms <= 0
        or errors
        or not partitions
        or _can_complete(broker, request, sctx.topics)  # Kafka tries its DelayedFetch at once
    ):
        broker.metrics.fetched(results)
        return _respond(sessions, ctx.version, sctx, results, _throttle(broker, ctx, size))
    _release(results)  # not the answer: it waits for more
    return _long_poll(broker, ctx, request, sctx, partitions, wait_ms)


def _throttle(broker: Broker, ctx: RequestContext, size: int) -> int:
    """consumer_byte_rate: the record bytes answered (D-QUOTA-2: sent even when throttled)."""
    return throttle(broker, ctx, FETCH, size) if size else 0


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _respond(
    sessions: FetchSessionCache,
    version: int,
    sctx: SessionContext,
    results: list[tuple[TopicKey, list[FetchPartitionResult]]],
    throttle_ms: int = 0,
) -> list[Sized]:
    session = sctx.session
    if session is None:
        session_id = 0
        if sctx.create:
            session_id = sessions.maybe_create(version, sctx.topics, results, _now_ms())
        return encode_fetch_response(
            version, results, session_id=session_id, throttle_time_ms=throttle_ms
        )
    if not sessions.still_current(sctx):
        # Another request moved the session on while this one waited (Kafka: a duplicate).
        _release(results)
        return encode_fetch_response(
            version,
            [],
            error_code=ErrorCode.INVALID_FETCH_SESSION_EPOCH,
            session_id=session.id,
            throttle_time_ms=throttle_ms,
        )
    return encode_fetch_response(
        version,
        sessions.respond_incremental(sctx, results),
        session_id=session.id,
        throttle_time_ms=throttle_ms,
    )


def _release(results: list[tuple[TopicKey, list[FetchPartitionResult]]]) -> None:
    for _topic, parts in results:
        for part in parts:
            release_chunks(part.records)


async def _long_poll(
    broker: Broker,
    ctx: RequestContext,
    request: Any,
    sctx: SessionContext,
    partitions: list[Partition],
    wait_ms: int,
) -> list[Sized]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    while True:
        await wait_for_data(partitions, deadline - loop.time())
        if loop.time() < deadline and not _can_complete(broker, request, sctx.topics):
            continue
        # Answered at the deadline whatever there is; before it, as Kafka's DelayedFetch
        # (onComplete reads again, whatever the read holds).
        results, size, _found, _errors = _read_all(
            broker,
            request,
            sctx.topics,
            ZERO_COPY_MIN if ctx.zero_copy else 0,
            _unreadable(broker, ctx, _keys(sctx)),
        )
        broker.metrics.fetched(results)
        return _respond(
            broker.fetch_sessions, ctx.version, sctx, results, _throttle(broker, ctx, size)
        )


def _can_complete(
    broker: Broker, request: Any, topics: list[tuple[TopicKey, Sequence[Any]]]
) -> bool:
    """Kafka's DelayedFetch.tryComplete: a partition gone or unreadable, or whose fetch offset
    is past its end or in an older segment than it, answers the Fetch; else the bytes to each
    partition's end, counted up to its partition_max_bytes (not max_bytes), must reach
    min_bytes."""
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    ready = 0
    for key, requested in topics:
        name = _topic_name(broker, key)
        for req in requested:
            partition = None if name is None else broker.topics.get_partition(name, req.partition)
            if partition is None:
                return True
            plog = partition.log
            end = plog.last_stable_offset if read_committed else None
            try:
                available = plog.bytes_to_end(req.fetch_offset, end)
            except (OSError, CorruptSegmentError):
                return True  # the read answers the partition's error, as Kafka's
            if available is None:
                return True
            ready += min(available, req.partition_max_bytes)
    return ready >= request.min_bytes


async def wait_for_data(partitions: Iterable[Partition], timeout: float) -> None:
    """Until an append (or marker) to any of ``partitions``, or ``timeout`` seconds (shared
    with ShareFetch's long poll)."""
    if timeout <= 0:
        return
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for p in partitions:
        p.wait_for_data(fut)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(fut, timeout)


def _keys(sctx: SessionContext) -> list[TopicKey]:
    """The topics to fetch: ids from v13 (KIP-516), names before."""
    return [key for key, _parts in sctx.topics]


def _unreadable(
    broker: Broker, ctx: RequestContext, keys: Iterable[str | uuid.UUID]
) -> frozenset[str]:
    """Rule 33: the names of the topics (named or by id) the principal may not Read."""
    if broker.authorizer is None:
        return frozenset()
    names = set()
    for key in keys:
        known = broker.topics.topics_by_id.get(key) if isinstance(key, uuid.UUID) else None
        name = known.name if known is not None else key
        if isinstance(name, str):
            names.add(name)
    return frozenset(names - authorized_names(broker, ctx, Op.READ, Res.TOPIC, names))


def _topic_name(broker: Broker, key: TopicKey) -> str | None:
    """v13+ names topics by id (KIP-516), earlier versions by name; None: an unknown id."""
    if isinstance(key, uuid.UUID):
        known = broker.topics.topics_by_id.get(key)
        return known.name if known is not None else None
    return key


def _read_all(
    broker: Broker,
    request: Any,
    topics: list[tuple[TopicKey, Sequence[Any]]],
    zero_copy_min: int = 0,
    denied: frozenset[str] = frozenset(),
) -> tuple[list[tuple[TopicKey, list[FetchPartitionResult]]], int, list[Partition], bool]:
    """Read ``topics`` (topic, partition entries with fetch_offset and partition_max_bytes:
    the request's own or a session's) within the request's size limits."""
    read_committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    budget = getattr(request, "max_bytes", 0x7FFFFFFF)
    total = 0
    errors = False
    found: list[Partition] = []
    results = []
    for key, requested in topics:
        out = []
        name = _topic_name(broker, key)
        by_id = isinstance(key, uuid.UUID)
        missing = ErrorCode.UNKNOWN_TOPIC_ID if by_id else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        for req in requested:
            if broker.offline is not None:
                out.append(FetchPartitionResult(req.partition, ErrorCode.KAFKA_STORAGE_ERROR))
                errors = True
                continue
            partition = None if name is None else broker.topics.get_partition(name, req.partition)
            # Partitions refused before any read carry an empty aborted-transaction list,
            # those whose read failed none (null), as Kafka's.
            if name in denied:
                out.append(
                    FetchPartitionResult(
                        req.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED, aborted=()
                    )
                )
                errors = True
                continue
            if partition is None:
                out.append(FetchPartitionResult(req.partition, missing, aborted=()))
                errors = True
                continue
            found.append(partition)
            plog = partition.log
            max_bytes = max(0, min(req.partition_max_bytes, budget - total))
            try:
                read = plog.read(
                    req.fetch_offset,
                    max_bytes,
                    min_one_batch=total == 0,
                    max_offset=plog.last_stable_offset if read_committed else None,
                    zero_copy_min=zero_copy_min,
                    whole_batches=False,  # Kafka's byte slice: its sizes and min_bytes test
                )
            except OffsetOutOfRangeError:
                # As Kafka: no offsets with the error (the consumer asks ListOffsets to reset).
                out.append(FetchPartitionResult(req.partition, ErrorCode.OFFSET_OUT_OF_RANGE))
                errors = True
                continue
            except OSError as exc:
                log.error("cannot read %s at offset %d: %s", plog.directory, req.fetch_offset, exc)
                out.append(FetchPartitionResult(req.partition, ErrorCode.KAFKA_STORAGE_ERROR))
                errors = True
                continue
            except CorruptSegmentError as exc:
                # Damage at rest found while reading: Kafka answers CORRUPT_MESSAGE for the
                # partition (its read fails with CorruptRecordException); other partitions and
                # the connection are served as usual.
                log.error("corrupt data in %s at offset %d: %s", plog.directory,
                          req.fetch_offset, exc)  # fmt: skip
                out.append(FetchPartitionResult(req.partition, ErrorCode.CORRUPT_MESSAGE))
                errors = True
                continue
            total += read.size
            out.append(
                FetchPartitionResult(
                    req.partition,
                    ErrorCode.NONE,
                    read.high_watermark,
                    read.last_stable_offset,
                    read.log_start_offset,
                    # Rule 17: aborted transactions overlapping what may be returned.
                    plog.aborted_transactions(req.fetch_offset, read.last_stable_offset)
                    if read_committed
                    else None,
                    read.chunks,
                    read.size,
                )
            )
        results.append((key, out))
    return results, total, found, errors
