"""The group coordinator's operations, as a pure state machine over the groups of its
registry.

Theory of operation
-------------------
Each operation (``join_group``, ``sync_group``, ``heartbeat``, ``leave_group``,
``consumer_heartbeat``, ``commit_offsets``, ``delete_groups``, ``delete_offsets``, ``tick``)
takes the request and ``now_ms`` and returns an :class:`~samsa.coordinator.runtime.Outcome`:
the ``__consumer_offsets`` records to write and the typed response. It is the shard of a
:class:`~samsa.coordinator.runtime.CoordinatorRuntime` (run by ``group_runtime.py``), which
appends the records and then ``replay``\\s them; durable state (committed offsets, each
group's stored generation) changes *only* in ``replay``, so a coordinator rebuilt by replaying
the topic holds the same durable state as the one that wrote it (docs/semantics.md, rule 26).
Start-up is exactly that, per partition: ``begin_load``, ``load_batch`` of every batch,
``end_load``; a partition's records replay in loading mode (groups restored as stored), while
the operations of partitions already loaded replay theirs as usual.

This class routes: a group id names one kind of group (``group_registry.py``), and each
request goes to the part serving that kind: classic groups (``classic_group_coordinator.py``),
KIP-848 consumer groups (``consumer_group_coordinator.py``), or the online migration between
them (``group_migration.py``, rule 38) when a member of the other protocol arrives. An empty
group of either kind becomes one of the other kind when a member of that kind joins it (its
records are deleted first; its offsets stay).

Committed offsets belong to :class:`~samsa.coordinator.offsets.OffsetStore` (``self.offsets``):
this module decides whether a member may commit (rule 23) and which offsets a group's
deletion or expiry removes; the store builds, orders and replays the offset records and the
transaction markers that decide transactional ones (rules 15, 24).

Timers are keyed per group, as in Kafka's coordinator timer: each group's earliest deadline
(sessions, join and sync phases, pending member ids, revocations) is scheduled in
:class:`~samsa.coordinator.timer.Timer`, and ``tick(now_ms)`` fires the groups whose deadline
passed (and offsets retention, on its own key); ``next_deadline`` tells the runtime when.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from samsa.coordinator.classic_group_coordinator import (
    Await,
    ClassicGroups,
    GroupConfig,
    GroupDescription,
    JoinedMember,
    JoinRequest,
    JoinResult,
    MemberDescription,
    Output,
    Owed,
    Pending,
    Reply,
    SyncResult,
    default_member_id,
)
from samsa.coordinator.consumer_group import ConsumerGroup
from samsa.coordinator.consumer_group_coordinator import (
    ConsumerGroupDescription,
    ConsumerGroups,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    Overrides,
    TopicInfo,
    no_overrides,
)
from samsa.coordinator.consumer_group_records import ConsumerGroupKey
from samsa.coordinator.group import Group, GroupState
from samsa.coordinator.group_migration import GroupMigration
from samsa.coordinator.group_registry import GroupRegistry
from samsa.coordinator.offsets import (
    OFFSETS_TOPIC,
    CoordinatorRecord,
    FetchedOffset,
    OffsetStore,
    OffsetToCommit,
    Positioned,
    TopicPartition,
)
from samsa.coordinator.offsets_records import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    encode_key,
    encode_value,
    partition_for,
)
from samsa.coordinator.ports import StoredBatch
from samsa.coordinator.runtime import Outcome
from samsa.coordinator.share_group import (
    ShareGroupDescription,
    ShareGroups,
    ShareHeartbeat,
    ShareHeartbeatResult,
)
from samsa.coordinator.timer import Timer
from samsa.protocol.errors import ErrorCode

S = GroupState
E = ErrorCode

log = logging.getLogger("samsa.coordinator")

# Start-up replay pauses after this many records applied at once (a run of plain commits
# ended: up to MAX_RUN_KEYS of them), so the runtime may yield to the event loop.
LOAD_PAUSE = 256

R = TypeVar("R")

__all__ = [
    "Await",
    "CoordinatorRecord",
    "FetchedOffset",
    "GroupConfig",
    "GroupCoordinator",
    "GroupDescription",
    "JoinRequest",
    "JoinResult",
    "JoinedMember",
    "MemberDescription",
    "OffsetToCommit",
    "Outcome",
    "Owed",
    "Pending",
    "Reply",
    "SyncResult",
]


class GroupCoordinator:
    def __init__(
        self,
        config: GroupConfig | None = None,
        new_member_id: Callable[[str], str] = default_member_id,
        topics: Callable[[], Mapping[str, TopicInfo]] = dict,
        overrides: Overrides = no_overrides,
    ) -> None:
        self._config = config or GroupConfig()
        self.registry = GroupRegistry()
        self._out = Output()
        # One timer key per group (its id); offsets retention is checked on its own clock.
        self._timer: Timer[str] = Timer()
        self._touched: set[str] = set()  # groups whose deadlines may have moved
        self._next_expiry_check_ms: int | None = None
        self.offsets = OffsetStore(self.config.offset_metadata_max_bytes)
        self.classic = ClassicGroups(
            self.config, self.registry.classic, self.offsets, self._out, new_member_id
        )
        # KIP-848 consumer groups; ``overrides``: their own timeouts (KIP-848 group configs).
        self.consumer = ConsumerGroups(
            self.config.consumer,
            self._out.emit,
            downgrade=self._downgrade_on_leave,
            overrides=overrides,
            groups=self.registry.consumer,
        )
        self.migration = GroupMigration(
            self.config, self.registry, self.consumer, self._out, topics, new_member_id
        )
        # KIP-932 share groups: an id naming a classic or consumer group names no share group.
        self.share = ShareGroups()
        self._topics = topics

    @property
    def config(self) -> GroupConfig:
        return self._config

    @config.setter
    def config(self, config: GroupConfig) -> None:
        # The parts read the same configuration (use_partitions replaces it).
        self._config = self.classic.config = self.migration.config = config

    @property
    def groups(self) -> dict[str, Group]:
        """The classic groups (and groups only storing offsets)."""
        return self.registry.classic

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

    # == the shard of a CoordinatorRuntime ========================================================

    topic = OFFSETS_TOPIC

    @property
    def num_partitions(self) -> int:
        return self.config.num_partitions

    def use_partitions(self, num_partitions: int) -> None:
        self.config = dataclasses.replace(self.config, num_partitions=num_partitions)

    def partition_of(self, record: CoordinatorRecord) -> int:
        return self.partition_for(record.group_id)

    def serialize(self, record: CoordinatorRecord) -> tuple[bytes, bytes | None]:
        return encode_key(record.key), encode_value(record.value)

    def load_batch(self, partition: int, batch: StoredBatch, now_ms: int) -> Iterator[None]:
        """Replay one stored batch as the result is iterated: the offset store holds plain
        commits back and hands out, in log order, what takes effect (``OffsetStore.load_batch``;
        a run it ends may be many records: the replay pauses every :data:`LOAD_PAUSE`)."""
        return self._load(self.offsets.load_batch(partition, batch), now_ms)

    def load_held(self, partition: int, now_ms: int) -> Iterator[None]:
        """The partition is read: the plain commits its run still holds take effect."""
        return self._load(self.offsets.end_load(partition), now_ms)

    def _load(self, records: Iterable[Positioned], now_ms: int) -> Iterator[None]:
        for count, (offset, record) in enumerate(records, 1):
            self.load_record(record, now_ms, offset)
            if not count % LOAD_PAUSE:
                yield

    def load_record(self, record: CoordinatorRecord, now_ms: int, log_offset: int) -> None:
        """Apply one record read at start-up, at its log offset (a group restored as it was
        stored, not driven as a live one)."""
        self._apply(record, now_ms, log_offset, loading=True)

    def load_damaged(self, partition: int, what: str) -> None:
        """Every record holds a key's whole state: what was skipped is only lost."""

    def write_failed(self, records: Sequence[CoordinatorRecord], error: ErrorCode) -> None:
        self.store_failed(records, error)

    def replay_marker(self, partition: int, producer_id: int, commit: bool, now_ms: int) -> None:
        """A transaction's marker reached ``__consumer_offsets`` partition ``partition``: its
        staged offsets take effect at their log offsets (commit) or are dropped (abort)."""
        for offset, record in self.offsets.replay_marker(partition, producer_id, commit):
            self.replay(record, now_ms, offset)

    def stage(
        self, partition: int, producer_id: int, written: list[tuple[int, CoordinatorRecord]]
    ) -> None:
        """A TxnOffsetCommit's records are in the log: staged until the marker (rule 15)."""
        self.offsets.stage(partition, producer_id, written)

    def take_outbox(self) -> list[Await | Reply]:
        out, self._out.outbox = self._out.outbox, []
        return out

    def _outcome(self, response: R) -> Outcome[CoordinatorRecord, R]:
        records, self._out.records = self._out.records, []
        return Outcome(records, response)

    def _downgrade_on_leave(self, cgroup: ConsumerGroup, leaving_id: str) -> bool:
        return self.migration.downgrade_on_leave(cgroup, leaving_id)

    # == the classic protocol ======================================================================

    def join_group(self, req: JoinRequest, now_ms: int) -> Outcome[CoordinatorRecord, Any]:
        self._touched.add(req.group_id)
        return self._outcome(self._join(req, now_ms))

    def _join(self, req: JoinRequest, now_ms: int) -> JoinResult | Pending:
        cfg = self.config
        if not req.group_id:
            return JoinResult(E.INVALID_GROUP_ID, req.member_id)
        if req.group_id in self.share.groups:  # as Kafka: a share group takes no classic member
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL)
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, req.member_id)
        cgroup = self.registry.consumer.get(req.group_id)
        if cgroup is not None:
            if cgroup.members:
                # A consumer group with members: the classic member joins it as a member of
                # the consumer group (online migration, rule 38).
                return self.migration.classic_join(cgroup, req, now_ms)
            # An empty one becomes a classic group, its offsets kept (as Kafka does for
            # empty groups): its records are deleted ahead of the classic group's.
            self.consumer.delete(cgroup)
        return self.classic.join(req, now_ms)

    def sync_group(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        now_ms: int,
    ) -> Outcome[CoordinatorRecord, Any]:
        self._touched.add(group_id)
        cgroup = self.registry.consumer.get(group_id)
        if cgroup is not None:
            return self._outcome(
                self.migration.classic_sync(
                    cgroup,
                    generation,
                    member_id,
                    group_instance_id,
                    protocol_type,
                    protocol_name,
                    now_ms,
                )
            )
        return self._outcome(
            self.classic.sync(
                group_id,
                generation,
                member_id,
                group_instance_id,
                protocol_type,
                protocol_name,
                assignments,
                now_ms,
            )
        )

    def store_failed(self, records: Iterable[CoordinatorRecord], error: ErrorCode) -> None:
        """The log refused ``records``: a conversion among them is undone (the registry), and
        a leader's assignment among them is not stored, so the members waiting for it get
        ``error`` and the group rebalances (as Kafka does)."""
        for rec in records:
            self._touched.add(rec.group_id)
            if self.registry.write_failed(rec.group_id):
                continue
            group = self.registry.classic.get(rec.group_id)
            if isinstance(rec.value, GroupMetadataValue) and group is not None:
                self.classic.store_failed(group, rec.value, error)

    def heartbeat(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        now_ms: int,
    ) -> Outcome[CoordinatorRecord, Any]:
        self._touched.add(group_id)
        cgroup = self.registry.consumer.get(group_id)
        if cgroup is not None:
            error = self.consumer.classic_heartbeat(
                cgroup, member_id, group_instance_id, generation, now_ms
            )
            return self._outcome(error)
        return self._outcome(
            self.classic.heartbeat(group_id, generation, member_id, group_instance_id, now_ms)
        )

    def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]], now_ms: int
    ) -> Outcome[CoordinatorRecord, Any]:
        """Response: (top-level error, [(member id, instance id, error)])."""
        self._touched.add(group_id)
        cgroup = self.registry.consumer.get(group_id)
        if cgroup is not None:
            return self._outcome((E.NONE, self.consumer.classic_leave(cgroup, members)))
        return self._outcome(self.classic.leave(group_id, members, now_ms))

    # == ConsumerGroupHeartbeat (KIP-848) =========================================================

    def consumer_heartbeat(
        self, req: ConsumerHeartbeat, topics: Mapping[str, TopicInfo], now_ms: int
    ) -> Outcome[CoordinatorRecord, ConsumerHeartbeatResult]:
        """A consumer-protocol member's heartbeat (``consumer_group_coordinator.py``). An
        empty classic group becomes a consumer group when such a member joins it, whatever
        ``group.consumer.migration.policy`` says; a classic group with members does so only
        if the policy allows upgrades and its members speak the ``consumer`` embedded protocol
        (rule 38); otherwise it is not a consumer group (GROUP_ID_NOT_FOUND, as Kafka)."""
        gid = req.group_id
        self._touched.add(gid)
        if gid in self.share.groups:
            return self._outcome(
                ConsumerHeartbeatResult(
                    E.GROUP_ID_NOT_FOUND, f"Group {gid} is not a consumer group."
                )
            )
        classic = self.registry.only_classic(gid)
        if classic is not None:
            if classic.members or not classic.is_in(S.EMPTY):
                why = self.migration.upgrade_refused(classic, req)
                if why is None:
                    return self._outcome(self.migration.upgrade(classic, req, topics, now_ms))
                return self._outcome(
                    ConsumerHeartbeatResult(E.GROUP_ID_NOT_FOUND, why, req.member_id or None)
                )
        result = self.consumer.heartbeat(req, topics, now_ms)
        if classic is not None and result.error == E.NONE and classic.stored is not None:
            # The classic group's metadata goes first: replay order is log order.
            self._out.records.insert(0, CoordinatorRecord(GroupMetadataKey(gid), None))
        return self._outcome(result)

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+ from a consumer-protocol member: it must be one, at its epoch."""
        cgroup = self.registry.consumer.get(group_id)
        if cgroup is None or member_id is None or member_epoch < 0:
            return E.NONE
        return self.consumer.validate_commit(cgroup, member_id, member_epoch)

    def describe_consumer_group(self, group_id: str) -> ConsumerGroupDescription:
        if group_id in self.share.groups:
            return ConsumerGroupDescription(
                group_id, E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group."
            )
        return self.consumer.describe(group_id)

    # == ShareGroupHeartbeat (KIP-932) ============================================================

    def share_heartbeat(
        self, req: ShareHeartbeat, topics: Mapping[str, TopicInfo], now_ms: int
    ) -> Outcome[CoordinatorRecord, ShareHeartbeatResult]:
        self._touched.add(req.group_id)
        if self.registry.knows(req.group_id):
            return self._outcome(
                ShareHeartbeatResult(
                    E.GROUP_ID_NOT_FOUND, f"Group {req.group_id} is not a share group."
                )
            )
        return self._outcome(self.share.heartbeat(req, topics, now_ms))

    def describe_share_group(self, group_id: str) -> ShareGroupDescription:
        if self.registry.knows(group_id):
            return ShareGroupDescription(
                group_id, E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a share group."
            )
        return self.share.describe(group_id)

    # == offsets ===================================================================================

    def commit_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetToCommit],
        now_ms: int,
    ) -> Outcome[CoordinatorRecord, Any]:
        """Response: {(topic, partition): error}."""
        self._touched.add(group_id)
        error = self.validate_commit(
            group_id, generation, member_id, group_instance_id, now_ms, offsets
        )
        errors, records = self.offsets.commit(group_id, offsets, error, now_ms)
        self._out.records += records
        return self._outcome(errors)

    def commit_transactional_offsets(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetToCommit],
        verified: ErrorCode,
        now_ms: int,
    ) -> Outcome[CoordinatorRecord, dict[TopicPartition, ErrorCode]]:
        """TxnOffsetCommit, once the transaction coordinator answered ``verified`` for the
        producer: the records to write as one transactional batch of the group's partition,
        staged until the transaction's marker (rule 15)."""
        # As Kafka, the verification's error as it is (INVALID_PRODUCER_ID_MAPPING for an
        # unknown producer: abortable for Java's producer, where INVALID_PRODUCER_EPOCH is fatal)
        self._touched.add(group_id)
        error = verified
        if error == E.NONE and (generation >= 0 or member_id):
            # KIP-447: a consumer-group-aware producer is fenced by the group generation.
            if not self.registry.knows(group_id) and generation >= 0:
                error = E.UNKNOWN_MEMBER_ID  # Kafka's answer when the group does not exist
            else:
                error = self.validate_commit(
                    group_id, generation, member_id, group_instance_id, now_ms, offsets
                )
        errors, records = self.offsets.commit(group_id, offsets, error, now_ms)
        return Outcome(records, errors)

    def validate_commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        iid: str | None,
        now_ms: int,
        offsets: Iterable[OffsetToCommit] = (),
    ) -> ErrorCode:
        """May this member commit ``offsets`` for the group now (OffsetCommit, and
        TxnOffsetCommit from a group-aware producer)? A commit accepted from a member counts
        as its heartbeat."""
        if not group_id:
            return E.INVALID_GROUP_ID
        cgroup = self.registry.consumer.get(group_id)
        if cgroup is not None:
            committed = [(o.topic_id, o.partition) for o in offsets]
            return self.consumer.validate_commit(cgroup, member_id, generation, committed)
        return self.classic.validate_commit(group_id, generation, member_id, iid, now_ms)

    def fetch_offsets(
        self,
        group_id: str,
        topics: list[tuple[str, list[int]]] | None,
        require_stable: bool = False,
    ) -> list[FetchedOffset]:
        """Committed offsets (:meth:`OffsetStore.fetch`)."""
        return self.offsets.fetch(group_id, topics, require_stable)

    def delete_offsets(
        self, group_id: str, topics: list[tuple[str, list[int]]], now_ms: int
    ) -> Outcome[CoordinatorRecord, Any]:
        """OffsetDelete: (top-level error, {(topic, partition): error})."""
        cgroup = self.registry.consumer.get(group_id)
        if cgroup is not None:
            errors = {
                (t, p): E.GROUP_SUBSCRIBED_TO_TOPIC
                if self.consumer.subscribes(cgroup, t)
                else E.NONE
                for t, ps in topics
                for p in ps
            }
            deleted = [tp for tp, e in errors.items() if e == E.NONE]
            self._out.records += self.offsets.tombstones(group_id, deleted)
            return self._outcome((E.NONE, errors))
        group = self.registry.classic.get(group_id)
        if group is None or group.is_in(S.DEAD):
            return self._outcome((E.GROUP_ID_NOT_FOUND, {}))
        # As Kafka's ClassicGroup: a group with members may have offsets deleted only if it
        # speaks the consumer protocol, and then only of topics it does not subscribe to; if
        # its subscriptions are not known (no generation yet, metadata that does not parse),
        # every topic counts as subscribed.
        if group.is_in(S.EMPTY):
            subscribed: frozenset[str] | None = frozenset()
        elif group.protocol_type != "consumer":
            return self._outcome((E.NON_EMPTY_GROUP, {}))
        else:
            subscribed = group.subscribed_topics()
        errors: dict[tuple[str, int], ErrorCode] = {}
        for topic, partitions in topics:
            held = subscribed is None or topic in subscribed
            for p in partitions:
                errors[(topic, p)] = E.GROUP_SUBSCRIBED_TO_TOPIC if held else E.NONE
        deleted = [tp for tp, e in errors.items() if e == E.NONE]
        self._out.records += self.offsets.tombstones(group_id, deleted)
        return self._outcome((E.NONE, errors))

    # == admin =====================================================================================

    def list_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every classic group, optionally of some
        states."""
        return self.classic.list_groups(states)

    def list_consumer_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(group id, state) of every consumer-protocol group, optionally of some states."""
        wanted = {s.lower() for s in states}
        return [
            (g.group_id, g.state)
            for g in self.registry.consumer.values()
            if not wanted or g.state.lower() in wanted
        ]

    def list_share_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(group id, state) of every share group (KIP-932), optionally of some states."""
        return self.share.list(states)

    def describe_group(self, group_id: str) -> GroupDescription:
        if group_id in self.registry.consumer:
            # As Kafka: DescribeGroups describes classic groups only; a consumer group is
            # described by ConsumerGroupDescribe, and here it is Dead (v6: GROUP_ID_NOT_FOUND).
            return GroupDescription(group_id, E.NONE, S.DEAD.value, "", "")
        return self.classic.describe(group_id)

    def delete_groups(self, group_ids: list[str], now_ms: int) -> Outcome[CoordinatorRecord, Any]:
        """Response: {group id: error}. Only groups without members can be deleted."""
        self._touched.update(group_ids)
        errors: dict[str, ErrorCode] = {}
        for gid in group_ids:
            if gid in self.share.groups:
                errors[gid] = self.share.delete(gid)
                continue
            cgroup = self.registry.consumer.get(gid)
            if cgroup is not None:
                if cgroup.members:
                    errors[gid] = E.NON_EMPTY_GROUP
                else:
                    errors[gid] = E.NONE
                    self._out.records += self.offsets.tombstones(gid, self.offsets.committed(gid))
                    self.consumer.delete(cgroup)
                continue
            group = self.registry.classic.get(gid)
            if group is None or group.is_in(S.DEAD):
                errors[gid] = E.GROUP_ID_NOT_FOUND
            elif not group.is_in(S.EMPTY):
                errors[gid] = E.NON_EMPTY_GROUP
            else:
                errors[gid] = E.NONE
                self.classic.tombstone(group)
        return self._outcome(errors)

    # == timers ====================================================================================

    def tick(self, now_ms: int) -> Outcome[CoordinatorRecord, Any]:
        """Fire the groups whose deadline has passed (pending member ids, session timeouts,
        the end of a join phase, members that never sent SyncGroup, revocations), and
        offsets retention when its check is due (the first tick arms it)."""
        self._reschedule()
        for group_id in self._timer.due(now_ms):
            self._fire(group_id, now_ms)
        if self._next_expiry_check_ms is None:
            self._next_expiry_check_ms = now_ms + self.config.offsets_retention_check_interval_ms
        elif now_ms >= self._next_expiry_check_ms:
            self._next_expiry_check_ms = now_ms + self.config.offsets_retention_check_interval_ms
            self.expire_offsets(now_ms)
        return self._outcome(None)

    def fire_group(self, group_id: str, now_ms: int) -> Outcome[CoordinatorRecord, Any]:
        """Fire the passed deadlines of one group, before a request about it is answered: a
        session is over for any request after its deadline, whenever the timer runs."""
        self._fire(group_id, now_ms)
        return self._outcome(None)

    def next_deadline(self) -> int | None:
        """When ``tick`` has something to do next: a group's deadline or the retention check
        (None: nothing is scheduled)."""
        self._reschedule()
        deadlines = [
            d for d in (self._timer.next_deadline(), self._next_expiry_check_ms) if d is not None
        ]
        return min(deadlines, default=None)

    def _fire(self, group_id: str, now_ms: int) -> None:
        group = self.registry.classic.get(group_id)
        if group is not None:
            self.classic.fire(group, now_ms)
        self.consumer.fire(group_id, now_ms)
        self.share.fire(group_id, self._topics(), now_ms)
        self._touched.add(group_id)

    def _reschedule(self) -> None:
        """Each group an operation or a replay touched is scheduled at its earliest deadline
        (its timer key is its id: one kind of group per id)."""
        for group_id in self._touched:
            group = self.registry.classic.get(group_id)
            deadline = self.classic.next_deadline(group) if group is not None else None
            if deadline is None:
                deadline = self.consumer.next_deadline(group_id)
            if deadline is None:
                deadline = self.share.next_deadline(group_id)
            if deadline is None:
                self._timer.cancel(group_id)
            else:
                self._timer.schedule(group_id, deadline)
        self._touched.clear()

    def expire_offsets(self, now_ms: int) -> None:
        """Offsets retention (KIP-211): a group's offsets expire once it has been Empty for
        ``offsets.retention.minutes`` (a group that never had members: once each offset is
        that old). An Empty group left with no offsets is deleted. Consumer-protocol groups
        (KIP-848) have no Empty timestamp: their offsets expire by commit time."""
        retention = self.config.offsets_retention_ms
        for group in list(self.registry.classic.values()):
            if not group.is_in(S.EMPTY):
                continue
            committed = self.offsets.committed(group.group_id)
            expired = []
            for tp, v in committed.items():
                if v.expire_timestamp >= 0:
                    gone = now_ms >= v.expire_timestamp
                elif group.protocol_type and group.state_timestamp_ms >= 0:
                    gone = now_ms >= group.state_timestamp_ms + retention
                else:
                    gone = now_ms >= v.commit_timestamp + retention
                if gone:
                    expired.append(tp)
            self._out.records += self.offsets.tombstones(group.group_id, expired)
            if len(expired) == len(committed):
                self._out.emit(GroupMetadataKey(group.group_id), None)
        for cgroup in list(self.registry.consumer.values()):
            # An empty consumer group: each offset once it is that old; then the group goes.
            if cgroup.members:
                continue
            gid = cgroup.group_id
            committed = self.offsets.committed(gid)
            expired = [
                tp for tp, v in committed.items() if now_ms >= v.commit_timestamp + retention
            ]
            self._out.records += self.offsets.tombstones(gid, expired)
            if len(expired) == len(committed):
                self.consumer.delete(cgroup)

    # == replay ====================================================================================

    def begin_load(self, partition: int) -> None:
        """Nothing to prepare: a group's records are all in its own partition."""

    def end_load(self, partition: int, now_ms: int = 0) -> list[CoordinatorRecord]:
        return []

    def replay(self, record: CoordinatorRecord, now_ms: int, log_offset: int | None = None) -> None:
        """Apply one record of ``__consumer_offsets``: the only way durable state changes.

        ``log_offset`` is the record's offset in its partition: offset commits are ordered by
        it (:meth:`OffsetStore.replay`); without it the record is applied unconditionally."""
        self._apply(record, now_ms, log_offset, loading=False)

    def _apply(
        self, record: CoordinatorRecord, now_ms: int, log_offset: int | None, *, loading: bool
    ) -> None:
        """``loading``: a stored record of start-up, which restores a group as it was
        stored rather than driving a live one."""
        key, value = record.key, record.value
        self._touched.add(key.group)
        if isinstance(key, ConsumerGroupKey):
            self.registry.replay_consumer(key.group, value)  # type: ignore[arg-type]
            self.consumer.replay(key, value, now_ms)  # type: ignore[arg-type]
            return
        group = self.registry.classic.get(key.group)
        if isinstance(key, OffsetCommitKey):
            if self.offsets.replay(record, log_offset) and value is not None:
                self.registry.offsets_only(key.group)
            return
        if value is None:
            if group is None:
                return
            if group.members:
                group.stored = None  # deleted under live members: they rewrite it at sync
            else:
                self.registry.end_classic(group, self.offsets.has_offsets(key.group), now_ms)
            return
        assert isinstance(value, GroupMetadataValue)
        if not loading:
            downgraded = self.registry.take_downgraded(key.group)
            if downgraded is not None:
                self.classic.take_over(downgraded, value, now_ms)
                return
        if loading or group is None:
            group = self.registry.classic[key.group] = Group(key.group)
        if loading:
            group.load(value, now_ms)
            return
        self.classic.replay(group, value, now_ms)

    # == inspection (tests, tooling) ===============================================================

    def durable_state(self) -> dict[str, Any]:
        """What the log must be able to rebuild: offsets of every group, and for groups at
        rest (Empty or Stable) their generation, protocol, leader, members and assignments."""
        out: dict[str, Any] = {}
        for gid, g in sorted(self.registry.classic.items()):
            entry: dict[str, Any] = {"offsets": dict(sorted(self.offsets.committed(gid).items()))}
            if g.is_in(S.EMPTY, S.STABLE) and (g.generation > 0 or g.members):
                entry.update(
                    state=g.state.value,
                    generation=g.generation,
                    protocol_type=g.protocol_type,
                    protocol=g.protocol_name,
                    leader=g.leader_id,
                    members=[
                        (
                            m.member_id,
                            m.group_instance_id,
                            m.client_id,
                            m.session_timeout_ms,
                            m.metadata(g.protocol_name),
                            m.assignment,
                        )
                        for m in g.members.values()
                    ],
                )
            out[gid] = entry
        for gid, cg in sorted(self.registry.consumer.items()):
            out[f"consumer:{gid}"] = {
                "offsets": dict(sorted(self.offsets.committed(gid).items())),
                "epochs": (cg.group_epoch, cg.assignment_epoch),
                "targets": sorted(cg.targets.items()),
                "members": [
                    (
                        m.member_id,
                        m.metadata,
                        m.member_epoch,
                        m.previous_member_epoch,
                        m.state,
                        sorted(m.assigned.items()),
                        sorted(m.pending_revocation.items()),
                    )
                    for m in sorted(cg.members.values(), key=lambda m: m.member_id)
                ],
            }
        return out
