"""One consumer group of KIP-848's consumer protocol: epochs, members and reconciliation.

Theory of operation
-------------------
The group has a *group epoch*, bumped whenever what the assignment depends on changes (a
member joins, leaves or changes its subscription; a subscribed topic gains partitions), and
a *target assignment* computed by the server-side assignor at some epoch, the *assignment
epoch*. Each member moves towards its target on its own, one heartbeat at a time, and has a
*member epoch*: the assignment epoch it has reconciled to.

A partition is never owned by two members: a member is given a partition of its target only
once no other member owns it (owns = assigned, or pending revocation). So a move is two
steps. The old owner is told to revoke (state UNREVOKED_PARTITIONS, its member epoch stays)
and reports, in a later heartbeat, that it no longer owns the partition; only then is it
released, and the new owner, which waited at the new epoch in UNRELEASED_PARTITIONS, gets
it at its next heartbeat (docs/semantics.md, rules 34-35). :func:`reconcile` is that rule.

Durable state (epochs, members' metadata, targets, current assignments) is what the records
of ``consumer_group_records.py`` hold and changes only in :meth:`ConsumerGroup.replay`.
Deadlines (session, revocation) are in memory, as in Kafka: after a restart members have a
fresh session timeout to heartbeat again.

This module is pure: no I/O, no clocks.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

from samsa.coordinator.consumer_group_records import (
    CURRENT_ASSIGNMENT_TYPE,
    GROUP_METADATA_TYPE,
    MEMBER_METADATA_TYPE,
    TARGET_MEMBER_TYPE,
    TARGET_METADATA_TYPE,
    Assignment,
    AssignmentEpochs,
    ConsumerGroupKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataValue,
    ConsumerGroupValue,
    CurrentMemberAssignmentValue,
    TargetAssignmentMemberValue,
    TargetAssignmentMetadataValue,
    spelled_out,
)

LEAVE_EPOCH = -1  # a member leaving the group
STATIC_LEAVE_EPOCH = -2  # a static member leaving for now: its assignment waits for it


class MemberState(enum.IntEnum):
    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    metadata: ConsumerGroupMemberMetadataValue
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    # The epoch each partition (assigned or pending revocation) was assigned at (KIP-1251):
    # a commit carrying an older member epoch is still the member's for such a partition.
    epochs: AssignmentEpochs = field(default_factory=dict)

    @property
    def instance_id(self) -> str | None:
        return self.metadata.instance_id

    @property
    def is_classic(self) -> bool:
        """A member speaking the classic protocol (JoinGroup/SyncGroup/Heartbeat) in a
        consumer group, during an online migration (rule 38)."""
        return self.metadata.classic is not None

    def session_timeout_ms(self, default: int) -> int:
        classic = self.metadata.classic
        return classic.session_timeout_ms if classic is not None else default

    def current_value(self) -> CurrentMemberAssignmentValue:
        return CurrentMemberAssignmentValue(
            self.member_epoch,
            self.previous_member_epoch,
            int(self.state),
            self.assigned,
            self.pending_revocation,
            self.epochs,
        )

    def epochs_of(self, *assignments: Assignment) -> AssignmentEpochs:
        """The assignment epochs of ``assignments``' partitions, every one spelled out."""
        return spelled_out(self.epochs, self.member_epoch, *assignments)

    def assignment_epoch(self, topic_id: uuid.UUID, partition: int) -> int | None:
        """The epoch the member was given the partition at, None if it does not own it."""
        if partition in self.assigned.get(topic_id, ()) or partition in (
            self.pending_revocation.get(topic_id, ())
        ):
            return self.epochs.get((topic_id, partition), self.member_epoch)
        return None


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    # As Kafka (4.4's ModernGroup): a new group is at epoch 1 before any record says so,
    # its target at 0; so the first member's heartbeat computes a target at epoch 1, or at
    # 2 if its subscription bumps the group.
    group_epoch: int = 1
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    targets: dict[str, Assignment] = field(default_factory=dict)
    # -- in memory only --
    # The subscribed topics' (name, id, partition count) the target was computed for; None
    # after loading, so the first heartbeat recomputes it; () for a group a heartbeat makes.
    topics_signature: tuple[tuple[str, uuid.UUID, int], ...] | None = None
    session_deadlines: dict[str, int] = field(default_factory=dict)
    revocation_deadlines: dict[str, int] = field(default_factory=dict)
    # The topics each member's principal may Describe, as its last heartbeat said (None: all);
    # its regex resolves among them only (Kafka 4.0). A member not heard from since loading
    # resolves within the scope of the member whose heartbeat is being handled, as Kafka
    # resolves a group's regexes with the context of the heartbeat that refreshes them.
    regex_scopes: dict[str, frozenset[str] | None] = field(default_factory=dict)

    # -- state ---------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """Kafka's ConsumerGroupState name."""
        if not self.members:
            return "Empty"
        if self.assignment_epoch != self.group_epoch:
            return "Assigning"
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state != MemberState.STABLE:
                return "Reconciling"
        return "Stable"

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    def owners(self, except_members: Set[str]) -> dict[tuple[uuid.UUID, int], str]:
        """Who owns each partition (assigned or pending revocation), but ``except_members``."""
        out: dict[tuple[uuid.UUID, int], str] = {}
        for m in self.members.values():
            if m.member_id in except_members:
                continue
            for assignment in (m.assigned, m.pending_revocation):
                for tid, parts in assignment.items():
                    for p in parts:
                        out[(tid, p)] = m.member_id
        return out

    def waiting_on_unreleased(self, member: ConsumerMember) -> bool:
        """Is a partition of the member's target still owned by another member?"""
        if member.state != MemberState.UNRELEASED_PARTITIONS:
            return False
        owners = self.owners({member.member_id})
        for tid, parts in self.targets.get(member.member_id, {}).items():
            have = member.assigned.get(tid, frozenset())
            if any((tid, p) in owners for p in parts - have):
                return True
        return False

    # -- replay --------------------------------------------------------------------------------

    def replay(
        self,
        key: ConsumerGroupKey,
        value: ConsumerGroupValue | None,
        now_ms: int,
        session_timeout_ms: int,
    ) -> None:
        mid = key.member_id or ""
        if key.type == GROUP_METADATA_TYPE:
            if isinstance(value, ConsumerGroupMetadataValue):
                self.group_epoch = value.epoch
        elif key.type == TARGET_METADATA_TYPE:
            if isinstance(value, TargetAssignmentMetadataValue):
                self.assignment_epoch = value.assignment_epoch
        elif key.type == MEMBER_METADATA_TYPE:
            if value is None:
                self.members.pop(mid, None)
                self.session_deadlines.pop(mid, None)
                self.revocation_deadlines.pop(mid, None)
            elif isinstance(value, ConsumerGroupMemberMetadataValue):
                member = self.members.get(mid)
                if member is None:
                    member = self.members[mid] = ConsumerMember(mid, value)
                    timeout = member.session_timeout_ms(session_timeout_ms)
                    self.session_deadlines.setdefault(mid, now_ms + timeout)
                else:
                    member.metadata = value
        elif key.type == TARGET_MEMBER_TYPE:
            if value is None:
                self.targets.pop(mid, None)
            elif isinstance(value, TargetAssignmentMemberValue):
                self.targets[mid] = dict(value.partitions)
        elif key.type == CURRENT_ASSIGNMENT_TYPE and isinstance(
            value, CurrentMemberAssignmentValue
        ):
            member = self.members.get(mid)
            if member is None:  # written before its metadata: Kafka's order avoids this
                return
            member.member_epoch = value.member_epoch
            member.previous_member_epoch = value.previous_member_epoch
            try:
                member.state = MemberState(value.state)
            except ValueError:
                member.state = MemberState.UNKNOWN
            member.assigned = dict(value.assigned)
            member.pending_revocation = dict(value.pending_revocation)
            member.epochs = dict(value.epochs)


