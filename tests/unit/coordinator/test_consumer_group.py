"""KIP-848 consumer groups on the pure group coordinator: epochs and fencing (docs/semantics.md,
rule 34), revocation before reassignment (rule 35), timeouts with fake time, static members,
regex subscriptions, offset commits with member epochs, classic groups side by side, the
assignors, and replay of the records (serialized in Kafka's formats) giving the same state."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from _coordinators import CoordinatorHarness
from samsa.coordinator.assignors import range_assign, uniform_assign
from samsa.coordinator.consumer_group import MemberState
from samsa.coordinator.consumer_group_coordinator import (
    ConsumerConfig,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    TopicInfo,
)
from samsa.coordinator.consumer_group_records import (
    ConsumerGroupKey,
    CurrentMemberAssignmentValue,
    decode_consumer_value,
    encode_consumer_key,
    encode_consumer_value,
)
from samsa.coordinator.group_coordinator import (
    CoordinatorRecord,
    GroupConfig,
    GroupCoordinator,
    JoinRequest,
    OffsetToCommit,
    Pending,
)
from samsa.coordinator.offsets import decode
from samsa.coordinator.offsets_records import GroupMetadataKey
from samsa.protocol.errors import ErrorCode as E

G = "cg"
T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
TOPICS = {"t": TopicInfo("t", T1, 6), "u": TopicInfo("u", T2, 2)}


class Harness(CoordinatorHarness[CoordinatorRecord]):
    """The coordinator run by the runtime (tests/_coordinators.py)."""

    def __init__(self, **consumer: Any) -> None:
        cfg = ConsumerConfig(**{"session_timeout_ms": 1000, **consumer})
        self.c = GroupCoordinator(GroupConfig(consumer=cfg))
        super().__init__(self.c)
        self.topics = dict(TOPICS)

    def hb(
        self,
        member: str,
        epoch: int,
        *,
        topics: tuple[str, ...] | None = None,
        regex: str | None = None,
        owned: dict[uuid.UUID, frozenset[int]] | None = None,
        instance: str | None = None,
        assignor: str | None = None,
        rebalance: int = -1,
    ) -> ConsumerHeartbeatResult:
        if epoch == 0:
            rebalance = 5000 if rebalance < 0 else rebalance
            if topics is None and regex is None:
                topics = ("t",)
            owned = {}
        req = ConsumerHeartbeat(
            G, member, epoch, instance, None, rebalance, topics, regex, assignor, owned, "c", "/h"
        )
        return self.run(self.c.consumer_heartbeat(req, self.topics, self.now))  # type: ignore[no-any-return]

    def member(self, mid: str) -> Any:
        return self.c.consumer.groups[G].members[mid]

    def tick(self, ms: int) -> None:
        self.now += ms
        self.run(self.c.tick(self.now))


def parts(result: ConsumerHeartbeatResult, topic: uuid.UUID = T1) -> frozenset[int]:
    assert result.assignment is not None
    return result.assignment.get(topic, frozenset())


def owned_by(*results: frozenset[int]) -> list[frozenset[int]]:
    return list(results)


# -- joining, reconciliation (rule 35) -------------------------------------------------------------


def test_first_member_gets_every_partition_at_epoch_two() -> None:
    h = Harness()
    r = h.hb("a", 0)
    # As Kafka 4.4: a new group is at epoch 1 and the member's subscription bumps it.
    assert (r.error, r.member_id, r.member_epoch) == (E.NONE, "a", 2)
    assert parts(r) == frozenset(range(6))
    assert r.heartbeat_interval_ms == 5000
    assert h.c.consumer.groups[G].state == "Stable"


def test_only_subscriptions_topics_and_assignors_bump_the_group_epoch() -> None:
    """As Kafka 4.4: joining with no subscription bumps nothing, so the first member is at
    epoch 1 and a second such member joins at the same epoch; a subscription, or a change of
    the group's preferred assignor, bumps it; the last member leaving bumps it once more."""
    h = Harness()
    assert h.hb("a", 0, topics=()).member_epoch == 1
    assert h.hb("b", 0, topics=()).member_epoch == 1
    assert h.hb("b", 1, topics=(), assignor="range").member_epoch == 2
    assert h.hb("a", 1, topics=(), owned={}).member_epoch == 2
    assert h.hb("a", 2, topics=("t",), owned={}).member_epoch == 3
    h.hb("a", -1)
    h.hb("b", -1)
    d = h.c.describe_consumer_group(G)
    assert (d.state, d.group_epoch, d.assignment_epoch) == ("Empty", 5, 5)


