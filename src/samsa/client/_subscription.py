"""What the consumer reads: its subscribed topics, its assignment and a position per partition.

An :class:`Assignment` is replaced, never edited, when the partitions change (assign(), a
group's new assignment, a fence): the old one is marked inactive, so work started for it (a
committed-offset or ListOffsets lookup in flight, which a lost response can stretch to
``request.timeout.ms``) sees that its answer is stale and drops it, rather than writing an
old offset into the new assignment's positions (as aiokafka's ``Assignment.active``).
Within one assignment only seeks, resets, validations and handed-out records move the
positions.

Each partition is in one :class:`FetchState` (Kafka's ``SubscriptionState.FetchStates``):

* ``INITIALIZING``: no position yet; the group's committed offset, else ``auto.offset.reset``;
* ``AWAIT_RESET``: the position is reset by ``auto.offset.reset`` alone (the fetch offset was
  out of range, or a truncation left no offset to go back to);
* ``AWAIT_VALIDATION``: a position read in a known leader epoch, to check with the current
  leader (OffsetForLeaderEpoch, KIP-320) before fetching from it;
* ``FETCHING``: the position is fetched from.

A position carries the leader epoch of the record before it (``offset_epoch``: the last
record handed out, or the one a commit recorded) and the (leader, epoch) it was last checked
against. When the metadata names another leader or epoch, a position with an epoch is
validated again: a leader elected uncleanly, or one that lost an unreplicated write, may
have truncated the log below it, and fetching on would skip the records written in place of
the lost ones.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from samsa.client._errors import KafkaError
from samsa.client._types import OffsetAndEpoch, TopicPartition
from samsa.protocol.errors import ErrorCode

NO_EPOCH = -1


class FetchState(enum.Enum):
    INITIALIZING = "initializing"
    AWAIT_RESET = "await_reset"
    AWAIT_VALIDATION = "await_validation"
    FETCHING = "fetching"


class Truncation(NamedTuple):
    """What validation found when the policy is ``none``: the position, and the first offset
    known to diverge with its epoch (None: the leader knows no offset for the epoch)."""

    tp: TopicPartition
    position: OffsetAndEpoch
    divergent: OffsetAndEpoch | None


@dataclass(slots=True)
class PartitionState:
    state: FetchState = FetchState.INITIALIZING
    offset: int | None = None
    offset_epoch: int = NO_EPOCH  # the leader epoch of the record before ``offset``
    # the (leader node, leader epoch) this position was last checked against (None: not yet)
    leader: tuple[int, int] | None = None


@dataclass(slots=True, eq=False)
class Assignment:
    """The partitions assigned at one time and their positions."""

    states: dict[TopicPartition, PartitionState] = field(default_factory=dict)
    active: bool = True

    @property
    def partitions(self) -> list[TopicPartition]:
        return list(self.states)

    @property
    def positions(self) -> dict[TopicPartition, int | None]:
        """The positions (None: to be looked up), a copy."""
        return {tp: s.offset for tp, s in self.states.items()}


class SubscriptionState:
    def __init__(self) -> None:
        self.topics: list[str] = []  # subscribed (group-managed assignment) when not empty
        self.assignment = Assignment()

    def assign(self, tps: list[TopicPartition], *, keep_positions: bool = True) -> Assignment:
        """Replace the assignment; a partition kept keeps its position unless told not to
        (a classic group's new generation starts from the committed offsets)."""
        old = self.assignment
        old.active = False
        states = {}
        for tp in dict.fromkeys(tps):
            kept = old.states.get(tp) if keep_positions else None
            states[tp] = replace(kept) if kept is not None else PartitionState()
        self.assignment = Assignment(states)
        return self.assignment

    @property
    def positions(self) -> dict[TopicPartition, int | None]:
        return self.assignment.positions

    def partitions(self) -> list[TopicPartition]:
        return self.assignment.partitions

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self.assignment.states

    def state(self, tp: TopicPartition) -> PartitionState | None:
        return self.assignment.states.get(tp)

    def position(self, tp: TopicPartition) -> int | None:
        s = self.assignment.states.get(tp)
        return s.offset if s is not None else None

    def fetching(self, tp: TopicPartition) -> bool:
        s = self.assignment.states.get(tp)
        return s is not None and s.state is FetchState.FETCHING

    def _assigned(self, tp: TopicPartition) -> PartitionState:
        s = self.assignment.states.get(tp)
        if s is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} is not assigned")
        return s

    def seek(self, tp: TopicPartition, offset: int | None) -> None:
        """The application's seek: no epoch, so nothing to validate (Java's seek(tp, long));
        None looks the position up again."""
        s = self._assigned(tp)
        if offset is None:
            s.state, s.offset, s.offset_epoch = FetchState.INITIALIZING, None, NO_EPOCH
        else:
            s.state, s.offset, s.offset_epoch = FetchState.FETCHING, offset, NO_EPOCH

    def seek_unvalidated(self, tp: TopicPartition, offset: int, epoch: int) -> None:
        """A position restored with the epoch it was read in (a committed offset): checked
        with the current leader before it is fetched from."""
        s = self._assigned(tp)
        s.offset, s.offset_epoch, s.leader = offset, epoch, None
        s.state = FetchState.AWAIT_VALIDATION if epoch >= 0 else FetchState.FETCHING

    def reset(self, tp: TopicPartition, offset: int) -> None:
        """The position ``auto.offset.reset`` found (ListOffsets): fetched without validation,
        as Java's consumer (the log start or end needs none)."""
        s = self._assigned(tp)
        s.state, s.offset, s.offset_epoch = FetchState.FETCHING, offset, NO_EPOCH

    def request_reset(self, tp: TopicPartition) -> None:
        s = self._assigned(tp)
        s.state, s.offset, s.offset_epoch = FetchState.AWAIT_RESET, None, NO_EPOCH

    def advance(self, tp: TopicPartition, offset: int, epoch: int | None = None) -> None:
        """Records up to ``offset`` handed out (``epoch``: the last one's leader epoch), or
        skipped batches passed (epoch unchanged)."""
        s = self.assignment.states[tp]
        s.offset = offset
        if epoch is not None:
            s.offset_epoch = epoch

    def maybe_validate(self, tp: TopicPartition, leader: tuple[int, int] | None) -> bool:
        """The metadata's (leader, epoch) for ``tp``: a position not yet checked against it
        awaits validation if both epochs are known (else it is fetched as it is). True while
        the partition awaits validation."""
        s = self.assignment.states.get(tp)
        if s is None or s.offset is None or leader is None:
            return False
        if s.leader != leader:
            s.leader = leader
            known = s.offset_epoch >= 0 and leader[1] >= 0
            s.state = FetchState.AWAIT_VALIDATION if known else FetchState.FETCHING
        return s.state is FetchState.AWAIT_VALIDATION

    def complete_validation(
        self,
        tp: TopicPartition,
        asked: OffsetAndEpoch,
        end: OffsetAndEpoch,
        *,
        can_reset: bool,
    ) -> Truncation | None:
        """The leader's answer to OffsetForLeaderEpoch(``asked.leader_epoch``): where that
        epoch ends in its log (``end``; -1 both: unknown to it). A position beyond the end
        was truncated away: with a reset policy the position goes back to the end (the first
        offset known to diverge; to the policy's offset when there is none), else the
        :class:`Truncation` is returned for the caller to raise. An answer for a position
        that moved meanwhile is dropped, as Java's consumer."""
        s = self.assignment.states.get(tp)
        if s is None or s.state is not FetchState.AWAIT_VALIDATION:
            return None
        if (s.offset, s.offset_epoch) != asked:
            return None
        if end.offset < 0 or end.leader_epoch < 0:
            if can_reset:
                self.request_reset(tp)
                return None
            return Truncation(tp, asked, None)
        assert s.offset is not None
        if end.offset < s.offset:
            if can_reset:  # back to where the logs diverge: nothing after it is skipped
                s.state, s.offset, s.offset_epoch = FetchState.FETCHING, end[0], end[1]
                return None
            return Truncation(tp, asked, end)
        s.state = FetchState.FETCHING
        return None

    def skip_validation(self, tp: TopicPartition) -> None:
        """The leader cannot validate (a broker before KIP-320): fetched as it is."""
        s = self.assignment.states.get(tp)
        if s is not None and s.state is FetchState.AWAIT_VALIDATION:
            s.state = FetchState.FETCHING

    def awaiting_validation(self) -> dict[TopicPartition, OffsetAndEpoch]:
        return {
            tp: OffsetAndEpoch(s.offset, s.offset_epoch)
            for tp, s in self.assignment.states.items()
            if s.state is FetchState.AWAIT_VALIDATION and s.offset is not None
        }

    def committable(self) -> dict[TopicPartition, OffsetAndEpoch]:
        """The positions known with their epochs, as an offset commit takes them."""
        return {
            tp: OffsetAndEpoch(s.offset, s.offset_epoch)
            for tp, s in self.assignment.states.items()
            if s.offset is not None
        }
