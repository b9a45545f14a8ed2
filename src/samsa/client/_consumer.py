"""The asyncio consumer: fetching, isolation levels, offsets and classic consumer groups.

Theory of operation
-------------------
The consumer owns a set of partitions, given by :meth:`AsyncConsumer.assign` or by the
group coordinator after :meth:`AsyncConsumer.subscribe`, and a *position* per partition:
the offset of the next record to hand out. A position is initialised from the group's
committed offset, else from ``auto.offset.reset`` (ListOffsets earliest / latest).

``getmany()`` / ``poll()`` return records already buffered, else send one Fetch per
leader broker for the partitions without buffered records, waiting up to
``fetch.max.wait.ms`` on the broker side. A fetched partition is parsed by
:func:`parse_fetched`, which is pure (unit-tested on crafted bytes): it walks whole batches
(a partial batch at the end of a response is normal), checks each CRC-32C when
``check.crcs``, decompresses, drops records below the position (a fetch may start inside a
batch), and always drops control batches. With ``isolation.level=read_committed`` the broker
returns data only below the last stable offset together with the aborted transactions
(producer id, first offset) of the range; as in Kafka's ``Fetcher``, a producer id becomes
"aborted" when a batch at or after its first offset is reached, its transactional batches are
skipped until its ABORT marker, and the marker clears it again.

Groups use the classic protocol: FindCoordinator, JoinGroup (with the consumer protocol's
subscription, version 1), the leader computes the assignment with the range or round-robin
assignor and sends it with SyncGroup, every member decodes its own. A background task
heartbeats; REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION mark the
membership for a rejoin, done in the next poll after committing (auto-commit) what was
consumed. ``close()`` commits (auto-commit) and sends LeaveGroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import io
import logging
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.consumer_protocol_assignment.v1 import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_assignment.v1.data import (
    TopicPartition as AssignmentTopicPartition,
)
from kio.schema.consumer_protocol_subscription.v1 import ConsumerProtocolSubscription
from kio.serial import entity_reader, entity_writer

from samsa.client._cluster import KEY_GROUP, Cluster
from samsa.client._config import CONSUMER, Config
from samsa.client._errors import (
    ClosedError,
    ConfigError,
    CorruptRecordError,
    KafkaError,
)
from samsa.client._retry import INVALID_METADATA, RetryLater
from samsa.client._types import ConsumerGroupMetadata, ConsumerRecord, TopicPartition
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import (
    MAGIC_V2,
    TIMESTAMP_TYPE_FLAG,
    ControlType,
    control_type_of,
    decode_records,
    iter_batches,
)

log = logging.getLogger("samsa.client.consumer")

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
EARLIEST = -2
LATEST = -1
_REFRESH_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_ID,
    }
)
_REJOIN_ERRORS = frozenset(
    {
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.FENCED_INSTANCE_ID,
    }
)
# Per-request answers retried after a backoff (besides a lost connection and the
# coordinator moving, which every coordinator request retries), as Java's consumer does.
_COMMIT_RETRY = frozenset(
    {
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)
# UNSTABLE_OFFSET_COMMIT (offsets of an open transaction pending) is not waited out here:
# committed() reports it, and poll() retries it (it is retriable) while initialising.
_OFFSET_FETCH_RETRY = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})


# --- parsing fetched data (pure) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int


def parse_fetched(
    tp: TopicPartition,
    data: bytes | memoryview | None,
    position: int,
    *,
    isolation_level: int = READ_UNCOMMITTED,
    aborted: Iterable[AbortedTxn] = (),
    check_crcs: bool = True,
) -> tuple[list[ConsumerRecord], int]:
    """Records at or after ``position`` in a fetched partition, and the next position.

    A batch failing its CRC raises CorruptRecordError carrying the records before it."""
    out: list[ConsumerRecord] = []
    if not data:
        return out, position
    heap = [(a.first_offset, a.producer_id) for a in aborted]
    heapq.heapify(heap)
    aborted_pids: set[int] = set()
    for batch in iter_batches(data):
        if batch.next_offset <= position:
            continue
        # The CRC does not cover the magic byte: a damaged one is caught on its own.
        problem = (
            f"has magic {batch.magic}, not {MAGIC_V2}"
            if batch.magic != MAGIC_V2
            else "failed its CRC check"
            if check_crcs and not batch.crc_is_valid()
            else ""
        )
        if problem:
            at = max(position, batch.base_offset)
            err = CorruptRecordError(
                f"{tp.topic}-{tp.partition}: record batch at offset {batch.base_offset} "
                f"{problem}; seek past offset {batch.last_offset} to skip it",
                tp.topic,
                tp.partition,
                at,
            )
            err.records = out
            raise err
        if isolation_level == READ_COMMITTED and batch.has_producer_id:
            while heap and heap[0][0] <= batch.last_offset:
                aborted_pids.add(heapq.heappop(heap)[1])
            if batch.is_control:
                if control_type_of(batch) == ControlType.ABORT:
                    aborted_pids.discard(batch.producer_id)
            elif batch.is_transactional and batch.producer_id in aborted_pids:
                position = batch.next_offset
                continue
        if batch.is_control:
            position = batch.next_offset
            continue
        ts_type = 1 if batch.attributes & TIMESTAMP_TYPE_FLAG else 0
        for r in decode_records(batch):
            if r.offset < position:
                continue
            out.append(
                ConsumerRecord(
                    tp.topic,
                    tp.partition,
                    r.offset,
                    batch.max_timestamp if ts_type else r.timestamp,
                    r.key,
                    r.value,
                    r.headers,
                    ts_type,
                    batch.producer_id,
                    batch.partition_leader_epoch,
                )
            )
        position = batch.next_offset
    return out, position


# --- assignors (pure) ----------------------------------------------------------------------


def range_assign(
    subscriptions: dict[str, list[str]], partitions: dict[str, int]
) -> dict[str, dict[str, list[int]]]:
    """Kafka's RangeAssignor: per topic, consecutive ranges to members in id order."""
    result: dict[str, dict[str, list[int]]] = {m: {} for m in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        n = partitions.get(topic, 0)
        if not members or not n:
            continue
        per, extra = divmod(n, len(members))
        start = 0
        for i, m in enumerate(members):
            count = per + (1 if i < extra else 0)
            if count:
                result[m][topic] = list(range(start, start + count))
            start += count
    return result


def roundrobin_assign(
    subscriptions: dict[str, list[str]], partitions: dict[str, int]
) -> dict[str, dict[str, list[int]]]:
    """Kafka's RoundRobinAssignor: all partitions, sorted, dealt to subscribed members."""
    result: dict[str, dict[str, list[int]]] = {m: {} for m in subscriptions}
    members = sorted(subscriptions)
    if not members:
        return result
    i = 0
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        for p in range(partitions.get(topic, 0)):
            for _ in range(len(members)):
                m = members[i % len(members)]
                i += 1
                if topic in subscriptions[m]:
                    result[m].setdefault(topic, []).append(p)
                    break
    return result


ASSIGNORS = {"range": range_assign, "roundrobin": roundrobin_assign}

_VERSION = struct.Struct(">h")
_write_subscription = entity_writer(ConsumerProtocolSubscription)
_read_subscription = entity_reader(ConsumerProtocolSubscription)
_write_assignment = entity_writer(ConsumerProtocolAssignment)
_read_assignment = entity_reader(ConsumerProtocolAssignment)


def encode_subscription(topics: list[str], owned: Iterable[TopicPartition] = ()) -> bytes:
    from kio.schema.consumer_protocol_subscription.v1.data import TopicPartition as SubTP

    by_topic: dict[str, list[int]] = {}
    for tp in owned:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    buf = io.BytesIO()
    buf.write(_VERSION.pack(1))
    _write_subscription(
        buf,
        ConsumerProtocolSubscription(
            topics=tuple(sorted(topics)),
            user_data=None,
            owned_partitions=tuple(
                SubTP(topic=t, partitions=tuple(sorted(ps))) for t, ps in sorted(by_topic.items())
            ),
        ),
    )
    return buf.getvalue()


def decode_subscription(data: bytes) -> list[str]:
    # Versions are forward compatible: fields added later follow the v1 ones.
    (version,) = _VERSION.unpack_from(data, 0)
    if version == 0:
        from kio.schema.consumer_protocol_subscription.v0 import (
            ConsumerProtocolSubscription as V0,
        )

        sub, _ = entity_reader(V0)(data, 2)
    else:
        sub, _ = _read_subscription(data, 2)
    return list(sub.topics)


def encode_assignment(assignment: dict[str, list[int]]) -> bytes:
    buf = io.BytesIO()
    buf.write(_VERSION.pack(1))
    _write_assignment(
        buf,
        ConsumerProtocolAssignment(
            assigned_partitions=tuple(
                AssignmentTopicPartition(topic=t, partitions=tuple(ps))
                for t, ps in sorted(assignment.items())
            ),
            user_data=None,
        ),
    )
    return buf.getvalue()


def decode_assignment(data: bytes) -> list[TopicPartition]:
    if not data:
        return []
    assignment, _ = _read_assignment(data, 2)
    return [
        TopicPartition(tp.topic, int(p))
        for tp in assignment.assigned_partitions
        for p in tp.partitions
    ]


# --- the consumer --------------------------------------------------------------------------


class AsyncConsumer:
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = c = Config(CONSUMER, config)
        self.group_id: str | None = c["group.id"]
        iso = str(c["isolation.level"]).lower()
        if iso not in ("read_uncommitted", "read_committed"):
            raise ConfigError("isolation.level must be read_uncommitted or read_committed")
        self.isolation_level = READ_COMMITTED if iso == "read_committed" else READ_UNCOMMITTED
        reset = str(c["auto.offset.reset"]).lower()
        if reset not in ("earliest", "latest", "none", "smallest", "largest"):
            raise ConfigError("auto.offset.reset must be earliest, latest or none")
        self.reset_policy = {"smallest": "earliest", "largest": "latest"}.get(reset, reset)
        self.auto_commit = c.bool("enable.auto.commit") and self.group_id is not None
        self.auto_commit_interval = c.seconds("auto.commit.interval.ms")
        self.check_crcs = c.bool("check.crcs")
        self.max_poll_records = c.int("max.poll.records")
        self.request_timeout = c.seconds("request.timeout.ms")
        self.retry_backoff = c.seconds("retry.backoff.ms")
        self.api_timeout = c.seconds("default.api.timeout.ms")
        strategy = str(c["partition.assignment.strategy"]).lower().split(",")[0].strip()
        if strategy not in ASSIGNORS:
            raise ConfigError("partition.assignment.strategy must be range or roundrobin")
        self.assignor = strategy
        self.cluster = Cluster.from_config(c, api_timeout=self.api_timeout)
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int | None] = {}
        self._buffer: dict[TopicPartition, list[ConsumerRecord]] = {}
        self._subscription: list[str] = []
        # A fetched batch that failed its CRC, per partition: raised by poll while the
        # position is at it (after the records before it), until a seek moves past it.
        self._corrupt: dict[TopicPartition, CorruptRecordError] = {}
        self._member_id = ""
        self._generation = -1
        self._commit_lock = asyncio.Lock()  # commits in call order: offsets never go back
        self._needs_join = False
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._last_commit = 0.0
        self._closed = False
        self._started = False

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.cluster.refresh([])

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- assignment ------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        if self._subscription:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "consumer is subscribed; cannot assign")
        self._set_assignment([TopicPartition(*tp) for tp in partitions])

    def _set_assignment(self, tps: list[TopicPartition]) -> None:
        self._assignment = list(dict.fromkeys(tps))
        self._positions = {tp: self._positions.get(tp) for tp in self._assignment}
        self._buffer = {tp: r for tp, r in self._buffer.items() if tp in self._positions}
        self._corrupt = {tp: e for tp, e in self._corrupt.items() if tp in self._positions}

    def assignment(self) -> list[TopicPartition]:
        return list(self._assignment)

    def subscribe(self, topics: Iterable[str]) -> None:
        if self.group_id is None:
            raise ConfigError("subscribe() needs group.id")
        self._subscription = sorted(set(topics))
        self._needs_join = True

    async def unsubscribe(self) -> None:
        await self._leave()
        self._subscription = []
        self._set_assignment([])

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        tp = TopicPartition(*tp)
        if tp not in self._positions:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} is not assigned")
        self._positions[tp] = offset
        self._buffer.pop(tp, None)
        self._corrupt.pop(tp, None)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._seek_to(list(tps) or self._assignment, EARLIEST)

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        await self._seek_to(list(tps) or self._assignment, LATEST)

    async def _seek_to(self, tps: list[TopicPartition], which: int) -> None:
        offsets = await self.list_offsets(tps, which)
        for tp, off in offsets.items():
            self.seek(tp, off)

    async def position(self, tp: TopicPartition) -> int:
        tp = TopicPartition(*tp)
        if self._positions.get(tp) is None:
            await self._init_positions([tp])
        pos = self._positions[tp]
        assert pos is not None
        return pos

    # --- offsets ---------------------------------------------------------------------------

    async def list_offsets(
        self, tps: Iterable[TopicPartition], timestamp: int, *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """ListOffsets: EARLIEST (-2), LATEST (-1) or the first offset at a timestamp.

        Sent to each partition's leader; lost connections and stale leaders (metadata
        refreshed) are retried until ``timeout`` (default ``default.api.timeout.ms``)."""
        todo = list(dict.fromkeys(TopicPartition(*tp) for tp in tps))
        out: dict[TopicPartition, int] = {}

        async def attempt() -> dict[TopicPartition, int]:
            by_node: dict[int, list[TopicPartition]] = {}
            for tp in todo:
                if tp in out:
                    continue
                leader = self.cluster.leader(*tp)
                if leader is None:
                    await self.cluster.refresh([tp.topic])
                    leader = self.cluster.leader(*tp)
                    if leader is None:
                        raise KafkaError(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader for {tp}")
                by_node.setdefault(leader, []).append(tp)
            stale: list[int] = []
            for node, group in by_node.items():
                resp = await self.cluster.send(
                    node,
                    ApiKey.LIST_OFFSETS,
                    (1, 7),
                    "ListOffsetsRequest",
                    lambda v, group=group: self._list_offsets_fields(v, group, timestamp),
                )
                for t in resp.topics:
                    for p in t.partitions:
                        code = int(p.error_code)
                        if code in INVALID_METADATA:
                            stale.append(code)
                        elif code:
                            raise KafkaError(code, f"ListOffsets {t.name}-{p.partition_index}")
                        else:
                            out[TopicPartition(t.name, int(p.partition_index))] = int(p.offset)
            if stale:
                await self.cluster.refresh(sorted({tp.topic for tp in todo}))
                raise RetryLater(stale[0], "ListOffsets")
            return out

        await self.cluster.retry(attempt, what="ListOffsets", timeout=timeout)
        return {tp: out[tp] for tp in todo if tp in out}

    def _list_offsets_fields(
        self, v: int, tps: list[TopicPartition], timestamp: int
    ) -> dict[str, Any]:
        topics: dict[str, list[Any]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(
                make_request(
                    ApiKey.LIST_OFFSETS,
                    v,
                    "ListOffsetsPartition",
                    partition_index=tp.partition,
                    current_leader_epoch=-1,
                    timestamp=timestamp,
                )
            )
        return {
            "replica_id": -1,
            "isolation_level": self.isolation_level,
            "topics": tuple(
                make_request(
                    ApiKey.LIST_OFFSETS, v, "ListOffsetsTopic", name=t, partitions=tuple(p)
                )
                for t, p in topics.items()
            ),
        }

    async def _init_positions(
        self, tps: list[TopicPartition], timeout: float | None = None
    ) -> None:
        if self.group_id is not None:
            committed = await self.committed(tps, timeout=timeout)
            for tp, off in committed.items():
                if off is not None and off >= 0 and self._positions.get(tp) is None:
                    self._positions[tp] = off
        missing = [tp for tp in tps if self._positions.get(tp) is None]
        if not missing:
            return
        if self.reset_policy == "none":
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, f"no offset for {missing}")
        offsets = await self.list_offsets(
            missing, EARLIEST if self.reset_policy == "earliest" else LATEST, timeout=timeout
        )
        for tp, off in offsets.items():
            self._positions[tp] = off

    # --- fetching --------------------------------------------------------------------------

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records grouped by partition; waits up to ``timeout_ms`` for the first."""
        if self._closed:
            raise ClosedError("consumer is closed")
        if not self._started:
            await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        limit = max_records or self.max_poll_records
        failures = 0
        while True:
            out: dict[TopicPartition, list[ConsumerRecord]] = {}
            try:
                # As Java's poll: group membership, positions and fetches that fail on a
                # lost connection or a retriable error are tried again within the poll's
                # time (and in the next poll); other errors reach the caller.
                await self._maybe_group_work()
                out = self._take_buffered(limit)
                if out:
                    return out
                self._raise_corrupt()
                remaining = deadline - loop.time()
                await self._fetch_once(
                    max(0.0, min(remaining, self.config.seconds("fetch.max.wait.ms"))),
                    max(0.0, remaining),
                )
                failures = 0
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                failures += 1
                log.debug("poll: %s", exc)
                wait = self.cluster.backoff.delay(failures)
                await asyncio.sleep(min(wait, max(0.0, deadline - loop.time())))
            out = self._take_buffered(limit)
            if out or loop.time() >= deadline:
                return out

    async def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        batches = await self.getmany(timeout_ms, max_records)
        return [r for recs in batches.values() for r in recs]

    def _take_buffered(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp in list(self._buffer):
            if limit <= 0:
                break
            recs = self._buffer[tp]
            take, rest = recs[:limit], recs[limit:]
            if rest:
                self._buffer[tp] = rest
            else:
                del self._buffer[tp]
            if take:
                out[tp] = take
                self._positions[tp] = take[-1].offset + 1
                limit -= len(take)
        return out

    def _raise_corrupt(self) -> None:
        """Raise the CRC failure of a partition whose position reached the corrupt batch."""
        for tp, err in self._corrupt.items():
            if tp not in self._buffer:
                # only skipped batches (control, aborted) lie between
                self._positions[tp] = err.offset
                raise err

    async def _fetch_once(self, max_wait: float, time_left: float) -> None:
        wanted = [
            tp for tp in self._assignment if tp not in self._buffer and tp not in self._corrupt
        ]
        if not wanted:
            await asyncio.sleep(max_wait)
            return
        unknown = [tp for tp in wanted if self._positions.get(tp) is None]
        if unknown:
            await self._init_positions(unknown, timeout=time_left)
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in wanted:
            leader = self.cluster.leader(*tp)
            if leader is None:
                await self.cluster.refresh([tp.topic])
                leader = self.cluster.leader(*tp)
            if leader is not None:
                by_node.setdefault(leader, []).append(tp)
        if not by_node:
            await asyncio.sleep(min(max_wait, self.retry_backoff))
            return
        results = await asyncio.gather(
            *(self._fetch_node(node, tps, max_wait) for node, tps in by_node.items()),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _fetch_node(self, node: int, tps: list[TopicPartition], max_wait: float) -> None:
        conn = await self.cluster.connection(node)
        v = conn.version(ApiKey.FETCH, 4, 12)
        c = self.config
        topics: dict[str, list[Any]] = {}
        positions = {tp: self._positions[tp] for tp in tps}
        if any(p is None for p in positions.values()):
            return  # seeked to "unknown" meanwhile; the next pass initialises it
        for tp in tps:
            topics.setdefault(tp.topic, []).append(
                make_request(
                    ApiKey.FETCH,
                    v,
                    "FetchPartition",
                    partition=tp.partition,
                    current_leader_epoch=-1,
                    fetch_offset=positions[tp],
                    last_fetched_epoch=-1,
                    log_start_offset=-1,
                    partition_max_bytes=c.int("max.partition.fetch.bytes"),
                )
            )
        req = make_request(
            ApiKey.FETCH,
            v,
            "FetchRequest",
            cluster_id=None,
            replica_id=-1,
            max_wait=int(max_wait * 1000),
            min_bytes=c.int("fetch.min.bytes"),
            max_bytes=c.int("fetch.max.bytes"),
            isolation_level=self.isolation_level,
            session_id=0,
            session_epoch=-1,
            topics=tuple(
                make_request(ApiKey.FETCH, v, "FetchTopic", topic=t, partitions=tuple(p))
                for t, p in topics.items()
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
        resp = await conn.request(
            ApiKey.FETCH, req, version=v, timeout=self.request_timeout + max_wait
        )
        if resp.error_code:
            raise KafkaError(int(resp.error_code), "Fetch")
        for t in resp.responses:
            for p in t.partitions:
                tp = TopicPartition(t.topic, int(p.partition_index))
                if tp not in self._positions or self._positions[tp] != positions.get(tp):
                    continue  # seeked or unassigned while fetching
                code = int(p.error_code)
                if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    log.info("%s: offset %s out of range; resetting", tp, positions[tp])
                    self._positions[tp] = None
                    continue
                if code in _REFRESH_ERRORS:
                    self._spawn_refresh(tp.topic)
                    continue
                if code == ErrorCode.CORRUPT_MESSAGE:
                    # The broker met damaged data reading at this offset. Asking again reads
                    # the same bytes: not retried, as Java's consumer (a KafkaException).
                    pos = positions[tp]
                    assert pos is not None
                    self._corrupt[tp] = err = CorruptRecordError(
                        f"{tp.topic}-{tp.partition}: the broker found corrupt data fetching "
                        f"offset {pos}; seek past it to go on",
                        tp.topic,
                        tp.partition,
                        pos,
                    )
                    log.error("%s", err)
                    continue
                if code:
                    raise KafkaError(code, f"Fetch {tp.topic}-{tp.partition}")
                aborted = [
                    AbortedTxn(int(a.producer_id), int(a.first_offset))
                    for a in (p.aborted_transactions or ())
                ]
                start = positions[tp]
                assert start is not None
                try:
                    records, nxt = parse_fetched(
                        tp,
                        p.records,
                        start,
                        isolation_level=self.isolation_level,
                        aborted=aborted,
                        check_crcs=self.check_crcs,
                    )
                except CorruptRecordError as exc:
                    # Not retriable (the same bytes come back): hand out what precedes
                    # the batch, then poll raises at its offset (Java's Fetcher).
                    log.error("%s", exc)
                    self._corrupt[tp] = exc
                    records, nxt = exc.records, exc.offset
                if records:
                    # the position moves as records are handed out; trailing control or
                    # aborted batches are skipped again by the next fetch
                    self._buffer[tp] = records
                elif nxt != start:
                    self._positions[tp] = nxt

    def _spawn_refresh(self, topic: str) -> None:
        async def refresh() -> None:
            with contextlib.suppress(KafkaError):
                await self.cluster.refresh([topic])

        asyncio.get_running_loop().create_task(refresh())

    # --- groups ----------------------------------------------------------------------------

    async def _group_request(
        self,
        api_key: int,
        lo: int,
        hi: int,
        cls: str,
        *,
        codes: Any = None,
        retry_codes: frozenset[int] = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}),
        timeout: float | None = None,
        request_timeout: float | None = None,
        **fields: Any,
    ) -> Any:
        """A request to the group coordinator, resent after a lost connection, a moved
        coordinator (found again) or a ``retry_codes`` answer until ``timeout`` (default
        ``default.api.timeout.ms``). Fields may be callables of the negotiated version
        (nested entities are built for it). Other answers are the caller's to handle."""
        assert self.group_id is not None

        def build(v: int) -> dict[str, Any]:
            return {k: f(v) if callable(f) else f for k, f in fields.items()}

        resp, _ = await self.cluster.coordinator_call(
            KEY_GROUP,
            self.group_id,
            api_key,
            (lo, hi),
            cls,
            build,
            codes or (lambda r: (int(getattr(r, "error_code", 0)),)),
            retry_codes=retry_codes,
            timeout=timeout,
            request_timeout=request_timeout,
        )
        return resp

    async def _maybe_group_work(self) -> None:
        if self.group_id is None:
            return
        if self._subscription and (self._needs_join or self._generation < 0):
            await self._join()
        if self.auto_commit and self._assignment:
            now = asyncio.get_running_loop().time()
            if now - self._last_commit >= self.auto_commit_interval:
                self._last_commit = now
                with contextlib.suppress(KafkaError):
                    await self.commit()

    async def _join(self) -> None:
        c = self.config
        if self.auto_commit and self._generation >= 0 and self._assignment:
            with contextlib.suppress(KafkaError):
                await self.commit()
        await self.cluster.refresh(self._subscription)
        session = c.int("session.timeout.ms")
        rebalance = c["rebalance.timeout.ms"] or c.int("max.poll.interval.ms")
        while True:
            resp = await self._group_request(
                ApiKey.JOIN_GROUP,
                0,
                7,
                "JoinGroupRequest",
                # the coordinator holds a JoinGroup until the rebalance completes (Java)
                request_timeout=max(self.request_timeout, int(rebalance) / 1000 + 5),
                group_id=self.group_id,
                session_timeout=session,
                rebalance_timeout=int(rebalance),
                member_id=self._member_id,
                group_instance_id=c["group.instance.id"],
                protocol_type="consumer",
                protocols=lambda v: (
                    make_request(
                        ApiKey.JOIN_GROUP,
                        v,
                        "JoinGroupRequestProtocol",
                        name=self.assignor,
                        metadata=encode_subscription(self._subscription, self._assignment),
                    ),
                ),
                reason=None,
            )
            code = int(resp.error_code)
            if code == ErrorCode.MEMBER_ID_REQUIRED:
                self._member_id = resp.member_id
                continue
            if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
                self._member_id = ""
                continue
            if code == ErrorCode.REBALANCE_IN_PROGRESS:
                await asyncio.sleep(self.retry_backoff)
                continue
            if code:
                raise KafkaError(code, "JoinGroup")
            break
        self._member_id = resp.member_id
        self._generation = int(resp.generation_id)
        assignments: list[Any] = []
        if resp.leader == resp.member_id:
            subs = {m.member_id: decode_subscription(m.metadata) for m in resp.members}
            topics = sorted({t for ts in subs.values() for t in ts})
            await self.cluster.refresh(topics)
            counts = {t: self.cluster.partition_count(t) or 0 for t in topics}
            plan = ASSIGNORS[resp.protocol_name or self.assignor](subs, counts)
            assignments = [(m, encode_assignment(a)) for m, a in plan.items()]
        resp2 = await self._group_request(
            ApiKey.SYNC_GROUP,
            0,
            5,
            "SyncGroupRequest",
            group_id=self.group_id,
            generation_id=self._generation,
            member_id=self._member_id,
            group_instance_id=c["group.instance.id"],
            protocol_type="consumer",
            protocol_name=resp.protocol_name,
            assignments=lambda v: tuple(
                make_request(
                    ApiKey.SYNC_GROUP, v, "SyncGroupRequestAssignment", member_id=m, assignment=a
                )
                for m, a in assignments
            ),
        )
        code = int(resp2.error_code)
        if code in _REJOIN_ERRORS:
            if code != ErrorCode.REBALANCE_IN_PROGRESS:
                self._member_id = ""
            self._needs_join = True
            return
        if code:
            raise KafkaError(code, "SyncGroup")
        tps = decode_assignment(resp2.assignment)
        log.info("group %s generation %d: assigned %s", self.group_id, self._generation, tps)
        self._positions = {}
        self._buffer = {}
        self._set_assignment(tps)
        self._needs_join = False
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        interval = self.config.seconds("heartbeat.interval.ms")
        while not self._closed and self._generation >= 0:
            await asyncio.sleep(interval)
            if self._needs_join:
                continue
            try:
                resp = await self._group_request(
                    ApiKey.HEARTBEAT,
                    0,
                    4,
                    "HeartbeatRequest",
                    timeout=interval,  # retried within the interval, then the next one
                    group_id=self.group_id,
                    generation_id=self._generation,
                    member_id=self._member_id,
                    group_instance_id=self.config["group.instance.id"],
                )
            except KafkaError as exc:
                log.debug("heartbeat: %s", exc)
                continue
            except Exception:  # a bug must not end heartbeats silently (the member expires)
                log.exception("heartbeat failed")
                continue
            code = int(resp.error_code)
            if code in _REJOIN_ERRORS:
                if code != ErrorCode.REBALANCE_IN_PROGRESS:
                    self._member_id = ""
                    self._generation = -1
                self._needs_join = True
            elif code:
                log.warning("heartbeat: %s", KafkaError(code))

    async def _leave(self) -> None:
        if self.group_id is None or self._generation < 0 or not self._member_id:
            return
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        with contextlib.suppress(KafkaError, OSError):
            await self._group_request(
                ApiKey.LEAVE_GROUP,
                0,
                4,
                "LeaveGroupRequest",
                # best effort, as Java's: without it the member expires after its session
                timeout=min(self.api_timeout, self.request_timeout, 5.0),
                group_id=self.group_id,
                member_id=self._member_id,
                members=lambda v: (
                    (
                        make_request(
                            ApiKey.LEAVE_GROUP,
                            v,
                            "MemberIdentity",
                            member_id=self._member_id,
                            group_instance_id=self.config["group.instance.id"],
                        ),
                    )
                    if v >= 3
                    else ()
                ),
            )
        self._generation = -1
        self._member_id = ""

    async def commit(
        self, offsets: dict[TopicPartition, int] | None = None, *, timeout: float | None = None
    ) -> None:
        """OffsetCommit of ``offsets`` (next offset to read), default the positions.

        A lost connection, a moved coordinator and COORDINATOR_LOAD_IN_PROGRESS /
        UNKNOWN_TOPIC_OR_PARTITION / REQUEST_TIMED_OUT are retried until ``timeout``
        (default ``default.api.timeout.ms``) with the same generation, which the coordinator
        checks: once the group rebalanced, the resent commit is refused (ILLEGAL_GENERATION,
        UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS), never applied late. Those are not retried:
        they raise, and the consumer rejoins. Commits run one at a time in call order, so a
        retried commit cannot land after a later one."""
        if self.group_id is None:
            raise ConfigError("commit() needs group.id")
        async with self._commit_lock:
            if offsets is None:
                offsets = {tp: p for tp, p in self._positions.items() if p is not None}
            if not offsets:
                return
            await self._commit(offsets, timeout)

    async def _commit(self, offsets: dict[TopicPartition, int], timeout: float | None) -> None:
        topics: dict[str, list[tuple[int, int]]] = {}
        for tp, off in offsets.items():
            topics.setdefault(tp.topic, []).append((tp.partition, off))

        def topic_entities(v: int) -> tuple[Any, ...]:
            return tuple(
                make_request(
                    ApiKey.OFFSET_COMMIT,
                    v,
                    "OffsetCommitRequestTopic",
                    name=t,
                    partitions=tuple(
                        make_request(
                            ApiKey.OFFSET_COMMIT,
                            v,
                            "OffsetCommitRequestPartition",
                            partition_index=p,
                            committed_offset=o,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        )
                        for p, o in ps
                    ),
                )
                for t, ps in topics.items()
            )

        resp = await self._group_request(
            ApiKey.OFFSET_COMMIT,
            2,
            8,
            "OffsetCommitRequest",
            codes=lambda r: [int(p.error_code) for t in r.topics for p in t.partitions],
            retry_codes=_COMMIT_RETRY,
            timeout=timeout,
            group_id=self.group_id,
            generation_id_or_member_epoch=self._generation,
            generation_id=self._generation,
            member_id=self._member_id,
            group_instance_id=self.config["group.instance.id"],
            retention_time=-1,
            topics=topic_entities,
        )
        for t in resp.topics:
            for p in t.partitions:
                code = int(p.error_code)
                what = f"OffsetCommit {t.name}-{p.partition_index}"
                if code in _REJOIN_ERRORS:
                    self._needs_join = True
                    what += (
                        ": the group rebalanced (or is rebalancing) since these records were "
                        "polled; the offsets were not committed"
                    )
                if code:
                    raise KafkaError(code, what)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The membership a transactional producer's offset commit is checked against."""
        if self.group_id is None:
            raise ConfigError("group_metadata() needs group.id")
        return ConsumerGroupMetadata(
            self.group_id, self._generation, self._member_id, self.config["group.instance.id"]
        )

    def commit_async(self, offsets: dict[TopicPartition, int] | None = None) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self.commit(offsets))

    async def committed(
        self, tps: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed); retried like
        :meth:`commit`. While offsets of an open transaction are pending it raises
        UNSTABLE_OFFSET_COMMIT (retriable: poll() asks again until they are stable)."""
        if self.group_id is None:
            raise ConfigError("committed() needs group.id")
        tps = [TopicPartition(*tp) for tp in tps]
        topics: dict[str, list[int]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(tp.partition)

        def topic_entities(v: int, cls: str) -> tuple[Any, ...]:
            return tuple(
                make_request(ApiKey.OFFSET_FETCH, v, cls, name=t, partition_indexes=tuple(ps))
                for t, ps in topics.items()
            )

        def group_of(resp: Any) -> Any:
            return resp.groups[0] if hasattr(resp, "groups") else resp

        def codes(resp: Any) -> list[int]:
            g = group_of(resp)
            return [int(g.error_code)] + [int(p.error_code) for t in g.topics for p in t.partitions]

        resp = await self._group_request(
            ApiKey.OFFSET_FETCH,
            1,
            8,
            "OffsetFetchRequest",
            codes=codes,
            retry_codes=_OFFSET_FETCH_RETRY,
            timeout=timeout,
            group_id=self.group_id,
            topics=lambda v: topic_entities(v, "OffsetFetchRequestTopic") if v < 8 else (),
            groups=lambda v: (
                (
                    make_request(
                        ApiKey.OFFSET_FETCH,
                        v,
                        "OffsetFetchRequestGroup",
                        group_id=self.group_id,
                        topics=topic_entities(v, "OffsetFetchRequestTopics"),
                    ),
                )
                if v >= 8
                else ()
            ),
            require_stable=True,
        )
        out: dict[TopicPartition, int | None] = dict.fromkeys(tps)
        group = group_of(resp)
        if group.error_code:
            raise KafkaError(int(group.error_code), "OffsetFetch")
        for t in group.topics:
            for p in t.partitions:
                if p.error_code:
                    raise KafkaError(int(p.error_code), f"OffsetFetch {t.name}-{p.partition_index}")
                off = int(p.committed_offset)
                out[TopicPartition(t.name, int(p.partition_index))] = off if off >= 0 else None
        return out

    async def close(self) -> None:
        if self._closed:
            return
        try:
            if self.auto_commit and self._assignment and self._generation >= 0:
                with contextlib.suppress(KafkaError, OSError):
                    await self.commit(timeout=min(self.api_timeout, 20.0))
            await self._leave()
        finally:
            self._closed = True
            if self._heartbeat_task is not None:
                self._heartbeat_task.cancel()
                with contextlib.suppress(BaseException):
                    await self._heartbeat_task
            await self.cluster.close()