def test_partition_moves_only_after_its_owner_revoked_it() -> None:
    h = Harness()
    a = parts(h.hb("a", 0))
    b = h.hb("b", 0)  # group epoch 3: half of a's partitions are b's target
    assert b.member_epoch == 3 and parts(b) == frozenset()
    assert h.member("b").state == MemberState.UNRELEASED_PARTITIONS
    # a still owns everything: told to keep three, its epoch stays 2.
    r = h.hb("a", 2, owned={T1: a})
    kept = parts(r)
    assert r.member_epoch == 2 and len(kept) == 3
    assert h.member("a").state == MemberState.UNREVOKED_PARTITIONS
    # b asks again: nothing released yet, so nothing given.
    r = h.hb("b", 3, owned={})
    assert r.member_epoch == 3 and (r.assignment is None or not parts(r))
    # Still owned by a (it has not reported revoking): still nothing.
    assert h.hb("a", 2, owned={T1: a}).member_epoch == 2
    assert h.hb("b", 3, owned={}).assignment in (None, {})
    # a reports the revocation: it moves to epoch 3, and b then gets the rest.
    r = h.hb("a", 2, owned={T1: kept})
    assert r.member_epoch == 3 and h.member("a").state == MemberState.STABLE
    r = h.hb("b", 3, owned={})
    assert parts(r) == frozenset(range(6)) - kept
    assert h.c.consumer.groups[G].state == "Stable"


def test_heartbeat_without_owned_partitions_does_not_release_them() -> None:
    h = Harness()
    a = parts(h.hb("a", 0))
    h.hb("b", 0)
    h.hb("a", 2, owned={T1: a})
    r = h.hb("a", 2, owned=None)  # the member did not say: still owns what it had
    assert r.member_epoch == 2
    assert h.member("a").state == MemberState.UNREVOKED_PARTITIONS


# -- epochs fence (rule 34) -----------------------------------------------------------------------


def test_epoch_fencing() -> None:
    h = Harness()
    a = parts(h.hb("a", 0))
    assert h.hb("a", 6, owned={T1: a}).error == E.FENCED_MEMBER_EPOCH
    assert h.hb("nobody", 2, owned={}).error == E.UNKNOWN_MEMBER_ID
    assert h.hb("b", 0).member_epoch == 3
    kept = parts(h.hb("a", 2, owned={T1: a}))
    assert h.hb("a", 2, owned={T1: kept}).member_epoch == 3
    # One missed bump: the previous epoch is accepted if it claims no more than it has.
    assert h.hb("a", 2, owned={T1: kept}).error == E.NONE
    assert h.hb("a", 2, owned={T1: a}).error == E.FENCED_MEMBER_EPOCH
    assert h.hb("a", 2, owned=None).error == E.FENCED_MEMBER_EPOCH
    h.hb("b", -1)  # epoch 4: a gets everything at once, its previous epoch is 3
    assert h.hb("a", 3, owned={T1: kept}).member_epoch == 4
    assert h.hb("a", 2, owned={T1: kept}).error == E.FENCED_MEMBER_EPOCH  # two behind


def test_unknown_group_and_bad_requests() -> None:
    h = Harness()
    assert h.hb("a", 4, owned={}).error == E.GROUP_ID_NOT_FOUND
    assert h.hb("a", 0, topics=("t",), regex="t.*").error == E.INVALID_REQUEST
    assert h.hb("a", 0, regex="(").error == E.INVALID_REGULAR_EXPRESSION
    # RE2 syntax, as Kafka's RE2/J: no backreferences or lookarounds (they can backtrack).
    assert h.hb("a", 0, regex=r"(t)\1").error == E.INVALID_REGULAR_EXPRESSION
    assert h.hb("a", 0, regex="(?=t)t").error == E.INVALID_REGULAR_EXPRESSION
    assert h.hb("a", 0, assignor="sticky").error == E.UNSUPPORTED_ASSIGNOR
    assert h.hb("", 4, owned={}).error == E.INVALID_REQUEST
    # Nothing was stored for any of them.
    assert h.log.entries == [] and G not in h.c.consumer.groups


