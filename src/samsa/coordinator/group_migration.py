"""Online migration of a group between the classic and the consumer protocol (rule 38,
``group.consumer.migration.policy``), Kafka's ``GroupMetadataManager`` conversions.

Theory of operation
-------------------
A consumer-protocol member joining a classic group with members converts it
(:meth:`GroupMigration.upgrade`); the classic members of a consumer group are served by
translating their JoinGroup/SyncGroup into the consumer group's operations
(:meth:`GroupMigration.classic_join`, :meth:`GroupMigration.classic_sync`; their Heartbeat and
LeaveGroup are ``ConsumerGroups``'); and the last consumer-protocol member leaving converts
it back (:meth:`GroupMigration.downgrade`, the hook ``ConsumerGroups`` is given). Each
conversion is tombstones of the old kind's records followed by the new kind's records, so
replay rebuilds whichever group the log last said; until they are replayed the registry
holds the conversion in flight (``group_registry.py``), undone if the write fails.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping

from samsa.coordinator.classic_group_coordinator import (
    GroupConfig,
    JoinRequest,
    JoinResult,
    Output,
    Owed,
    SyncResult,
)
from samsa.coordinator.consumer_group import ConsumerGroup, ConsumerMember, MemberState
from samsa.coordinator.consumer_group_coordinator import (
    ConsumerGroups,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    TopicInfo,
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
from samsa.coordinator.group_registry import GroupRegistry
from samsa.coordinator.offsets_records import GroupMetadataKey
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


class GroupMigration:
    def __init__(
        self,
        config: GroupConfig,
        registry: GroupRegistry,
        consumer: ConsumerGroups,
        out: Output,
        topics: Callable[[], Mapping[str, TopicInfo]],
        new_member_id: Callable[[str], str],
    ) -> None:
        self.config = config
        self.registry = registry
        self.consumer = consumer
        self._out = out
        # The cluster's topics: partitions are named by id in consumer groups, by name in the
        # classic protocol.
        self.topics = topics
        self._new_member_id = new_member_id

    def upgrade_refused(self, classic: Group, req: ConsumerHeartbeat) -> str | None:
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

    def upgrade(
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
        mark = len(self._out.records)
        try:
            records = _consumer_records_of(classic, topics)
        except ConsumerProtocolError as exc:
            return ConsumerHeartbeatResult(
                E.GROUP_ID_NOT_FOUND,
                f"cannot upgrade group {gid}: its consumer protocol is malformed ({exc})",
                req.member_id or None,
            )
        self._out.emit(GroupMetadataKey(gid), None)
        cgroup = ConsumerGroup(gid)
        for key, value in records:
            self._out.emit(key, value)
            # The heartbeat below needs the converted group before its records are replayed
            # (replaying them again later changes nothing).
            cgroup.replay(key, value, now_ms, self.config.consumer.session_timeout_ms)
        self.registry.upgrade(classic, cgroup)
        result = self.consumer.heartbeat(req, topics, now_ms)
        if result.error != E.NONE:
            self.registry.undo_upgrade(classic)
            del self._out.records[mark:]
            return result
        # Members waiting for a JoinGroup or SyncGroup answer rejoin the consumer group.
        for m in classic.members.values():
            if m.awaiting_join:
                self._out.reply(
                    Owed.JOIN, classic.group_id, m.member_id, JoinResult(E.REBALANCE_IN_PROGRESS)
                )
            if m.awaiting_sync:
                self._out.reply(
                    Owed.SYNC, classic.group_id, m.member_id, SyncResult(E.REBALANCE_IN_PROGRESS)
                )
        self.registry.upgrade_written(classic)
        log.info("group %s: upgraded from classic to consumer group", gid)
        return result

    def classic_join(self, cgroup: ConsumerGroup, req: JoinRequest, now_ms: int) -> JoinResult:
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
            group = self.downgrade(cgroup, replaced.member_id, joining)
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
        self.consumer.expect_sync(cgroup, member_id, now_ms + req.rebalance_timeout_ms)
        return JoinResult(
            E.NONE, member_id, result.member_epoch, PROTOCOL_TYPE, supported[0], "", False, ()
        )

    def classic_sync(
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
        self.consumer.classic_synced(cgroup, member, now_ms)
        names = {t.topic_id: t.name for t in self.topics().values()}
        return SyncResult(
            E.NONE,
            PROTOCOL_TYPE,
            protocol_name or protocols[0],
            _classic_assignment(member.assigned, names),
        )

    def downgrade_on_leave(self, cgroup: ConsumerGroup, leaving_id: str) -> bool:
        """Kafka's validateOnlineDowngradeWithFencedMember and convertToClassicGroup: when
        the last consumer-protocol member of a group whose other members are classic leaves
        (or is fenced), the consumer group's records are tombstoned and a classic group of
        the others is written at the group epoch; once replayed it rebalances, so each member
        rejoins the classic way."""
        return self.downgrade(cgroup, leaving_id, None) is not None

    def downgrade(
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
        self._out.emit(GroupMetadataKey(gid), group.to_record(0))
        self.registry.downgrade_written(group)
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


# --- helpers --------------------------------------------------------------------------------


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
