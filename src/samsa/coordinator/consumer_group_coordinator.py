"""The operations of KIP-848 consumer groups: ConsumerGroupHeartbeat, describe, fencing.

Theory of operation
-------------------
:class:`ConsumerGroups` is the part of the group coordinator (``group_coordinator.py``) that
serves consumer-protocol groups. Like the rest of the coordinator, an operation never changes
durable state: it computes the group's next state and emits the records that say so (through
the ``emit`` callback, into the coordinator's outcome); the runtime writes and then replays
them (:meth:`ConsumerGroups.replay`), and only then is the state changed (rule 26).

A heartbeat, in order (Kafka's ``GroupMetadataManager.consumerGroupHeartbeat``):

1. validate the request and the member's epoch: a member ahead of the group, or behind it
   other than by one missed epoch bump, is fenced (FENCED_MEMBER_EPOCH) and must rejoin
   with epoch 0 and no partitions;
2. update the member's metadata (subscription, timeouts, assignor); a new member, a changed
   subscription or changed partition counts of the subscribed topics bump the group epoch;
3. if the target assignment is older than the group epoch, the assignor computes a new one;
4. the member is reconciled towards its target (``consumer_group.reconcile``): partitions
   move only after their previous owner reported revoking them (rule 35).

A member that stops heartbeating for ``group.consumer.session.timeout.ms``, or does not
revoke within its rebalance timeout, is fenced by :meth:`ConsumerGroups.fire`: its records are
deleted and its partitions become free.

During an online migration (rule 38) a consumer group may also hold classic members, whose
member metadata carries Kafka's ClassicMemberMetadata: their JoinGroup runs as a heartbeat
(``ConsumerHeartbeat.classic``, no epoch checks, what they own read from their subscription),
their Heartbeat tells them to rejoin (:meth:`ConsumerGroups.classic_heartbeat`) and their
sessions use their own timeout.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import re2

from samsa.coordinator.assignors import ASSIGNORS
from samsa.coordinator.consumer_group import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    ConsumerMember,
    MemberState,
    reconcile,
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
    TargetAssignmentMemberValue,
    TargetAssignmentMetadataValue,
)
from samsa.protocol.errors import ErrorCode

E = ErrorCode


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    """A ConsumerGroupHeartbeat request; None fields mean "unchanged since the last one"."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""
    # A classic member's JoinGroup, translated (rule 38): no epoch checks, ``owned`` is what
    # its subscription says it still owns.
    classic: ClassicMemberMetadata | None = None
    # The topic names the member's principal may Describe; None: every topic (no authorizer).
    describable: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None


@dataclass(frozen=True, slots=True)
class ConsumerMemberDescription:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: Assignment
    target: Assignment
    classic: bool = False  # speaks the classic protocol (rule 38)


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    group_id: str
    error: ErrorCode
    message: str | None = None
    state: str = "Dead"
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    members: tuple[ConsumerMemberDescription, ...] = ()


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors
    max_size: int = 1000  # group.consumer.max.size (bounded: members cost memory)
    # group.consumer.migration.policy: bidirectional | upgrade | downgrade | disabled
    migration_policy: str = "bidirectional"

    @property
    def upgrade_enabled(self) -> bool:
        return self.migration_policy in ("bidirectional", "upgrade")

    @property
    def downgrade_enabled(self) -> bool:
        return self.migration_policy in ("bidirectional", "downgrade")


Emit = Callable[[ConsumerGroupKey, ConsumerGroupValue | None], None]
# Called before a consumer-protocol member is removed; True if it converted the group to a
# classic group instead (online downgrade, rule 38).
Downgrade = Callable[[ConsumerGroup, str], bool]
# A group's own (session timeout, heartbeat interval), None where it has none (the group
# configs of KIP-848, set by the broker).
Overrides = Callable[[str], tuple[int | None, int | None]]