def test_group_size_is_bounded() -> None:
    h = Harness(max_size=2)
    h.hb("a", 0)
    h.hb("b", 0)
    assert h.hb("c", 0).error == E.GROUP_MAX_SIZE_REACHED


def test_session_timeout_fences_and_frees_partitions() -> None:
    h = Harness()
    a = parts(h.hb("a", 0))
    h.hb("b", 0)
    kept = parts(h.hb("a", 2, owned={T1: a}))
    h.hb("a", 2, owned={T1: kept})
    got = parts(h.hb("b", 3, owned={}))
    h.tick(600)
    h.hb("b", 3, owned={T1: got})  # b stays alive; a is silent
    h.tick(600)
    assert "a" not in h.c.consumer.groups[G].members
    r = h.hb("b", 3, owned={T1: got})
    assert r.member_epoch == 4 and parts(r) == frozenset(range(6))
    assert h.hb("a", 3, owned={T1: kept}).error == E.UNKNOWN_MEMBER_ID


def test_rebalance_timeout_fences_a_member_that_does_not_revoke() -> None:
    h = Harness(session_timeout_ms=60_000)
    a = parts(h.hb("a", 0, rebalance=500))
    h.hb("b", 0)
    h.hb("a", 2, owned={T1: a})
    h.tick(300)
    h.hb("a", 2, owned={T1: a})  # heartbeats, but never gives the partitions up
    h.tick(300)
    assert "a" not in h.c.consumer.groups[G].members
    assert parts(h.hb("b", 3, owned={})) == frozenset(range(6))


def test_leave_gives_partitions_to_the_others() -> None:
    h = Harness()
    a = parts(h.hb("a", 0))
    h.hb("b", 0)
    kept = parts(h.hb("a", 2, owned={T1: a}))
    h.hb("a", 2, owned={T1: kept})
    got = parts(h.hb("b", 3, owned={}))
    r = h.hb("a", -1, owned=None)
    assert (r.error, r.member_epoch) == (E.NONE, -1)
    r = h.hb("b", 3, owned={T1: got})
    assert r.member_epoch == 4 and parts(r) == frozenset(range(6))


def test_static_member_comes_back_to_its_assignment() -> None:
    h = Harness()
    a = parts(h.hb("a1", 0, instance="i"))
    h.hb("b", 0)
    kept = parts(h.hb("a1", 2, owned={T1: a}, instance="i"))
    h.hb("a1", 2, owned={T1: kept}, instance="i")
    epoch = h.c.consumer.groups[G].group_epoch
    assert h.hb("a2", 0, instance="i").error == E.UNRELEASED_INSTANCE_ID
    assert h.hb("a1", -2, instance="i").member_epoch == -2
    r = h.hb("a2", 0, instance="i")  # a new incarnation: same partitions, no rebalance
    assert r.error == E.NONE and parts(r) == kept
    assert h.c.consumer.groups[G].group_epoch == epoch
    assert "a1" not in h.c.consumer.groups[G].members


def test_regex_subscription_follows_new_topics() -> None:
    h = Harness()
    r = h.hb("a", 0, regex="t|u")
    assert parts(r, T1) == frozenset(range(6)) and parts(r, T2) == frozenset({0, 1})
    t3 = uuid.UUID(int=3)
    h.topics["u"] = TopicInfo("u", T2, 3)  # more partitions: a new epoch
    h.topics["v"] = TopicInfo("v", t3, 1)  # not matched
    r = h.hb("a", 2, owned={T1: frozenset(range(6)), T2: frozenset({0, 1})})
    assert r.member_epoch == 3 and parts(r, T2) == frozenset({0, 1, 2}) and parts(r, t3) == set()


