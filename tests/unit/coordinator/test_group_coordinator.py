"""The group coordinator as a pure state machine: transitions, fencing, static membership,
timers and retention with fake time, and replay equivalence (docs/semantics.md, rules 23 and
25)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from _coordinators import CoordinatorHarness
from samsa.coordinator.group import VALID_PREVIOUS_STATES, GroupState, IllegalStateTransition
from samsa.coordinator.group_coordinator import (
    CoordinatorRecord,
    GroupConfig,
    GroupCoordinator,
    JoinRequest,
    JoinResult,
    OffsetToCommit,
    Outcome,
    Pending,
    Reply,
    SyncResult,
)
from samsa.coordinator.offsets import OFFSETS_TOPIC, decode
from samsa.coordinator.offsets_records import GroupMetadataKey, GroupMetadataValue
from samsa.protocol.errors import ErrorCode as E

G = "group"
SUB = b"\x00\x01\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"  # consumer protocol: topic "t"


class Harness(CoordinatorHarness[CoordinatorRecord]):
    """The coordinator run by the runtime (tests/_coordinators.py); owed JoinGroup/SyncGroup
    answers are collected."""

    def __init__(self, **config: Any) -> None:
        ids = itertools.count(1)
        cfg = {"initial_rebalance_delay_ms": 0, "min_session_timeout_ms": 10, **config}
        self.c = GroupCoordinator(GroupConfig(**cfg), new_member_id=lambda p: f"{p}-{next(ids)}")
        super().__init__(self.c)
        self.replies: dict[tuple[str, str], Any] = {}

    def records(self) -> list[CoordinatorRecord]:
        """Every record written, decoded from the log's bytes."""
        return [decode(k, v) for k, v in self.log.entries]

    def run(self, outcome: Outcome) -> Any:
        response = super().run(outcome)
        for ev in self.c.take_outbox():
            if isinstance(ev, Reply):
                self.replies[(ev.kind, ev.member_id)] = ev.result
        return response

    def join(
        self,
        member_id: str = "",
        *,
        instance: str | None = None,
        client: str = "c",
        session: int = 1000,
        rebalance: int = 5000,
        protocols: tuple[tuple[str, bytes], ...] = (("range", SUB),),
        v4: bool = True,
    ) -> Any:
        req = JoinRequest(
            G,
            member_id,
            instance,
            client,
            "/127.0.0.1",
            session,
            rebalance,
            "consumer",
            protocols,
            v4,
        )
        result = self.run(self.c.join_group(req, self.now))
        if isinstance(result, Pending):
            self.due_timers()
            return self.replies.pop(("join", result.member_id), result)
        return result

    def join_new(self, **kw: Any) -> Any:
        first = self.join(**kw)
        if isinstance(first, JoinResult) and first.error == E.MEMBER_ID_REQUIRED:
            return self.join(first.member_id, **kw)
        return first

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        instance: str | None = None,
    ) -> Any:
        result = self.run(
            self.c.sync_group(
                G, generation, member_id, instance, "consumer", None, assignments or {}, self.now
            )
        )
        if isinstance(result, Pending):
            return self.replies.pop(("sync", member_id), result)
        return result

    def heartbeat(self, member_id: str, generation: int, instance: str | None = None) -> E:
        return self.run(self.c.heartbeat(G, generation, member_id, instance, self.now))  # type: ignore[no-any-return]

    def commit(self, member_id: str, generation: int, offset: int = 5, group: str = G) -> E:
        errors = self.run(
            self.c.commit_offsets(
                group, generation, member_id, None, [OffsetToCommit("t", 0, offset)], self.now
            )
        )
        return errors[("t", 0)]  # type: ignore[no-any-return]

    def due_timers(self) -> None:
        """What the runtime's timer does next when a deadline is already due (an initial
        rebalance with no delay ends on the timer, never inside the JoinGroup)."""
        deadline = self.c.next_deadline()
        if deadline is not None and deadline <= self.now:
            self.run(self.c.tick(self.now))

    def tick(self, advance_ms: int) -> None:
        self.now += advance_ms
        self.run(self.c.tick(self.now))

    @property
    def group(self) -> Any:
        return self.c.groups[G]

    def stable_group_of_one(self) -> str:
        first = self.join()
        assert first.error == E.MEMBER_ID_REQUIRED and first.member_id  # KIP-394, v4+
        j = self.join(first.member_id)
        assert j.error == E.NONE and j.generation == 1 and j.leader == j.member_id
        s = self.sync(j.member_id, 1, {j.member_id: b"A1"})
        assert s == SyncResult(E.NONE, "consumer", "range", b"A1")
        return j.member_id  # type: ignore[no-any-return]


