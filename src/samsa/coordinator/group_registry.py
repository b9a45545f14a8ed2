"""Every group the group coordinator knows, of either kind, and the rule that a group id names
one kind: a classic group (``group.py``) or a KIP-848 consumer group (``consumer_group.py``).

Theory of operation
-------------------
The registry holds the two maps and is the only place an id moves from one to the other.
Durable moves happen at replay (rule 26): a consumer group's record replayed ends the classic
group of the id (:meth:`GroupRegistry.replay_consumer`); a GroupMetadata record replayed
after an online downgrade installs the classic group it describes
(:meth:`GroupRegistry.take_downgraded`). An online upgrade (rule 38) needs the consumer group
before its records are replayed, as the joining member's heartbeat runs against it: the
registry swaps the groups at once and keeps the classic one until the records are replayed,
so a write that fails puts it back (:meth:`GroupRegistry.write_failed`).

The maps are plain dicts, shared with ``ClassicGroups`` and ``ConsumerGroups``, which look
groups up and, for the consumer kind, replay records into them.
"""

from __future__ import annotations

from samsa.coordinator.consumer_group import ConsumerGroup
from samsa.coordinator.consumer_group_records import ConsumerGroupValue
from samsa.coordinator.group import Group, GroupState


class GroupRegistry:
    def __init__(self) -> None:
        self.classic: dict[str, Group] = {}
        self.consumer: dict[str, ConsumerGroup] = {}
        # Conversions written but not yet replayed: the classic group an upgrade replaced
        # (back if the write fails), the classic group a downgrade wrote (in once replayed).
        self._upgrading: dict[str, Group] = {}
        self._downgrading: dict[str, Group] = {}

    def knows(self, group_id: str) -> bool:
        return group_id in self.classic or group_id in self.consumer

    def only_classic(self, group_id: str) -> Group | None:
        """The classic group of the id, if no consumer group has it (yet)."""
        return None if group_id in self.consumer else self.classic.get(group_id)

    # -- online migration (rule 38) ------------------------------------------------------------

    def upgrade(self, classic: Group, cgroup: ConsumerGroup) -> None:
        """The id names ``cgroup`` from now on (its records are being written)."""
        self.consumer[cgroup.group_id] = cgroup
        del self.classic[classic.group_id]

    def undo_upgrade(self, classic: Group) -> None:
        """The upgrade was refused before anything was written."""
        del self.consumer[classic.group_id]
        self.classic[classic.group_id] = classic

    def upgrade_written(self, classic: Group) -> None:
        """The upgrade's records go to the log: ``classic`` comes back if they are not
        written."""
        self._upgrading[classic.group_id] = classic

    def downgrade_written(self, group: Group) -> None:
        """A downgrade's records go to the log: ``group`` takes over once replayed."""
        self._downgrading[group.group_id] = group

    def take_downgraded(self, group_id: str) -> Group | None:
        """The classic group a downgrade wrote, now replayed: it names the id from now on."""
        group = self._downgrading.pop(group_id, None)
        if group is not None:
            self.classic[group_id] = group
        return group

    # -- replay and failed writes --------------------------------------------------------------

    def replay_consumer(self, group_id: str, value: ConsumerGroupValue | None) -> None:
        """A consumer group's record is replayed: the classic group of the id ends (an empty
        one, or one with members: an online upgrade, whose tombstone of the classic metadata
        came first)."""
        classic = self.classic.get(group_id)
        if classic is not None and (value is not None or not classic.members):
            del self.classic[group_id]
        if value is not None:
            self._upgrading.pop(group_id, None)

    def offsets_only(self, group_id: str) -> None:
        """An offset commit of an id that names no group was replayed: a group only storing
        offsets (a "simple" consumer's)."""
        if not self.knows(group_id):
            self.classic[group_id] = Group(group_id)

    def end_classic(self, group: Group, offsets_left: bool, now_ms: int) -> None:
        """The metadata of an empty classic group was deleted: it is Dead, unless its
        offsets outlive it (then it only stores offsets)."""
        gid = group.group_id
        if offsets_left and gid not in self.consumer:
            self.classic[gid] = Group(gid)
        else:
            group.transition_to(GroupState.DEAD, now_ms)
            del self.classic[gid]

    def write_failed(self, group_id: str) -> bool:
        """A record of the group was not written: a conversion in flight is undone (True if
        it was an upgrade: the classic group is back); a consumer group whose first
        heartbeat was not stored is forgotten."""
        upgraded = self._upgrading.pop(group_id, None)
        if upgraded is not None:
            self.consumer.pop(group_id, None)
            self.classic[group_id] = upgraded
            return True
        self._downgrading.pop(group_id, None)
        cgroup = self.consumer.get(group_id)
        if cgroup is not None and not cgroup.members and cgroup.assignment_epoch == 0:
            del self.consumer[group_id]
        return False
