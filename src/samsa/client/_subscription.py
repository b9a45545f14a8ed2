"""What the consumer reads: its subscribed topics, its assignment and a position per partition.

An :class:`Assignment` is replaced, never edited, when the partitions change (assign(), a
group's new assignment, a fence): the old one is marked inactive, so work started for it (a
committed-offset or ListOffsets lookup in flight, which a lost response can stretch to
``request.timeout.ms``) sees that its answer is stale and drops it, rather than writing an
old offset into the new assignment's positions (as aiokafka's ``Assignment.active``).
Within one assignment only seeks and handed-out records move the positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from samsa.client._errors import KafkaError
from samsa.client._types import TopicPartition
from samsa.protocol.errors import ErrorCode


@dataclass(slots=True, eq=False)
class Assignment:
    """The partitions assigned at one time and their positions (None: to be looked up)."""

    positions: dict[TopicPartition, int | None] = field(default_factory=dict)
    active: bool = True

    @property
    def partitions(self) -> list[TopicPartition]:
        return list(self.positions)


class SubscriptionState:
    def __init__(self) -> None:
        self.topics: list[str] = []  # subscribed (group-managed assignment) when not empty
        self.assignment = Assignment()

    def assign(self, tps: list[TopicPartition], *, keep_positions: bool = True) -> Assignment:
        """Replace the assignment; a partition kept keeps its position unless told not to
        (a classic group's new generation starts from the committed offsets)."""
        old = self.assignment
        old.active = False
        self.assignment = Assignment(
            {tp: old.positions.get(tp) if keep_positions else None for tp in dict.fromkeys(tps)}
        )
        return self.assignment

    @property
    def positions(self) -> dict[TopicPartition, int | None]:
        return self.assignment.positions

    def partitions(self) -> list[TopicPartition]:
        return self.assignment.partitions

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self.assignment.positions

    def position(self, tp: TopicPartition) -> int | None:
        return self.assignment.positions.get(tp)

    def seek(self, tp: TopicPartition, offset: int | None) -> None:
        if tp not in self.assignment.positions:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} is not assigned")
        self.assignment.positions[tp] = offset

    def committable(self) -> dict[TopicPartition, int]:
        """The positions known, as an offset commit takes them."""
        return {tp: p for tp, p in self.assignment.positions.items() if p is not None}