def test_states_and_their_valid_previous_states() -> None:
    assert VALID_PREVIOUS_STATES[GroupState.STABLE] == {GroupState.COMPLETING_REBALANCE}
    assert VALID_PREVIOUS_STATES[GroupState.EMPTY] == {GroupState.PREPARING_REBALANCE}
    h = Harness()
    h.stable_group_of_one()
    with pytest.raises(IllegalStateTransition):
        h.group.transition_to(GroupState.COMPLETING_REBALANCE, 0)


def test_join_sync_and_a_second_member_rebalances() -> None:
    h = Harness()
    a = h.stable_group_of_one()
    assert h.group.state == GroupState.STABLE

    b_first = h.join()
    b_pending = h.join(b_first.member_id)
    assert isinstance(b_pending, Pending)
    assert h.group.state == GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, 1) == E.REBALANCE_IN_PROGRESS
    assert h.commit(a, 1) == E.NONE  # commits before rejoining are still allowed

    ja = h.join(a)  # everyone has rejoined: the join phase completes at once
    assert ja.generation == 2 and ja.leader == a and len(ja.members) == 2
    jb = h.replies.pop(("join", b_first.member_id))
    assert jb.generation == 2 and jb.members == ()
    assert h.group.state == GroupState.COMPLETING_REBALANCE
    assert h.commit(a, 2) == E.REBALANCE_IN_PROGRESS

    assert isinstance(h.sync(b_first.member_id, 2), Pending)  # waits for the leader
    records_before = len(h.log.entries)
    sa = h.sync(a, 2, {a: b"PA", b_first.member_id: b"PB"})
    assert sa.assignment == b"PA"
    assert h.replies.pop(("sync", b_first.member_id)).assignment == b"PB"
    # Stable only once the assignment record was replayed.
    assert isinstance(h.records()[records_before].value, GroupMetadataValue)
    assert h.group.state == GroupState.STABLE
    assert h.heartbeat(a, 2) == E.NONE


def test_generation_and_member_fencing() -> None:
    h = Harness()
    a = h.stable_group_of_one()
    assert h.commit(a, 0) == E.ILLEGAL_GENERATION
    assert h.commit("stranger", 1) == E.UNKNOWN_MEMBER_ID
    assert h.commit("", -1) == E.UNKNOWN_MEMBER_ID  # "simple" commits only for Empty groups
    assert h.heartbeat(a, 7) == E.ILLEGAL_GENERATION
    assert h.heartbeat("stranger", 1) == E.UNKNOWN_MEMBER_ID
    assert h.sync(a, 9) == SyncResult(E.ILLEGAL_GENERATION)
    assert h.join("stranger").error == E.UNKNOWN_MEMBER_ID
    assert h.commit(a, 1) == E.NONE
    # An unknown group accepts simple commits (and is created by their replay) ...
    assert h.commit("", -1, group="simple") == E.NONE
    assert "simple" in h.c.groups
    assert h.c.offsets.committed("simple")[("t", 0)].offset == 5
    # ... but a generation from another life is refused.
    assert h.commit("m", 3, group="unknown") == E.ILLEGAL_GENERATION


