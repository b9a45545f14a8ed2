"""The share-partition state machine (KIP-932) on a fake clock: acquisition locks, delivery
counts, acknowledgements, the SPSO/SPEO window and its bound."""

from __future__ import annotations

from samsa.coordinator.share_partition import (
    AcknowledgeType as Ack,
)
from samsa.coordinator.share_partition import (
    AcquiredRange,
    RecordState,
    SharePartition,
    StateBatch,
)
from samsa.protocol.errors import ErrorCode as E

LOCK = 1000


def part(**kw: int) -> SharePartition:
    return SharePartition(0, lock_duration_ms=LOCK, delivery_count_limit=3, **kw)


def test_two_members_never_hold_the_same_record() -> None:
    p = part()
    assert p.acquire("a", 0, 4, now_ms=0) == [AcquiredRange(0, 4, 1)]
    assert p.acquire("b", 0, 9, now_ms=0) == [AcquiredRange(5, 9, 1)]
    assert (p.start_offset, p.end_offset) == (0, 10)
    assert p.owner(3) == "a" and p.owner(7) == "b"


def test_accepting_the_front_moves_the_start_offset() -> None:
    p = part()
    p.acquire("a", 0, 9, now_ms=0)
    assert p.acknowledge("a", 2, 4, Ack.ACCEPT) is E.NONE
    assert p.start_offset == 0  # 0 and 1 still held
    assert p.acknowledge("a", 0, 1, Ack.ACCEPT) is E.NONE
    assert p.start_offset == 5 and p.in_flight == 5
    assert p.state(3) is RecordState.ARCHIVED  # below the SPSO: finished


def test_only_the_holder_may_acknowledge_and_a_bad_range_changes_nothing() -> None:
    p = part()
    p.acquire("a", 0, 4, now_ms=0)
    p.acquire("b", 5, 9, now_ms=0)
    assert p.acknowledge("b", 3, 6, Ack.ACCEPT) is E.INVALID_RECORD_STATE
    assert p.acknowledge("a", 0, 12, Ack.ACCEPT) is E.INVALID_RECORD_STATE
    assert p.acknowledge("a", 4, 3, Ack.ACCEPT) is E.INVALID_RECORD_STATE
    assert all(p.state(o) is RecordState.ACQUIRED for o in range(10))
    assert p.acknowledge("a", 0, 0, Ack.ACCEPT) is E.NONE
    assert p.acknowledge("a", 0, 0, Ack.ACCEPT) is E.INVALID_RECORD_STATE  # already done


def test_a_released_record_is_redelivered_with_a_higher_count() -> None:
    p = part()
    p.acquire("a", 0, 2, now_ms=0)
    assert p.acknowledge("a", 1, 1, Ack.RELEASE) is E.NONE
    assert p.next_fetch_offset() == 1
    assert p.acquire("b", 0, 5, now_ms=10) == [AcquiredRange(1, 1, 2), AcquiredRange(3, 5, 1)]


def test_an_expired_lock_makes_the_record_available_again() -> None:
    p = part()
    p.acquire("a", 0, 1, now_ms=0)
    assert p.next_deadline() == LOCK
    assert p.expire_locks(LOCK - 1) == 0
    assert p.expire_locks(LOCK) == 2
    assert p.state(0) is RecordState.AVAILABLE and p.owner(0) is None
    # the late holder's acknowledgement is refused; a new holder gets the records
    assert p.acknowledge("a", 0, 1, Ack.ACCEPT) is E.INVALID_RECORD_STATE
    assert p.acquire("b", 0, 1, now_ms=LOCK) == [AcquiredRange(0, 1, 2)]


def test_a_poison_record_is_archived_after_the_delivery_limit() -> None:
    p = part()
    now = 0
    for count in (1, 2, 3):
        assert p.acquire("a", 0, 0, now_ms=now) == [AcquiredRange(0, 0, count)]
        now += LOCK  # the consumer dies holding it
    assert p.expire_locks(now) == 1
    assert p.state(0) is RecordState.ARCHIVED
    assert p.start_offset == 1
    assert p.acquire("a", 0, 0, now_ms=now) == []


