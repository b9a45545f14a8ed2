"""A share partition (KIP-932) under random acquisitions, acknowledgements, releases, members
leaving, log-start moves and passing time, on a fake clock: no record is ever held by two
members; a record is delivered at most ``delivery_count_limit`` times, each delivery counted
once; a finished record (accepted, rejected, archived) is never delivered again; the record
locks stay within their bound; the SPSO only moves forward, past finished records; and the
persisted state batches restore the same partition, locks aside."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from samsa.coordinator.share_partition import (
    AcknowledgeType,
    RecordState,
    SharePartition,
)
from samsa.protocol.errors import ErrorCode as E

LOCK = 100
LIMIT = 3
LOCKS = 12
MEMBERS = st.sampled_from(["a", "b", "c"])


class SharePartitionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.p = SharePartition(
            0, lock_duration_ms=LOCK, delivery_count_limit=LIMIT, max_in_flight=LOCKS
        )
        self.now = 0
        self.log_end = 0  # the log grows; the partition acquires from it
        self.holder: dict[int, str] = {}  # the model: who holds what
        self.deliveries: dict[int, int] = {}
        self.finished: set[int] = set()
        self.last_start = 0

    def _sync_expired(self) -> None:
        # Whatever the partition no longer shows as ACQUIRED by its holder was given back.
        for offset, member in list(self.holder.items()):
            if self.p.state(offset) is not RecordState.ACQUIRED or self.p.owner(offset) != member:
                del self.holder[offset]
        for offset in range(self.last_start, self.p.start_offset):
            self.finished.add(offset)

    @rule(n=st.integers(1, 6))
    def produce(self, n: int) -> None:
        self.log_end += n

    @rule(member=MEMBERS, skip=st.integers(0, 4), cap=st.none() | st.integers(1, 5))
    def acquire(self, member: str, skip: int, cap: int | None) -> None:
        first = self.p.next_fetch_offset() + skip
        if first >= self.log_end:
            return
        got = self.p.acquire(member, first, self.log_end - 1, self.now, max_records=cap)
        self._sync_expired()
        count = 0
        for r in got:
            for offset in range(r.first_offset, r.last_offset + 1):
                assert offset not in self.holder, "held twice"
                assert offset not in self.finished, "a finished record redelivered"
                self.deliveries[offset] = self.deliveries.get(offset, 0) + 1
                assert r.delivery_count == self.deliveries[offset]
                assert r.delivery_count <= LIMIT
                self.holder[offset] = member
                count += 1
        assert cap is None or count <= cap

    @rule(
        member=MEMBERS,
        kind=st.sampled_from(list(AcknowledgeType)),
        which=st.integers(0, 50),
        length=st.integers(1, 4),
    )
    def acknowledge(self, member: str, kind: AcknowledgeType, which: int, length: int) -> None:
        mine = sorted(o for o, m in self.holder.items() if m == member)
        first = mine[which % len(mine)] if mine else which
        last = first + length - 1
        valid = all(self.holder.get(o) == member for o in range(first, last + 1))
        error = self.p.acknowledge(member, first, last, kind)
        assert (error is E.NONE) == valid
        if valid:
            for offset in range(first, last + 1):
                del self.holder[offset]
                if kind is not AcknowledgeType.RELEASE or self.deliveries[offset] >= LIMIT:
                    self.finished.add(offset)
        self._sync_expired()

    @rule(member=MEMBERS)
    def leave(self, member: str) -> None:
        held = sum(1 for m in self.holder.values() if m == member)
        assert self.p.release_member(member) == held
        self._sync_expired()

    @rule(ms=st.integers(1, 2 * LOCK))
    def tick(self, ms: int) -> None:
        self.now += ms
        self.p.expire_locks(self.now)
        for offset in list(self.holder):
            if self.deliveries[offset] >= LIMIT and self.p.state(offset) is RecordState.ARCHIVED:
                self.finished.add(offset)
        self._sync_expired()

    @rule(by=st.integers(1, 3))
    def delete_records(self, by: int) -> None:
        target = min(self.p.start_offset + by, self.log_end)
        self.p.move_start(target)
        self._sync_expired()

    @invariant()
    def window(self) -> None:
        p = self.p
        assert self.last_start <= p.start_offset <= p.end_offset
        assert p.in_flight <= LOCKS
        assert p.start_offset == p.end_offset or p.state(p.start_offset) not in (
            RecordState.ACKNOWLEDGED,
            RecordState.ARCHIVED,
        )
        self.last_start = p.start_offset

    @invariant()
    def holders_match(self) -> None:
        for offset in range(self.p.start_offset, self.p.end_offset):
            owner = self.p.owner(offset)
            assert owner == self.holder.get(offset)
            assert self.p.delivery_count(offset) <= LIMIT
            if owner is not None:
                assert self.p.state(offset) is RecordState.ACQUIRED

    @invariant()
    def persisted_state_restores(self) -> None:
        q = SharePartition.restore(
            self.p.start_offset,
            self.p.state_batches(),
            lock_duration_ms=LOCK,
            delivery_count_limit=LIMIT,
            max_in_flight=LOCKS,
        )
        assert (q.start_offset, q.end_offset) == (self.p.start_offset, self.p.end_offset)
        for offset in range(q.start_offset, q.end_offset):
            before = self.p.state(offset)
            expected = RecordState.AVAILABLE if before is RecordState.ACQUIRED else before
            assert q.state(offset) is expected
            assert q.delivery_count(offset) == self.p.delivery_count(offset)


SharePartitionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_share_partition_machine = SharePartitionMachine.TestCase