def test_leave_empties_the_group_and_bumps_the_generation() -> None:
    h = Harness()
    a = h.stable_group_of_one()
    top, results = h.run(h.c.leave_group(G, [(a, None)], h.now))
    assert top == E.NONE and results == [(a, None, E.NONE)]
    assert h.group.state == GroupState.EMPTY and h.group.generation == 2
    stored = h.records()[-1]
    assert stored.key == GroupMetadataKey(G) and stored.value.members == ()
    assert h.commit("", -1) == E.NONE  # now the group only stores offsets


def test_session_timeout_removes_a_silent_member() -> None:
    h = Harness()
    a = h.stable_group_of_one()
    b = h.join()
    b = h.join(b.member_id)
    assert isinstance(b, Pending)
    h.join(a)
    h.sync(b.member_id, 2)
    h.sync(a, 2, {})
    assert h.group.state == GroupState.STABLE
    h.tick(600)
    assert h.heartbeat(a, 2) == E.NONE  # a is alive, b says nothing
    h.tick(600)  # b's 1000 ms session is over
    assert b.member_id not in h.group.members
    assert h.group.state == GroupState.PREPARING_REBALANCE
    ja = h.join(a)
    assert ja.generation == 3 and [m.member_id for m in ja.members] == [a]


def test_rebalance_timeout_drops_members_that_do_not_rejoin() -> None:
    h = Harness()
    a = h.stable_group_of_one()
    b = h.join()
    assert isinstance(h.join(b.member_id), Pending)
    h.tick(900)
    h.heartbeat(a, 1)  # a heartbeats but never rejoins
    h.tick(900)
    h.heartbeat(a, 1)
    assert h.group.state == GroupState.PREPARING_REBALANCE
    h.tick(5000 - 1800)  # the rebalance timeout of the phase
    jb = h.replies.pop(("join", b.member_id))
    assert jb.generation == 2 and jb.leader == b.member_id
    assert list(h.group.members) == [b.member_id]


def test_static_member_rejoins_without_rebalance_and_fences_its_old_self() -> None:
    h = Harness()
    j = h.join_new(instance="i-1")
    assert j.member_id.startswith("i-1-")  # static members need no MEMBER_ID_REQUIRED
    h.sync(j.member_id, 1, {j.member_id: b"X"})
    again = h.join(instance="i-1")  # a restarted instance, same instance id
    assert again.error == E.NONE and again.generation == 1 and again.member_id != j.member_id
    assert h.group.state == GroupState.STABLE  # no rebalance
    assert isinstance(h.records()[-1].value, GroupMetadataValue)  # the new member id is stored
    assert h.heartbeat(j.member_id, 1, "i-1") == E.FENCED_INSTANCE_ID
    assert h.sync(j.member_id, 1, instance="i-1") == SyncResult(E.FENCED_INSTANCE_ID)
    assert h.heartbeat(again.member_id, 1, "i-1") == E.NONE
    assert h.sync(again.member_id, 1, instance="i-1").assignment == b"X"


def test_initial_rebalance_delay_collects_members() -> None:
    h = Harness(initial_rebalance_delay_ms=100)
    a = h.join(v4=False)
    b = h.join(v4=False)
    assert isinstance(a, Pending) and isinstance(b, Pending)
    h.tick(100)  # a member arrived during the delay: wait once more
    assert h.group.state == GroupState.PREPARING_REBALANCE
    h.tick(100)
    ra = h.replies.pop(("join", a.member_id))
    assert ra.generation == 1 and len(ra.members) == 2


def test_a_zero_initial_delay_still_ends_on_the_timer() -> None:
    """As Kafka's coordinator: the first rebalance of an empty group is never completed by a
    JoinGroup, even with no delay; joins received before the timer fires are in generation 1
    (answering the first member at once would start generation 2 as the next one arrives)."""
    h = Harness(initial_rebalance_delay_ms=0)
    a = h.run(h.c.join_group(_join_req(), h.now))
    b = h.run(h.c.join_group(_join_req(), h.now))
    assert isinstance(a, Pending) and isinstance(b, Pending)
    assert h.group.state == GroupState.PREPARING_REBALANCE and h.c.next_deadline() == h.now
    h.due_timers()
    ra, rb = h.replies.pop(("join", a.member_id)), h.replies.pop(("join", b.member_id))
    assert ra.generation == rb.generation == 1 and len(ra.members) == 2


