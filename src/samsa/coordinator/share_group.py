"""Share groups' membership (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe, as Kafka's
group coordinator serves them. Pure: time comes in as ``now_ms``.

Theory of operation
-------------------
A share group's members do not own partitions: several members may be assigned one partition
and the share partitions (``share_partition.py``) decide who gets which record. So there is no
revocation and no reconciliation, unlike a KIP-848 consumer group: a change of members or
subscriptions bumps the group epoch, the target assignment is recomputed at once by the simple
assignor, and every member takes it at its next heartbeat (its epoch becomes the group's).

The simple assignor, as Kafka's: for each topic, the members subscribed to it share its
partitions. With no more members than partitions each partition goes to one member
(round-robin over the sorted members); with more members than partitions each member gets one
partition, so several members share each (round-robin over the partitions). No member is left
without work while a subscribed topic has partitions.

Bounded: at most ``max_size`` members per group (``group.share.max.size``, else
GROUP_MAX_SIZE_REACHED) and ``max_groups`` share groups (``group.share.max.groups``).
A member that stops heartbeating leaves after ``session_timeout_ms``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from samsa.coordinator.consumer_group_coordinator import TopicInfo
from samsa.protocol.errors import ErrorCode

E = ErrorCode

# topic id -> partitions
Assignment = dict[uuid.UUID, frozenset[int]]

ASSIGNOR = "simple"
LEAVE_EPOCH = -1
MAX_MEMBER_ID_LENGTH = 36  # as Kafka: a share consumer's id is a UUID's string


@dataclass(frozen=True, slots=True)
class ShareConfig:
    session_timeout_ms: int = 45_000  # group.share.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.share.heartbeat.interval.ms
    max_size: int = 200  # group.share.max.size
    max_groups: int = 10  # group.share.max.groups


@dataclass(frozen=True, slots=True)
class ShareHeartbeat:
    """A ShareGroupHeartbeat request; None fields mean "unchanged since the last one"."""

    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: tuple[str, ...] | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class ShareHeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None  # None: unchanged since the member's last answer


@dataclass(slots=True)
class ShareMember:
    member_id: str
    member_epoch: int = 0
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed: tuple[str, ...] = ()
    assignment: Assignment = field(default_factory=dict)
    session_deadline_ms: int = 0


@dataclass(frozen=True, slots=True)
class ShareMemberDescription:
    member_id: str
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    assignment: Assignment


@dataclass(frozen=True, slots=True)
class ShareGroupDescription:
    group_id: str
    error: ErrorCode
    message: str | None = None
    state: str = "Dead"
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ASSIGNOR
    members: tuple[ShareMemberDescription, ...] = ()


@dataclass(slots=True)
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    # The subscribed topics' ids and partition counts the assignment was made for.
    metadata: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed}


def simple_assign(
    members: Mapping[str, tuple[str, ...]], topics: Mapping[str, TopicInfo]
) -> dict[str, Assignment]:
    """Kafka's simple share assignor over ``members`` (id -> subscribed topic names)."""
    out: dict[str, Assignment] = {m: {} for m in members}
    for name in sorted({t for subs in members.values() for t in subs}):
        info = topics.get(name)
        if info is None or info.partitions <= 0:
            continue
        subscribers = sorted(m for m, subs in members.items() if name in subs)
        pairs: list[tuple[str, int]]
        if len(subscribers) <= info.partitions:
            pairs = [(subscribers[p % len(subscribers)], p) for p in range(info.partitions)]
        else:
            pairs = [(m, i % info.partitions) for i, m in enumerate(subscribers)]
        for member, p in pairs:
            owned = out[member].get(info.topic_id, frozenset())
            out[member][info.topic_id] = owned | {p}
    return out