def test_release_at_the_limit_archives() -> None:
    p = part()
    p.acquire("a", 0, 1, now_ms=0)
    p.acknowledge("a", 1, 1, Ack.ACCEPT)
    for _ in range(3):  # deliveries 1-3; the third release reaches the limit
        p.acquire("a", 0, 0, now_ms=0)
        p.acknowledge("a", 0, 0, Ack.RELEASE)
    assert p.state(0) is RecordState.ARCHIVED and p.start_offset == 2


def test_reject_and_gap_archive() -> None:
    p = part()
    p.acquire("a", 0, 3, now_ms=0)
    assert p.acknowledge("a", 0, 1, Ack.REJECT) is E.NONE
    assert p.acknowledge("a", 2, 2, Ack.GAP) is E.NONE
    assert p.start_offset == 3


def test_a_leaving_member_gives_its_records_back() -> None:
    p = part()
    p.acquire("a", 0, 2, now_ms=0)
    p.acquire("b", 0, 5, now_ms=0)
    assert p.release_member("a") == 3
    assert p.acquired_by("a") == [] and p.acquired_by("b") == [3, 4, 5]
    assert p.next_fetch_offset() == 0


def test_the_record_locks_are_bounded() -> None:
    p = part(max_in_flight=4)
    assert p.acquire("a", 0, 9, now_ms=0) == [AcquiredRange(0, 3, 1)]
    assert p.acquire("b", 4, 9, now_ms=0) == []
    p.acknowledge("a", 0, 1, Ack.ACCEPT)
    assert p.acquire("b", 4, 9, now_ms=0) == [AcquiredRange(4, 5, 1)]
    assert p.in_flight == 4


def test_max_records_caps_one_acquisition() -> None:
    p = part()
    assert p.acquire("a", 0, 9, now_ms=0, max_records=3) == [AcquiredRange(0, 2, 1)]
    assert p.next_fetch_offset() == 3


def test_offsets_missing_from_the_log_are_archived_gaps() -> None:
    p = part()
    p.acquire("a", 0, 1, now_ms=0)
    assert p.acquire("a", 5, 6, now_ms=0) == [AcquiredRange(5, 6, 1)]
    assert [p.state(o) for o in (2, 3, 4)] == [RecordState.ARCHIVED] * 3
    p.acknowledge("a", 0, 1, Ack.ACCEPT)
    assert p.start_offset == 5
    q = part()
    assert q.acquire("a", 7, 8, now_ms=0) == [AcquiredRange(7, 8, 1)]  # nothing in flight: jump
    assert q.start_offset == 7


def test_aborted_records_are_archived_not_delivered() -> None:
    p = part()
    p.archive(0, 2)
    assert p.start_offset == 3
    assert p.acquire("a", 0, 5, now_ms=0) == [AcquiredRange(3, 5, 1)]


def test_the_log_start_moving_drops_records() -> None:
    p = part()
    p.acquire("a", 0, 4, now_ms=0)
    p.move_start(3)
    assert (p.start_offset, p.end_offset) == (3, 5)
    p.move_start(9)
    assert (p.start_offset, p.end_offset) == (9, 9)


def test_state_batches_round_trip_and_locks_do_not_survive() -> None:
    p = part()
    p.acquire("a", 0, 5, now_ms=0)
    p.acknowledge("a", 1, 2, Ack.ACCEPT)
    p.acknowledge("a", 3, 3, Ack.RELEASE)
    batches = p.state_batches()
    assert batches == [
        StateBatch(0, 0, RecordState.AVAILABLE, 1),
        StateBatch(1, 2, RecordState.ACKNOWLEDGED, 1),
        StateBatch(3, 5, RecordState.AVAILABLE, 1),  # 4-5 were held: persisted available
    ]
    q = SharePartition.restore(
        p.start_offset, batches, lock_duration_ms=LOCK, delivery_count_limit=3
    )
    assert (q.start_offset, q.end_offset) == (0, 6)
    assert q.acquire("b", 0, 9, now_ms=0) == [
        AcquiredRange(0, 0, 2),
        AcquiredRange(3, 5, 2),
        AcquiredRange(6, 9, 1),
    ]
