"""Online migration of a group between the classic and the consumer protocol on the pure
group coordinator (docs/semantics.md, rule 38): a classic group with members becomes a consumer
group when a consumer-protocol member joins, its classic members keep rejoining, syncing and
heartbeating the classic way and never share a partition with anyone, it becomes a classic group
again when its last consumer-protocol member leaves or is fenced, the policy decides, and the
records (Kafka's byte formats) replay to the same group at every step."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

from _coordinators import CoordinatorHarness
from samsa.broker.config import BrokerConfig, ConfigError
from samsa.client import TopicPartition
from samsa.client._assignors import assigned_partitions as client_assignment
from samsa.coordinator.consumer_group import MemberState
from samsa.coordinator.consumer_group_coordinator import (
    ConsumerConfig,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    TopicInfo,
)
from samsa.coordinator.consumer_group_records import (
    ClassicMemberMetadata,
    ConsumerGroupKey,
    ConsumerGroupMemberMetadataValue,
    decode_consumer_value,
    encode_consumer_value,
)
from samsa.coordinator.group import GroupState
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
from samsa.protocol.consumer_protocol import (
    ConsumerProtocolError,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from samsa.protocol.errors import ErrorCode as E

G = "mig"
T = uuid.UUID(int=7)
TOPICS = {"t": TopicInfo("t", T, 6)}
ALL = frozenset(range(6))


class Harness(CoordinatorHarness[CoordinatorRecord]):
    """The coordinator run by the runtime (tests/_coordinators.py); owed JoinGroup/SyncGroup
    answers are collected."""

    def __init__(self, **consumer: Any) -> None:
        ids = itertools.count(1)
        cfg = GroupConfig(
            initial_rebalance_delay_ms=0,
            min_session_timeout_ms=10,
            consumer=ConsumerConfig(**{"session_timeout_ms": 1000, **consumer}),
        )
        self.c = GroupCoordinator(
            cfg, new_member_id=lambda p: f"{p}-{next(ids)}", topics=lambda: TOPICS
        )
        super().__init__(self.c)
        self.replies: dict[tuple[str, str], Any] = {}

    def run(self, outcome: Outcome) -> Any:
        response = super().run(outcome)
        for ev in self.c.take_outbox():
            if isinstance(ev, Reply):
                self.replies[(ev.kind, ev.member_id)] = ev.result
        return response

    def join(self, member_id: str, owned: tuple[int, ...] = (), session: int = 3000) -> Any:
        sub = encode_subscription(["t"], [TopicPartition("t", p) for p in owned])
        req = JoinRequest(
            G, member_id, None, "c", "/h", session, 5000, "consumer", (("range", sub),), True
        )
        result = self.run(self.c.join_group(req, self.now))
        if isinstance(result, Pending):
            self.due_timers()
            return self.replies.pop(("join", result.member_id), result)
        return result

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes]) -> Any:
        out = self.c.sync_group(
            G, generation, member_id, None, "consumer", None, assignments, self.now
        )
        result = self.run(out)
        if isinstance(result, Pending):
            return self.replies.pop(("sync", member_id), result)
        return result

    def heartbeat(self, member_id: str, generation: int) -> E:
        return self.run(self.c.heartbeat(G, generation, member_id, None, self.now))  # type: ignore[no-any-return]

    def hb(
        self, member_id: str, epoch: int, owned: frozenset[int] | None = None
    ) -> ConsumerHeartbeatResult:
        first = epoch == 0
        req = ConsumerHeartbeat(
            G,
            member_id,
            epoch,
            rebalance_timeout_ms=5000 if first else -1,
            subscribed_topic_names=("t",) if first else None,
            owned={} if first else ({T: owned} if owned else {}),
        )
        return self.run(self.c.consumer_heartbeat(req, TOPICS, self.now))  # type: ignore[no-any-return]

    def due_timers(self) -> None:
        """What the runtime's timer does next when a deadline is already due (an initial
        rebalance with no delay ends on the timer, never inside the JoinGroup)."""
        deadline = self.c.next_deadline()
        if deadline is not None and deadline <= self.now:
            self.run(self.c.tick(self.now))

    def tick(self, ms: int) -> None:
        self.now += ms
        self.run(self.c.tick(self.now))

    def replayed(self) -> GroupCoordinator:
        return self.rebuilt(GroupCoordinator(GroupConfig(), topics=lambda: TOPICS))


def synced(result: SyncResult) -> frozenset[int]:
    assert result.error == E.NONE, result
    return frozenset(tp.partition for tp in client_assignment(result.assignment))


def classic_group_of_two(h: Harness) -> tuple[str, str]:
    """A Stable classic group at generation 2: a owns 0-2, b owns 3-5."""
    a = h.join(h.join("").member_id).member_id  # KIP-394: the id first, then the join
    assert synced(h.sync(a, 1, {a: encode_assignment({"t": list(range(6))})})) == ALL
    b = h.join("").member_id
    assert isinstance(h.join(b), Pending)  # the group rebalances: a must rejoin
    assert h.heartbeat(a, 1) == E.REBALANCE_IN_PROGRESS
    ja = h.join(a)
    jb = h.replies.pop(("join", b))
    assert ja.error == jb.error == E.NONE and ja.generation == jb.generation == 2
    assert ja.leader == a
    assert isinstance(h.run(h.c.sync_group(G, 2, b, None, "consumer", None, {}, h.now)), Pending)
    plan = {a: encode_assignment({"t": [0, 1, 2]}), b: encode_assignment({"t": [3, 4, 5]})}
    assert synced(h.sync(a, 2, plan)) == {0, 1, 2}
    assert synced(h.replies.pop(("sync", b))) == {3, 4, 5}
    assert h.c.groups[G].state == GroupState.STABLE
    return a, b


def _rejoin(member_id: str) -> JoinRequest:
    sub = encode_subscription(["t"])
    return JoinRequest(
        G, member_id, None, "c", "/h", 3000, 5000, "consumer", (("range", sub),), True
    )


def owners(h: Harness) -> dict[int, str]:
    """Who owns each partition (assigned or pending revocation); no partition twice."""
    out: dict[int, str] = {}
    for m in h.c.consumer.groups[G].members.values():
        for assignment in (m.assigned, m.pending_revocation):
            for p in assignment.get(T, frozenset()):
                assert p not in out, f"partition {p} owned by {out[p]} and {m.member_id}"
                out[p] = m.member_id
    return out


def upgraded(h: Harness) -> tuple[str, str, ConsumerHeartbeatResult]:
    a, b = classic_group_of_two(h)
    r = h.hb("k", 0)
    assert r.error == E.NONE and r.member_epoch == 3
    return a, b, r


# -- upgrade -----------------------------------------------------------------------------------


def test_consumer_member_converts_a_classic_group_and_classic_members_stay() -> None:
    h = Harness()
    a, b, k = upgraded(h)
    assert G not in h.c.groups and G in h.c.consumer.groups
    group = h.c.consumer.groups[G]
    assert group.group_epoch == 3
    ma, mb = group.members[a], group.members[b]
    assert ma.is_classic and mb.is_classic and not group.members["k"].is_classic
    # The classic members own what their classic assignment said, at the classic generation.
    assert (ma.member_epoch, ma.assigned[T]) == (2, frozenset({0, 1, 2}))
    assert (mb.member_epoch, mb.assigned[T]) == (2, frozenset({3, 4, 5}))
    # The newcomer waits for partitions still owned by the classic members.
    assert k.assignment == {} and group.members["k"].state == MemberState.UNRELEASED_PARTITIONS
    assert set(owners(h).values()) == {a, b}
    # Classic members are told to rejoin through their heartbeat, and keep committing at
    # their generation until they do.
    assert h.heartbeat(a, 2) == E.REBALANCE_IN_PROGRESS
    assert h.heartbeat(a, 1) == E.ILLEGAL_GENERATION
    commit = h.c.commit_offsets(G, 2, a, None, [OffsetToCommit("t", 0, 5)], h.now)
    assert h.run(commit) == {("t", 0): E.NONE}
    commit = h.c.commit_offsets(G, 3, a, None, [OffsetToCommit("t", 0, 6)], h.now)
    assert h.run(commit) == {("t", 0): E.ILLEGAL_GENERATION}


def test_classic_members_rejoin_and_no_partition_is_ever_owned_twice() -> None:
    h = Harness()
    a, b, _ = upgraded(h)
    # a rejoins the eager way (owning nothing): it keeps its share of the target, answered at
    # once as a follower at the new epoch; the partitions it gave up go to k.
    ja = h.join(a)
    assert isinstance(ja, JoinResult)
    assert (ja.error, ja.generation, ja.protocol_name, ja.leader) == (E.NONE, 3, "range", "")
    got_a = synced(h.sync(a, 3, {}))
    assert got_a and got_a < {0, 1, 2}
    owners(h)
    got_k = h.hb("k", 3, frozenset())
    assert got_k.assignment is not None
    k_parts = got_k.assignment.get(T, frozenset())
    assert k_parts == {0, 1, 2} - got_a
    # b still owns 3-5 until it rejoins too.
    assert h.heartbeat(b, 2) == E.REBALANCE_IN_PROGRESS
    # b rejoins the cooperative way, still owning 3-5: it first gives up what k gets and
    # stays at its epoch (rule 35), then rejoins owning only what it keeps.
    assert h.join(b, owned=(3, 4, 5)).generation == 2
    got_b = synced(h.sync(b, 2, {}))
    assert len(got_b) == 2 and got_b < {3, 4, 5}
    owners(h)
    assert h.heartbeat(b, 2) == E.REBALANCE_IN_PROGRESS
    assert h.join(b, owned=tuple(got_b)).generation == 3
    assert synced(h.sync(b, 3, {})) == got_b
    assert h.heartbeat(b, 3) == E.NONE
    rest = h.hb("k", 3, k_parts).assignment
    assert rest is not None
    k_parts = rest.get(T, k_parts)
    assert got_a | got_b | k_parts == ALL
    assert not (got_a & got_b or got_a & k_parts or got_b & k_parts)
    assert h.heartbeat(a, 3) == E.NONE and h.c.consumer.groups[G].state == "Stable"
    # A classic member's old generation is fenced the classic way.
    assert h.sync(a, 2, {}) == SyncResult(E.ILLEGAL_GENERATION)


def test_a_classic_member_that_does_not_rejoin_in_time_is_removed() -> None:
    h = Harness(session_timeout_ms=60_000)
    a, b, _ = upgraded(h)
    assert h.heartbeat(a, 2) == E.REBALANCE_IN_PROGRESS
    for second in range(1, 6):  # both heartbeat (sessions are fine); neither rejoins
        h.tick(1000)
        h.heartbeat(a, 2)
        if second >= 2:
            assert h.heartbeat(b, 2) == E.REBALANCE_IN_PROGRESS
    # a's rebalance timeout (5 s) has passed, b's has not
    members = h.c.consumer.groups[G].members
    assert a not in members and b in members


def test_a_classic_member_that_joins_but_never_syncs_is_removed() -> None:
    h = Harness(session_timeout_ms=60_000)
    a, b, _ = upgraded(h)
    assert h.join(a).generation == 3
    synced(h.sync(b, h.join(b).generation, {}))
    for _ in range(4):  # both heartbeat; only b sent SyncGroup
        h.tick(1000)
        assert h.heartbeat(a, 3) == E.NONE
        assert h.heartbeat(b, 3) == E.NONE
    h.tick(1000)  # a's rebalance timeout (5 s) since it joined
    members = h.c.consumer.groups[G].members
    assert a not in members and b in members


# -- downgrade ---------------------------------------------------------------------------------


def test_last_consumer_member_leaving_converts_back_to_a_classic_group() -> None:
    h = Harness()
    a, b, _ = upgraded(h)
    ja = h.join(a)
    h.sync(a, ja.generation, {})
    assert h.hb("k", -1).error == E.NONE
    assert G not in h.c.consumer.groups
    group = h.c.groups[G]
    # At the group epoch, rebalancing: both classic members rejoin the classic way.
    assert group.state == GroupState.PREPARING_REBALANCE and group.generation == 3
    assert set(group.members) == {a, b} and group.protocol_name == "range"
    assert h.heartbeat(a, 3) == E.REBALANCE_IN_PROGRESS
    pending = h.run(h.c.join_group(_rejoin(a), h.now))
    jb = h.join(b)
    ja = h.replies.pop(("join", a)) if isinstance(pending, Pending) else pending
    assert ja.error == jb.error == E.NONE and ja.generation == jb.generation == 4
    assert h.c.groups[G].state == GroupState.COMPLETING_REBALANCE


def test_a_fenced_last_consumer_member_also_converts_back() -> None:
    h = Harness()
    a, b, _ = upgraded(h)
    for _ in range(4):  # the classic members keep heartbeating; k falls silent
        h.tick(400)
        h.heartbeat(a, 2)
        h.heartbeat(b, 2)
    assert G not in h.c.consumer.groups and set(h.c.groups[G].members) == {a, b}


def test_a_classic_member_leaving_does_not_downgrade() -> None:
    h = Harness()
    a, b, _ = upgraded(h)
    leave = h.run(h.c.leave_group(G, [(a, None), ("nobody", None)], h.now))
    assert leave == (E.NONE, [(a, None, E.NONE), ("nobody", None, E.UNKNOWN_MEMBER_ID)])
    assert set(h.c.consumer.groups[G].members) == {b, "k"}


# -- the policy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["disabled", "downgrade"])
def test_a_policy_without_upgrades_refuses_the_consumer_member(policy: str) -> None:
    h = Harness(migration_policy=policy)
    classic_group_of_two(h)
    before = len(h.log.entries)
    r = h.hb("k", 0)
    assert r.error == E.GROUP_ID_NOT_FOUND and "not a consumer group" in (r.message or "")
    assert G in h.c.groups and G not in h.c.consumer.groups and len(h.log.entries) == before


def test_upgrade_only_policy_keeps_the_consumer_group_when_its_consumer_member_leaves() -> None:
    h = Harness(migration_policy="upgrade")
    a, b, _ = upgraded(h)
    h.hb("k", -1)
    assert G not in h.c.groups and set(h.c.consumer.groups[G].members) == {a, b}


def test_the_broker_setting_takes_kafkas_values() -> None:
    assert BrokerConfig().group_consumer_migration_policy == "bidirectional"
    c = BrokerConfig().with_properties({"group.consumer.migration.policy": "UPGRADE"}).validate()
    assert c.group_consumer_migration_policy == "UPGRADE"
    with pytest.raises(ConfigError, match=r"migration\.policy must be one of"):
        BrokerConfig().with_properties({"group.consumer.migration.policy": "sideways"}).validate()


# -- records and replay (rule 26) ---------------------------------------------------------------


def test_classic_member_metadata_is_kafkas_tagged_field() -> None:
    key = ConsumerGroupKey(5, G, "m")
    plain = ConsumerGroupMemberMetadataValue(None, None, "c", "/h", ("t",), None, 5000, None)
    classic = ConsumerGroupMemberMetadataValue(
        None, None, "c", "/h", ("t",), None, 5000, None, ClassicMemberMetadata(3000, (("r", b"x"),))
    )
    raw = encode_consumer_value(classic)
    # Tag 0 after the plain fields: int8 1 (not null), session timeout, protocols, no tags.
    tagged = b"\x01\x00\x00\x0b\xb8\x02\x02r\x02x\x00\x00"
    assert raw == encode_consumer_value(plain)[:-1] + b"\x01\x00" + bytes([len(tagged)]) + tagged
    assert decode_consumer_value(key, raw) == classic
    assert decode_consumer_value(key, encode_consumer_value(plain)) == plain


def test_replay_mid_migration_rebuilds_the_group_and_members_carry_on() -> None:
    h = Harness()
    a, b, _ = upgraded(h)
    h.sync(a, h.join(a).generation, {})
    live = h.c.durable_state()
    # The broker restarted: the members go on against the replayed group.
    fresh = h.c = h.restart(GroupCoordinator(GroupConfig(), topics=lambda: TOPICS))
    assert fresh.durable_state() == live
    assert G not in fresh.groups
    # The classic members' sessions are theirs (3 s), the consumer member's the broker's.
    deadlines = fresh.consumer.groups[G].session_deadlines
    assert (deadlines[a], deadlines["k"]) == (h.now + 3000, h.now + 45_000)
    assert h.heartbeat(a, 3) == E.NONE
    assert h.heartbeat(b, 2) == E.REBALANCE_IN_PROGRESS
    assert h.hb("k", 3, frozenset()).error == E.NONE
    # Classic members have their own session timeout (3 s) after the restart too.
    h.tick(3100)
    assert set(h.c.consumer.groups[G].members) == {"k"}


def test_replay_after_a_downgrade_is_the_classic_group() -> None:
    h = Harness()
    a, b, _ = upgraded(h)
    h.hb("k", -1)
    fresh = h.replayed()
    assert G not in fresh.consumer.groups
    group = fresh.groups[G]
    assert set(group.members) == {a, b} and group.generation == 3
    assert group.state == GroupState.STABLE  # as loaded; the members' heartbeats carry on
    assert fresh.heartbeat(G, 3, a, None, h.now).response == E.NONE


def test_a_conversion_the_log_refused_leaves_the_classic_group() -> None:
    h = Harness()
    a, b = classic_group_of_two(h)
    req = ConsumerHeartbeat(G, "k", 0, rebalance_timeout_ms=5000, subscribed_topic_names=("t",))
    outcome = h.c.consumer_heartbeat(req, TOPICS, h.now)
    assert outcome.response.error == E.NONE and G in h.c.consumer.groups
    h.c.store_failed(outcome.records, E.NOT_ENOUGH_REPLICAS)
    assert G not in h.c.consumer.groups and set(h.c.groups[G].members) == {a, b}
    assert h.heartbeat(a, 2) == E.NONE


def test_embedded_protocol_of_every_version_and_bad_bytes() -> None:
    import io

    from kio.schema.consumer_protocol_subscription.v3 import ConsumerProtocolSubscription
    from kio.schema.consumer_protocol_subscription.v3.data import TopicPartition as SubTP
    from kio.serial import entity_writer

    buf = io.BytesIO()
    buf.write(b"\x00\x03")
    sub = ConsumerProtocolSubscription(
        topics=("t",), owned_partitions=(SubTP(topic="t", partitions=(1, 2)),), rack_id="r1"
    )
    entity_writer(ConsumerProtocolSubscription)(buf, sub)
    v3 = buf.getvalue()
    got = decode_subscription(v3)
    assert (got.topics, got.owned, got.rack_id) == (("t",), {"t": frozenset({1, 2})}, "r1")
    # A version newer than known is read with the newest schema (versions only append).
    assert decode_subscription(b"\x00\x09" + v3[2:]) == got
    assert decode_subscription(encode_subscription(["a", "b"])).topics == ("a", "b")
    assert decode_assignment(b"") == {}
    assert decode_assignment(encode_assignment({"t": [4]}, version=3)) == {"t": frozenset({4})}
    for bad in (b"", b"\x00", b"\xff\xff" + v3[2:], b"\x00\x01\x00\x00\x00\x05\x00"):
        with pytest.raises(ConsumerProtocolError):
            decode_subscription(bad)
    with pytest.raises(ConsumerProtocolError):
        decode_assignment(b"\x00\x00\x00\x00\x00\x02")


# -- static members across protocols -------------------------------------------------------------


def static_join(h: Harness, member_id: str, iid: str) -> Any:
    sub = encode_subscription(["t"])
    req = JoinRequest(G, member_id, iid, "c", "/h", 3000, 5000, "consumer", (("range", sub),), True)
    return h.run(h.c.join_group(req, h.now))


def static_hb(
    h: Harness, member_id: str, epoch: int, iid: str, owned: frozenset[int] = frozenset()
) -> ConsumerHeartbeatResult:
    first = epoch == 0
    req = ConsumerHeartbeat(
        G,
        member_id,
        epoch,
        instance_id=iid,
        rebalance_timeout_ms=5000 if first else -1,
        subscribed_topic_names=("t",) if first else None,
        owned={} if first or not owned else {T: owned},
    )
    return h.run(h.c.consumer_heartbeat(req, TOPICS, h.now))  # type: ignore[no-any-return]


def consumer_and_static_classic(h: Harness) -> tuple[str, str]:
    """A consumer group: static consumer member k ("ik") owns 0-2, static classic member a
    ("ia") owns 3-5, both stable at epoch 3 (k's subscription made it 2, a's join 3)."""
    assert static_hb(h, "k", 0, "ik").error == E.NONE
    ja = static_join(h, "", "ia")  # a static member needs no member id round trip
    assert ja.error == E.NONE and ja.generation == 3
    a = ja.member_id
    assert static_hb(h, "k", 2, "ik", ALL).assignment == {T: frozenset({0, 1, 2})}
    assert static_hb(h, "k", 2, "ik", frozenset({0, 1, 2})).member_epoch == 3
    assert synced(h.sync(a, static_join(h, a, "ia").generation, {})) == {3, 4, 5}
    return "k", a


def test_a_static_classic_member_replaces_the_member_holding_its_instance_id() -> None:
    h = Harness()
    k, a = consumer_and_static_classic(h)
    n = static_join(h, "", "ia")  # a restarted: same instance id, no member id
    assert n.error == E.NONE and n.member_id not in (a, k) and n.generation == 3
    group = h.c.consumer.groups[G]
    assert set(group.members) == {k, n.member_id}
    new = group.members[n.member_id]
    # It takes over the old member's epoch and assignment: no rebalance, no partition moves.
    assert (new.member_epoch, new.assigned, new.instance_id) == (3, {T: {3, 4, 5}}, "ia")
    assert group.group_epoch == 3 and group.targets[n.member_id] == {T: {3, 4, 5}}
    assert synced(h.sync(n.member_id, 3, {})) == {3, 4, 5}
    # The old instance is fenced on every classic call.
    assert h.run(h.c.heartbeat(G, 3, a, "ia", h.now)) == E.FENCED_INSTANCE_ID
    old_sync = h.c.sync_group(G, 3, a, "ia", "consumer", None, {}, h.now)
    assert h.run(old_sync) == SyncResult(E.FENCED_INSTANCE_ID)
    assert static_join(h, a, "ia").error == E.FENCED_INSTANCE_ID
    assert static_join(h, "nobody", "iz").error == E.UNKNOWN_MEMBER_ID
    # A restart replays the same group: the new member, not the old.
    fresh = h.replayed()
    assert fresh.durable_state() == h.c.durable_state()
    assert set(fresh.consumer.groups[G].members) == {k, n.member_id}


def test_replacing_the_last_consumer_member_downgrades_to_a_classic_group() -> None:
    h = Harness()
    k, a = consumer_and_static_classic(h)
    n = static_join(h, "", "ik")  # k restarted as a classic consumer
    assert (n.error, n.generation, n.protocol_name) == (E.NONE, 3, "range")
    assert G not in h.c.consumer.groups
    group = h.c.groups[G]
    assert set(group.members) == {a, n.member_id} and group.generation == 3
    assert group.static_members == {"ia": a, "ik": n.member_id}
    # The newcomer holds k's partitions in the classic group (the leader's next plan starts
    # from them); the group rebalances so every member rejoins the classic way.
    got = client_assignment(group.members[n.member_id].assignment)
    assert {tp.partition for tp in got} == {0, 1, 2}
    assert group.state == GroupState.PREPARING_REBALANCE
    assert h.sync(n.member_id, 3, {}) == SyncResult(E.REBALANCE_IN_PROGRESS)
    # The replaced consumer member is no member of the classic group.
    assert static_hb(h, k, 3, "ik").error == E.GROUP_ID_NOT_FOUND
    fresh = h.replayed()
    assert G not in fresh.consumer.groups
    loaded = fresh.groups[G]
    assert set(loaded.members) == {a, n.member_id} and loaded.generation == 3
    assert loaded.members[n.member_id].assignment == group.members[n.member_id].assignment


def test_replacing_the_last_consumer_member_without_downgrades_stays_a_consumer_group() -> None:
    h = Harness(migration_policy="upgrade")
    _, a = consumer_and_static_classic(h)
    n = static_join(h, "", "ik")
    assert n.error == E.NONE and G not in h.c.groups
    members = h.c.consumer.groups[G].members
    assert set(members) == {a, n.member_id}
    assert members[n.member_id].is_classic and members[n.member_id].assigned == {T: {0, 1, 2}}
    assert synced(h.sync(n.member_id, n.generation, {})) == {0, 1, 2}


def test_a_replaced_consumer_member_is_fenced() -> None:
    h = Harness()
    k, _ = consumer_and_static_classic(h)
    # Another consumer member keeps the group a consumer group when k is replaced.
    assert static_hb(h, "m", 0, "im").error == E.NONE
    n = static_join(h, "", "ik")
    assert n.error == E.NONE and G in h.c.consumer.groups
    # It starts from k's partitions, towards k's target (m takes some).
    group = h.c.consumer.groups[G]
    assert group.members[n.member_id].assigned == group.targets[n.member_id]
    assert 0 < len(group.targets[n.member_id][T]) < 3
    r = static_hb(h, k, 3, "ik", frozenset({0, 1, 2}))
    assert r.error == E.FENCED_INSTANCE_ID


def test_a_consumer_member_cannot_take_an_instance_id_a_classic_member_holds() -> None:
    h = Harness()
    k, a = consumer_and_static_classic(h)
    before = len(h.log.entries)
    r = static_hb(h, "", 0, "ia")  # Kafka: only an instance that left (epoch -2) is taken
    assert r.error == E.UNRELEASED_INSTANCE_ID and len(h.log.entries) == before
    assert set(h.c.consumer.groups[G].members) == {k, a}
    # The same in a classic group: the upgrade it would make is undone.
    h2 = Harness()
    pending = static_join(h2, "", "ia")
    h2.due_timers()
    sa = h2.replies.pop(("join", pending.member_id)) if isinstance(pending, Pending) else pending
    synced(h2.sync(sa.member_id, sa.generation, {sa.member_id: encode_assignment({"t": [0]})}))
    before = len(h2.log.entries)
    r = static_hb(h2, "", 0, "ia")
    assert r.error == E.UNRELEASED_INSTANCE_ID and len(h2.log.entries) == before
    assert G not in h2.c.consumer.groups and set(h2.c.groups[G].members) == {sa.member_id}