class ShareGroups:
    """Every share group the coordinator knows, and their heartbeats, descriptions and
    session deadlines."""

    def __init__(self, config: ShareConfig | None = None) -> None:
        self.config = config or ShareConfig()
        self.groups: dict[str, ShareGroup] = {}
        # Called as (group, member) when a member leaves or its session runs out: the broker
        # closes its share session and releases its records (membership is not replayed, so
        # this never fires twice for one departure).
        self.on_leave: list[Callable[[str, str], None]] = []
        # Called with the group id when an empty share group is deleted (DeleteGroups): the
        # broker deletes its share partitions' state, as Kafka's share coordinator does.
        self.on_delete: list[Callable[[str], None]] = []

    def heartbeat(
        self, req: ShareHeartbeat, topics: Mapping[str, TopicInfo], now_ms: int
    ) -> ShareHeartbeatResult:
        refused = self._validate(req)
        if refused is not None:
            return refused
        group = self.groups.get(req.group_id)
        if req.member_epoch == LEAVE_EPOCH:
            if group is not None and req.member_id in group.members:
                self._remove(group, req.member_id, topics)
            return ShareHeartbeatResult(E.NONE, None, req.member_id, LEAVE_EPOCH)
        if group is None:
            if req.member_epoch != 0:
                # Membership is not stored (D-SHARE-2): after a restart a member's group is
                # gone, and UNKNOWN_MEMBER_ID makes it join again where Kafka's group would
                # still be there.
                return ShareHeartbeatResult(E.UNKNOWN_MEMBER_ID, f"unknown member {req.member_id}")
            if len(self.groups) >= self.config.max_groups:
                return ShareHeartbeatResult(
                    E.GROUP_MAX_SIZE_REACHED, "the maximum number of share groups is reached"
                )
            group = self.groups[req.group_id] = ShareGroup(req.group_id)
        member = group.members.get(req.member_id)
        if member is None:
            if req.member_epoch != 0:
                return ShareHeartbeatResult(E.UNKNOWN_MEMBER_ID, f"unknown member {req.member_id}")
            if len(group.members) >= self.config.max_size:
                return ShareHeartbeatResult(
                    E.GROUP_MAX_SIZE_REACHED,
                    f"share group {group.group_id} has reached its maximum size",
                )
            member = group.members[req.member_id] = ShareMember(req.member_id)
            changed = True
        elif req.member_epoch not in (0, member.member_epoch):
            return ShareHeartbeatResult(
                E.FENCED_MEMBER_EPOCH,
                f"member epoch {req.member_epoch} is not the current {member.member_epoch}",
            )
        else:
            changed = False
        member.client_id, member.client_host = req.client_id, req.client_host
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.subscribed_topic_names is not None:
            subscribed = tuple(sorted(set(req.subscribed_topic_names)))
            changed = changed or subscribed != member.subscribed
            member.subscribed = subscribed
        member.session_deadline_ms = now_ms + self.config.session_timeout_ms
        if changed:
            group.group_epoch += 1
        self._assign(group, topics, changed)
        # The assignment goes out with each new epoch, and to a member (re)joining.
        send = req.member_epoch != group.group_epoch
        member.member_epoch = group.group_epoch
        return ShareHeartbeatResult(
            E.NONE,
            None,
            member.member_id,
            member.member_epoch,
            self.config.heartbeat_interval_ms,
            dict(member.assignment) if send else None,
        )

    def _validate(self, req: ShareHeartbeat) -> ShareHeartbeatResult | None:
        if not req.group_id:
            return ShareHeartbeatResult(E.INVALID_REQUEST, "GroupId can't be empty.")
        if not req.member_id:
            return ShareHeartbeatResult(E.INVALID_REQUEST, "MemberId can't be empty.")
        if len(req.member_id) > MAX_MEMBER_ID_LENGTH:
            return ShareHeartbeatResult(
                E.INVALID_REQUEST,
                f"MemberId can't be longer than {MAX_MEMBER_ID_LENGTH} characters.",
            )
        if req.member_epoch < LEAVE_EPOCH:
            return ShareHeartbeatResult(E.INVALID_REQUEST, "MemberEpoch is invalid.")
        if req.member_epoch == 0 and not req.subscribed_topic_names:
            return ShareHeartbeatResult(
                E.INVALID_REQUEST, "SubscribedTopicNames must be set in first request."
            )
        return None

    def _assign(self, group: ShareGroup, topics: Mapping[str, TopicInfo], changed: bool) -> None:
        """A new target assignment when the members or their subscriptions changed, or the
        subscribed topics did (created, grown: Kafka compares a hash of their metadata, and
        its change is a group epoch bump of its own)."""
        metadata = {
            name: (topics[name].topic_id, topics[name].partitions)
            for name in sorted(group.subscribed_topics())
            if name in topics
        }
        if metadata != group.metadata:
            group.metadata = metadata
            group.group_epoch += 1
            changed = True
        if not changed:
            return
        target = simple_assign({m.member_id: m.subscribed for m in group.members.values()}, topics)
        group.assignment_epoch = group.group_epoch
        for member_id, assignment in target.items():
            group.members[member_id].assignment = assignment

    def _remove(self, group: ShareGroup, member_id: str, topics: Mapping[str, TopicInfo]) -> None:
        del group.members[member_id]
        group.group_epoch += 1
        self._assign(group, topics, True)
        for listener in self.on_leave:
            listener(group.group_id, member_id)

    # -- timers

    def fire(self, group_id: str, topics: Mapping[str, TopicInfo], now_ms: int) -> list[str]:
        """Members whose session is over leave; returns their ids."""
        group = self.groups.get(group_id)
        if group is None:
            return []
        gone = [m.member_id for m in group.members.values() if m.session_deadline_ms <= now_ms]
        for member_id in gone:
            self._remove(group, member_id, topics)
        return gone

    def next_deadline(self, group_id: str) -> int | None:
        group = self.groups.get(group_id)
        if group is None:
            return None
        return min((m.session_deadline_ms for m in group.members.values()), default=None)

    def delete(self, group_id: str) -> ErrorCode:
        """DeleteGroups: only a share group without members goes (its state with it)."""
        group = self.groups.get(group_id)
        if group is None:
            return E.GROUP_ID_NOT_FOUND
        if group.members:
            return E.NON_EMPTY_GROUP
        del self.groups[group_id]
        for listener in self.on_delete:
            listener(group_id)
        return E.NONE

    # -- reading

    def is_member(self, group_id: str, member_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and member_id in group.members

    def describe(self, group_id: str) -> ShareGroupDescription:
        group = self.groups.get(group_id)
        if group is None:
            return ShareGroupDescription(
                group_id, E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."
            )
        return ShareGroupDescription(
            group_id,
            E.NONE,
            None,
            group.state,
            group.group_epoch,
            group.assignment_epoch,
            ASSIGNOR,
            tuple(
                ShareMemberDescription(
                    m.member_id,
                    m.rack_id,
                    m.member_epoch,
                    m.client_id,
                    m.client_host,
                    m.subscribed,
                    dict(m.assignment),
                )
                for m in group.members.values()
            ),
        )

    def list(self, states: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(group id, state) of every share group, optionally of some states (any case)."""
        wanted = {s.lower() for s in states}
        return [
            (g.group_id, g.state)
            for g in self.groups.values()
            if not wanted or g.state.lower() in wanted
        ]