# -- offsets --------------------------------------------------------------------------------------


def test_offset_commit_carries_the_member_epoch() -> None:
    h = Harness()
    h.hb("a", 0)
    offsets = [OffsetToCommit("t", 0, 42)]
    commit = h.c.commit_offsets
    assert h.run(commit(G, 0, "a", None, offsets, h.now)) == {("t", 0): E.STALE_MEMBER_EPOCH}
    assert h.run(commit(G, 1, "x", None, offsets, h.now)) == {("t", 0): E.UNKNOWN_MEMBER_ID}
    assert h.run(commit(G, -1, "", None, offsets, h.now)) == {("t", 0): E.UNKNOWN_MEMBER_ID}
    assert h.run(commit(G, 2, "a", None, offsets, h.now)) == {("t", 0): E.NONE}
    assert h.c.fetch_offsets(G, [("t", [0])])[0].offset == 42
    h.hb("a", -1)
    # An empty group takes commits from outside it (admin tools).
    assert h.run(commit(G, -1, "", None, offsets, h.now)) == {("t", 0): E.NONE}


def test_a_commit_at_an_older_epoch_passes_for_partitions_owned_since() -> None:
    """As Kafka 4.4 (KIP-1251): a commit may carry an epoch older than the member's when the
    member was given every committed partition at that epoch or before; so a commit that
    raced the member's own epoch bump is taken, and one for a partition it got later, or
    gave up, is not. Replay keeps each partition's assignment epoch."""
    h = Harness()
    h.hb("a", 0)  # epoch 2: all six partitions, assigned at 2
    h.hb("b", 0)  # epoch 3
    assert h.hb("a", 2, owned={T1: frozenset(range(6))}).member_epoch == 2  # revoking first
    kept = h.member("a").assigned[T1]
    assert len(kept) == 3
    assert h.hb("a", 2, owned={T1: kept}).member_epoch == 3
    theirs = parts(h.hb("b", 3, owned={}))
    assert theirs == frozenset(range(6)) - kept and h.member("b").member_epoch == 3

    def commit(c: GroupCoordinator, member: str, epoch: int, partition: int) -> E:
        offsets = [OffsetToCommit("t", partition, 1, topic_id=T1)]
        return h.run(c.commit_offsets(G, epoch, member, None, offsets, h.now))[("t", partition)]  # type: ignore[no-any-return]

    k, gone = min(kept), min(theirs)
    assert commit(h.c, "a", 2, k) == E.NONE  # owned since epoch 2
    assert commit(h.c, "a", 2, gone) == E.STALE_MEMBER_EPOCH  # given up
    assert commit(h.c, "a", 4, k) == E.STALE_MEMBER_EPOCH  # ahead of the member
    assert commit(h.c, "b", 2, gone) == E.STALE_MEMBER_EPOCH  # b got it at epoch 3
    assert commit(h.c, "b", 3, gone) == E.NONE
    assert h.c.validate_fetch(G, "a", 2) == E.STALE_MEMBER_EPOCH  # fetches stay strict
    # b leaves (epoch 4): a takes b's partitions in the same step, assigned at 4.
    h.hb("b", -1)
    assert parts(h.hb("a", 3, owned={T1: kept})) == frozenset(range(6))
    assert commit(h.c, "a", 3, k) == E.NONE
    assert commit(h.c, "a", 3, gone) == E.STALE_MEMBER_EPOCH
    fresh = h.rebuilt(GroupCoordinator(GroupConfig()))
    assert commit(fresh, "a", 2, k) == E.NONE
    assert commit(fresh, "a", 3, gone) == E.STALE_MEMBER_EPOCH
    assert commit(fresh, "a", 4, gone) == E.NONE


# -- classic and consumer groups side by side -----------------------------------------------------


def classic_join(h: Harness, group: str) -> Any:
    req = JoinRequest(
        group, "", None, "c", "/h", 10_000, 10_000, "consumer", (("range", b""),), False
    )
    return h.run(h.c.join_group(req, h.now))