# --- reconciliation ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reconciled:
    member_epoch: int
    previous_member_epoch: int
    state: MemberState
    assigned: Assignment
    pending_revocation: Assignment
    epochs: AssignmentEpochs


def _owns_any(owned: Assignment | None, pending: Assignment) -> bool:
    """Does the member still report owning a partition it was told to revoke? Unknown (the
    heartbeat did not say) counts as yes."""
    if not pending:
        return False
    if owned is None:
        return True
    return any(owned.get(tid, frozenset()) & parts for tid, parts in pending.items())


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    target: Assignment,
    subscribed: frozenset[uuid.UUID],
    owned: Assignment | None,
    owners: Mapping[tuple[uuid.UUID, int], str],
) -> Reconciled:
    """The member's next state towards ``target`` at ``target_epoch`` (Kafka's
    CurrentAssignmentBuilder): ``owned`` is what its heartbeat reports owning (None if it did
    not say), ``owners`` who else owns which partition."""
    unchanged = Reconciled(
        member.member_epoch,
        member.previous_member_epoch,
        member.state,
        member.assigned,
        member.pending_revocation,
        member.epochs,
    )
    if member.state == MemberState.STABLE and member.member_epoch == target_epoch:
        return unchanged
    if member.state == MemberState.UNREVOKED_PARTITIONS and _owns_any(
        owned, member.pending_revocation
    ):
        return unchanged
    assigned: Assignment = {}
    revoke: Assignment = {}
    wanted: Assignment = {}
    unreleased = False
    for tid in set(target) | set(member.assigned):
        goal = target.get(tid, frozenset()) if tid in subscribed else frozenset()
        current = member.assigned.get(tid, frozenset())
        keep = current & goal
        if keep:
            assigned[tid] = keep
        if current - keep:
            revoke[tid] = current - keep
        free = set()
        for p in goal - keep:
            if (tid, p) in owners:
                unreleased = True
            else:
                free.add(p)
        if free:
            wanted[tid] = frozenset(free)
    epoch = member.member_epoch
    # A partition the member keeps keeps the epoch it was assigned at (KIP-1251); one it is
    # given now is assigned at the target epoch.
    epochs = member.epochs_of(assigned)
    if revoke and _owns_any(owned, revoke):
        # First the member gives up what must go; its epoch stays until it has.
        epochs |= member.epochs_of(revoke)
        return Reconciled(epoch, epoch, MemberState.UNREVOKED_PARTITIONS, assigned, revoke, epochs)
    for tid, parts in wanted.items():
        assigned[tid] = assigned.get(tid, frozenset()) | parts
        epochs.update(((tid, p), target_epoch) for p in parts)
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return Reconciled(target_epoch, epoch, state, assigned, {}, epochs)


def assignment_size(assignment: Assignment) -> int:
    return sum(len(p) for p in assignment.values())