def _join_req() -> JoinRequest:
    return JoinRequest(G, "", None, "c", "/h", 1000, 5000, "consumer", (("range", SUB),), False)


def test_inconsistent_protocols_and_session_bounds() -> None:
    h = Harness()
    h.stable_group_of_one()
    assert h.join(protocols=(("other", b""),)).error == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.join(session=1).error == E.INVALID_SESSION_TIMEOUT


def test_offsets_retention_with_fake_time() -> None:
    h = Harness(offsets_retention_ms=5000, offsets_retention_check_interval_ms=100)
    assert h.commit("", -1, group="simple") == E.NONE
    first = h.join(session=60_000)
    a = h.join(first.member_id, session=60_000).member_id
    h.sync(a, 1)
    assert h.commit(a, 1) == E.NONE
    h.tick(100)  # arms the check
    h.tick(5000)
    assert "simple" not in h.c.groups  # its offset is older than retention: gone, group too
    assert h.c.offsets.committed(G)  # a group with members keeps its offsets
    h.run(h.c.leave_group(G, [(a, None)], h.now))
    h.tick(4000)
    assert h.c.offsets.committed(G)  # Empty for 4 s: kept
    h.tick(1000)
    assert G not in h.c.groups  # Empty for the retention: offsets expired, group deleted


def test_delete_groups_and_offsets() -> None:
    h = Harness()
    a = h.stable_group_of_one()
    h.commit(a, 1)
    h.run(h.c.commit_offsets(G, 1, a, None, [OffsetToCommit("other", 0, 1)], h.now))
    assert h.run(h.c.delete_groups([G, "nope"], h.now)) == {
        G: E.NON_EMPTY_GROUP,
        "nope": E.GROUP_ID_NOT_FOUND,
    }
    top, errors = h.run(h.c.delete_offsets(G, [("t", [0]), ("other", [0])], h.now))
    assert top == E.NONE
    assert errors == {("t", 0): E.GROUP_SUBSCRIBED_TO_TOPIC, ("other", 0): E.NONE}
    assert ("other", 0) not in h.c.offsets.committed(G)
    h.run(h.c.leave_group(G, [(a, None)], h.now))
    assert h.run(h.c.delete_groups([G], h.now)) == {G: E.NONE}
    assert G not in h.c.groups
    assert h.c.describe_group(G).state == "Dead"


def test_replay_rebuilds_the_same_durable_state() -> None:
    h = Harness()
    a = h.stable_group_of_one()
    h.commit(a, 1, offset=10)
    b = h.join()
    h.join(b.member_id)
    h.join(a)
    h.sync(b.member_id, 2)
    h.sync(a, 2, {a: b"A", b.member_id: b"B"})
    h.commit(b.member_id, 2, offset=20)
    static = h.join(instance="s-1")
    assert isinstance(static, Pending)
    h.commit("", -1, group="simple", offset=3)
    h.run(h.c.commit_offsets("simple", -1, "", None, [OffsetToCommit("x", 1, 4, 2, "m")], h.now))
    h.join(a)
    h.join(b.member_id)
    h.sync(a, 3, {a: b"A3", b.member_id: b"B3", static.member_id: b"S3"})
    h.sync(b.member_id, 3)
    h.run(h.c.leave_group("simple", [], h.now))
    live = h.c.durable_state()
    assert live[G]["state"] == "Stable" and live[G]["generation"] == 3

    fresh = h.rebuilt(GroupCoordinator(h.c.config))
    assert fresh.durable_state() == live
    # The loaded group serves its members: same generation, assignments intact.
    assert fresh.heartbeat(G, 3, a, None, h.now).response == E.NONE
    assert (
        fresh.sync_group(G, 3, b.member_id, None, None, None, {}, h.now).response.assignment
        == b"B3"
    )


