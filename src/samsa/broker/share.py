"""The broker's share partitions (KIP-932): one ``SharePartition`` state machine per (share
group, topic partition), fed from the partition's log. Kafka's ``SharePartitionManager``.

A fetch for a member reads whole batches from the first record the share partition may hand
out (a redelivery, else its end offset) and acquires, batch by batch, the records of each it
may still give, up to the request's record budget; a batch is returned only if it gave some.
Control batches are archived, never delivered. With ``share.isolation.level`` read_committed
the read stops at the last stable offset and the records of aborted transactions are archived
(the aborted-transaction index says which, as a read_committed consumer reads it). A new share
partition starts at the log end (``share.auto.offset.reset`` = latest, Kafka's default) or at
the log start (earliest), and follows the log start forward (retention, DeleteRecords). The
group configs (``share.record.lock.duration.ms``, ``share.delivery.count.limit``,
``share.partition.max.record.locks``, ...) apply to a share partition when it is made.

Bounded: a share partition holds at most ``max_record_locks`` in-flight records
(``group.share.partition.max.record.locks``).

Durable: every change of a share partition's state (an acquisition, which counts a delivery;
an acknowledgement; a lock expiring; the start moving) is written as its snapshot to
``__share_group_state`` (``coordinator/share_group_state_records.py``) before the request is
answered, and :meth:`SharePartitions.load` replays the topic at start-up. Locks do not survive
a restart: records acquired then are available again, their deliveries counted.

Lock expiry: each share partition's earliest lock deadline is kept in a timer
(``coordinator/timer.py``) and the broker wakes up at the earliest of all
(:meth:`SharePartitions.expire_locks`), as Kafka's acquisition-lock timer task does: a lock
runs out on time even if no fetch for that partition ever comes, so a second member, the
offsets admin calls and the persisted state see the record released (or archived) at once.
Times are :func:`share_clock`'s (monotonic, milliseconds).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from samsa.broker.topics import Partition
from samsa.coordinator.ports import CoordinatorLog, StoreUnavailable
from samsa.coordinator.share_group_state_records import (
    SHARE_STATE_TOPIC,
    ShareSnapshot,
    ShareStateFormatError,
    ShareStateKey,
    decode_key,
    decode_snapshot,
    encode_key,
    encode_snapshot,
    state_partition,
)
from samsa.coordinator.share_partition import AcknowledgeType, AcquiredRange, SharePartition
from samsa.coordinator.timer import Timer
from samsa.log.log import OffsetOutOfRangeError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import iter_batches

log = logging.getLogger("samsa.share")

ShareKey = tuple[str, uuid.UUID, int]  # group, topic id, partition
STATE_PARTITIONS = 50  # share.coordinator.state.topic.num.partitions


@dataclass(frozen=True, slots=True)
class ShareConfigs:
    lock_duration_ms: int = 30_000  # group.share.record.lock.duration.ms
    delivery_count_limit: int = 5  # group.share.delivery.count.limit
    max_record_locks: int = 2000  # group.share.partition.max.record.locks
    auto_offset_reset: str = "latest"  # share.auto.offset.reset


@dataclass(slots=True)
class ShareRead:
    """What one partition gave a member: the batches holding its acquired records."""

    error: ErrorCode = ErrorCode.NONE
    records: list[bytes] = field(default_factory=list)
    size: int = 0
    acquired: list[AcquiredRange] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(r.last_offset - r.first_offset + 1 for r in self.acquired)


def share_clock() -> int:
    """Milliseconds of the monotonic clock: lock deadlines must not jump with the wall clock."""
    return int(time.monotonic() * 1000)


def _no_group_configs(group_id: str) -> Mapping[str, str]:
    return {}


class SharePartitions:
    def __init__(
        self,
        configs: ShareConfigs | None = None,
        group_configs: Callable[[str], Mapping[str, str]] = _no_group_configs,
        store: CoordinatorLog | None = None,
    ) -> None:
        self.configs = configs or ShareConfigs()
        self._group_configs = group_configs  # a group's own values (IncrementalAlterConfigs)
        self._partitions: dict[ShareKey, SharePartition] = {}
        self._store = store
        self._epochs: dict[ShareKey, int] = {}  # snapshot epochs written
        # Each share partition's earliest acquisition-lock deadline: Kafka's per-batch lock
        # timers, so a lock runs out on time whether or not a fetch comes by.
        self._locks: Timer[ShareKey] = Timer()
        # Told the new earliest deadline whenever it moves earlier (the broker's wake-up).
        self.on_deadline: Callable[[int], None] | None = None

    # -- durability

    def load(self) -> int:
        """Rebuild the share partitions from ``__share_group_state`` (the last snapshot of
        each). Returns how many."""
        if self._store is None:
            return 0
        count = self._store.partition_count(SHARE_STATE_TOPIC) or 0
        latest: dict[ShareKey, ShareSnapshot | None] = {}
        for p in range(count):
            where = f"{SHARE_STATE_TOPIC}-{p}"
            for batch in self._store.read(
                SHARE_STATE_TOPIC, p, lambda what, where=where: log.error("%s: %s", where, what)
            ):
                for key, data in zip(batch.keys, batch.values, strict=True):
                    if key is None:
                        continue
                    try:
                        k = decode_key(bytes(key))
                        value = None if data is None else decode_snapshot(bytes(data))
                    except ShareStateFormatError as exc:
                        log.error("%s: skipped a record: %s", where, exc)
                        continue
                    latest[(k.group_id, k.topic_id, k.partition)] = value
        for key, snap in latest.items():
            if snap is None:
                continue
            self._epochs[key] = snap.snapshot_epoch
            self._partitions[key] = SharePartition.restore(
                snap.start_offset, list(snap.batches), **self._limits(key[0])
            )
        return len(self._partitions)

    def _persist(self, key: ShareKey, sp: SharePartition) -> ErrorCode:
        if self._store is None:
            return ErrorCode.NONE
        epoch = self._epochs[key] = self._epochs.get(key, -1) + 1
        skey = ShareStateKey(*key)
        value = ShareSnapshot(epoch, sp.start_offset, tuple(sp.state_batches()))
        try:
            self._store.ensure_topic(SHARE_STATE_TOPIC, STATE_PARTITIONS)
        except StoreUnavailable:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        n = self._store.partition_count(SHARE_STATE_TOPIC) or STATE_PARTITIONS
        appended = self._store.append(
            SHARE_STATE_TOPIC,
            state_partition(skey, n),
            [(encode_key(skey), encode_snapshot(value))],
        )
        return appended.error

    def _limits(self, group_id: str) -> dict[str, int]:
        own = self._group_configs(group_id)
        c = self.configs
        return {
            "lock_duration_ms": int(own.get("share.record.lock.duration.ms", c.lock_duration_ms)),
            "delivery_count_limit": int(
                own.get("share.delivery.count.limit", c.delivery_count_limit)
            ),
            "max_in_flight": int(own.get("share.partition.max.record.locks", c.max_record_locks)),
        }

    def lock_duration_ms(self, group_id: str) -> int:
        """The group's ``share.record.lock.duration.ms``, else the broker's."""
        return self._limits(group_id)["lock_duration_ms"]

    def __len__(self) -> int:
        return len(self._partitions)

    def get(self, key: ShareKey) -> SharePartition | None:
        return self._partitions.get(key)

    def _partition(self, key: ShareKey, log_partition: Partition) -> SharePartition:
        sp = self._partitions.get(key)
        if sp is None:
            plog = log_partition.log
            own = self._group_configs(key[0])
            reset = own.get("share.auto.offset.reset", self.configs.auto_offset_reset)
            start = plog.log_start_offset if reset == "earliest" else plog.high_watermark
            sp = self._partitions[key] = SharePartition(start, **self._limits(key[0]))
            self._persist(key, sp)  # the start chosen is kept: "latest" must not move on
        return sp

    def read_committed(self, group_id: str) -> bool:
        return self._group_configs(group_id).get("share.isolation.level") == "read_committed"

    def fetch(
        self,
        key: ShareKey,
        log_partition: Partition,
        member_id: str,
        max_records: int,
        max_bytes: int,
        now_ms: int,
    ) -> ShareRead:
        sp = self._partition(key, log_partition)
        before = _signature(sp)
        out = self._fetch(key[0], sp, log_partition, member_id, max_records, max_bytes, now_ms)
        self._track(key, sp)
        if _signature(sp) != before:
            error = self._persist(key, sp)
            if error != ErrorCode.NONE:  # not durable: not handed out (the locks expire)
                return ShareRead(error)
        return out

    def _fetch(
        self,
        group_id: str,
        sp: SharePartition,
        log_partition: Partition,
        member_id: str,
        max_records: int,
        max_bytes: int,
        now_ms: int,
    ) -> ShareRead:
        plog = log_partition.log
        sp.move_start(plog.log_start_offset)
        sp.expire_locks(now_ms)
        out = ShareRead()
        start = sp.next_fetch_offset()
        committed = self.read_committed(group_id)
        limit = plog.last_stable_offset if committed else plog.high_watermark
        if start >= limit or max_records <= 0:
            return out
        try:
            read = plog.read(start, max_bytes, min_one_batch=True, max_offset=limit)
        except OffsetOutOfRangeError:
            return ShareRead(ErrorCode.OFFSET_OUT_OF_RANGE)
        data = b"".join(bytes(c) for c in read.chunks)  # zero_copy_min=0: bytes only
        # read_committed: producer id -> first offset of its aborted transactions in range
        aborted = (
            sorted(plog.aborted_transactions(start, limit), key=lambda a: a[1]) if committed else []
        )
        aborting: set[int] = set()
        budget = max_records
        for batch in iter_batches(data):
            while aborted and aborted[0][1] <= batch.last_offset:
                aborting.add(aborted.pop(0)[0])
            if batch.is_control:
                aborting.discard(batch.producer_id)
                sp.archive(batch.base_offset, batch.last_offset)
                continue
            if committed and batch.is_transactional and batch.producer_id in aborting:
                sp.archive(batch.base_offset, batch.last_offset)
                continue
            got = sp.acquire(
                member_id, batch.base_offset, batch.last_offset, now_ms, max_records=budget
            )
            if got:
                out.records.append(batch.to_bytes())
                out.size += batch.size
                out.acquired += got
                budget -= sum(r.last_offset - r.first_offset + 1 for r in got)
            if budget <= 0 or sp.in_flight >= sp.max_in_flight:
                break
        return out

    def acknowledge(
        self,
        key: ShareKey,
        member_id: str,
        batches: Iterable[tuple[int, int, tuple[int, ...]]],
    ) -> ErrorCode:
        """Acknowledgement batches (first, last, types: one for the range or one per
        offset) of one partition; the first refused one is the partition's error."""
        sp = self._partitions.get(key)
        if sp is None:
            return ErrorCode.INVALID_RECORD_STATE
        before = _signature(sp)
        error = ErrorCode.NONE
        for first, last, types in batches:
            for run_first, run_last, kind in _runs(first, last, types):
                if kind is None:
                    result = ErrorCode.INVALID_REQUEST
                else:
                    result = sp.acknowledge(member_id, run_first, run_last, kind)
                if error == ErrorCode.NONE:
                    error = result
        self._track(key, sp)
        if _signature(sp) != before:
            stored = self._persist(key, sp)
            error = stored if stored != ErrorCode.NONE else error
        return error

    # -- the admin calls (Describe/Alter/DeleteShareGroupOffsets)

    def has_state(self, group_id: str) -> bool:
        return any(key[0] == group_id for key in self._partitions)

    def keys_of(self, group_id: str) -> list[ShareKey]:
        return [key for key in self._partitions if key[0] == group_id]

    def alter_start(self, key: ShareKey, offset: int) -> ErrorCode:
        """Start the share partition afresh at ``offset`` (its group has no members)."""
        sp = self._partitions[key] = SharePartition(offset, **self._limits(key[0]))
        self._locks.cancel(key)
        return self._persist(key, sp)

    def delete(self, group_id: str, topic_id: uuid.UUID | None = None) -> ErrorCode:
        """Forget the group's share partitions of the topic (None: of every topic, the group
        being deleted), with tombstones in the state topic."""
        error = ErrorCode.NONE
        for key in [k for k in self._partitions if k[0] == group_id and topic_id in (None, k[1])]:
            del self._partitions[key]
            self._epochs.pop(key, None)
            self._locks.cancel(key)
            if self._store is not None:
                skey = ShareStateKey(*key)
                n = self._store.partition_count(SHARE_STATE_TOPIC) or STATE_PARTITIONS
                appended = self._store.append(
                    SHARE_STATE_TOPIC, state_partition(skey, n), [(encode_key(skey), None)]
                )
                error = appended.error if error == ErrorCode.NONE else error
        return error

    def release_member(self, group_id: str, member_id: str) -> int:
        """The member's share session closed or it left: its acquired records go back.
        Returns how many."""
        released = 0
        for key, sp in self._partitions.items():
            if key[0] != group_id:
                continue
            before = _signature(sp)
            count = sp.release_member(member_id)
            if count:
                released += count
                self._track(key, sp)
                if _signature(sp) != before:
                    self._persist(key, sp)
        return released

    # -- the acquisition-lock timer

    def next_deadline(self) -> int | None:
        """The earliest acquisition-lock deadline of any share partition."""
        return self._locks.next_deadline()

    def expire_locks(self, now_ms: int) -> int:
        """Locks run out at their deadline even when no fetch comes: the records become
        AVAILABLE again, or ARCHIVED at the delivery-count limit (which may move the SPSO, as
        DescribeShareGroupOffsets then shows). Returns how many records were released."""
        released = 0
        for key in self._locks.due(now_ms):
            sp = self._partitions.get(key)
            if sp is None:
                continue
            before = _signature(sp)
            released += sp.expire_locks(now_ms)
            self._track(key, sp)
            if _signature(sp) != before:
                self._persist(key, sp)
        return released

    def _track(self, key: ShareKey, sp: SharePartition) -> None:
        deadline = sp.next_deadline()
        if deadline is None:
            self._locks.cancel(key)
            return
        earliest = self._locks.next_deadline()
        self._locks.schedule(key, deadline)
        if self.on_deadline is not None and (earliest is None or deadline < earliest):
            self.on_deadline(deadline)


def _signature(sp: SharePartition) -> tuple[int, int, tuple[object, ...]]:
    """What is persisted of a share partition (locks are not)."""
    return sp.start_offset, sp.end_offset, tuple(sp.state_batches())


def _runs(
    first: int, last: int, types: tuple[int, ...]
) -> Iterable[tuple[int, int, AcknowledgeType | None]]:
    """An acknowledgement batch as runs of one type (None: a type or length not allowed)."""
    if len(types) == 1:
        kinds = [_kind(types[0])]
        yield first, last, kinds[0]
        return
    if len(types) != last - first + 1:
        yield first, last, None
        return
    run_first = first
    for i in range(1, len(types) + 1):
        if i == len(types) or types[i] != types[run_first - first]:
            yield run_first, first + i - 1, _kind(types[run_first - first])
            run_first = first + i


def _kind(value: int) -> AcknowledgeType | None:
    try:
        return AcknowledgeType(value)
    except ValueError:
        return None