def test_classic_join_to_a_consumer_group_needs_a_readable_subscription() -> None:
    h = Harness()
    h.hb("a", 0)
    h.run(h.c.commit_offsets(G, 2, "a", None, [OffsetToCommit("t", 2, 9)], h.now))
    # A classic member may join a consumer group with members (rule 38), not with an
    # embedded protocol that is not the consumer protocol's.
    assert classic_join(h, G).error == E.INCONSISTENT_GROUP_PROTOCOL
    assert G in h.c.consumer.groups
    h.hb("a", -1)
    # Empty: it becomes a classic group (its records deleted), its offsets kept.
    assert isinstance(classic_join(h, G), Pending)  # joined, waiting for the rebalance
    assert G not in h.c.consumer.groups and G in h.c.groups
    assert h.c.fetch_offsets(G, [("t", [2])])[0].offset == 9
    fresh = h.rebuilt(GroupCoordinator(GroupConfig()))
    assert G not in fresh.consumer.groups
    assert fresh.fetch_offsets(G, [("t", [2])])[0].offset == 9


def test_consumer_member_cannot_join_a_classic_group_with_members_when_disabled() -> None:
    h = Harness(migration_policy="disabled")
    classic_join(h, G)
    assert h.hb("a", 0).error == E.GROUP_ID_NOT_FOUND  # rule 38's policy


def test_empty_classic_group_converts_and_keeps_its_offsets() -> None:
    h = Harness()
    h.run(h.c.commit_offsets(G, -1, "", None, [OffsetToCommit("t", 1, 7)], h.now))
    assert G in h.c.groups
    assert h.hb("a", 0).error == E.NONE
    assert G not in h.c.groups and G in h.c.consumer.groups
    assert h.c.fetch_offsets(G, [("t", [1])])[0].offset == 7
    listed = h.c.list_consumer_groups()
    assert listed == [(G, "Stable")] and h.c.list_groups() == []


def test_delete_group_needs_it_empty_and_leaves_tombstones() -> None:
    h = Harness()
    h.hb("a", 0)
    assert h.run(h.c.delete_groups([G], h.now)) == {G: E.NON_EMPTY_GROUP}
    h.hb("a", -1)
    assert h.run(h.c.delete_groups([G], h.now)) == {G: E.NONE}
    assert G not in h.c.consumer.groups
    fresh = h.rebuilt(GroupCoordinator(GroupConfig()))
    assert G not in fresh.consumer.groups


# -- replay ---------------------------------------------------------------------------------------


def test_replaying_the_records_rebuilds_the_same_groups() -> None:
    h = Harness()
    a = parts(h.hb("a", 0))
    h.hb("b", 0, instance="sb")
    h.hb("a", 2, owned={T1: a})  # a mid-revocation: UNREVOKED_PARTITIONS
    h.hb("c", 0, regex="u")
    h.run(h.c.commit_offsets(G, 2, "a", None, [OffsetToCommit("t", 0, 3)], h.now))
    fresh = h.rebuilt(GroupCoordinator(GroupConfig()))
    assert fresh.durable_state() == h.c.durable_state()
    # ...and the rebuilt coordinator carries on where the first one was.
    r = fresh.consumer_heartbeat(
        ConsumerHeartbeat(G, "a", 2, owned={T1: h.member("a").assigned[T1]}), TOPICS, h.now
    )
    assert r.response.error == E.NONE


