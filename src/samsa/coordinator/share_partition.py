"""One partition of a share group (KIP-932): which of its records are in flight, in what state,
delivered how often, and locked by whom until when. Pure: no I/O, no clock (``now_ms`` comes in).

The in-flight records are those between the share-partition start offset (SPSO, the first
record not yet finished with) and the share-partition end offset (SPEO). Here the SPEO is
exclusive: the first offset never yet acquired, so ``end_offset - start_offset`` is the number
of record locks the partition holds, bounded by ``max_in_flight``
(``group.share.partition.max.record.locks``). A record is

- AVAILABLE: may be acquired (again); its delivery count says how often it was;
- ACQUIRED: delivered to one member, locked until its deadline
  (``share.record.lock.duration.ms``); at the deadline it goes back to AVAILABLE, or to
  ARCHIVED when it has been delivered ``delivery_count_limit`` times (a poison record);
- ACKNOWLEDGED (accepted) or ARCHIVED (rejected, over the limit, a gap or an aborted record):
  finished. The SPSO moves past finished records at the front, which then leave memory.

States keep Kafka's wire values (``RecordState``), so describe and persist calls use them as is.
Acknowledgements are all-or-nothing per range: every offset must be ACQUIRED by the member
acknowledging, else nothing changes and the answer is INVALID_RECORD_STATE, as Kafka's
SharePartition does for a batch.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

from ..protocol.errors import ErrorCode


class RecordState(enum.IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AcknowledgeType(enum.IntEnum):
    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


_FINISHED = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@dataclass(frozen=True)
class AcquiredRange:
    """Offsets ``first_offset..last_offset`` (inclusive) handed to a member, all delivered
    ``delivery_count`` times: ShareFetch's AcquiredRecords."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True)
