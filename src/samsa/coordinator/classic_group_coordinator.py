"""Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) over
:class:`~samsa.coordinator.group.Group`: the classic half of the group coordinator.

Theory of operation
-------------------
:class:`ClassicGroups` serves the classic groups of the registry (``group_registry.py``); the
group coordinator (``group_coordinator.py``) sends it a request once it knows the group id
names no consumer group. Like the rest of the coordinator it never changes durable state: it
emits records into the shared :class:`Output`, and the group's stored generation changes
only when the runtime replays them (:meth:`ClassicGroups.replay`, rule 26).

Classic-protocol membership in flight (who has rejoined, deadlines) is in memory only, as in
Kafka. Its one step that waits for the log is CompletingRebalance -> Stable: the leader's
SyncGroup produces a GroupMetadata record carrying the assignment, and the members receive
their assignments when that record is *replayed* — never an assignment the log lacks.

Requests that cannot be answered at once (JoinGroup until the join phase completes,
SyncGroup until the leader's assignment is stored) return :class:`Pending`. Owed responses
and their answers go out through the outbox as :class:`Await` and :class:`Reply` events, in
order; the runtime turns them into futures.

Error codes follow Kafka's classic ``GroupCoordinator``: MEMBER_ID_REQUIRED for a new dynamic
member at JoinGroup v4+, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS,
FENCED_INSTANCE_ID for a replaced static member, INCONSISTENT_GROUP_PROTOCOL,
INVALID_SESSION_TIMEOUT, COORDINATOR_NOT_AVAILABLE for a Dead group.

Deadlines are data (``heartbeat_deadline_ms``, ``join_deadline_ms``, ``sync_deadline_ms``,
pending member ids); :meth:`ClassicGroups.fire` ends those of a group that passed, and
:meth:`ClassicGroups.next_deadline` tells the coordinator's timer when to call it.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from samsa.coordinator.consumer_group_coordinator import ConsumerConfig
from samsa.coordinator.group import Group, GroupState, Member
from samsa.coordinator.offsets import CoordinatorRecord, OffsetStore
from samsa.coordinator.offsets_records import GroupMetadataKey, GroupMetadataValue, Key, Value
from samsa.protocol.errors import ErrorCode

S = GroupState
E = ErrorCode


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
class Output:
    """What the operation being run produces: the records to write, and the outbox of owed
    responses (shared by the classic, consumer and migration parts of the coordinator)."""

    records: list[CoordinatorRecord] = field(default_factory=list)
    outbox: list[Await | Reply] = field(default_factory=list)

    def emit(self, key: Key, value: Value | None) -> None:
        self.records.append(CoordinatorRecord(key, value))

    def owe(self, kind: Owed, group_id: str, member_id: str) -> None:
        self.outbox.append(Await(kind, group_id, member_id))

    def reply(self, kind: Owed, group_id: str, member_id: str, result: Any) -> None:
        self.outbox.append(Reply(kind, group_id, member_id, result))


def default_member_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


class ClassicGroups:
    def __init__(
        self,
        config: GroupConfig,
        groups: dict[str, Group],
        offsets: OffsetStore,
        out: Output,
        new_member_id: Callable[[str], str] = default_member_id,
    ) -> None:
        self.config = config
        self.groups = groups  # the registry's classic groups
        self._offsets = offsets
        self._out = out
        self._new_member_id = new_member_id

    # == JoinGroup =================================================================================

    def join(self, req: JoinRequest, now_ms: int) -> JoinResult | Pending:
        """A JoinGroup for a group id that names no consumer group."""
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return JoinResult(E.UNKNOWN_MEMBER_ID, req.member_id)
            group = Group(req.group_id, state_timestamp_ms=now_ms)
            self.groups[req.group_id] = group
        if group.is_in(S.DEAD):
            return JoinResult(E.COORDINATOR_NOT_AVAILABLE, req.member_id)
        if not group.supports_protocols(req.protocol_type, [p for p, _ in req.protocols]):
            self.forget_if_unused(group)
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
        self._out.owe(Owed.JOIN, group.group_id, member_id)
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
            self._out.reply(
                Owed.JOIN, group.group_id, member.member_id, JoinResult(E.REBALANCE_IN_PROGRESS)
            )
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        member.awaiting_join = True
        member.heartbeat_deadline_ms = now_ms + req.session_timeout_ms
        self._out.owe(Owed.JOIN, group.group_id, member.member_id)
        self._maybe_prepare_rebalance(group, now_ms)
        return Pending(Owed.JOIN, group.group_id, member.member_id)

    def _replace_static_member(
        self, group: Group, iid: str, old_id: str, new_id: str, req: JoinRequest, now_ms: int
    ) -> JoinResult | Pending:
        old = group.members[old_id]
        # The previous instance of this static member is fenced: its owed responses say so.
        if old.awaiting_join:
            self._out.reply(
                Owed.JOIN, group.group_id, old_id, JoinResult(E.FENCED_INSTANCE_ID, old_id)
            )
            old.awaiting_join = False
        if old.awaiting_sync:
            self._out.reply(Owed.SYNC, group.group_id, old_id, SyncResult(E.FENCED_INSTANCE_ID))
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
                self._out.emit(GroupMetadataKey(group.group_id), group.to_record(now_ms))
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
                self._out.reply(Owed.SYNC, group.group_id, m.member_id, SyncResult(error))

    def _maybe_complete_join(self, group: Group, now_ms: int, *, timer: bool = False) -> None:
        if not group.is_in(S.PREPARING_REBALANCE) or group.join_deadline_ms is None:
            return
        if group.initial_delay_remaining_ms is not None:
            # The first rebalance of an empty group never completes early, nor inside a
            # request (as Kafka's, even with a zero delay: only its timer ends the phase, so
            # joins already received are in): it waits for the delay, and again while new
            # members keep coming, within the rebalance timeout.
            if not timer:
                return
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
            self._out.emit(GroupMetadataKey(group.group_id), group.to_record(now_ms))
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
                self._out.reply(Owed.JOIN, group.group_id, m.member_id, self._join_result(group, m))

    def _remove_member_and_update_group(
        self, group: Group, member: Member, now_ms: int, error: ErrorCode = E.UNKNOWN_MEMBER_ID
    ) -> None:
        if member.awaiting_join:
            self._out.reply(
                Owed.JOIN, group.group_id, member.member_id, JoinResult(error, member.member_id)
            )
        if member.awaiting_sync:
            self._out.reply(Owed.SYNC, group.group_id, member.member_id, SyncResult(error))
        group.remove(member.member_id)
        if group.is_in(S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms)
        self._maybe_complete_join(group, now_ms)

    # == SyncGroup =================================================================================

    def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        now_ms: int,
    ) -> SyncResult | Pending:
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if group.is_in(S.DEAD):
            return SyncResult(E.COORDINATOR_NOT_AVAILABLE)
        if group.is_static_member_fenced(member_id, group_instance_id):
            return SyncResult(E.FENCED_INSTANCE_ID)
        if group.is_unknown_instance(group_instance_id):
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        member = group.members.get(member_id)
        if member is None or group.is_in(S.EMPTY):
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if generation != group.generation:
            return SyncResult(E.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(E.INCONSISTENT_GROUP_PROTOCOL)
        if group.is_in(S.PREPARING_REBALANCE):
            return SyncResult(E.REBALANCE_IN_PROGRESS)
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        member.synced = True
        if group.is_in(S.STABLE):
            return self._sync_result(group, member)
        # CompletingRebalance: owed an answer once the leader's assignment is stored.
        if member.awaiting_sync:
            self._out.reply(
                Owed.SYNC, group.group_id, member_id, SyncResult(E.REBALANCE_IN_PROGRESS)
            )
        member.awaiting_sync = True
        self._out.owe(Owed.SYNC, group_id, member_id)
        if member_id == group.leader_id:
            record = group.to_record(now_ms)
            members = tuple(
                dataclasses.replace(mm, assignment=assignments.get(mm.member_id, b""))
                for mm in record.members
            )
            value = dataclasses.replace(record, members=members)
            self._out.emit(GroupMetadataKey(group_id), value)
        return Pending(Owed.SYNC, group_id, member_id)

    def _sync_result(self, group: Group, member: Member) -> SyncResult:
        return SyncResult(E.NONE, group.protocol_type, group.protocol_name, member.assignment)

    def store_failed(self, group: Group, value: GroupMetadataValue, error: ErrorCode) -> None:
        """The log refused ``value``: a leader's assignment among them is not stored, so the
        members waiting for it get ``error`` and the group rebalances (as Kafka does)."""
        if group.is_in(S.COMPLETING_REBALANCE) and value.generation == group.generation:
            self._reset_and_propagate_assignment_error(group, error)
            self._prepare_rebalance(group, group.state_timestamp_ms)

    # == Heartbeat and LeaveGroup ==================================================================

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, iid: str | None, now_ms: int
    ) -> ErrorCode:
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

    def leave(
        self, group_id: str, members: list[tuple[str, str | None]], now_ms: int
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        """(top-level error, [(member id, instance id, error)])."""
        group = self.groups.get(group_id)
        if group is None:
            return (E.NONE, [(m, i, E.UNKNOWN_MEMBER_ID) for m, i in members])
        if group.is_in(S.DEAD):
            return (E.COORDINATOR_NOT_AVAILABLE, [])
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
        return (E.NONE, results)

    # == offsets ===================================================================================

    def validate_commit(
        self, group_id: str, generation: int, member_id: str, iid: str | None, now_ms: int
    ) -> ErrorCode:
        """May this member commit offsets for the classic group now? A commit accepted from
        a member counts as its heartbeat."""
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

    def tombstone(self, group: Group) -> None:
        gid = group.group_id
        self._out.records += self._offsets.tombstones(gid, self._offsets.committed(gid))
        self._out.emit(GroupMetadataKey(gid), None)

    def forget_if_unused(self, group: Group) -> None:
        unused = not self._offsets.has_offsets(group.group_id) and group.stored is None
        if group.is_in(S.EMPTY) and unused:
            self.groups.pop(group.group_id, None)

    # == admin =====================================================================================

    def list_groups(self, states: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group, optionally of some states."""
        wanted = {s.lower() for s in states}
        return [
            (g.group_id, g.protocol_type or "", g.state.value)
            for g in self.groups.values()
            if not g.is_in(S.DEAD) and (not wanted or g.state.value.lower() in wanted)
        ]

    def describe(self, group_id: str) -> GroupDescription:
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

    # == timers ====================================================================================

    def fire(self, group: Group, now_ms: int) -> None:
        """End what of the group passed its deadline: pending member ids, sessions, the join
        phase, members that never sent SyncGroup."""
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
        self._maybe_complete_join(group, now_ms, timer=True)

    def next_deadline(self, group: Group) -> int | None:
        """The earliest deadline :meth:`fire` acts on, or None."""
        deadlines = list(group.pending_members.values())
        deadlines += (
            m.heartbeat_deadline_ms
            for m in group.members.values()
            if not (m.awaiting_join or m.awaiting_sync)
        )
        if group.sync_deadline_ms is not None:
            deadlines.append(group.sync_deadline_ms)
        if group.is_in(S.PREPARING_REBALANCE) and group.join_deadline_ms is not None:
            deadlines.append(group.join_deadline_ms)
        return min(deadlines, default=None)

    # == replay ====================================================================================

    def take_over(self, group: Group, value: GroupMetadataValue, now_ms: int) -> None:
        """An online downgrade is in the log (rule 38): ``group``, the classic group it wrote,
        rebalances at once, so its members rejoin the classic way."""
        group.stored = value
        for m in group.members.values():
            m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
        self._prepare_rebalance(group, now_ms)

    def replay(self, group: Group, value: GroupMetadataValue, now_ms: int) -> None:
        """A GroupMetadata record of a live group (not a load, not a downgrade) replayed."""
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
                    self._out.reply(
                        Owed.SYNC, group.group_id, m.member_id, self._sync_result(group, m)
                    )