def test_record_formats_are_kafkas() -> None:
    key = ConsumerGroupKey(8, "g", "m")
    assert encode_consumer_key(key) == b"\x00\x08\x00\x01g\x00\x01m"
    assert encode_consumer_key(ConsumerGroupKey(3, "g")) == b"\x00\x03\x00\x01g"
    epochs = {(T1, 0): 2, (T1, 1): 3}
    value = CurrentMemberAssignmentValue(3, 2, 1, {T1: frozenset({1, 0})}, {}, epochs)
    raw = encode_consumer_value(value)
    # version 0; epochs; state; compact array of one topic (id, [0, 1], tagged field 0: the
    # partitions' assignment epochs [2, 3], as Kafka 4.4 writes them); empty; no tags
    assert raw == (
        b"\x00\x00" + b"\x00\x00\x00\x03" + b"\x00\x00\x00\x02" + b"\x01"
        + b"\x02" + T1.bytes + b"\x03\x00\x00\x00\x00\x00\x00\x00\x01"
        + b"\x01\x00\x09" + b"\x03\x00\x00\x00\x02\x00\x00\x00\x03"
        + b"\x01" + b"\x00"
    )  # fmt: skip
    assert decode_consumer_value(key, raw) == value
    # A record of a Kafka before 4.4 has no epochs: each partition's is the member epoch.
    topic_end = 11 + 1 + 16 + 9  # header, array length, topic id, partitions
    old = raw[:topic_end] + b"\x00" + raw[topic_end + 12 :]
    assert decode_consumer_value(key, old).epochs == {}
    assert encode_consumer_value(decode_consumer_value(key, old)) == raw.replace(
        b"\x00\x00\x00\x02\x00\x00\x00\x03\x01\x00", b"\x00\x00\x00\x03\x00\x00\x00\x03\x01\x00"
    )


def test_bad_record_is_an_error_not_a_crash() -> None:
    from samsa.coordinator.offsets_records import RecordFormatError

    with pytest.raises(RecordFormatError):
        decode(b"\x00\x08\x00\x01g\x00\x01m", b"\x00\x00\x00\x00")


# -- assignors ------------------------------------------------------------------------------------


def test_range_assignor_gives_contiguous_ranges() -> None:
    subs = {"m1": {T1, T2}, "m2": {T1, T2}, "m3": {T1}}
    out = range_assign(subs, {T1: 7, T2: 3}, {})
    assert out["m1"][T1] == {0, 1, 2} and out["m2"][T1] == {3, 4} and out["m3"][T1] == {5, 6}
    assert out["m1"][T2] == {0, 1} and out["m2"][T2] == {2} and T2 not in out["m3"]


def test_uniform_assignor_balances_and_is_sticky() -> None:
    subs = {"m1": {T1}, "m2": {T1}, "m3": {T1}}
    first = uniform_assign(subs, {T1: 6}, {})
    assert sorted(len(a[T1]) for a in first.values()) == [2, 2, 2]
    grown = uniform_assign({**subs, "m4": {T1}}, {T1: 6}, first)
    sizes = sorted(len(a.get(T1, ())) for a in grown.values())
    assert sizes == [1, 1, 2, 2]
    for mid in subs:  # nobody lost more than it had to
        assert grown[mid][T1] <= first[mid][T1]
    union = [p for a in grown.values() for p in a.get(T1, ())]
    assert sorted(union) == list(range(6))
    assert uniform_assign(subs, {T1: 6}, {}) == first  # deterministic


def test_assignor_follows_the_members_choice() -> None:
    h = Harness()
    r = h.hb("a", 0, topics=("t", "u"), assignor="range")
    assert h.c.describe_consumer_group(G).assignor == "range"
    assert parts(r, T2) == {0, 1}
    d = h.c.describe_consumer_group(G)
    assert (d.state, d.group_epoch, d.assignment_epoch) == ("Stable", 2, 2)
    assert d.members[0].assignment == {T1: frozenset(range(6)), T2: frozenset({0, 1})}
    assert h.c.describe_consumer_group("nope").error == E.GROUP_ID_NOT_FOUND
    # DescribeGroups is for classic groups: a consumer group is Dead there, as in Kafka.
    assert h.c.describe_group(G).state == "Dead"


def test_records_are_coordinator_records() -> None:
    h = Harness()
    outcome = h.c.consumer_heartbeat(
        ConsumerHeartbeat(G, "a", 0, None, None, 5000, ("t",)), TOPICS, 0
    )
    types = [r.key.type for r in outcome.records if isinstance(r, CoordinatorRecord)]
    assert types == [5, 3, 7, 6, 8]  # metadata, epoch, target, target epoch, current