def test_a_plain_commit_written_after_a_txn_offset_commit_outlasts_its_marker() -> None:
    """Offsets are ordered by their records' log offsets (rule 15): the transactional offset is
    staged at its offset, the plain commit lands later in the log, so the COMMIT marker does
    not bring the older transactional offset back; a restart agrees."""
    h = Harness()
    pid, partition = 7, h.c.partition_for(G)
    h.log.add_marker_listener(lambda _t, p, pid, commit: h.c.replay_marker(p, pid, commit, h.now))
    # TxnOffsetCommit, written as the group runtime writes it: one transactional batch, staged.
    txn = h.c.commit_transactional_offsets(G, -1, "", None, [OffsetToCommit("t", 0, 5)], E.NONE, 0)
    h.runtime.ensure_topic()
    records = [h.c.serialize(r) for r in txn.records]
    written = h.log.append(OFFSETS_TOPIC, partition, records, producer_id=pid, transactional=True)
    h.c.offsets.stage(partition, pid, [(written.base_offset, r) for r in txn.records])
    assert h.commit("", -1, offset=9) == E.NONE  # a plain commit, before the marker
    h.log.write_marker(OFFSETS_TOPIC, partition, pid, 0, 0, commit=True)
    assert h.c.fetch_offsets(G, [("t", [0])])[0].offset == 9
    assert h.rebuilt(GroupCoordinator(h.c.config)).fetch_offsets(G, [("t", [0])])[0].offset == 9


def test_delete_offsets_when_the_subscriptions_are_not_known() -> None:
    """OffsetDelete as Kafka's ClassicGroup: a consumer-protocol group whose subscriptions are
    not known (no generation yet, or metadata that does not parse) counts every topic as
    subscribed; a non-empty group of another protocol type keeps all its offsets."""
    h = Harness(initial_rebalance_delay_ms=3000)  # the first generation waits 3 s
    h.run(h.c.commit_offsets(G, -1, "", None, [OffsetToCommit("other", 0, 1)], h.now))
    first = h.join(session=60_000)
    h.join(first.member_id, session=60_000)
    assert h.group.state.value == "PreparingRebalance"
    top, errors = h.run(h.c.delete_offsets(G, [("other", [0])], h.now))
    assert (top, errors) == (E.NONE, {("other", 0): E.GROUP_SUBSCRIBED_TO_TOPIC})
    assert ("other", 0) in h.c.offsets.committed(G)

    bad = Harness()  # a subscription that does not parse, in a stable group
    first = bad.join(session=60_000, protocols=(("range", b"\x00"),))
    m = bad.join(first.member_id, session=60_000, protocols=(("range", b"\x00"),)).member_id
    bad.sync(m, 1)
    assert bad.group.state.value == "Stable"
    bad.run(bad.c.commit_offsets(G, 1, m, None, [OffsetToCommit("other", 0, 1)], bad.now))
    _, errors = bad.run(bad.c.delete_offsets(G, [("other", [0])], bad.now))
    assert errors == {("other", 0): E.GROUP_SUBSCRIBED_TO_TOPIC}

    other = Harness()  # a group of another protocol type with a member
    protocols = (("v1", b""),)
    req = JoinRequest(G, "", None, "c", "/127.0.0.1", 60_000, 5000, "connect", protocols, False)
    joined = other.run(other.c.join_group(req, other.now))
    if isinstance(joined, Pending):
        other.due_timers()
        joined = other.replies.pop(("join", joined.member_id))
    assert joined.error == E.NONE
    assert other.run(other.c.delete_offsets(G, [("other", [0])], other.now)) == (
        E.NON_EMPTY_GROUP,
        {},
    )
