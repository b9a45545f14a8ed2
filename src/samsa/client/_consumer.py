"""The asyncio consumer: fetching, isolation levels, offsets and classic consumer groups.

Theory of operation
-------------------
The consumer owns a set of partitions, given by :meth:`AsyncConsumer.assign` or by the
group coordinator after :meth:`AsyncConsumer.subscribe`, and a *position* per partition:
the offset of the next record to hand out. A position is initialised from the group's
committed offset, else from ``auto.offset.reset`` (ListOffsets earliest / latest).

``getmany()`` / ``poll()`` / ``consume_arrow()`` return records already buffered, else send
one Fetch per leader broker (a *round*), waiting up to ``fetch.max.wait.ms`` on the broker
side. A fetched partition is buffered as received and decoded when first handed out, by
:func:`samsa.protocol.columnar.decode_fetched` (column-wise, no Python object per record;
``poll()`` then builds its ConsumerRecords from the columns). :func:`parse_fetched` is the
per-record reference of the same rules (unit-tested on crafted bytes): walk whole batches (a
partial batch at the end of a response is normal), check each CRC-32C when ``check.crcs``,
decompress, drop records below the position (a fetch may start inside a batch), and always
drop control batches. A poll that hands out records sends the next round before returning
(fetch ahead, from where the buffered data ends), so the broker works while the application
handles the records; a partition holds at most two responses (the one being handed out and
the next) and no round is sent while ``fetch.max.bytes`` are buffered in all.

With ``isolation.level=read_committed`` the broker returns data only below the last stable
offset together with the aborted transactions (producer id, first offset) of the range; as
in Kafka's ``Fetcher``, a producer id becomes "aborted" when a batch at or after its first
offset is reached, its transactional batches are skipped until its ABORT marker, and the
marker clears it again.

Groups use the classic protocol: FindCoordinator, JoinGroup (with the consumer protocol's
subscription, version 1), the leader computes the assignment with the range or round-robin
assignor and sends it with SyncGroup, every member decodes its own. A background task
heartbeats; REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION mark the
membership for a rejoin, done in the next poll after committing (auto-commit) what was
consumed; rejoining gives the partitions up first (eager protocol, as Java's onJoinPrepare),
so nothing fetched for them is handed out once another member may own them. ``close()``
commits (auto-commit) and sends LeaveGroup.

With ``group.protocol=consumer`` (KIP-848) the broker assigns: the member heartbeats with
ConsumerGroupHeartbeat (its member epoch, subscription and owned partitions) and applies each
assignment it is sent: it commits (auto-commit) and drops the partitions taken away, takes
the new ones, and reports what it owns at once, so the coordinator can hand the dropped
partitions on. A fenced member (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) loses its partitions
and rejoins with epoch 0; ``close()`` leaves with epoch -1 (-2 for a static member).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import io
import itertools
import logging
import struct
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
from samsa.client._fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchPlan,
    FetchSessionHandler,
    fetch_request,
)
from samsa.client._retry import INVALID_METADATA, RetryLater
from samsa.client._types import ConsumerGroupMetadata, ConsumerRecord, TopicPartition
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import (
    HEADER_SIZE,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    TIMESTAMP_TYPE_FLAG,
    ControlType,
    InvalidBatchError,
    RecordBatchView,
    control_type_of,
    decode_records,
    iter_batches,
)

if TYPE_CHECKING:
    import pyarrow as pa

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
        if batch.batch_length < MIN_BATCH_LENGTH:  # it would walk backwards
            raise InvalidBatchError(
                ErrorCode.CORRUPT_MESSAGE, f"batch length {batch.batch_length} at {batch.pos}"
            )
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


_BASE_AND_DELTA = struct.Struct(">q15xi")  # baseOffset ... lastOffsetDelta (at byte 23)


def split_at_corrupt(
    tp: TopicPartition,
    data: bytes | memoryview,
    position: int,
    decodes: Callable[[memoryview], object],
    cause: Exception,
) -> tuple[memoryview, CorruptRecordError]:
    """The whole batches before the first one that ``decodes`` fails on, and the error for it.

    ``decodes`` raised ``cause`` on all of ``data``; the bad batch is the first whose prefix
    of ``data`` fails (found by bisection, so the decoder's state, e.g. aborted transactions,
    is the same as in the full decode). A header that cannot be walked is the bad batch when
    every whole batch before it decodes."""
    mv = memoryview(data).cast("B")
    ends = [0]  # byte ends of the first k whole batches
    after = [position]  # the offset after them
    while len(mv) - ends[-1] >= HEADER_SIZE:
        view = RecordBatchView(mv, ends[-1])
        if view.batch_length < MIN_BATCH_LENGTH or ends[-1] + view.size > len(mv):
            break
        ends.append(ends[-1] + view.size)
        after.append(max(after[-1], view.next_offset))

    def ok(k: int) -> bool:
        try:
            decodes(mv[: ends[k]])
        except (InvalidBatchError, KafkaError, ValueError):
            return False
        return True

    lo, hi = 0, len(ends) - 1  # the first lo batches decode; find the largest such lo
    if ok(hi):
        lo = hi
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
    at = ends[lo]
    # a header too damaged to walk has no offsets to trust: the error is where it starts
    walked = lo < len(ends) - 1
    base, delta = _BASE_AND_DELTA.unpack_from(mv, at) if walked else (after[lo], 0)
    err = CorruptRecordError(
        f"{tp.topic}-{tp.partition}: record batch at offset {base} is corrupt ({cause}); "
        f"seek past offset {base + delta} to skip it",
        tp.topic,
        tp.partition,
        max(after[lo], base),
    )
    return mv[:at], err


@dataclass(slots=True)
class _Fetched:
    """One partition's records from one Fetch response, decoded when first handed out: into
    ConsumerRecords by poll(), into Arrow by consume_arrow() (a switch between the two decodes
    again from ``start``, which keeps the aborted-transaction state right)."""

    data: bytes | memoryview
    start: int  # the fetch offset
    end: int  # the offset after its last whole batch: where a fetch ahead starts
    aborted: list[AbortedTxn]
    records: list[ConsumerRecord] | None = None  # the rest to hand out, once decoded
    arrow: pa.RecordBatch | None = None
    next_offset: int = -1  # the position after all of it (skipped batches included)
    taken: int = 0  # rows of ``records`` already handed out
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.data)


def _batch_owners(data: bytes | memoryview) -> tuple[list[int], list[int], list[int]]:
    """Base offset, producer id and partition leader epoch of each whole batch."""
    bases: list[int] = []
    pids: list[int] = []
    epochs: list[int] = []
    with contextlib.suppress(InvalidBatchError):
        for batch in iter_batches(data):
            if batch.batch_length < MIN_BATCH_LENGTH:
                break
            bases.append(batch.base_offset)
            pids.append(batch.producer_id)
            epochs.append(batch.partition_leader_epoch)
    return bases, pids, epochs


def _end_offset(data: bytes | memoryview | None, start: int) -> int:
    """The offset after the last whole batch in fetched data (``start`` if none)."""
    end = start
    if data:
        with contextlib.suppress(InvalidBatchError):
            for batch in iter_batches(data):
                if batch.batch_length < MIN_BATCH_LENGTH:
                    break
                end = max(end, batch.next_offset)
    return end


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
        # Fetched data is decoded with it (and pyarrow, numpy): loaded with the consumer
        # (~0.2 s once per process), not in the first poll, nor by producer-only programs.
        import samsa.protocol.columnar  # noqa: F401

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
        protocol = str(c["group.protocol"]).lower()
        if protocol not in ("classic", "consumer"):
            raise ConfigError("group.protocol must be classic or consumer")
        self.kip848 = protocol == "consumer"
        # KIP-848 members name themselves (ConsumerGroupHeartbeat v1), once per consumer.
        self._member_id_848 = str(uuid.uuid4())
        self._heartbeat_interval_848 = c.seconds("heartbeat.interval.ms")
        self.cluster = Cluster.from_config(c, api_timeout=self.api_timeout)
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int | None] = {}
        # Fetched data per partition, in offset order: the response being handed out and at
        # most one fetched ahead of it (see _fetchable: what prefetching may hold is bounded).
        self._buffer: dict[TopicPartition, deque[_Fetched]] = {}
        # The Fetch round in flight: sent when a poll hands out the last buffered records of
        # a partition, so the broker works while the application handles them.
        self._fetching: asyncio.Task[None] | None = None
        self.max_partition_fetch_bytes = c.int("max.partition.fetch.bytes")
        self.fetch_max_bytes = c.int("fetch.max.bytes")
        # KIP-227 fetch sessions, one per broker (client/_fetch_session.py).
        self._sessions: dict[int, FetchSessionHandler] = {}
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
        # Nothing is left to fetch: the fetch sessions' slots are freed on the brokers now.
        await self._stop_fetching()
        await self._close_sessions()

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
        while True:
            if tp not in self._positions:  # as Java's: only an assigned partition's
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} is not assigned")
            pos = self._positions[tp]
            if pos is not None:
                return pos
            await self._init_positions([tp])  # (a rebalance meanwhile: looked up again)

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
        # An answer applies only to the assignment it was asked for: a rebalance while it is
        # in flight (a lost response waits request.timeout.ms) replaces the positions, and a
        # stale committed/earliest offset written into the new ones would fetch again what
        # another member consumed and committed meanwhile. A seek meanwhile also wins.
        positions = self._positions

        def settle(tp: TopicPartition, off: int) -> None:
            if self._positions is positions and tp in positions and positions[tp] is None:
                positions[tp] = off

        if self.group_id is not None:
            committed = await self.committed(tps, timeout=timeout)
            for tp, off in committed.items():
                if off is not None and off >= 0:
                    settle(tp, off)
        if self._positions is not positions:
            return  # the next fetch round looks the new assignment's positions up
        missing = [tp for tp in tps if tp in positions and positions[tp] is None]
        if not missing:
            return
        if self.reset_policy == "none":
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, f"no offset for {missing}")
        offsets = await self.list_offsets(
            missing, EARLIEST if self.reset_policy == "earliest" else LATEST, timeout=timeout
        )
        for tp, off in offsets.items():
            settle(tp, off)

    # --- fetching --------------------------------------------------------------------------

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records grouped by partition; waits up to ``timeout_ms`` for the first."""
        limit = max_records or self.max_poll_records
        return await self._poll(timeout_ms, lambda: self._take_records(limit)) or {}

    async def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        batches = await self.getmany(timeout_ms, max_records)
        return [r for recs in batches.values() for r in recs]

    async def consume_arrow(
        self,
        max_records: int | None = None,
        timeout_ms: int = 0,
        *,
        include_headers: bool = False,
    ) -> pa.RecordBatch:
        """Up to ``max_records`` records as one Arrow batch in the columns of Spark's Kafka
        source (``headers`` last when ``include_headers``), decoded column-wise from the
        fetched batches without a Python object per record. Positions, commits, seeks,
        isolation and corrupt batches behave as in :meth:`poll` (the two may be mixed); rows
        of a partition are in offset order, partitions one after another."""
        import pyarrow as pa

        from samsa.protocol.columnar import ARROW_SCHEMA, ARROW_SCHEMA_HEADERS, empty_batch

        limit = max_records or self.max_poll_records
        parts = await self._poll(timeout_ms, lambda: self._take_arrow(limit, include_headers))
        if not parts:
            return empty_batch(ARROW_SCHEMA_HEADERS if include_headers else ARROW_SCHEMA)
        if len(parts) == 1:
            return parts[0]
        if hasattr(pa, "concat_batches"):  # pyarrow >= 19
            return pa.concat_batches(parts)
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    async def _poll(self, timeout_ms: int, take: Callable[[], Any]) -> Any:
        """``take()``'s first non-empty answer within ``timeout_ms`` (else its empty one)."""
        if self._closed:
            raise ClosedError("consumer is closed")
        if not self._started:
            await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        failures = 0
        while True:
            try:
                # As Java's poll: group membership, positions and fetches that fail on a
                # lost connection or a retriable error are tried again within the poll's
                # time (and in the next poll); other errors reach the caller.
                await self._maybe_group_work()
                out = take()
                if out:
                    self._prefetch()
                    return out
                self._raise_corrupt()
                await self._wait_fetch(deadline)
                failures = 0
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                failures += 1
                log.debug("poll: %s", exc)
                wait = self.cluster.backoff.delay(failures)
                await asyncio.sleep(min(wait, max(0.0, deadline - loop.time())))
            out = take()
            if out:
                self._prefetch()
                return out
            if loop.time() >= deadline:
                return out

    async def _wait_fetch(self, deadline: float) -> None:
        """Wait for the Fetch round in flight (sending one if none) until ``deadline``; a
        round this poll sends is waited for whole (its broker-side wait fits the poll's)."""
        loop = asyncio.get_running_loop()
        remaining = max(0.0, deadline - loop.time())
        task = self._fetching
        if task is None:
            max_wait = min(remaining, self.config.seconds("fetch.max.wait.ms"))
            task = self._fetching = loop.create_task(self._fetch_once(max_wait, remaining))
            await asyncio.wait({task})
        else:
            await asyncio.wait({task}, timeout=remaining)
        if task.done():
            if self._fetching is task:
                self._fetching = None
            task.result()  # its error, if any, is this poll's

    def _prefetch(self) -> None:
        """Send the next Fetch round now, if a partition wants one, so its answer is on the
        way while the application handles what this poll returns."""
        done = self._fetching
        if done is not None and done.done() and not done.cancelled() and not done.exception():
            self._fetching = None  # (a failed one stays, for the next wait to raise)
        if self._fetching is None and not self._closed and self._fetchable():
            self._fetching = asyncio.get_running_loop().create_task(
                self._fetch_once(self.config.seconds("fetch.max.wait.ms"), self.api_timeout)
            )

    def _fetchable(self) -> list[TopicPartition]:
        """Partitions to fetch. Prefetching is bounded: a partition is fetched while it holds
        at most one response (the one being handed out; the next fetch starts after it), and
        none while the buffered responses reach ``fetch.max.bytes`` in all."""
        if sum(e.size for q in self._buffer.values() for e in q) >= self.fetch_max_bytes:
            return []
        out = []
        for tp in self._assignment:
            q = self._buffer.get(tp)
            if tp in self._corrupt or (q and (len(q) > 1 or q[-1].end <= q[-1].start)):
                continue
            out.append(tp)
        return out

    def _fetch_offset(self, tp: TopicPartition) -> int | None:
        q = self._buffer.get(tp)
        return q[-1].end if q else self._positions.get(tp)

    def _take(
        self, limit: int, hand_out: Callable[[TopicPartition, _Fetched, int], tuple[Any, int, int]]
    ) -> list[tuple[TopicPartition, Any]]:
        """Rows for up to ``limit`` records, partition after partition: ``hand_out`` gives
        (rows, count, offset after the last) from the head response of a partition."""
        out: list[tuple[TopicPartition, Any]] = []
        for tp in list(self._buffer):
            q = self._buffer[tp]
            while q and limit > 0:
                e = q[0]
                rows, n, after = hand_out(tp, e, limit)
                if n:
                    out.append((tp, rows))
                    self._positions[tp] = after
                    limit -= n
                if self._remaining(e) == 0:
                    q.popleft()
                    # past the skipped batches (control, aborted) after its last record
                    pos = self._positions[tp]
                    if pos is not None and e.next_offset > pos:
                        self._positions[tp] = e.next_offset
            if not q:
                del self._buffer[tp]
            if limit <= 0:
                break
        return out

    @staticmethod
    def _remaining(e: _Fetched) -> int:
        if e.records is not None:
            return len(e.records) - e.taken
        return e.arrow.num_rows if e.arrow is not None else -1

    def _take_records(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        def hand_out(tp: TopicPartition, e: _Fetched, n: int) -> tuple[Any, int, int]:
            recs = self._records_of(tp, e)
            rows = recs[e.taken : e.taken + n]
            e.taken += len(rows)
            return rows, len(rows), rows[-1].offset + 1 if rows else 0

        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp, rows in self._take(limit, hand_out):
            out.setdefault(tp, []).extend(rows)
        return out

    def _take_arrow(self, limit: int, include_headers: bool) -> list[pa.RecordBatch]:
        def hand_out(tp: TopicPartition, e: _Fetched, n: int) -> tuple[Any, int, int]:
            batch = self._arrow_of(tp, e, include_headers)
            rows = batch.slice(0, n)
            e.arrow = batch.slice(rows.num_rows)
            if not rows.num_rows:
                return rows, 0, 0
            return rows, rows.num_rows, rows.column(4)[-1].as_py() + 1

        return [rows for _, rows in self._take(limit, hand_out)]

    def _records_of(self, tp: TopicPartition, e: _Fetched) -> list[ConsumerRecord]:
        """The response's records not yet handed out, as ConsumerRecords (built once)."""
        if e.records is not None:
            return e.records

        # Column-wise decoding, then one object per record built from the columns: about
        # twice as fast as decoding record by record (benchmarks/client.py).
        batch = self._arrow_of(tp, e, True)
        n = batch.num_rows
        records: list[ConsumerRecord] = []
        if n:
            import numpy as np

            from samsa.protocol.columnar import to_numpy

            cols = batch.columns
            offsets = to_numpy(cols[4])
            # producer id and leader epoch are per batch: found by offset among the batches
            bases, pids, epochs = _batch_owners(e.data)
            at = np.searchsorted(np.asarray(bases, np.int64), offsets, "right") - 1
            heads = cols[7]
            if heads.offsets[-1].as_py() == heads.offsets[0].as_py():  # no headers at all
                headers: Iterable[Any] = itertools.repeat((), n)
            else:
                headers = [tuple((h["key"], h["value"]) for h in hs) for hs in heads.to_pylist()]
            records = list(
                map(
                    ConsumerRecord,
                    itertools.repeat(tp.topic, n),
                    itertools.repeat(tp.partition, n),
                    offsets.tolist(),
                    (to_numpy(cols[5]) // 1000).tolist(),
                    cols[0].to_pylist(),
                    cols[1].to_pylist(),
                    headers,
                    cols[6].to_pylist(),
                    np.asarray(pids, np.int64)[at].tolist(),
                    np.asarray(epochs, np.int64)[at].tolist(),
                )
            )
        e.records, e.taken, e.arrow = records, 0, None
        return records

    def _arrow_of(self, tp: TopicPartition, e: _Fetched, include_headers: bool) -> pa.RecordBatch:
        """The response's records not yet handed out, decoded once (column-wise)."""
        import numpy as np
        import pyarrow as pa

        from samsa.protocol.columnar import ARROW_SCHEMA, decode_fetched, to_numpy

        batch = e.arrow
        if batch is not None:
            has = batch.num_columns > len(ARROW_SCHEMA)
            if has and not include_headers:
                return pa.RecordBatch.from_arrays(batch.columns[:-1], schema=ARROW_SCHEMA)
            if has or not include_headers:
                return batch

        def decode(data: bytes | memoryview) -> Any:
            return decode_fetched(
                data,
                tp.topic,
                tp.partition,
                e.start,
                isolation_level=self.isolation_level,
                aborted=e.aborted,
                check_crcs=self.check_crcs,
                include_headers=include_headers,
            )

        try:
            d = decode(e.data)
        except (InvalidBatchError, KafkaError, ValueError) as exc:
            self._split_corrupt(tp, e, decode, exc)
            d = decode(e.data)
        batch, e.next_offset = d.batch, d.next_offset
        pos = self._positions[tp]
        if pos is not None and pos > e.start and batch.num_rows:  # some handed out already
            offsets = to_numpy(batch.column(4))
            batch = batch.slice(int(np.searchsorted(offsets, pos)))
        e.arrow, e.records = batch, None
        return batch

    def _split_corrupt(
        self, tp: TopicPartition, e: _Fetched, decode: Callable[[Any], Any], exc: Exception
    ) -> None:
        """Keep what precedes the batch ``decode`` failed on; poll raises at its offset after
        handing that out (Java's Fetcher). Not retriable: the same bytes come back."""
        e.data, err = split_at_corrupt(tp, e.data, e.start, decode, exc)
        log.error("%s", err)
        self._corrupt[tp] = err
        e.end = err.offset
        q = self._buffer.get(tp)
        while q and q[-1] is not e:  # fetched after the corrupt batch
            q.pop()

    def _raise_corrupt(self) -> None:
        """Raise the CRC failure of a partition whose position reached the corrupt batch."""
        for tp, err in self._corrupt.items():
            if tp not in self._buffer:
                # only skipped batches (control, aborted) lie between
                self._positions[tp] = err.offset
                raise err

    async def _fetch_once(self, max_wait: float, time_left: float) -> None:
        wanted = self._fetchable()
        if not wanted:
            await asyncio.sleep(max_wait)
            return
        unknown = [tp for tp in wanted if self._positions.get(tp) is None]
        if unknown:
            await self._init_positions(unknown, timeout=time_left)
            # a rebalance meanwhile: what is no longer assigned is not fetched
            wanted = [tp for tp in wanted if self._positions.get(tp) is not None]
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
        positions = {tp: self._fetch_offset(tp) for tp in tps}
        if any(p is None for p in positions.values()):
            return  # seeked to "unknown" meanwhile; the next pass initialises it
        part_max = c.int("max.partition.fetch.bytes")
        wanted = {(tp.topic, tp.partition): (off, part_max) for tp, off in positions.items()}
        # KIP-227 from Fetch v7 (as Java's consumer, always): a full request opens a session,
        # later ones name only what changed. Rounds are sequential (one _fetching task, one
        # request per node each), as a session allows one request in flight.
        handler = self._sessions.setdefault(node, FetchSessionHandler()) if v >= 7 else None
        if handler is not None:
            plan = handler.build(wanted)
        else:
            plan = FetchPlan(INVALID_SESSION_ID, FINAL_EPOCH, wanted)
        req = fetch_request(
            v,
            plan,
            max_wait_ms=int(max_wait * 1000),
            min_bytes=c.int("fetch.min.bytes"),
            max_bytes=c.int("fetch.max.bytes"),
            isolation_level=self.isolation_level,
        )
        try:
            fut = conn.send_nowait(ApiKey.FETCH, req, version=v)
            try:
                await conn.drain()
                resp = await conn.wait_response(fut, ApiKey.FETCH, self.request_timeout + max_wait)
            except asyncio.CancelledError:
                # a fetch ahead cancelled (close, unsubscribe): its answer (or the connection's
                # error) has nobody left to read it
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())
                raise
        except BaseException:
            if handler is not None:
                handler.handle_error()  # what the broker made of it is unknown: start over
            raise
        if handler is not None and not handler.handle_response(
            int(resp.error_code), int(resp.session_id)
        ):
            # A session error: nothing was read; the next round fetches the same offsets in
            # a full request (retried at once, as Java's consumer).
            log.debug("fetch session with node %d: error %d; next fetch full", node,
                      int(resp.error_code))  # fmt: skip
            return
        if resp.error_code:
            raise KafkaError(int(resp.error_code), "Fetch")
        for t in resp.responses:
            for p in t.partitions:
                tp = TopicPartition(t.topic, int(p.partition_index))
                if tp not in self._positions or self._fetch_offset(tp) != positions.get(tp):
                    continue  # seeked or unassigned while fetching
                code = int(p.error_code)
                if code in _REFRESH_ERRORS:
                    self._spawn_refresh(tp.topic)
                    continue
                if code and tp in self._buffer:
                    continue  # a fetch ahead: asked again once the buffered data is out
                if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    log.info("%s: offset %s out of range; resetting", tp, positions[tp])
                    self._positions[tp] = None
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
                if not p.records:
                    continue
                start = positions[tp]
                assert start is not None
                self._buffer.setdefault(tp, deque()).append(
                    _Fetched(
                        p.records,
                        start,
                        _end_offset(p.records, start),
                        [
                            AbortedTxn(int(a.producer_id), int(a.first_offset))
                            for a in (p.aborted_transactions or ())
                        ],
                    )
                )

    async def _stop_fetching(self) -> None:
        """Cancel the Fetch round in flight (a fetch ahead): its answer is not wanted."""
        if self._fetching is not None:
            self._fetching.cancel()
            with contextlib.suppress(BaseException):
                await self._fetching
            self._fetching = None

    async def _close_sessions(self) -> None:
        """Close the fetch sessions (epoch -1), freeing their slots on the brokers at once
        rather than when evicted; best effort, briefly, as Java's consumer on close."""
        sessions, self._sessions = self._sessions, {}
        for node, handler in sessions.items():
            plan = handler.close()
            if plan is None:
                continue
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                conn = await asyncio.wait_for(self.cluster.connection(node), 1.0)
                v = conn.version(ApiKey.FETCH, 7, 12)
                req = fetch_request(
                    v, plan, max_wait_ms=0, min_bytes=0, max_bytes=0,
                    isolation_level=self.isolation_level,
                )  # fmt: skip
                fut = conn.send_nowait(ApiKey.FETCH, req, version=v)
                await conn.drain()
                await conn.wait_response(fut, ApiKey.FETCH, 1.0)

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
            await (self._join_848() if self.kip848 else self._join())
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
        # Eager protocol (Java's onJoinPrepare): rejoining gives every partition up, and what
        # was fetched for them is dropped whatever this join's outcome. A SyncGroup refused
        # (the group rebalanced again) can come after the others' succeeded: they own those
        # partitions now, and handing out the records fetched ahead would deliver them twice.
        self._set_assignment([])
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

    # --- KIP-848: the consumer group protocol ----------------------------------------------

    async def _consumer_heartbeat(self, epoch: int, timeout: float | None = None) -> Any:
        """One ConsumerGroupHeartbeat with everything (subscription, owned partitions)."""
        c = self.config
        ids = {t: info.topic_id for t, info in self.cluster.topics.items()}
        owned: dict[Any, list[int]] = {}
        for tp in self._assignment:
            if ids.get(tp.topic) is not None:
                owned.setdefault(ids[tp.topic], []).append(tp.partition)
        rebalance = c["rebalance.timeout.ms"] or c.int("max.poll.interval.ms")
        joining_or_leaving = epoch <= 0
        return await self._group_request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT,
            0,
            1,
            "ConsumerGroupHeartbeatRequest",
            timeout=timeout,
            group_id=self.group_id,
            member_id=self._member_id_848,
            member_epoch=epoch,
            instance_id=c["group.instance.id"],
            rack_id=None,
            rebalance_timeout=int(rebalance),
            subscribed_topic_names=tuple(self._subscription) if epoch >= 0 else None,
            subscribed_topic_regex=None,
            server_assignor=c["group.remote.assignor"],
            topic_partitions=lambda v: (
                None
                if epoch < 0
                else tuple(
                    make_request(
                        ApiKey.CONSUMER_GROUP_HEARTBEAT,
                        v,
                        "TopicPartitions",
                        topic_id=tid,
                        partitions=tuple(sorted(ps)),
                    )
                    for tid, ps in ([] if joining_or_leaving else owned.items())
                )
            ),
        )

    async def _join_848(self) -> None:
        await self.cluster.refresh(self._subscription)
        if self._generation < 0:
            self._set_assignment([])  # a new incarnation owns nothing
        resp = await self._consumer_heartbeat(0 if self._generation < 0 else self._generation)
        await self._on_consumer_heartbeat(resp)
        if int(resp.error_code):
            raise KafkaError(int(resp.error_code), f"ConsumerGroupHeartbeat: {resp.error_message}")
        self._needs_join = False
        if self._heartbeat_task is None or self._heartbeat_task.done():
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_848())

    async def _on_consumer_heartbeat(self, resp: Any) -> bool:
        """Apply a heartbeat's answer; True if the assignment changed."""
        code = int(resp.error_code)
        if code in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
            # Fenced: the partitions are someone else's now; nothing of them is committed.
            log.info("group %s: fenced (%s), rejoining", self.group_id, ErrorCode(code).name)
            self._generation = -1
            self._set_assignment([])
            self._needs_join = True
            return True
        if code:
            return False
        self._generation = int(resp.member_epoch)
        self._heartbeat_interval_848 = resp.heartbeat_interval.total_seconds()
        if resp.assignment is None:
            return False
        names = {info.topic_id: t for t, info in self.cluster.topics.items()}
        if any(tp.topic_id not in names for tp in resp.assignment.topic_partitions):
            await self.cluster.refresh(self._subscription)
            names = {info.topic_id: t for t, info in self.cluster.topics.items()}
        new = [
            TopicPartition(names[tp.topic_id], p)
            for tp in resp.assignment.topic_partitions
            if tp.topic_id in names
            for p in tp.partitions
        ]
        if set(new) == set(self._assignment):
            return False
        revoked = [tp for tp in self._assignment if tp not in set(new)]
        if revoked and self.auto_commit:
            positions = {tp: self._positions.get(tp) for tp in revoked}
            with contextlib.suppress(KafkaError, OSError):
                await self.commit({tp: p for tp, p in positions.items() if p is not None})
        log.info("group %s epoch %d: assigned %s", self.group_id, self._generation, new)
        self._set_assignment(new)
        return True

    async def _heartbeat_848(self) -> None:
        changed = False
        while not self._closed and self._generation >= 0:
            if not changed:  # after a change, tell the coordinator what is owned at once
                await asyncio.sleep(self._heartbeat_interval_848)
            if self._generation < 0 or self._closed:
                return
            try:
                resp = await self._consumer_heartbeat(
                    self._generation, timeout=self._heartbeat_interval_848
                )
                changed = await self._on_consumer_heartbeat(resp)
            except KafkaError as exc:
                log.debug("heartbeat: %s", exc)
                changed = False
            except Exception:  # a bug must not end heartbeats silently (the member expires)
                log.exception("heartbeat failed")
                changed = False

    async def _leave_848(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        epoch = -2 if self.config["group.instance.id"] is not None else -1
        with contextlib.suppress(KafkaError, OSError):
            await self._consumer_heartbeat(
                epoch, timeout=min(self.api_timeout, self.request_timeout, 5.0)
            )
        self._generation = -1

    async def _leave(self) -> None:
        if self.kip848:
            if self.group_id is not None and self._generation >= 0:
                await self._leave_848()
            return
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
            9 if self.kip848 else 8,  # v9: the member epoch of a KIP-848 group
            "OffsetCommitRequest",
            codes=lambda r: [int(p.error_code) for t in r.topics for p in t.partitions],
            retry_codes=_COMMIT_RETRY,
            timeout=timeout,
            group_id=self.group_id,
            generation_id_or_member_epoch=self._generation,
            generation_id=self._generation,
            member_id=self._member_id_848 if self.kip848 else self._member_id,
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
        member_id = self._member_id_848 if self.kip848 else self._member_id
        return ConsumerGroupMetadata(
            self.group_id, self._generation, member_id, self.config["group.instance.id"]
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
            await self._stop_fetching()
            if self._heartbeat_task is not None:
                self._heartbeat_task.cancel()
                with contextlib.suppress(BaseException):
                    await self._heartbeat_task
            await self._close_sessions()
            await self.cluster.close()
