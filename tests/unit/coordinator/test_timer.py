"""Timers keyed per group (Kafka's coordinator timer): the pure :class:`Timer`, and the group
coordinator telling its runtime when the next deadline is, firing only the groups due."""

from __future__ import annotations

from test_group_coordinator import G, Harness

from samsa.coordinator.timer import Timer
from samsa.protocol.errors import ErrorCode as E


def test_a_key_has_one_deadline_and_due_keys_come_earliest_first() -> None:
    t: Timer[str] = Timer()
    t.schedule("a", 300)
    t.schedule("b", 100)
    t.schedule("a", 200)  # replaces 300
    t.schedule("c", 150)
    t.cancel("c")
    assert t.next_deadline() == 100 and len(t) == 2
    assert t.due(99) == []
    assert t.due(250) == ["b", "a"]
    assert t.due(10_000) == [] and t.next_deadline() is None and len(t) == 0


def test_a_heap_of_replaced_deadlines_stays_bounded() -> None:
    t: Timer[str] = Timer()
    for i in range(10_000):
        t.schedule("k", i)
    assert len(t._heap) < 200 and t.next_deadline() == 9_999


def test_the_coordinator_schedules_each_group_at_its_earliest_deadline() -> None:
    h = Harness(offsets_retention_check_interval_ms=10**9)
    h.tick(0)  # arms the retention check, far away
    a = h.stable_group_of_one()  # session 1000 ms
    assert h.c.next_deadline() == h.now + 1000
    h.now += 600
    assert h.heartbeat(a, 1) == E.NONE  # the session starts again
    assert h.c.next_deadline() == h.now + 1000
    h.tick(999)
    assert a in h.group.members
    h.tick(1)  # exactly at the deadline: the member is out, the group rebalances to Empty
    assert not h.group.members and h.c.next_deadline() == 10**9 + 1_000_000
    assert G in h.c.groups