class StateBatch:
    """A run of consecutive offsets in one state with one delivery count: the unit Kafka's
    share coordinator persists (ShareSnapshot/ShareUpdate's StateBatches)."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int


@dataclass(slots=True)
class _InFlight:
    state: RecordState
    delivery_count: int
    member_id: str | None = None
    deadline_ms: int = 0


class SharePartition:
    def __init__(
        self,
        start_offset: int = 0,
        *,
        lock_duration_ms: int = 30_000,
        delivery_count_limit: int = 5,
        max_in_flight: int = 2000,
    ) -> None:
        if delivery_count_limit < 1 or max_in_flight < 1 or lock_duration_ms < 1:
            raise ValueError("share partition limits must be positive")
        self.lock_duration_ms = lock_duration_ms
        self.delivery_count_limit = delivery_count_limit
        self.max_in_flight = max_in_flight
        self._start = start_offset
        self._end = start_offset
        # offset -> state for every offset in [start, end); a dict, not ranges: the bound
        # (max_in_flight) keeps it small, and acknowledgements split ranges anywhere.
        self._records: dict[int, _InFlight] = {}

    # -- reading

    @property
    def start_offset(self) -> int:
        """SPSO: the first offset not yet finished with."""
        return self._start

    @property
    def end_offset(self) -> int:
        """SPEO (exclusive): the first offset never acquired."""
        return self._end

    @property
    def in_flight(self) -> int:
        return self._end - self._start

    def state(self, offset: int) -> RecordState:
        """The state of any offset: below the SPSO finished (ARCHIVED, as Kafka answers), at
        or past the SPEO not yet delivered (AVAILABLE)."""
        if offset < self._start:
            return RecordState.ARCHIVED
        record = self._records.get(offset)
        return RecordState.AVAILABLE if record is None else record.state

    def delivery_count(self, offset: int) -> int:
        record = self._records.get(offset)
        return 0 if record is None else record.delivery_count

    def owner(self, offset: int) -> str | None:
        record = self._records.get(offset)
        return record.member_id if record is not None else None

    def next_fetch_offset(self) -> int:
        """Where a fetch for this partition should read from: the first AVAILABLE in-flight
        offset (a redelivery), else the SPEO."""
        for offset in range(self._start, self._end):
            if self._records[offset].state is RecordState.AVAILABLE:
                return offset
        return self._end

    def next_deadline(self) -> int | None:
        """The earliest lock deadline, for the caller's timer."""
        deadlines = [
            r.deadline_ms for r in self._records.values() if r.state is RecordState.ACQUIRED
        ]
        return min(deadlines, default=None)

    def finished_in_flight(self) -> int:
        """Records between the SPSO and SPEO already acknowledged or archived (the lag of
        DescribeShareGroupOffsets leaves them out)."""
        return sum(1 for r in self._records.values() if r.state in _FINISHED)

    def acquired_by(self, member_id: str) -> list[int]:
        return [o for o, r in self._records.items() if r.member_id == member_id]

    # -- acquiring

    def acquire(
        self,
        member_id: str,
        first_offset: int,
        last_offset: int,
        now_ms: int,
        *,
        max_records: int | None = None,
    ) -> list[AcquiredRange]:
        """Acquire for ``member_id`` the offsets ``first_offset..last_offset`` a fetch read from
        the log (whole batches): the AVAILABLE in-flight ones and new ones past the SPEO, up to
        ``max_records`` and the partition's lock bound. Offsets between the SPEO and a later
        ``first_offset`` are not in the log (compacted away): they are archived."""
        self.expire_locks(now_ms)
        budget = max_records if max_records is not None else last_offset - first_offset + 1
        deadline = now_ms + self.lock_duration_ms
        taken: list[tuple[int, int]] = []  # (offset, delivery count), ascending
        offset = max(first_offset, self._start)
        if offset > self._end:
            if self._start == self._end:  # nothing in flight: the window jumps
                self._start = self._end = offset
            elif offset - self._start <= self.max_in_flight:
                for gap in range(self._end, offset):
                    self._records[gap] = _InFlight(RecordState.ARCHIVED, 0)
                self._end = offset
            else:
                return []
        while offset <= last_offset and budget > 0:
            record = self._records.get(offset)
            if record is None:  # past the SPEO: a new in-flight record, if a lock is left
                if self._end - self._start >= self.max_in_flight:
                    break
                record = self._records[offset] = _InFlight(RecordState.AVAILABLE, 0)
                self._end = offset + 1
            if record.state is RecordState.AVAILABLE:
                record.state = RecordState.ACQUIRED
                record.delivery_count += 1
                record.member_id = member_id
                record.deadline_ms = deadline
                taken.append((offset, record.delivery_count))
                budget -= 1
            offset += 1
        self._advance()
        return list(_ranges(taken))

    # -- finishing

    def acknowledge(
        self, member_id: str, first_offset: int, last_offset: int, kind: AcknowledgeType
    ) -> ErrorCode:
        """Accept, release, reject (or mark as gaps) offsets ``member_id`` holds."""
        if first_offset > last_offset or first_offset < self._start or last_offset >= self._end:
            return ErrorCode.INVALID_RECORD_STATE
        span = [self._records[o] for o in range(first_offset, last_offset + 1)]
        if any(r.state is not RecordState.ACQUIRED or r.member_id != member_id for r in span):
            return ErrorCode.INVALID_RECORD_STATE
        for record in span:
            if kind is AcknowledgeType.ACCEPT:
                self._finish(record, RecordState.ACKNOWLEDGED)
            elif kind is AcknowledgeType.RELEASE:
                self._release(record)
            else:  # REJECT, GAP: never to be delivered
                self._finish(record, RecordState.ARCHIVED)
        self._advance()
        return ErrorCode.NONE

    def release_member(self, member_id: str) -> int:
        """A member left (or its share session closed): what it holds becomes available
        again (archived at the delivery limit). Returns how many records it held."""
        held = [r for r in self._records.values() if r.member_id == member_id]
        for record in held:
            self._release(record)
        self._advance()
        return len(held)

    def expire_locks(self, now_ms: int) -> int:
        """Records whose lock has run out go back as if released. Returns how many."""
        expired = [
            r
            for r in self._records.values()
            if r.state is RecordState.ACQUIRED and r.deadline_ms <= now_ms
        ]
        for record in expired:
            self._release(record)
        self._advance()
        return len(expired)

    def archive(self, first_offset: int, last_offset: int) -> None:
        """Records never to be delivered (aborted transactions under read_committed, control
        batches): AVAILABLE ones in flight and new ones past the SPEO are archived."""
        offset = max(first_offset, self._start)
        while offset <= last_offset:
            record = self._records.get(offset)
            if record is None:
                if offset != self._end or self._end - self._start >= self.max_in_flight:
                    break
                record = self._records[offset] = _InFlight(RecordState.AVAILABLE, 0)
                self._end = offset + 1
            if record.state is RecordState.AVAILABLE:
                record.state = RecordState.ARCHIVED
            offset += 1
        self._advance()

    def move_start(self, offset: int) -> None:
        """The log start moved (retention, DeleteRecords): records before it are gone."""
        while self._start < min(offset, self._end):
            del self._records[self._start]
            self._start += 1
        if offset > self._end:
            self._start = self._end = offset
        self._advance()

    # -- persisting

    def state_batches(self) -> list[StateBatch]:
        """The in-flight records as runs for the share coordinator. An ACQUIRED record is
        persisted as AVAILABLE with its delivery count: a lock does not survive a restart,
        but the delivery does (Kafka's share coordinator keeps the same)."""
        runs: list[StateBatch] = []
        for offset in range(self._start, self._end):
            record = self._records[offset]
            state = RecordState.AVAILABLE if record.state is RecordState.ACQUIRED else record.state
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.state is state
                and last.delivery_count == record.delivery_count
            ):
                runs[-1] = StateBatch(last.first_offset, offset, state, last.delivery_count)
            else:
                runs.append(StateBatch(offset, offset, state, record.delivery_count))
        return runs

    @classmethod
    def restore(
        cls,
        start_offset: int,
        batches: list[StateBatch],
        *,
        lock_duration_ms: int = 30_000,
        delivery_count_limit: int = 5,
        max_in_flight: int = 2000,
    ) -> SharePartition:
        """The partition as persisted: the SPSO and the runs after it (a gap between runs is
        records not yet delivered)."""
        partition = cls(
            start_offset,
            lock_duration_ms=lock_duration_ms,
            delivery_count_limit=delivery_count_limit,
            max_in_flight=max_in_flight,
        )
        for batch in sorted(batches, key=lambda b: b.first_offset):
            for offset in range(max(batch.first_offset, start_offset), batch.last_offset + 1):
                for missing in range(partition._end, offset):
                    partition._records[missing] = _InFlight(RecordState.AVAILABLE, 0)
                state = (
                    RecordState.AVAILABLE if batch.state is RecordState.ACQUIRED else batch.state
                )
                partition._records[offset] = _InFlight(state, batch.delivery_count)
                partition._end = max(partition._end, offset + 1)
        partition._advance()
        return partition

    # -- internals

    def _release(self, record: _InFlight) -> None:
        if record.delivery_count >= self.delivery_count_limit:
            self._finish(record, RecordState.ARCHIVED)
        else:
            record.state = RecordState.AVAILABLE
            record.member_id = None
            record.deadline_ms = 0

    @staticmethod
    def _finish(record: _InFlight, state: RecordState) -> None:
        record.state = state
        record.member_id = None
        record.deadline_ms = 0

    def _advance(self) -> None:
        # The SPSO moves past the finished records at the front, freeing their locks.
        while self._start < self._end and self._records[self._start].state in _FINISHED:
            del self._records[self._start]
            self._start += 1


def _ranges(taken: list[tuple[int, int]]) -> Iterator[AcquiredRange]:
    """Consecutive offsets of one delivery count as one range."""
    run: list[int] | None = None  # [first, last, count]
    for offset, count in taken:
        if run is not None and offset == run[1] + 1 and count == run[2]:
            run[1] = offset
            continue
        if run is not None:
            yield AcquiredRange(run[0], run[1], run[2])
        run = [offset, offset, count]
    if run is not None:
        yield AcquiredRange(run[0], run[1], run[2])