def test_offset_fetch_checks_the_member_epoch() -> None:
    h = Harness()
    h.hb("a", 0)
    assert h.c.validate_fetch(G, "a", 2) == E.NONE
    assert h.c.validate_fetch(G, "a", 0) == E.STALE_MEMBER_EPOCH
    assert h.c.validate_fetch(G, "zz", 1) == E.UNKNOWN_MEMBER_ID
    assert h.c.validate_fetch(G, None, -1) == E.NONE  # not a member: admin tools
    assert h.c.validate_fetch("classic", "m", 3) == E.NONE  # not a consumer group


def test_classic_group_emptied_converts_and_its_metadata_is_deleted() -> None:
    h = Harness()
    req = JoinRequest(G, "", None, "c", "/h", 10_000, 10_000, "consumer", (("range", b""),), False)
    h.c.config = h.c.config.__class__(initial_rebalance_delay_ms=0, consumer=h.c.config.consumer)
    h.run(h.c.join_group(req, h.now))
    h.now += 1
    h.run(h.c.tick(h.now))  # the join completes; the member never syncs or heartbeats
    h.now += 60_000
    h.run(h.c.tick(h.now))
    assert not h.c.groups[G].members and h.c.groups[G].stored is not None
    assert h.hb("a", 0).error == E.NONE
    # The classic group's record is deleted first, then the consumer group's are written.
    records = [decode(k, v) for k, v in h.log.entries]
    tombstone = records.index(CoordinatorRecord(GroupMetadataKey(G), None))
    assert all(isinstance(r.key, ConsumerGroupKey) for r in records[tombstone + 1 :])
    fresh = h.rebuilt(GroupCoordinator(GroupConfig()))
    assert G not in fresh.groups and fresh.consumer.groups[G].members.keys() == {"a"}


def test_empty_consumer_group_offsets_expire_then_the_group_goes() -> None:
    h2 = Harness(session_timeout_ms=60_000)
    h2.c.config = h2.c.config.__class__(
        offsets_retention_ms=10_000,
        offsets_retention_check_interval_ms=1000,
        consumer=h2.c.config.consumer,
    )
    h2.hb("a", 0)
    h2.run(h2.c.commit_offsets(G, 2, "a", None, [OffsetToCommit("t", 0, 5)], h2.now))
    h2.tick(1)
    h2.tick(20_000)
    assert h2.c.fetch_offsets(G, [("t", [0])])[0].offset == 5  # kept while it has members
    h2.hb("a", -1)
    h2.tick(1000)
    assert G not in h2.c.consumer.groups
    assert h2.c.fetch_offsets(G, [("t", [0])])[0].offset == -1


def test_a_heartbeat_whose_records_are_not_stored_leaves_nothing() -> None:
    h = Harness()
    outcome = h.c.consumer_heartbeat(
        ConsumerHeartbeat(G, "a", 0, None, None, 5000, ("t",)), TOPICS, 0
    )
    h.c.write_failed(outcome.records, E.COORDINATOR_NOT_AVAILABLE)
    assert G not in h.c.consumer.groups
    assert h.hb("a", 0).member_epoch == 2


def test_offset_delete_refuses_subscribed_topics_by_name_or_regex() -> None:
    h = Harness()
    h.hb("a", 0, topics=("t",))
    h.hb("b", 0, regex="u.*")
    commits = [OffsetToCommit(t, 0, 1) for t in ("t", "u", "w")]
    h.run(h.c.commit_offsets(G, -1, "", None, commits, h.now))  # refused: not empty
    h.c.offsets.replay(CoordinatorRecord(*_offset("w")), None)
    error, errors = h.run(h.c.delete_offsets(G, [("t", [0]), ("u", [0]), ("w", [0])], h.now))
    assert error == E.NONE
    assert errors == {
        ("t", 0): E.GROUP_SUBSCRIBED_TO_TOPIC,
        ("u", 0): E.GROUP_SUBSCRIBED_TO_TOPIC,
        ("w", 0): E.NONE,
    }


def _offset(topic: str) -> tuple[Any, Any]:
    from samsa.coordinator.offsets_records import OffsetCommitKey, OffsetCommitValue

    return OffsetCommitKey(G, topic, 0), OffsetCommitValue(1)
