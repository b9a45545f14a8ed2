"""The group coordinator's operations, as a pure state machine over :class:`Group`.

Theory of operation
-------------------
Each operation (``join_group``, ``sync_group``, ``heartbeat``, ``leave_group``,
``commit_offsets``, ``delete_groups``, ``delete_offsets``, ``tick``) takes the request and
``now_ms`` and returns an :class:`~samsa.coordinator.runtime.Outcome`: the
``__consumer_offsets`` records to write and the typed response. It is the shard of a
:class:`~samsa.coordinator.runtime.CoordinatorRuntime` (run by ``group_runtime.py``), which
appends the records and then ``replay``\\s them; durable state (committed offsets, each
group's stored generation) changes *only* in ``replay``, so a coordinator rebuilt by replaying
the topic holds the same durable state as the one that wrote it (docs/semantics.md, rule 26).
Start-up is exactly that: ``begin_load``, ``load_batch`` of every batch, ``end_load``.

Committed offsets belong to :class:`~samsa.coordinator.offsets.OffsetStore` (``self.offsets``):
this module decides whether a member may commit (rule 23) and which offsets a group's
deletion or expiry removes; the store builds, orders and replays the offset records and the
transaction markers that decide transactional ones (rules 15, 24).

Classic-protocol membership in flight (who has rejoined, deadlines) is in memory only, as in
Kafka. Its one step that waits for the log is CompletingRebalance -> Stable: the leader's
SyncGroup produces a GroupMetadata record carrying the assignment, and the members receive
their assignments when that record is *replayed* — never an assignment the log lacks.

Requests that cannot be answered at once (JoinGroup until the join phase completes,
SyncGroup until the leader's assignment is stored) return :class:`Pending`. The coordinator
announces owed responses and their answers through an outbox of :class:`Await` and
:class:`Reply` events, in order; the runtime turns them into futures.

Error codes follow Kafka's classic ``GroupCoordinator``: MEMBER_ID_REQUIRED for a new dynamic
member at JoinGroup v4+, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS,
FENCED_INSTANCE_ID for a replaced static member, INCONSISTENT_GROUP_PROTOCOL,
INVALID_SESSION_TIMEOUT, COORDINATOR_NOT_AVAILABLE for a Dead group.

Timers are deadlines in the data (``heartbeat_deadline_ms``, ``join_deadline_ms``,
``sync_deadline_ms``, pending member ids); ``tick(now_ms)`` fires those that passed.

KIP-848 consumer groups (``consumer_heartbeat``) are served by ``self.consumer``
(``consumer_group_coordinator.py``), through the same outcome and replay. A group id names one
kind of group; an empty group of either kind becomes one of the other kind when a member
of that kind joins it (its records are deleted first; its offsets stay). Groups with members
migrate online (rule 38, ``group.consumer.migration.policy``): a consumer-protocol member
joining a classic group converts it (``_upgrade``), classic members of a consumer group are
served by translating JoinGroup/SyncGroup/Heartbeat/LeaveGroup into the consumer group's
operations, and the last consumer-protocol member leaving converts it back
(``_maybe_downgrade``); each conversion is tombstones of the old kind's records followed by
the new kind's records, so replay rebuilds whichever group the log last said.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from samsa.coordinator.consumer_group import ConsumerGroup, ConsumerMember, MemberState
from samsa.coordinator.consumer_group_coordinator import (
    ConsumerConfig,
    ConsumerGroupDescription,
    ConsumerGroups,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    Overrides,
    TopicInfo,
    no_overrides,
)
from samsa.coordinator.consumer_group_records import (
    CURRENT_ASSIGNMENT_TYPE,
    GROUP_METADATA_TYPE,
    MEMBER_METADATA_TYPE,
    TARGET_MEMBER_TYPE,
    TARGET_METADATA_TYPE,
    Assignment,
    ClassicMemberMetadata,
    ConsumerGroupKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataValue,
    ConsumerGroupValue,
    CurrentMemberAssignmentValue,
    TargetAssignmentMemberValue,
    TargetAssignmentMetadataValue,
)
from samsa.coordinator.group import Group, GroupState, Member
from samsa.coordinator.offsets import (
    OFFSETS_TOPIC,
    CoordinatorRecord,
    FetchedOffset,
    OffsetStore,
    OffsetToCommit,
    TopicPartition,
)
from samsa.coordinator.offsets_records import (
    GroupMetadataKey,
    GroupMetadataValue,
    Key,
    OffsetCommitKey,
    Value,
    encode_key,
    encode_value,
    partition_for,
)
from samsa.coordinator.ports import StoredBatch
from samsa.coordinator.runtime import Outcome
from samsa.protocol.consumer_protocol import (
    PROTOCOL_TYPE,
    ConsumerProtocolError,
    decode_assignment,
    decode_subscription,
    encode_assignment,
)
from samsa.protocol.errors import ErrorCode

S = GroupState
E = ErrorCode

log = logging.getLogger("samsa.coordinator")

R = TypeVar("R")

__all__ = [
    "CoordinatorRecord",
    "FetchedOffset",
    "GroupCoordinator",
    "OffsetToCommit",
    "Outcome",
    "Owed",
]


class Owed(enum.StrEnum):
    """The kind of a response owed to a member, answered later through the outbox."""

    JOIN = "join"
    SYNC = "sync"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    num_partitions: int = 50  # offsets.topic.num.partitions
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    max_size: int = 1000  # group.max.size
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)  # KIP-848 groups


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: tuple[JoinedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Pending:
    """The response will come through a Reply of the outbox."""

    kind: Owed
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class Await:
    kind: Owed
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class Reply:
    kind: Owed
    group_id: str
    member_id: str
    result: JoinResult | SyncResult


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    require_known_member_id: bool  # JoinGroup v4+
    skip_assignment: bool = True  # JoinGroup v9+ (KIP-814)


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...] = ()


@dataclass(slots=True)
class _Buffers:
    records: list[CoordinatorRecord] = field(default_factory=list)
    outbox: list[Await | Reply] = field(default_factory=list)


def _default_member_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


class GroupCoordinator:
    def __init__(
        self,
        config: GroupConfig | None = None,
        new_member_id: Callable[[str], str] = _default_member_id,
        topics: Callable[[], Mapping[str, TopicInfo]] = dict,
        overrides: Overrides = no_overrides,
    ) -> None:
        self.config = config or GroupConfig()
        self.groups: dict[str, Group] = {}
        self._new_member_id = new_member_id
        self._buf = _Buffers()
        self._loading = False
        self._next_expiry_check_ms: int | None = None
        self.offsets = OffsetStore(self.config.offset_metadata_max_bytes)
        # KIP-848 consumer groups; a group id names a classic or a consumer group, not both.
        # ``overrides``: the consumer groups' own timeouts (KIP-848 group configs).
        self.consumer = ConsumerGroups(
            self.config.consumer,
            self._emit,
            downgrade=self._maybe_downgrade,
            overrides=overrides,
        )
        # Online migration between the protocols (rule 38): the cluster's topics (partitions
        # are named by id in consumer groups, by name in the classic protocol), and the groups
        # whose conversion records are written but not yet replayed.
        self.topics = topics
        self._upgrading: dict[str, Group] = {}
        self._downgrading: dict[str, Group] = {}

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

    def load_batch(self, partition: int, batch: StoredBatch, now_ms: int) -> None:
        for offset, record in self.offsets.load_batch(partition, batch):
            self.replay(record, now_ms, offset)

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
        out, self._buf.outbox = self._buf.outbox, []
        return out

    def _outcome(self, response: R) -> Outcome[CoordinatorRecord, R]:
        records, self._buf.records = self._buf.records, []
        return Outcome(records, response)

    def _emit(self, key: Key, value: Value | None) -> None:
        self._buf.records.append(CoordinatorRecord(key, value))

    def _reply(self, kind: Owed, group: Group, member_id: str, result: Any) -> None:
        self._buf.outbox.append(Reply(kind, group.group_id, member_id, result))

    # == JoinGroup =================================================================================

    def join_group(self, req: JoinRequest, now_ms: int) -> Outcome[CoordinatorRecord, Any]:
        return self._outcome(self._join(req, now_ms))

    def _join(self, req: JoinRequest, now_ms: int) -> JoinResult | Pending:
        cfg = self.config
        if not req.group_id:
            return JoinResult(E.INVALID_GROUP_ID, req.member_id)
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, req.member_id)
        cgroup = self.consumer.groups.get(req.group_id)
        if cgroup is not None:
            if cgroup.members:
                # A consumer group with members: the classic member joins it as a member of
                # the consumer group (online migration, rule 38).
                return self._classic_join_consumer_group(cgroup, req, now_ms)
            # An empty one becomes a classic group, its offsets kept (as Kafka does for
            # empty groups): its records are deleted ahead of the classic group's.
            self.consumer.delete(cgroup)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return JoinResult(E.UNKNOWN_MEMBER_ID, req.member_id)
            group = Group(req.group_id, state_timestamp_ms=now_ms)
            self.groups[req.group_id] = group
        if group.is_in(S.DEAD):
            return JoinResult(E.COORDINATOR_NOT_AVAILABLE, req.member_id)
        if not group.supports_protocols(req.protocol_type, [p for p, _ in req.protocols]):
            self._forget_if_unused(group)
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
        if not self._accepts_joining(group, req.member_id):
            return JoinResult(E.GROUP_MAX_SIZE_REACHED, req.member_id)
        if not req.member_id:
            result = self._new_member_join(group, req, now_ms)
        else:
            result = self._current_member_join(group, req, now_ms)
        self._maybe_complete_join(group, now_ms)
        return result

    def _accepts_joining(self, group: Group, member_id: str) -> bool:
        """group.max.size, as Kafka counts it: an Empty group takes anyone; while preparing a
        rebalance, the members already rejoining count; otherwise the members."""
        limit = self.config.max_size
        member = group.members.get(member_id)
        if group.is_in(S.EMPTY, S.DEAD):
            return True
        if group.is_in(S.PREPARING_REBALANCE):
            waiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (member is not None and member.awaiting_join) or waiting < limit
        return member is not None or len(group.members) < limit

    def _new_member_join(self, group: Group, req: JoinRequest, now_ms: int) -> JoinResult | Pending:
        iid = req.group_instance_id
        if iid is not None:
            new_id = self._new_member_id(iid)
            old_id = group.static_members.get(iid)
            if old_id is None:
                return self._add_member_and_rebalance(group, new_id, req, now_ms)
            return self._replace_static_member(group, iid, old_id, new_id, req, now_ms)
        new_id = self._new_member_id(req.client_id)
        if req.require_known_member_id:
            # KIP-394: the member id is handed out first and must come back within the
            # session timeout; until then it counts as a member not yet joined.
            group.pending_members[new_id] = now_ms + req.session_timeout_ms
            return JoinResult(E.MEMBER_ID_REQUIRED, new_id)
        return self._add_member_and_rebalance(group, new_id, req, now_ms)

    def _current_member_join(
        self, group: Group, req: JoinRequest, now_ms: int
    ) -> JoinResult | Pending:
        mid = req.member_id
        if mid in group.pending_members:
            del group.pending_members[mid]
            return self._add_member_and_rebalance(group, mid, req, now_ms)
        if group.is_static_member_fenced(mid, req.group_instance_id):
            return JoinResult(E.FENCED_INSTANCE_ID, mid)
        member = group.members.get(mid)
        if member is None or group.is_in(S.EMPTY, S.DEAD):
            return JoinResult(E.UNKNOWN_MEMBER_ID, mid)
        same = member.protocols == list(req.protocols)
        if group.is_in(S.PREPARING_REBALANCE):
            return self._update_member_and_rebalance(group, member, req, now_ms)
        if group.is_in(S.COMPLETING_REBALANCE):
            if same:  # a retry of a join that completed: answer it again
                return self._join_result(group, member)
            return self._update_member_and_rebalance(group, member, req, now_ms)
        # Stable
        if group.leader_id == mid or not same:
            return self._update_member_and_rebalance(group, member, req, now_ms)
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        return self._join_result(group, member)

    def _join_result(self, group: Group, member: Member, skip: bool = False) -> JoinResult:
        leader = group.leader_id == member.member_id
        members = ()
        if leader:
            members = tuple(
                JoinedMember(m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
                for m in group.members.values()
            )
        return JoinResult(
            E.NONE,
            member.member_id,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            skip and leader,
            members,
        )

    def _add_member_and_rebalance(
        self, group: Group, member_id: str, req: JoinRequest, now_ms: int
    ) -> Pending:
        member = Member(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=list(req.protocols),
            awaiting_join=True,
            is_new=True,
            heartbeat_deadline_ms=now_ms + req.session_timeout_ms,
        )
        group.add(member)
        self._buf.outbox.append(Await(Owed.JOIN, group.group_id, member_id))
        if group.is_in(S.PREPARING_REBALANCE) and group.initial_delay_remaining_ms is not None:
            group.new_member_added = True
        self._maybe_prepare_rebalance(group, now_ms)
        return Pending(Owed.JOIN, group.group_id, member_id)

    def _update_member_and_rebalance(
        self, group: Group, member: Member, req: JoinRequest, now_ms: int
    ) -> Pending:
        if member.awaiting_join:
            # A duplicate join: the earlier request still needs an answer (responses on a
            # connection go out in order); it is told to rejoin.
            self._reply(Owed.JOIN, group, member.member_id, JoinResult(E.REBALANCE_IN_PROGRESS))
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        member.awaiting_join = True
        member.heartbeat_deadline_ms = now_ms + req.session_timeout_ms
        self._buf.outbox.append(Await(Owed.JOIN, group.group_id, member.member_id))
        self._maybe_prepare_rebalance(group, now_ms)
        return Pending(Owed.JOIN, group.group_id, member.member_id)

    def _replace_static_member(
        self, group: Group, iid: str, old_id: str, new_id: str, req: JoinRequest, now_ms: int
    ) -> JoinResult | Pending:
        old = group.members[old_id]
        # The previous instance of this static member is fenced: its owed responses say so.
        if old.awaiting_join:
            self._reply(Owed.JOIN, group, old_id, JoinResult(E.FENCED_INSTANCE_ID, old_id))
            old.awaiting_join = False
        if old.awaiting_sync:
            self._reply(Owed.SYNC, group, old_id, SyncResult(E.FENCED_INSTANCE_ID))
            old.awaiting_sync = False
        member = group.replace_static_member(iid, old_id, new_id)
        member.client_id = req.client_id
        member.client_host = req.client_host
        if group.is_in(S.STABLE):
            old_protocols = member.protocols
            member.protocols = list(req.protocols)
            member.session_timeout_ms = req.session_timeout_ms
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
            member.heartbeat_deadline_ms = now_ms + req.session_timeout_ms
            if group.select_protocol() == group.protocol_name and old_protocols == member.protocols:
                # KIP-345: a static member coming back unchanged keeps its assignment with
                # no rebalance; the new member id is made durable.
                self._emit(GroupMetadataKey(group.group_id), group.to_record(now_ms))
                if req.skip_assignment:
                    return self._join_result(group, member, skip=True)
                # As Kafka before v9: the old leader id, so the member does not take the
                # leader's part (it would rebalance); no member list.
                return replace(
                    self._join_result(group, member),
                    leader=old_id if group.leader_id == member.member_id else group.leader_id or "",
                    members=(),
                )
        return self._update_member_and_rebalance(group, member, req, now_ms)

    # -- rebalance mechanics -----------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group, now_ms: int) -> None:
        if group.is_in(S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY):
            self._prepare_rebalance(group, now_ms)

    def _prepare_rebalance(self, group: Group, now_ms: int) -> None:
        if group.is_in(S.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, E.REBALANCE_IN_PROGRESS)
        was_empty = group.is_in(S.EMPTY)
        group.transition_to(S.PREPARING_REBALANCE, now_ms)
        group.sync_deadline_ms = None
        rebalance_timeout = group.max_rebalance_timeout_ms()
        if was_empty:
            delay = min(self.config.initial_rebalance_delay_ms, rebalance_timeout)
            group.join_deadline_ms = now_ms + delay
            group.initial_delay_remaining_ms = max(rebalance_timeout - delay, 0)
            group.new_member_added = False
        else:
            group.join_deadline_ms = now_ms + rebalance_timeout
            group.initial_delay_remaining_ms = None

    def _reset_and_propagate_assignment_error(self, group: Group, error: ErrorCode) -> None:
        for m in group.members.values():
            m.assignment = b""
            if m.awaiting_sync:
                m.awaiting_sync = False
                self._reply(Owed.SYNC, group, m.member_id, SyncResult(error))

    def _maybe_complete_join(self, group: Group, now_ms: int) -> None:
        if not group.is_in(S.PREPARING_REBALANCE) or group.join_deadline_ms is None:
            return
        if group.initial_delay_remaining_ms is not None:
            # The first rebalance of an empty group never completes early: it waits for the
            # delay, and again while new members keep coming, within the rebalance timeout.
            while now_ms >= group.join_deadline_ms:
                if group.new_member_added and group.initial_delay_remaining_ms > 0:
                    delay = min(
                        self.config.initial_rebalance_delay_ms, group.initial_delay_remaining_ms
                    )
                    group.initial_delay_remaining_ms -= delay
                    group.new_member_added = False
                    group.join_deadline_ms = now_ms + delay
                else:
                    self._complete_join(group, now_ms)
                    return
            return
        if group.has_all_members_joined() or now_ms >= group.join_deadline_ms:
            self._complete_join(group, now_ms)

    def _complete_join(self, group: Group, now_ms: int) -> None:
        # Dynamic members that did not rejoin in time are out; static ones keep their place.
        for m in list(group.members.values()):
            if not m.awaiting_join and m.group_instance_id is None:
                group.remove(m.member_id)
        if group.members and not any(m.awaiting_join for m in group.members.values()):
            # Nobody rejoined (only absent static members): wait for them, or for their
            # session timeouts to remove them.
            group.join_deadline_ms = now_ms + group.max_rebalance_timeout_ms()
            group.initial_delay_remaining_ms = None
            return
        group.join_deadline_ms = None
        group.initial_delay_remaining_ms = None
        leader = group.members.get(group.leader_id or "")
        if leader is None or not leader.awaiting_join:
            group.leader_id = next(
                (m.member_id for m in group.members.values() if m.awaiting_join), None
            )
        group.generation += 1
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            group.transition_to(S.EMPTY, now_ms)
            self._emit(GroupMetadataKey(group.group_id), group.to_record(now_ms))
            return
        group.protocol_name = group.select_protocol()
        group.transition_to(S.COMPLETING_REBALANCE, now_ms)
        group.sync_deadline_ms = now_ms + group.max_rebalance_timeout_ms()
        for m in group.members.values():
            m.synced = False
            m.is_new = False
            m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
            if m.awaiting_join:
                m.awaiting_join = False
                self._reply(Owed.JOIN, group, m.member_id, self._join_result(group, m))

    def _remove_member_and_update_group(
        self, group: Group, member: Member, now_ms: int, error: ErrorCode = E.UNKNOWN_MEMBER_ID
    ) -> None:
        if member.awaiting_join:
            self._reply(Owed.JOIN, group, member.member_id, JoinResult(error, member.member_id))
        if member.awaiting_sync:
            self._reply(Owed.SYNC, group, member.member_id, SyncResult(error))
        group.remove(member.member_id)
        if group.is_in(S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms)
        self._maybe_complete_join(group, now_ms)

    # == SyncGroup =================================================================================

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
        cgroup = self.consumer.groups.get(group_id)
        if cgroup is not None:
            return self._outcome(
                self._classic_sync_consumer_group(
                    cgroup,
                    generation,
                    member_id,
                    group_instance_id,
                    protocol_type,
                    protocol_name,
                    now_ms,
                )
            )
        group = self.groups.get(group_id)
        if group is None:
            return self._outcome(SyncResult(E.UNKNOWN_MEMBER_ID))
        if group.is_in(S.DEAD):
            return self._outcome(SyncResult(E.COORDINATOR_NOT_AVAILABLE))
        if group.is_static_member_fenced(member_id, group_instance_id):
            return self._outcome(SyncResult(E.FENCED_INSTANCE_ID))
        if group.is_unknown_instance(group_instance_id):
            return self._outcome(SyncResult(E.UNKNOWN_MEMBER_ID))
        member = group.members.get(member_id)
        if member is None or group.is_in(S.EMPTY):
            return self._outcome(SyncResult(E.UNKNOWN_MEMBER_ID))
        if generation != group.generation:
            return self._outcome(SyncResult(E.ILLEGAL_GENERATION))
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return self._outcome(SyncResult(E.INCONSISTENT_GROUP_PROTOCOL))
        if group.is_in(S.PREPARING_REBALANCE):
            return self._outcome(SyncResult(E.REBALANCE_IN_PROGRESS))
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        member.synced = True
        if group.is_in(S.STABLE):
            return self._outcome(self._sync_result(group, member))
        # CompletingRebalance: owed an answer once the leader's assignment is stored.
        if member.awaiting_sync:
            self._reply(Owed.SYNC, group, member_id, SyncResult(E.REBALANCE_IN_PROGRESS))
        member.awaiting_sync = True
        self._buf.outbox.append(Await(Owed.SYNC, group_id, member_id))
        if member_id == group.leader_id:
            record = group.to_record(now_ms)
            members = tuple(
                dataclasses.replace(mm, assignment=assignments.get(mm.member_id, b""))
                for mm in record.members
            )
            value = dataclasses.replace(record, members=members)
            self._emit(GroupMetadataKey(group_id), value)
        return self._outcome(Pending(Owed.SYNC, group_id, member_id))

    def _sync_result(self, group: Group, member: Member) -> SyncResult:
        return SyncResult(E.NONE, group.protocol_type, group.protocol_name, member.assignment)

    def store_failed(self, records: Iterable[CoordinatorRecord], error: ErrorCode) -> None:
        """The log refused ``records``: a leader's assignment among them is not stored, so
        the members waiting for it get ``error`` and the group rebalances (as Kafka does)."""
        for rec in records:
            upgraded = self._upgrading.pop(rec.group_id, None)
            if upgraded is not None:
                # The conversion is not in the log: the group is the classic one it was.
                self.consumer.groups.pop(rec.group_id, None)
                self.groups[rec.group_id] = upgraded
                continue
            self._downgrading.pop(rec.group_id, None)
            cgroup = self.consumer.groups.get(rec.group_id)
            if cgroup is not None and not cgroup.members and cgroup.assignment_epoch == 0:
                del self.consumer.groups[rec.group_id]  # its first heartbeat was not stored
            group = self.groups.get(rec.group_id)
            if (
                isinstance(rec.value, GroupMetadataValue)
                and group is not None
                and group.is_in(S.COMPLETING_REBALANCE)
                and rec.value.generation == group.generation
            ):
                self._reset_and_propagate_assignment_error(group, error)
                self._prepare_rebalance(group, group.state_timestamp_ms)

    # == Heartbeat and LeaveGroup ==================================================================

    def heartbeat(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        now_ms: int,
    ) -> Outcome[CoordinatorRecord, Any]:
        return self._outcome(
            self._heartbeat(group_id, generation, member_id, group_instance_id, now_ms)
        )

    def _heartbeat(
        self, group_id: str, generation: int, member_id: str, iid: str | None, now_ms: int
    ) -> ErrorCode:
        cgroup = self.consumer.groups.get(group_id)
        if cgroup is not None:
            return self.consumer.classic_heartbeat(cgroup, member_id, iid, generation, now_ms)
        group = self.groups.get(group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if group.is_in(S.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        if group.is_static_member_fenced(member_id, iid):
            return E.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None or group.is_in(S.EMPTY) or group.is_unknown_instance(iid):
            return E.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return E.ILLEGAL_GENERATION
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.is_in(S.PREPARING_REBALANCE):
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def leave_group(
        self, group_id: str, members: list[tuple[str, str | None]], now_ms: int
    ) -> Outcome[CoordinatorRecord, Any]:
        """Response: (top-level error, [(member id, instance id, error)])."""
        cgroup = self.consumer.groups.get(group_id)
        if cgroup is not None:
            return self._outcome((E.NONE, self.consumer.classic_leave(cgroup, members)))
        group = self.groups.get(group_id)
        if group is None:
            return self._outcome((E.NONE, [(m, i, E.UNKNOWN_MEMBER_ID) for m, i in members]))
        if group.is_in(S.DEAD):
            return self._outcome((E.COORDINATOR_NOT_AVAILABLE, []))
        results: list[tuple[str, str | None, ErrorCode]] = []
        for member_id, iid in members:
            target = member_id
            if iid is not None:
                known = group.static_members.get(iid)
                if known is None:
                    results.append((member_id, iid, E.UNKNOWN_MEMBER_ID))
                    continue
                if member_id and known != member_id:
                    results.append((member_id, iid, E.FENCED_INSTANCE_ID))
                    continue
                target = known
            if target in group.pending_members:
                del group.pending_members[target]
                self._maybe_complete_join(group, now_ms)
                results.append((member_id, iid, E.NONE))
                continue
            member = group.members.get(target)
            if member is None:
                results.append((member_id, iid, E.UNKNOWN_MEMBER_ID))
                continue
            self._remove_member_and_update_group(group, member, now_ms)
            results.append((member_id, iid, E.NONE))
        return self._outcome((E.NONE, results))

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
        classic = self.groups.get(gid)
        if classic is not None and gid not in self.consumer.groups:
            if classic.members or not classic.is_in(S.EMPTY):
                why = self._upgrade_refused(classic, req)
                if why is None:
                    return self._outcome(self._upgrade(classic, req, topics, now_ms))
                return self._outcome(
                    ConsumerHeartbeatResult(E.GROUP_ID_NOT_FOUND, why, req.member_id or None)
                )
        result = self.consumer.heartbeat(req, topics, now_ms)
        if classic is not None and result.error == E.NONE and classic.stored is not None:
            # The classic group's metadata goes first: replay order is log order.
            self._buf.records.insert(0, CoordinatorRecord(GroupMetadataKey(gid), None))
        return self._outcome(result)

    # == online migration (rule 38) ================================================================

    def _upgrade_refused(self, classic: Group, req: ConsumerHeartbeat) -> str | None:
        """Why a classic group with members cannot become a consumer group now (Kafka's
        validateOnlineUpgrade), or None."""
        gid = classic.group_id
        if req.member_epoch != 0:
            return f"group {gid} is not a consumer group"  # only a joining member converts
        if not self.config.consumer.upgrade_enabled:
            return f"group {gid} is not a consumer group: online upgrade is disabled"
        if classic.protocol_type != PROTOCOL_TYPE:
            return f"group {gid} is not a consumer group and does not use the consumer protocol"
        if len(classic.members) > self.config.consumer.max_size:
            return f"group {gid} has more members than group.consumer.max.size allows"
        return None

    def _upgrade(
        self,
        classic: Group,
        req: ConsumerHeartbeat,
        topics: Mapping[str, TopicInfo],
        now_ms: int,
    ) -> ConsumerHeartbeatResult:
        """Kafka's convertToConsumerGroup: the classic group's metadata is tombstoned and the
        consumer group's records say the same thing (group and assignment epochs at the
        classic generation; each member, marked classic, owns and targets its last classic
        assignment); then the joining member's heartbeat runs against that group. Nothing
        of it stays if the heartbeat is refused."""
        gid = classic.group_id
        mark = len(self._buf.records)
        try:
            records = _consumer_records_of(classic, topics)
        except ConsumerProtocolError as exc:
            return ConsumerHeartbeatResult(
                E.GROUP_ID_NOT_FOUND,
                f"cannot upgrade group {gid}: its consumer protocol is malformed ({exc})",
                req.member_id or None,
            )
        self._emit(GroupMetadataKey(gid), None)
        cgroup = ConsumerGroup(gid)
        for key, value in records:
            self._emit(key, value)
            # The heartbeat below needs the converted group before its records are replayed
            # (replaying them again later changes nothing).
            cgroup.replay(key, value, now_ms, self.config.consumer.session_timeout_ms)
        self.consumer.groups[gid] = cgroup
        del self.groups[gid]
        result = self.consumer.heartbeat(req, topics, now_ms)
        if result.error != E.NONE:
            del self.consumer.groups[gid]
            self.groups[gid] = classic
            del self._buf.records[mark:]
            return result
        # Members waiting for a JoinGroup or SyncGroup answer rejoin the consumer group.
        for m in classic.members.values():
            if m.awaiting_join:
                self._reply(Owed.JOIN, classic, m.member_id, JoinResult(E.REBALANCE_IN_PROGRESS))
            if m.awaiting_sync:
                self._reply(Owed.SYNC, classic, m.member_id, SyncResult(E.REBALANCE_IN_PROGRESS))
        self._upgrading[gid] = classic
        log.info("group %s: upgraded from classic to consumer group", gid)
        return result

    def _classic_join_consumer_group(
        self, cgroup: ConsumerGroup, req: JoinRequest, now_ms: int
    ) -> JoinResult:
        """Kafka's classicGroupJoinToConsumerGroup: a classic member's JoinGroup becomes a
        heartbeat of a member of the consumer group, reconciled as any other (its
        subscription says what it still owns); it is answered at once, as a follower (no
        leader: the server assigns), at its member epoch as the generation."""
        names = [p for p, _ in req.protocols]
        iid = req.group_instance_id
        held = cgroup.static_member(iid) if iid is not None else None
        if iid is not None and req.member_id:
            # A static member naming its member id must be the one holding its instance id.
            if held is None:
                return JoinResult(E.UNKNOWN_MEMBER_ID, req.member_id)
            if held.member_id != req.member_id:
                return JoinResult(E.FENCED_INSTANCE_ID, req.member_id)
        replaced = held if held is not None and not req.member_id else None
        others = [
            m
            for m in cgroup.members.values()
            if m.is_classic and m.member_id != req.member_id and m is not replaced
        ]
        supported = [
            p
            for p in names
            if all(
                p in {n for n, _ in m.metadata.classic.protocols}  # type: ignore[union-attr]
                for m in others
            )
        ]
        if req.protocol_type != PROTOCOL_TYPE or not supported:
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
        if not req.member_id and iid is None and req.require_known_member_id:
            # KIP-394 is for dynamic members: a static one is known by its instance id.
            return JoinResult(E.MEMBER_ID_REQUIRED, self._new_member_id(req.client_id))
        member_id = req.member_id or self._new_member_id(req.client_id)
        try:
            sub = decode_subscription(req.protocols[0][1])
        except ConsumerProtocolError as exc:
            log.info("group %s: JoinGroup of %s refused: %s", cgroup.group_id, member_id, exc)
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
        topics = self.topics()
        owned: Assignment = {}
        for name, parts in sub.owned.items():
            if name in topics and parts:
                owned[topics[name].topic_id] = parts
        hb = ConsumerHeartbeat(
            group_id=cgroup.group_id,
            member_id=member_id,
            member_epoch=0,
            instance_id=req.group_instance_id,
            rack_id=sub.rack_id,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            subscribed_topic_names=sub.topics,
            owned=owned,
            client_id=req.client_id,
            client_host=req.client_host,
            classic=ClassicMemberMetadata(req.session_timeout_ms, tuple(req.protocols)),
        )
        result = self.consumer.heartbeat(hb, topics, now_ms)
        if result.error != E.NONE:
            return JoinResult(result.error, member_id)
        if replaced is not None and not replaced.is_classic:
            # It replaced the group's last consumer-protocol member: back to a classic group.
            joining = self._classic_member_of(
                replaced, member_id, hb.classic, req, result.assignment or {}
            )
            group = self._downgrade(cgroup, replaced.member_id, joining)
            if group is not None:
                assert group.protocol_name is not None
                return JoinResult(
                    E.NONE,
                    member_id,
                    group.generation,
                    PROTOCOL_TYPE,
                    group.protocol_name,
                    "",
                    False,
                    (),
                )
        # Its SyncGroup is due within the rebalance timeout (Kafka's sync timeout).
        cgroup.revocation_deadlines.setdefault(member_id, now_ms + req.rebalance_timeout_ms)
        return JoinResult(
            E.NONE, member_id, result.member_epoch, PROTOCOL_TYPE, supported[0], "", False, ()
        )

    def _classic_sync_consumer_group(
        self,
        cgroup: ConsumerGroup,
        generation: int,
        member_id: str,
        iid: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        now_ms: int,
    ) -> SyncResult:
        """Kafka's classicGroupSyncToConsumerGroup: the member receives the partitions the
        consumer group assigns it, in the consumer protocol's assignment format."""
        error, member = self.consumer.classic_member(cgroup, member_id, iid, generation)
        if member is None:
            return SyncResult(error)
        classic = member.metadata.classic
        assert classic is not None
        protocols = [n for n, _ in classic.protocols]
        if (protocol_type is not None and protocol_type != PROTOCOL_TYPE) or (
            protocol_name is not None and protocol_name not in protocols
        ):
            return SyncResult(E.INCONSISTENT_GROUP_PROTOCOL)
        cgroup.session_deadlines[member_id] = now_ms + classic.session_timeout_ms
        if member.state != MemberState.UNREVOKED_PARTITIONS:  # else it must still rejoin
            cgroup.revocation_deadlines.pop(member_id, None)
        names = {t.topic_id: t.name for t in self.topics().values()}
        return SyncResult(
            E.NONE,
            PROTOCOL_TYPE,
            protocol_name or protocols[0],
            _classic_assignment(member.assigned, names),
        )

    def _maybe_downgrade(self, cgroup: ConsumerGroup, leaving_id: str) -> bool:
        """Kafka's validateOnlineDowngradeWithFencedMember and convertToClassicGroup: when
        the last consumer-protocol member of a group whose other members are classic leaves
        (or is fenced), the consumer group's records are tombstoned and a classic group of
        the others is written at the group epoch; once replayed it rebalances, so each member
        rejoins the classic way."""
        return self._downgrade(cgroup, leaving_id, None) is not None

    def _downgrade(
        self, cgroup: ConsumerGroup, leaving_id: str, joining: Member | None
    ) -> Group | None:
        """The downgrade when ``leaving_id`` goes, and the classic group written, or None;
        ``joining``: the classic member that replaced it (its records not replayed yet)."""
        leaving = cgroup.members.get(leaving_id)
        rest = [m for m in cgroup.members.values() if m.member_id != leaving_id]
        if leaving is None or leaving.is_classic or not (rest or joining):
            return None
        if not all(m.is_classic for m in rest):
            return None
        if not self.config.consumer.downgrade_enabled:
            log.info("group %s: not downgraded: online downgrade is disabled", cgroup.group_id)
            return None
        gid = cgroup.group_id
        names = {t.topic_id: t.name for t in self.topics().values()}
        group = Group(gid, state=S.STABLE, generation=cgroup.group_epoch)
        for m in rest:
            classic = m.metadata.classic
            assert classic is not None
            group.add(
                Member(
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    client_id=m.metadata.client_id,
                    client_host=m.metadata.client_host,
                    rebalance_timeout_ms=m.metadata.rebalance_timeout_ms,
                    session_timeout_ms=classic.session_timeout_ms,
                    protocol_type=PROTOCOL_TYPE,
                    protocols=list(classic.protocols),
                    assignment=_classic_assignment(m.assigned, names),
                )
            )
        if joining is not None:
            group.add(joining)
        group.protocol_name = group.select_protocol() if group.candidate_protocols() else None
        if group.protocol_name is None:
            return None  # no protocol every member speaks: stays a consumer group
        self.consumer.delete(cgroup, [joining.member_id] if joining is not None else [])
        self._emit(GroupMetadataKey(gid), group.to_record(0))
        self._downgrading[gid] = group
        log.info("group %s: downgrading from consumer to classic group", gid)
        return group

    def _classic_member_of(
        self,
        replaced: ConsumerMember,
        member_id: str,
        classic: ClassicMemberMetadata | None,
        req: JoinRequest,
        assigned: Assignment,
    ) -> Member:
        """The classic member a static replacement makes, for a downgrade."""
        assert classic is not None
        names = {t.topic_id: t.name for t in self.topics().values()}
        return Member(
            member_id=member_id,
            group_instance_id=replaced.instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=classic.session_timeout_ms,
            protocol_type=PROTOCOL_TYPE,
            protocols=list(classic.protocols),
            assignment=_classic_assignment(assigned, names),
        )

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+ from a consumer-protocol member: it must be one, at its epoch."""
        cgroup = self.consumer.groups.get(group_id)
        if cgroup is None or member_id is None or member_epoch < 0:
            return E.NONE
        return self.consumer.validate_commit(cgroup, member_id, member_epoch)

    def describe_consumer_group(self, group_id: str) -> ConsumerGroupDescription:
        return self.consumer.describe(group_id)

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
        error = self.validate_commit(group_id, generation, member_id, group_instance_id, now_ms)
        errors, records = self.offsets.commit(group_id, offsets, error, now_ms)
        self._buf.records += records
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
        error = verified
        if error == E.NONE and (generation >= 0 or member_id):
            # KIP-447: a consumer-group-aware producer is fenced by the group generation.
            if self._unknown_group(group_id) and generation >= 0:
                error = E.UNKNOWN_MEMBER_ID  # Kafka's answer when the group does not exist
            else:
                error = self.validate_commit(
                    group_id, generation, member_id, group_instance_id, now_ms
                )
        errors, records = self.offsets.commit(group_id, offsets, error, now_ms)
        return Outcome(records, errors)

    def _unknown_group(self, group_id: str) -> bool:
        return group_id not in self.groups and group_id not in self.consumer.groups

    def validate_commit(
        self, group_id: str, generation: int, member_id: str, iid: str | None, now_ms: int
    ) -> ErrorCode:
        """May this member commit offsets for the group now (OffsetCommit, and TxnOffsetCommit
        from a group-aware producer)? A commit accepted from a member counts as its
        heartbeat."""
        if not group_id:
            return E.INVALID_GROUP_ID
        cgroup = self.consumer.groups.get(group_id)
        if cgroup is not None:
            return self.consumer.validate_commit(cgroup, member_id, generation)
        group = self.groups.get(group_id)
        if group is None:
            # A group only storing offsets ("simple" consumer); replaying the commit creates
            # it. A generation for a group we do not know is from another life: reject.
            return E.NONE if generation < 0 else E.ILLEGAL_GENERATION
        if group.is_in(S.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        if group.is_static_member_fenced(member_id, iid):
            return E.FENCED_INSTANCE_ID
        if generation < 0 and group.is_in(S.EMPTY):
            return E.NONE
        member = group.members.get(member_id)
        if member is None:
            return E.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return E.ILLEGAL_GENERATION
        if group.is_in(S.COMPLETING_REBALANCE):
            return E.REBALANCE_IN_PROGRESS
        # Stable, or PreparingRebalance (revocation commits before rejoining are allowed).
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        return E.NONE

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
        cgroup = self.consumer.groups.get(group_id)
        if cgroup is not None:
            errors = {
                (t, p): E.GROUP_SUBSCRIBED_TO_TOPIC
                if self.consumer.subscribes(cgroup, t)
                else E.NONE
                for t, ps in topics
                for p in ps
            }
            deleted = [tp for tp, e in errors.items() if e == E.NONE]
            self._buf.records += self.offsets.tombstones(group_id, deleted)
            return self._outcome((E.NONE, errors))
        group = self.groups.get(group_id)
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
        self._buf.records += self.offsets.tombstones(group_id, deleted)
        return self._outcome((E.NONE, errors))

    # == admin =====================================================================================

    def list_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group, optionally of some states."""
        wanted = {s.lower() for s in states}
        return [
            (g.group_id, g.protocol_type or "", g.state.value)
            for g in self.groups.values()
            if not g.is_in(S.DEAD) and (not wanted or g.state.value.lower() in wanted)
        ]

    def list_consumer_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(group id, state) of every consumer-protocol group, optionally of some states."""
        wanted = {s.lower() for s in states}
        return [
            (g.group_id, g.state)
            for g in self.consumer.groups.values()
            if not wanted or g.state.lower() in wanted
        ]

    def describe_group(self, group_id: str) -> GroupDescription:
        cgroup = self.consumer.groups.get(group_id)
        if cgroup is not None:
            # As Kafka: DescribeGroups describes classic groups only; a consumer group is
            # described by ConsumerGroupDescribe, and here it is Dead (v6: GROUP_ID_NOT_FOUND).
            return GroupDescription(group_id, E.NONE, S.DEAD.value, "", "")
        group = self.groups.get(group_id)
        if group is None:
            return GroupDescription(group_id, E.NONE, S.DEAD.value, "", "")
        if not group.is_in(S.STABLE):
            # As Kafka: member metadata and assignments only for a Stable group.
            members = tuple(
                MemberDescription(
                    m.member_id, m.group_instance_id, m.client_id, m.client_host, b"", b""
                )
                for m in group.members.values()
            )
            return GroupDescription(
                group_id, E.NONE, group.state.value, group.protocol_type or "", "", members
            )
        members = tuple(
            MemberDescription(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(group.protocol_name),
                m.assignment,
            )
            for m in group.members.values()
        )
        return GroupDescription(
            group_id,
            E.NONE,
            group.state.value,
            group.protocol_type or "",
            group.protocol_name or "",
            members,
        )

    def delete_groups(self, group_ids: list[str], now_ms: int) -> Outcome[CoordinatorRecord, Any]:
        """Response: {group id: error}. Only groups without members can be deleted."""
        errors: dict[str, ErrorCode] = {}
        for gid in group_ids:
            cgroup = self.consumer.groups.get(gid)
            if cgroup is not None:
                if cgroup.members:
                    errors[gid] = E.NON_EMPTY_GROUP
                else:
                    errors[gid] = E.NONE
                    self._buf.records += self.offsets.tombstones(gid, self.offsets.committed(gid))
                    self.consumer.delete(cgroup)
                continue
            group = self.groups.get(gid)
            if group is None or group.is_in(S.DEAD):
                errors[gid] = E.GROUP_ID_NOT_FOUND
            elif not group.is_in(S.EMPTY):
                errors[gid] = E.NON_EMPTY_GROUP
            else:
                errors[gid] = E.NONE
                self._tombstone_group(group)
        return self._outcome(errors)

    def _tombstone_group(self, group: Group) -> None:
        gid = group.group_id
        self._buf.records += self.offsets.tombstones(gid, self.offsets.committed(gid))
        self._emit(GroupMetadataKey(gid), None)

    def _forget_if_unused(self, group: Group) -> None:
        unused = not self.offsets.has_offsets(group.group_id) and group.stored is None
        if group.is_in(S.EMPTY) and unused:
            self.groups.pop(group.group_id, None)

    # == timers ====================================================================================

    def tick(self, now_ms: int) -> Outcome[CoordinatorRecord, Any]:
        """Fire every deadline that has passed: pending member ids, session timeouts, the end
        of a join phase, members that never sent SyncGroup, and offsets retention."""
        for group in list(self.groups.values()):
            self._fire(group, now_ms)
        self.consumer.tick(now_ms)
        if self._next_expiry_check_ms is None:
            self._next_expiry_check_ms = now_ms + self.config.offsets_retention_check_interval_ms
        elif now_ms >= self._next_expiry_check_ms:
            self._next_expiry_check_ms = now_ms + self.config.offsets_retention_check_interval_ms
            self.expire_offsets(now_ms)
        return self._outcome(None)

    def fire_group(self, group_id: str, now_ms: int) -> Outcome[CoordinatorRecord, Any]:
        """Fire the passed deadlines of one group, before a request about it is answered: a
        session ends exactly at its deadline, as under Kafka's per-member timers, not at the
        next tick."""
        group = self.groups.get(group_id)
        if group is not None:
            self._fire(group, now_ms)
        self.consumer.fire(group_id, now_ms)
        return self._outcome(None)

    def _fire(self, group: Group, now_ms: int) -> None:
        for mid, deadline in list(group.pending_members.items()):
            if now_ms >= deadline:
                del group.pending_members[mid]
                self._maybe_complete_join(group, now_ms)
        for m in list(group.members.values()):
            # Members owed a join or sync answer are bounded by the rebalance timeout.
            if m.awaiting_join or m.awaiting_sync or now_ms < m.heartbeat_deadline_ms:
                continue
            if group.members.get(m.member_id) is m:
                self._remove_member_and_update_group(group, m, now_ms)
        if group.sync_deadline_ms is not None and now_ms >= group.sync_deadline_ms:
            group.sync_deadline_ms = None
            laggards = [m for m in group.members.values() if not m.synced]
            if laggards and group.is_in(S.COMPLETING_REBALANCE, S.STABLE):
                for m in laggards:
                    self._remove_member_and_update_group(group, m, now_ms)
        self._maybe_complete_join(group, now_ms)

    def expire_offsets(self, now_ms: int) -> None:
        """Offsets retention (KIP-211): a group's offsets expire once it has been Empty for
        ``offsets.retention.minutes`` (a group that never had members: once each offset is
        that old). An Empty group left with no offsets is deleted. Consumer-protocol groups
        (KIP-848) have no Empty timestamp: their offsets expire by commit time."""
        retention = self.config.offsets_retention_ms
        for group in list(self.groups.values()):
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
            self._buf.records += self.offsets.tombstones(group.group_id, expired)
            if len(expired) == len(committed):
                self._emit(GroupMetadataKey(group.group_id), None)
        for cgroup in list(self.consumer.groups.values()):
            # An empty consumer group: each offset once it is that old; then the group goes.
            if cgroup.members:
                continue
            gid = cgroup.group_id
            committed = self.offsets.committed(gid)
            expired = [
                tp for tp, v in committed.items() if now_ms >= v.commit_timestamp + retention
            ]
            self._buf.records += self.offsets.tombstones(gid, expired)
            if len(expired) == len(committed):
                self.consumer.delete(cgroup)

    # == replay ====================================================================================

    def begin_load(self) -> None:
        self._loading = True

    def end_load(self, now_ms: int = 0) -> list[CoordinatorRecord]:
        self._loading = False
        return []

    def replay(self, record: CoordinatorRecord, now_ms: int, log_offset: int | None = None) -> None:
        """Apply one record of ``__consumer_offsets``: the only way durable state changes.

        ``log_offset`` is the record's offset in its partition: offset commits are ordered by
        it (:meth:`OffsetStore.replay`); without it the record is applied unconditionally."""
        key, value = record.key, record.value
        if isinstance(key, ConsumerGroupKey):
            classic = self.groups.get(key.group)
            if classic is not None and (value is not None or not classic.members):
                # The group became a consumer group (an empty one, or one with members: an
                # online upgrade, whose tombstone of the classic metadata came first).
                del self.groups[key.group]
            if value is not None:
                self._upgrading.pop(key.group, None)
            self.consumer.replay(key, value, now_ms)  # type: ignore[arg-type]
            return
        group = self.groups.get(key.group)
        if isinstance(key, OffsetCommitKey):
            known = group is not None or key.group in self.consumer.groups
            if self.offsets.replay(record, log_offset) and value is not None and not known:
                self.groups[key.group] = Group(key.group)  # a group only storing offsets
            return
        if value is None:
            if group is None:
                return
            if group.members:
                group.stored = None  # deleted under live members: they rewrite it at sync
            elif self.offsets.has_offsets(key.group) and key.group not in self.consumer.groups:
                # Its offsets outlive the metadata: a group that only stores offsets.
                self.groups[key.group] = Group(key.group)
            else:
                group.transition_to(S.DEAD, now_ms)
                del self.groups[key.group]
            return
        assert isinstance(value, GroupMetadataValue)
        downgraded = self._downgrading.pop(key.group, None)
        if downgraded is not None and not self._loading:
            # An online downgrade is in the log: the classic group takes over and rebalances
            # at once, so its members rejoin the classic way (rule 38).
            downgraded.stored = value
            for m in downgraded.members.values():
                m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
            self.groups[key.group] = downgraded
            self._prepare_rebalance(downgraded, now_ms)
            return
        if group is None:
            group = self.groups[key.group] = Group(key.group)
        if self._loading:
            group = self.groups[key.group] = Group(key.group)
            group.load(value, now_ms)
            return
        group.stored = value
        if group.is_in(S.COMPLETING_REBALANCE) and value.generation == group.generation:
            # The leader's assignment is in the log: hand it out, the group is Stable.
            for mm in value.members:
                m = group.members.get(mm.member_id)
                if m is not None:
                    m.assignment = mm.assignment
            group.transition_to(S.STABLE, now_ms)
            for m in group.members.values():
                if m.awaiting_sync:
                    m.awaiting_sync = False
                    self._reply(Owed.SYNC, group, m.member_id, self._sync_result(group, m))

    # == inspection (tests, tooling) ===============================================================

    def durable_state(self) -> dict[str, Any]:
        """What the log must be able to rebuild: offsets of every group, and for groups at
        rest (Empty or Stable) their generation, protocol, leader, members and assignments."""
        out: dict[str, Any] = {}
        for gid, g in sorted(self.groups.items()):
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
        for gid, cg in sorted(self.consumer.groups.items()):
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


# --- online migration helpers ----------------------------------------------------------------


def _classic_assignment(assigned: Assignment, names: Mapping[uuid.UUID, str]) -> bytes:
    return encode_assignment({names[tid]: ps for tid, ps in assigned.items() if tid in names})


def _consumer_records_of(
    classic: Group, topics: Mapping[str, TopicInfo]
) -> list[tuple[ConsumerGroupKey, ConsumerGroupValue]]:
    """The records of the consumer group a classic group becomes (Kafka's
    ConsumerGroup.fromClassicGroup and createConsumerGroupRecords)."""
    gid, epoch = classic.group_id, classic.generation
    members: list[tuple[str, ConsumerGroupMemberMetadataValue, Assignment]] = []
    for m in classic.members.values():
        protocol = classic.protocol_name or (m.protocols[0][0] if m.protocols else "")
        sub = decode_subscription(m.metadata(protocol))
        assigned: Assignment = {}
        for name, parts in decode_assignment(m.assignment).items():
            if name in topics and parts:
                assigned[topics[name].topic_id] = parts
        meta = ConsumerGroupMemberMetadataValue(
            m.group_instance_id,
            sub.rack_id,
            m.client_id,
            m.client_host,
            tuple(sorted(set(sub.topics))),
            None,
            m.rebalance_timeout_ms,
            None,
            ClassicMemberMetadata(m.session_timeout_ms, tuple(m.protocols)),
        )
        members.append((m.member_id, meta, assigned))
    out: list[tuple[ConsumerGroupKey, ConsumerGroupValue]] = []
    for mid, meta, _ in members:
        out.append((ConsumerGroupKey(MEMBER_METADATA_TYPE, gid, mid), meta))
    out.append((ConsumerGroupKey(GROUP_METADATA_TYPE, gid), ConsumerGroupMetadataValue(epoch)))
    for mid, _, assigned in members:
        out.append(
            (ConsumerGroupKey(TARGET_MEMBER_TYPE, gid, mid), TargetAssignmentMemberValue(assigned))
        )
    out.append((ConsumerGroupKey(TARGET_METADATA_TYPE, gid), TargetAssignmentMetadataValue(epoch)))
    for mid, _, assigned in members:
        current = CurrentMemberAssignmentValue(epoch, epoch, int(MemberState.STABLE), assigned)
        out.append((ConsumerGroupKey(CURRENT_ASSIGNMENT_TYPE, gid, mid), current))
    return out