def _no_downgrade(group: ConsumerGroup, member_id: str) -> bool:
    return False


def no_overrides(group_id: str) -> tuple[int | None, int | None]:
    return None, None


class _Refused(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _key(t: int, group: str, member: str | None = None) -> ConsumerGroupKey:
    return ConsumerGroupKey(t, group, member)


class ConsumerGroups:
    def __init__(
        self,
        config: ConsumerConfig,
        emit: Emit,
        new_member_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        downgrade: Downgrade = _no_downgrade,
        overrides: Overrides = no_overrides,
        groups: dict[str, ConsumerGroup] | None = None,
    ) -> None:
        self.config = config
        # The registry's consumer groups (``group_registry.py``), when part of a coordinator.
        self.groups: dict[str, ConsumerGroup] = {} if groups is None else groups
        self._emit = emit
        self._new_member_id = new_member_id
        self.downgrade = downgrade
        self.overrides = overrides

    def session_timeout_ms(self, group_id: str) -> int:
        own = self.overrides(group_id)[0]
        return self.config.session_timeout_ms if own is None else own

    def heartbeat_interval_ms(self, group_id: str) -> int:
        own = self.overrides(group_id)[1]
        return self.config.heartbeat_interval_ms if own is None else own

    # == heartbeat =================================================================================

    def heartbeat(
        self, req: ConsumerHeartbeat, topics: Mapping[str, TopicInfo], now_ms: int
    ) -> ConsumerHeartbeatResult:
        """``topics``: the cluster's (non-internal) topics by name."""
        try:
            return self._heartbeat(req, topics, now_ms)
        except _Refused as exc:
            return ConsumerHeartbeatResult(exc.error, exc.message, req.member_id or None)

    def _heartbeat(
        self, req: ConsumerHeartbeat, topics: Mapping[str, TopicInfo], now_ms: int
    ) -> ConsumerHeartbeatResult:
        _validate(req, self.config)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_epoch != 0:
                raise _Refused(E.GROUP_ID_NOT_FOUND, f"Group {req.group_id} not found.")
            group = ConsumerGroup(req.group_id, topics_signature=())
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, req)
        member, is_new, replaced = self._member_for(group, req)
        gone = {replaced} if replaced else set()
        targets = {mid: a for mid, a in group.targets.items() if mid not in gone}
        if replaced and replaced in group.targets:
            targets[member.member_id] = group.targets[replaced]
        # -- 2. metadata ---------------------------------------------------------------------
        meta = _updated_metadata(None if is_new else member.metadata, req)
        # As Kafka, joining alone does not bump the group epoch: a changed subscription or
        # preferred assignor does, and so do changed subscribed topics (below).
        bump = False
        if meta != member.metadata or is_new:
            self._emit(_key(MEMBER_METADATA_TYPE, group.group_id, member.member_id), meta)
            if member.metadata.subscribed_topic_names != meta.subscribed_topic_names or (
                member.metadata.subscribed_topic_regex != meta.subscribed_topic_regex
            ):
                bump = True
        group.session_deadlines[member.member_id] = now_ms + (
            req.classic.session_timeout_ms
            if req.classic is not None
            else self.session_timeout_ms(group.group_id)
        )
        subs = {m.member_id: m.metadata for m in group.members.values() if m.member_id not in gone}
        subs[member.member_id] = meta
        before = {m.member_id: m.metadata for m in group.members.values()}
        if self._assignor(subs) != self._assignor(before):
            bump = True
        group.regex_scopes[member.member_id] = req.describable
        for mid in gone:
            group.regex_scopes.pop(mid, None)
        resolved = {
            mid: _resolve(md, topics, group.regex_scopes.get(mid, req.describable))
            for mid, md in subs.items()
        }
        signature = _signature(resolved, topics)
        if signature != group.topics_signature:
            bump = True
        group_epoch = group.group_epoch + 1 if bump else group.group_epoch
        if bump:
            self._emit(
                _key(GROUP_METADATA_TYPE, group.group_id), ConsumerGroupMetadataValue(group_epoch)
            )
        # -- 3. target assignment ----------------------------------------------------------------
        assignment_epoch = group.assignment_epoch
        if assignment_epoch < group_epoch:
            targets = self._assign(group, subs, resolved, topics, targets, group_epoch)
            assignment_epoch = group_epoch
            group.topics_signature = signature
        # -- 4. reconciliation -------------------------------------------------------------------
        owned = req.owned
        if req.classic is not None:
            owned = req.owned or {}  # a subscription without owned partitions owns none
        elif req.member_epoch == 0:
            owned = {}
        nxt = reconcile(
            member,
            assignment_epoch,
            targets.get(member.member_id, {}),
            resolved[member.member_id],
            owned,
            group.owners({member.member_id} | gone),
        )
        changed = (
            nxt.member_epoch != member.member_epoch
            or nxt.previous_member_epoch != member.previous_member_epoch
            or nxt.state != member.state
            or nxt.assigned != member.assigned
            or nxt.pending_revocation != member.pending_revocation
        )
        if changed or is_new:
            updated = ConsumerMember(
                member.member_id,
                meta,
                nxt.member_epoch,
                nxt.previous_member_epoch,
                nxt.state,
                nxt.assigned,
                nxt.pending_revocation,
                nxt.epochs,
            )
            self._emit(
                _key(CURRENT_ASSIGNMENT_TYPE, group.group_id, member.member_id),
                updated.current_value(),
            )
        if nxt.state == MemberState.UNREVOKED_PARTITIONS:
            group.revocation_deadlines.setdefault(
                member.member_id, now_ms + meta.rebalance_timeout_ms
            )
        else:
            group.revocation_deadlines.pop(member.member_id, None)
        self.groups.setdefault(group.group_id, group)  # its records are replayed into it
        send = (
            req.member_epoch == 0
            or req.classic is not None
            or nxt.assigned != member.assigned
            or (req.owned is not None and req.owned != nxt.assigned)
        )
        return ConsumerHeartbeatResult(
            E.NONE,
            None,
            member.member_id,
            nxt.member_epoch,
            self.heartbeat_interval_ms(group.group_id),
            dict(nxt.assigned) if send else None,
        )

    def _assign(
        self,
        group: ConsumerGroup,
        subs: Mapping[str, ConsumerGroupMemberMetadataValue],
        resolved: Mapping[str, frozenset[uuid.UUID]],
        topics: Mapping[str, TopicInfo],
        targets: Mapping[str, Assignment],
        epoch: int,
    ) -> dict[str, Assignment]:
        """A new target assignment at ``epoch``: the records of the members' targets that
        changed, then the target's epoch."""
        by_id = {t.topic_id: t.partitions for t in topics.values()}
        previous = {mid: targets.get(mid, {}) for mid in subs}
        new_targets = ASSIGNORS[self._assignor(subs)](resolved, by_id, previous)
        for mid in sorted(subs):
            if mid not in targets or targets[mid] != new_targets[mid]:
                self._emit(
                    _key(TARGET_MEMBER_TYPE, group.group_id, mid),
                    TargetAssignmentMemberValue(new_targets[mid]),
                )
        self._emit(_key(TARGET_METADATA_TYPE, group.group_id), TargetAssignmentMetadataValue(epoch))
        return new_targets

    def _member_for(
        self, group: ConsumerGroup, req: ConsumerHeartbeat
    ) -> tuple[ConsumerMember, bool, str | None]:
        """The member the heartbeat is from as it is now, whether it is new (joins), and the
        static member it replaces, if any."""
        if req.classic is not None:
            # A classic JoinGroup: a member id the group does not know is a new member; a
            # known one rejoins keeping its assignment (what it still owns is reconciled).
            # A static member under a new member id replaces the one holding its instance id,
            # of either protocol (Kafka's classicGroupJoinToConsumerGroup): it takes over its
            # epoch and assignment, the old one is fenced (the caller checked the member id).
            prior = group.static_member(req.instance_id) if req.instance_id is not None else None
            if prior is not None and prior.member_id != req.member_id:
                return self._replace(group, prior, req.member_id), True, prior.member_id
            existing = group.members.get(req.member_id)
            if existing is not None:
                return existing, False, None
            if len(group.members) >= self.config.max_size:
                raise _Refused(E.GROUP_MAX_SIZE_REACHED, f"group {group.group_id} is full")
            return ConsumerMember(req.member_id, _empty_metadata()), True, None
        if req.member_epoch == 0:
            if len(group.members) >= self.config.max_size and req.member_id not in group.members:
                raise _Refused(E.GROUP_MAX_SIZE_REACHED, f"group {group.group_id} is full")
            mid = req.member_id or self._new_member_id()
            if req.instance_id is not None:
                prior = group.static_member(req.instance_id)
                if prior is not None and prior.member_id != mid:
                    if prior.member_epoch != STATIC_LEAVE_EPOCH:
                        raise _Refused(
                            E.UNRELEASED_INSTANCE_ID,
                            f"instance {req.instance_id} is still in use by another member",
                        )
                    # KIP-848 static membership: the new incarnation takes over the
                    # assignment of the one that left, without a rebalance.
                    self._delete_member(group, prior.member_id)
                    if prior.member_id in group.targets:
                        self._emit(
                            _key(TARGET_MEMBER_TYPE, group.group_id, mid),
                            TargetAssignmentMemberValue(group.targets[prior.member_id]),
                        )
                    taken = ConsumerMember(
                        mid,
                        prior.metadata,
                        0,
                        -1,
                        MemberState.STABLE,
                        dict(prior.assigned),
                        {},
                        prior.epochs_of(prior.assigned),
                    )
                    return taken, True, prior.member_id
            existing = group.members.get(mid)
            if existing is not None:
                # Rejoining with epoch 0: the member gave up what it had (KIP-848 fencing).
                self._delete_member(group, mid)
            return ConsumerMember(mid, _empty_metadata()), True, None
        member = group.members.get(req.member_id)
        if member is None and req.instance_id is not None and group.static_member(req.instance_id):
            # Its instance id went to a newer member (Kafka's throwIfInstanceIdIsFenced).
            raise _Refused(E.FENCED_INSTANCE_ID, "the static member was replaced")
        if member is None:
            raise _Refused(E.UNKNOWN_MEMBER_ID, f"member {req.member_id} is not in the group")
        if member.instance_id != req.instance_id and req.instance_id is not None:
            raise _Refused(E.FENCED_INSTANCE_ID, "the static member was replaced")
        if req.member_epoch > member.member_epoch:
            raise _Refused(E.FENCED_MEMBER_EPOCH, "the member epoch is ahead of the group's")
        if req.member_epoch < member.member_epoch:
            # A member that missed its last epoch bump may retry with the previous epoch,
            # as long as it does not claim partitions it no longer has.
            owned = req.owned or {}
            if (
                req.member_epoch != member.previous_member_epoch
                or req.owned is None
                or any(
                    parts - member.assigned.get(tid, frozenset()) for tid, parts in owned.items()
                )
            ):
                raise _Refused(E.FENCED_MEMBER_EPOCH, "the member epoch is fenced")
        return member, False, None

    def _replace(
        self, group: ConsumerGroup, prior: ConsumerMember, member_id: str
    ) -> ConsumerMember:
        """``member_id`` takes the place of the static member ``prior``, whose records go."""
        self._delete_member(group, prior.member_id)
        if prior.member_id in group.targets:
            self._emit(
                _key(TARGET_MEMBER_TYPE, group.group_id, member_id),
                TargetAssignmentMemberValue(group.targets[prior.member_id]),
            )
        return ConsumerMember(
            member_id,
            prior.metadata,
            prior.member_epoch,
            prior.previous_member_epoch,
            prior.state,
            dict(prior.assigned),
            dict(prior.pending_revocation),
            dict(prior.epochs),
        )

    def _leave(self, group: ConsumerGroup, req: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        member = group.members.get(req.member_id)
        if member is None and req.instance_id is not None:
            member = group.static_member(req.instance_id)
        if member is None:
            raise _Refused(E.UNKNOWN_MEMBER_ID, f"member {req.member_id} is not in the group")
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # The static member will be back: it keeps its assignment until then (or until
            # its session times out).
            left = ConsumerMember(
                member.member_id,
                member.metadata,
                STATIC_LEAVE_EPOCH,
                member.member_epoch,
                member.state,
                member.assigned,
                member.pending_revocation,
                member.epochs_of(member.assigned, member.pending_revocation),
            )
            self._emit(
                _key(CURRENT_ASSIGNMENT_TYPE, group.group_id, member.member_id),
                left.current_value(),
            )
        else:
            self.remove_member(group, member.member_id)
        # As Kafka, a member that left is given no heartbeat interval.
        return ConsumerHeartbeatResult(E.NONE, None, member.member_id, req.member_epoch, 0)

    def _delete_member(self, group: ConsumerGroup, member_id: str) -> None:
        for t in (CURRENT_ASSIGNMENT_TYPE, TARGET_MEMBER_TYPE, MEMBER_METADATA_TYPE):
            self._emit(_key(t, group.group_id, member_id), None)

    def remove_member(self, group: ConsumerGroup, member_id: str) -> bool:
        """The member is gone (left or fenced): its records go and the group epoch moves on,
        so the others get its partitions. If it was the last consumer-protocol member of a
        group whose other members are classic, the group may become a classic group instead
        (rule 38)."""
        group.regex_scopes.pop(member_id, None)
        if self.downgrade(group, member_id):
            return True
        self._delete_member(group, member_id)
        epoch = group.group_epoch + 1
        self._emit(_key(GROUP_METADATA_TYPE, group.group_id), ConsumerGroupMetadataValue(epoch))
        if not set(group.members) - {member_id}:
            # Nobody is left to heartbeat the new target in: as Kafka, the (empty) target
            # assignment is computed now, at the new epoch.
            self._emit(
                _key(TARGET_METADATA_TYPE, group.group_id), TargetAssignmentMetadataValue(epoch)
            )
        return False

    def _assignor(self, subs: Mapping[str, ConsumerGroupMemberMetadataValue]) -> str:
        """The assignor most members ask for; ties and no preference: the configured order."""
        configured = self.config.assignors
        votes = {name: 0 for name in configured}
        for md in subs.values():
            if md.server_assignor in votes:
                votes[md.server_assignor] += 1
        return max(configured, key=lambda n: (votes[n], -configured.index(n)))

    # == fencing ===================================================================================

    def next_deadline(self, group_id: str) -> int | None:
        """The earliest session or revocation deadline of the group's members, or None."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        deadlines = [
            d
            for table in (group.session_deadlines, group.revocation_deadlines)
            for mid, d in table.items()
            if mid in group.members
        ]
        return min(deadlines, default=None)

    def fire(self, group_id: str, now_ms: int) -> None:
        """End the sessions and revocations of ``group_id`` whose deadline has passed."""
        group = self.groups.get(group_id)
        if group is None:
            return
        for mid in list(group.members):
            session = group.session_deadlines.get(mid)
            revoke = group.revocation_deadlines.get(mid)
            if (session is not None and now_ms >= session) or (
                revoke is not None and now_ms >= revoke
            ):
                group.session_deadlines.pop(mid, None)
                group.revocation_deadlines.pop(mid, None)
                if self.remove_member(group, mid):
                    break  # the group is becoming a classic group

    # == admin =====================================================================================

    def describe(self, group_id: str) -> ConsumerGroupDescription:
        group = self.groups.get(group_id)
        if group is None:
            return ConsumerGroupDescription(
                group_id, E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."
            )
        members = tuple(
            ConsumerMemberDescription(
                m.member_id,
                m.metadata.instance_id,
                m.metadata.rack_id,
                m.member_epoch,
                m.metadata.client_id,
                m.metadata.client_host,
                m.metadata.subscribed_topic_names,
                m.metadata.subscribed_topic_regex,
                m.assigned,
                group.targets.get(m.member_id, {}),
                m.is_classic,
            )
            for m in group.members.values()
        )
        return ConsumerGroupDescription(
            group_id,
            E.NONE,
            None,
            group.state,
            group.group_epoch,
            group.assignment_epoch,
            self._assignor({m.member_id: m.metadata for m in group.members.values()}),
            members,
        )

    def validate_commit(
        self,
        group: ConsumerGroup,
        member_id: str,
        member_epoch: int,
        partitions: Iterable[tuple[uuid.UUID | None, int]] | None = None,
    ) -> ErrorCode:
        """OffsetCommit (``partitions``: the (topic id, partition) committed) or OffsetFetch
        (None) for a consumer group. The member's current epoch always passes; as Kafka 4.4
        (KIP-1251), a commit at an older epoch passes too if the member owns every partition
        since that epoch or before, so a commit racing its own epoch bump is not refused."""
        if not member_id and member_epoch < 0:
            # Not a member (admin tools, manual assignment): only while the group is empty.
            return E.NONE if not group.members else E.UNKNOWN_MEMBER_ID
        member = group.members.get(member_id)
        if member is None:
            return E.UNKNOWN_MEMBER_ID
        if member_epoch == member.member_epoch:
            return E.NONE
        # A classic member's generation is its member epoch (rule 38).
        stale = E.ILLEGAL_GENERATION if member.is_classic else E.STALE_MEMBER_EPOCH
        if member_epoch > member.member_epoch or partitions is None:
            return stale
        for topic_id, partition in partitions:
            since = None if topic_id is None else member.assignment_epoch(topic_id, partition)
            if since is None or member_epoch < since:
                return stale
        return E.NONE

    # == classic members of a consumer group (online migration, rule 38) ========================

    def classic_member(
        self, group: ConsumerGroup, member_id: str, instance_id: str | None, generation: int
    ) -> tuple[ErrorCode, ConsumerMember | None]:
        """Validate a classic member's SyncGroup or Heartbeat: Kafka's classic errors."""
        member = group.members.get(member_id)
        if member is None:
            if instance_id is not None and group.static_member(instance_id) is not None:
                return E.FENCED_INSTANCE_ID, None
            return E.UNKNOWN_MEMBER_ID, None
        if not member.is_classic:
            return E.UNKNOWN_MEMBER_ID, None  # a consumer-protocol member heartbeats otherwise
        if instance_id is not None and member.instance_id != instance_id:
            return E.FENCED_INSTANCE_ID, None
        if generation != member.member_epoch:
            return E.ILLEGAL_GENERATION, None
        return E.NONE, member

    def classic_heartbeat(
        self,
        group: ConsumerGroup,
        member_id: str,
        instance_id: str | None,
        generation: int,
        now_ms: int,
    ) -> ErrorCode:
        """A classic member's Heartbeat: it is told to rejoin (REBALANCE_IN_PROGRESS) when the
        group moved past its epoch, when it must give partitions up, or when partitions it
        waits for are free; it must rejoin within its rebalance timeout."""
        error, member = self.classic_member(group, member_id, instance_id, generation)
        if member is None:
            return error
        group.session_deadlines[member_id] = now_ms + member.session_timeout_ms(
            self.session_timeout_ms(group.group_id)
        )
        if (
            member.member_epoch < group.group_epoch
            or member.state == MemberState.UNREVOKED_PARTITIONS
            or (
                member.state == MemberState.UNRELEASED_PARTITIONS
                and not group.waiting_on_unreleased(member)
            )
        ):
            group.revocation_deadlines.setdefault(
                member_id, now_ms + member.metadata.rebalance_timeout_ms
            )
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def expect_sync(self, group: ConsumerGroup, member_id: str, deadline_ms: int) -> None:
        """A classic member joined: its SyncGroup is due by ``deadline_ms`` (Kafka's sync
        timeout, the rebalance timeout), or it is fenced as one that does not revoke."""
        group.revocation_deadlines.setdefault(member_id, deadline_ms)

    def classic_synced(self, group: ConsumerGroup, member: ConsumerMember, now_ms: int) -> None:
        """A classic member's SyncGroup: a heartbeat of its own session timeout, and the end
        of its sync timeout unless it still has partitions to give up (it must rejoin)."""
        classic = member.metadata.classic
        assert classic is not None
        group.session_deadlines[member.member_id] = now_ms + classic.session_timeout_ms
        if member.state != MemberState.UNREVOKED_PARTITIONS:
            group.revocation_deadlines.pop(member.member_id, None)

    def classic_leave(
        self, group: ConsumerGroup, members: list[tuple[str, str | None]]
    ) -> list[tuple[str, str | None, ErrorCode]]:
        """LeaveGroup of classic members (or of any member by id) of a consumer group."""
        results: list[tuple[str, str | None, ErrorCode]] = []
        for member_id, iid in members:
            member = group.members.get(member_id) if member_id else None
            if iid is not None:
                known = group.static_member(iid)
                if known is None:
                    results.append((member_id, iid, E.UNKNOWN_MEMBER_ID))
                    continue
                if member_id and known.member_id != member_id:
                    results.append((member_id, iid, E.FENCED_INSTANCE_ID))
                    continue
                member = known
            if member is None:
                results.append((member_id, iid, E.UNKNOWN_MEMBER_ID))
                continue
            self.remove_member(group, member.member_id)
            results.append((member_id, iid, E.NONE))
        return results

    def subscribes(self, group: ConsumerGroup, topic: str) -> bool:
        """Does a member subscribe to ``topic``, by name or by regex?"""
        for m in group.members.values():
            regex = m.metadata.subscribed_topic_regex
            if topic in m.metadata.subscribed_topic_names:
                return True
            if regex is not None:
                with contextlib.suppress(re2.error):
                    if _compile(regex).fullmatch(topic):
                        return True
        return False

    def delete(self, group: ConsumerGroup, joined: Iterable[str] = ()) -> None:
        """Tombstones for an empty group's records (and those of members ``joined`` by
        records not yet replayed)."""
        for mid in [*group.members, *joined]:
            self._delete_member(group, mid)
        self._emit(_key(TARGET_METADATA_TYPE, group.group_id), None)
        self._emit(_key(GROUP_METADATA_TYPE, group.group_id), None)

    # == replay ====================================================================================

    def replay(self, key: ConsumerGroupKey, value: ConsumerGroupValue | None, now_ms: int) -> None:
        group = self.groups.get(key.group)
        if key.type == GROUP_METADATA_TYPE and value is None:
            self.groups.pop(key.group, None)
            return
        if group is None:
            if value is None:
                return
            group = self.groups[key.group] = ConsumerGroup(key.group)
        group.replay(key, value, now_ms, self.session_timeout_ms(key.group))


# --- helpers ---------------------------------------------------------------------------------


def _validate(req: ConsumerHeartbeat, config: ConsumerConfig) -> None:
    def bad(message: str) -> _Refused:
        return _Refused(E.INVALID_REQUEST, message)

    if not req.group_id:
        raise _Refused(E.INVALID_GROUP_ID, "the group id is empty")
    if req.member_epoch < STATIC_LEAVE_EPOCH:
        raise bad(f"member epoch {req.member_epoch} is invalid")
    if req.member_epoch != 0 and not req.member_id:
        raise bad("the member id is required unless joining")
    if req.member_epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
        raise bad("epoch -2 is for static members, which have an instance id")
    if req.subscribed_topic_names is not None and req.subscribed_topic_regex is not None:
        raise bad("subscribe to topic names or a regex, not both")
    if req.member_epoch == 0:
        if req.rebalance_timeout_ms <= 0:
            raise bad("the rebalance timeout is required when joining")
        if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
            raise bad("a subscription is required when joining")
    if req.server_assignor is not None and req.server_assignor not in config.assignors:
        raise _Refused(E.UNSUPPORTED_ASSIGNOR, f"assignor {req.server_assignor} is not supported")
    if req.subscribed_topic_regex is not None:
        try:
            _compile(req.subscribed_topic_regex)
        except re2.error as exc:
            raise _Refused(E.INVALID_REGULAR_EXPRESSION, f"invalid regex: {exc!s}") from None


def _empty_metadata() -> ConsumerGroupMemberMetadataValue:
    return ConsumerGroupMemberMetadataValue(None, None, "", "", (), None, -1, None)


def _updated_metadata(
    old: ConsumerGroupMemberMetadataValue | None, req: ConsumerHeartbeat
) -> ConsumerGroupMemberMetadataValue:
    base = old or ConsumerGroupMemberMetadataValue(
        req.instance_id, req.rack_id, req.client_id, req.client_host, (), None, -1, None
    )
    names, regex = base.subscribed_topic_names, base.subscribed_topic_regex
    if req.subscribed_topic_names is not None:
        names, regex = tuple(sorted(set(req.subscribed_topic_names))), None
    elif req.subscribed_topic_regex is not None:
        names, regex = (), req.subscribed_topic_regex
    return ConsumerGroupMemberMetadataValue(
        req.instance_id if req.instance_id is not None else base.instance_id,
        req.rack_id if req.rack_id is not None else base.rack_id,
        req.client_id or base.client_id,
        req.client_host or base.client_host,
        names,
        regex,
        req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0 else base.rebalance_timeout_ms,
        req.server_assignor if req.server_assignor is not None else base.server_assignor,
        req.classic if req.classic is not None else base.classic,
    )


@functools.lru_cache(maxsize=256)  # every heartbeat resolves every member's subscription
def _compile(regex: str) -> Any:
    """KIP-848 regexes are RE2/J's syntax, as in Kafka; RE2 also matches in linear time, so a
    client's pattern cannot stall the coordinator (Python's ``re`` can backtrack for ever)."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(regex, options=options)


def _resolve(
    meta: ConsumerGroupMemberMetadataValue,
    topics: Mapping[str, TopicInfo],
    describable: frozenset[str] | None = None,
) -> frozenset[uuid.UUID]:
    """The ids of the existing topics a member subscribes to, by name or by regex; a regex
    matches only among the ``describable`` topics (None: all), as in Kafka 4.0."""
    if meta.subscribed_topic_regex is not None:
        try:
            pattern = _compile(meta.subscribed_topic_regex)
        except re2.error:
            return frozenset()
        return frozenset(
            t.topic_id
            for name, t in topics.items()
            if (describable is None or name in describable) and pattern.fullmatch(name)
        )
    return frozenset(topics[n].topic_id for n in meta.subscribed_topic_names if n in topics)


def _signature(
    resolved: Mapping[str, frozenset[uuid.UUID]], topics: Mapping[str, TopicInfo]
) -> tuple[tuple[str, uuid.UUID, int], ...]:
    wanted = frozenset().union(*resolved.values()) if resolved else frozenset()
    return tuple(
        sorted((t.name, t.topic_id, t.partitions) for t in topics.values() if t.topic_id in wanted)
    )
