"""One consumer group of Kafka's classic protocol: its states and members (its committed offsets
are ``offsets.py``'s).

Theory of operation
-------------------
A group moves through five states; which state may follow which is data
(:data:`VALID_PREVIOUS_STATES`, as in Kafka's ``ClassicGroupState``) and every transition is
checked against it::

    Empty ──join──▶ PreparingRebalance ──all joined / rebalance timeout──▶ CompletingRebalance
      ▲                 ▲        │                                          │ leader's SyncGroup
      └── last member ──┘        └──── no member left ──▶ Empty             ▼ record replayed
          left/expired  ◀───────── join, leave, expiry, new metadata ──── Stable
    any state ──▶ Dead (group deleted, or expired with nothing left)

A group has two kinds of state. *Durable* state — the metadata of the
last completed generation (protocol, generation id, leader, members with their subscription
and assignment) — is exactly what ``__consumer_offsets`` records hold, and it changes only
when those records are replayed (see ``classic_group_coordinator.py``). *Membership in flight* —
who has rejoined, pending member ids, heartbeat and rebalance deadlines — is not durable in
Kafka either: after a coordinator restart, clients rejoin or heartbeat against the loaded
generation. That part lives only in memory and is changed by the operations directly.

This module is pure: no I/O, no clocks; times are passed in as ``now_ms``.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from samsa.coordinator.offsets_records import GroupMetadataValue, MemberMetadata


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.PREPARING_REBALANCE: frozenset({S.EMPTY, S.COMPLETING_REBALANCE, S.STABLE}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.DEAD: frozenset({S.EMPTY, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.STABLE, S.DEAD}),
}


class IllegalStateTransition(RuntimeError):
    pass


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # in the member's order of preference
    assignment: bytes = b""
    awaiting_join: bool = False  # a JoinGroup response is owed to it
    awaiting_sync: bool = False  # a SyncGroup response is owed to it
    synced: bool = True  # sent SyncGroup in the current generation
    heartbeat_deadline_ms: int = 0
    is_new: bool = False  # joined during the current rebalance

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    state_timestamp_ms: int = -1
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: dict[str, int] = field(default_factory=dict)  # member id -> deadline
    stored: GroupMetadataValue | None = None  # the last replayed GroupMetadata record
    # PreparingRebalance: when the join phase ends at the latest.
    join_deadline_ms: int | None = None
    # Kafka's InitialDelayedJoin: the first rebalance of an empty group waits
    # group.initial.rebalance.delay.ms, again and again while members keep arriving.
    initial_delay_remaining_ms: int | None = None
    new_member_added: bool = False
    # CompletingRebalance: members that have not sent SyncGroup by then are removed.
    sync_deadline_ms: int | None = None

    # -- states ------------------------------------------------------------------------------

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalStateTransition(
                f"group {self.group_id}: {self.state.value} -> {target.value} is not a valid "
                "transition"
            )
        self.state = target
        self.state_timestamp_ms = now_ms

    # -- members -----------------------------------------------------------------------------

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        iid = member.group_instance_id
        if iid is not None and self.static_members.get(iid) == member_id:
            del self.static_members[iid]
        if self.leader_id == member_id:
            # Prefer a member that has already rejoined, as Kafka does.
            joined = [m.member_id for m in self.members.values() if m.awaiting_join]
            rest = list(self.members)
            self.leader_id = (joined or rest or [None])[0]
        return member

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        return member

    def is_static_member_fenced(self, member_id: str, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        known = self.static_members.get(instance_id)
        return known is not None and known != member_id

    def is_unknown_instance(self, instance_id: str | None) -> bool:
        """A static member's instance id that names no member (Kafka: UNKNOWN_MEMBER_ID)."""
        return instance_id is not None and instance_id not in self.static_members

    def has_all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    # -- protocols ---------------------------------------------------------------------------

    def candidate_protocols(self) -> list[str]:
        """Protocols every member supports, in the first member's order of preference."""
        members = list(self.members.values())
        if not members:
            return []
        common = set(members[0].protocol_names())
        for m in members[1:]:
            common &= set(m.protocol_names())
        return [p for p in members[0].protocol_names() if p in common]

    def supports_protocols(self, protocol_type: str, protocols: list[str]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        return protocol_type == self.protocol_type and bool(
            set(protocols) & set(self.candidate_protocols())
        )

    def select_protocol(self) -> str:
        """Each member votes for its most preferred candidate; the most votes win."""
        candidates = self.candidate_protocols()
        votes: Counter[str] = Counter()
        for m in self.members.values():
            votes[next(p for p in m.protocol_names() if p in candidates)] += 1
        return max(candidates, key=lambda p: votes[p])  # ties: the first candidate

    def subscribed_topics(self) -> frozenset[str] | None:
        """Topics the members of a ``consumer`` protocol group subscribe to; None if not known
        (another protocol type, no protocol chosen yet, a subscription that does not parse)."""
        from samsa.coordinator.offsets_records import subscribed_topics

        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            mine = subscribed_topics(m.metadata(self.protocol_name))
            if mine is None:
                return None
            topics |= mine
        return frozenset(topics)

    # -- durable form ------------------------------------------------------------------------

    def to_record(self, now_ms: int) -> GroupMetadataValue:
        return GroupMetadataValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation,
            protocol=self.protocol_name,
            leader=self.leader_id,
            current_state_timestamp=now_ms,
            members=tuple(
                MemberMetadata(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata(self.protocol_name),
                    m.assignment,
                )
                for m in self.members.values()
            ),
        )

    def load(self, value: GroupMetadataValue, now_ms: int) -> None:
        """Become the group a GroupMetadata record describes (coordinator start-up)."""
        self.generation = value.generation
        self.protocol_type = value.protocol_type or None
        self.protocol_name = value.protocol
        self.leader_id = value.leader
        self.state_timestamp_ms = value.current_state_timestamp
        self.members = {}
        self.static_members = {}
        for mm in value.members:
            self.add(
                Member(
                    member_id=mm.member_id,
                    group_instance_id=mm.group_instance_id,
                    client_id=mm.client_id,
                    client_host=mm.client_host,
                    rebalance_timeout_ms=mm.rebalance_timeout,
                    session_timeout_ms=mm.session_timeout,
                    protocol_type=value.protocol_type,
                    protocols=[(value.protocol or "", mm.subscription)],
                    assignment=mm.assignment,
                    heartbeat_deadline_ms=now_ms + mm.session_timeout,
                )
            )
        self.leader_id = value.leader
        # Kafka's loading rule: a group with members is Stable, otherwise Empty.
        self.state = GroupState.STABLE if self.members else GroupState.EMPTY
        self.stored = value

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
