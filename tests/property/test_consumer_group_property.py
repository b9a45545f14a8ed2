"""A KIP-848 consumer group under random joins, leaves, heartbeats, crashes, pauses, slow
revocations, passing time and topic growth (docs/semantics.md, rules 34-35): no partition is
ever owned by two members, neither in the coordinator's view nor in what the clients that are
still members believe they own; a client the coordinator dropped while it was paused (a
zombie, still believing it owns its partitions) cannot commit, and is fenced when it
heartbeats again; a member that does not give up a revoked partition within its rebalance
timeout is fenced; once everyone heartbeats, every partition is assigned exactly once and the
group is Stable; and replaying the records rebuilds the same group."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from samsa.coordinator.consumer_group_coordinator import (
    ConsumerConfig,
    ConsumerHeartbeat,
    TopicInfo,
)
from samsa.coordinator.group_coordinator import GroupConfig, GroupCoordinator, Outcome
from samsa.coordinator.offsets import decode
from samsa.protocol.errors import ErrorCode as E

G = "g"
SESSION = 1000
REBALANCE = 1500  # a member must give up revoked partitions within this
STEP = 600  # time passing between heartbeats: under the session timeout
TID = uuid.UUID(int=7)
TID2 = uuid.UUID(int=8)
MEMBERS = [f"m{i}" for i in range(4)]


@dataclass
class Client:
    """What a well-behaved consumer does with the answers it gets."""

    member_id: str
    epoch: int = 0
    owned: dict[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    assignor: str | None = None
    slow: bool = False  # its revocation callback is still running: it keeps what it owns
    revoke_since: int | None = None  # since when it holds partitions it was told to revoke


class ConsumerGroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        cfg = GroupConfig(consumer=ConsumerConfig(session_timeout_ms=SESSION))
        self.c = GroupCoordinator(cfg)
        self.log: list[tuple[bytes, bytes | None]] = []
        self.now = 0
        self.topics = {"t": TopicInfo("t", TID, 5), "s": TopicInfo("s", TID2, 2)}
        self.clients: dict[str, Client] = {}
        self.paused: dict[str, Client] = {}  # no heartbeats: the coordinator may drop them
        self.fenced: list[str] = []  # member ids told FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID
        self.incarnation = 0

    def run(self, outcome: Outcome) -> object:
        for r in outcome.records:
            key, value = self.c.serialize(r)
            self.log.append((key, value))
            self.c.replay(decode(key, value), self.now)
        return outcome.response

    def heartbeat(self, client: Client) -> None:
        joining = client.epoch == 0
        req = ConsumerHeartbeat(
            G,
            client.member_id,
            client.epoch,
            rebalance_timeout_ms=REBALANCE if joining else -1,
            subscribed_topic_names=("t", "s") if joining else None,
            server_assignor=client.assignor if joining else None,
            owned=dict(client.owned),
        )
        r = self.run(self.c.consumer_heartbeat(req, self.topics, self.now))
        if r.error in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
            self.fenced.append(client.member_id)
            client.epoch, client.owned = 0, {}  # gives everything up and rejoins
            client.revoke_since = None
            return
        assert r.error == E.NONE, r
        client.epoch = r.member_epoch
        if r.assignment is None:
            return
        new = dict(r.assignment)
        revoked = any(client.owned.get(t, frozenset()) - new.get(t, frozenset()) for t in new)
        revoked |= any(t not in new and ps for t, ps in client.owned.items())
        if client.slow and revoked:
            if client.revoke_since is None:
                client.revoke_since = self.now
            return  # keeps (and reports) what it owns
        client.owned, client.revoke_since = new, None  # revokes, then takes what is new

    def member_ids(self) -> set[str]:
        group = self.c.consumer.groups.get(G)
        return set(group.members) if group is not None else set()

    @rule(i=st.integers(0, len(MEMBERS) - 1), assignor=st.sampled_from([None, "range"]))
    def join(self, i: int, assignor: str | None) -> None:
        if MEMBERS[i] in self.clients or MEMBERS[i] in self.paused:
            return
        self.incarnation += 1
        client = Client(f"{MEMBERS[i]}-{self.incarnation}", assignor=assignor)
        self.clients[MEMBERS[i]] = client
        self.heartbeat(client)

    @rule(i=st.integers(0, len(MEMBERS) - 1))
    def heartbeat_one(self, i: int) -> None:
        client = self.clients.get(MEMBERS[i])
        if client is not None:
            self.heartbeat(client)

    @rule(i=st.integers(0, len(MEMBERS) - 1))
    def leave(self, i: int) -> None:
        client = self.clients.pop(MEMBERS[i], None)
        if client is not None and client.epoch > 0:
            req = ConsumerHeartbeat(G, client.member_id, -1)
            assert self.run(self.c.consumer_heartbeat(req, self.topics, self.now)).error == E.NONE

    @rule(i=st.integers(0, len(MEMBERS) - 1))
    def pause(self, i: int) -> None:
        """The member stops (a long GC pause, SIGSTOP) still believing it owns its partitions."""
        client = self.clients.pop(MEMBERS[i], None)
        if client is not None:
            self.paused[MEMBERS[i]] = client

    @rule(i=st.integers(0, len(MEMBERS) - 1))
    def resume(self, i: int) -> None:
        client = self.paused.pop(MEMBERS[i], None)
        if client is None:
            return
        dropped = client.epoch > 0 and client.member_id not in self.member_ids()
        self.heartbeat(client)
        if dropped:  # a zombie: fenced, it gave up everything
            assert (client.epoch, client.owned) == (0, {}), client
        self.clients[MEMBERS[i]] = client

    @rule(i=st.integers(0, len(MEMBERS) - 1), slow=st.booleans())
    def slow_revocation(self, i: int, slow: bool) -> None:
        client = self.clients.get(MEMBERS[i])
        if client is not None:
            client.slow = slow

    @rule()
    def time_passes(self) -> None:
        """Everyone live heartbeats; a slow member past its rebalance timeout is fenced."""
        self.now += STEP
        for client in list(self.clients.values()):
            self.heartbeat(client)
        self.run(self.c.tick(self.now))
        members = self.member_ids()
        for client in self.clients.values():
            since = client.revoke_since
            if since is not None and self.now - since >= REBALANCE + STEP:
                assert client.member_id not in members, f"{client.member_id} never fenced"

    @rule(i=st.integers(0, len(MEMBERS) - 1))
    def crash(self, i: int) -> None:
        """The member dies: only its session timeout removes it."""
        if self.clients.pop(MEMBERS[i], None) is None:
            return
        self.now += SESSION
        for client in list(self.clients.values()):
            self.heartbeat(client)
        self.run(self.c.tick(self.now))

    @rule()
    def topic_grows(self) -> None:
        t = self.topics["t"]
        if t.partitions < 8:
            self.topics["t"] = TopicInfo("t", TID, t.partitions + 1)

    @invariant()
    def zombies_cannot_commit(self) -> None:
        members = self.member_ids()
        group = self.c.consumer.groups.get(G)
        for client in [*self.clients.values(), *self.paused.values()]:
            if group is None or client.epoch <= 0 or client.member_id in members:
                continue
            code = self.c.consumer.validate_commit(group, client.member_id, client.epoch)
            assert code != E.NONE, f"{client.member_id}, dropped, may commit"

    @invariant()
    def nobody_shares_a_partition(self) -> None:
        seen: set[tuple[uuid.UUID, int]] = set()
        members = self.member_ids()
        # Clients the coordinator still counts (paused ones too); a dropped one is a zombie.
        for client in [*self.clients.values(), *self.paused.values()]:
            if client.member_id not in members:
                continue
            for tid, parts in client.owned.items():
                for p in parts:
                    assert (tid, p) not in seen, f"{tid}/{p} owned by two clients"
                    seen.add((tid, p))
        group = self.c.consumer.groups.get(G)
        if group is None:
            return
        held: set[tuple[uuid.UUID, int]] = set()
        for m in group.members.values():
            for a in (m.assigned, m.pending_revocation):
                for tid, parts in a.items():
                    for p in parts:
                        assert (tid, p) not in held, f"{tid}/{p} held by two members"
                        held.add((tid, p))

    def teardown(self) -> None:
        for name in list(self.paused):
            self.resume(MEMBERS.index(name))
        for client in self.clients.values():
            client.slow = False
        if not self.clients:
            return
        for _ in range(6):  # heartbeats converge within a few rounds
            for client in self.clients.values():
                self.heartbeat(client)
        self.nobody_shares_a_partition()
        group = self.c.consumer.groups[G]
        assert group.state == "Stable"
        owned = sorted(
            (tid, p) for c in self.clients.values() for tid, ps in c.owned.items() for p in ps
        )
        wanted = sorted((t.topic_id, p) for t in self.topics.values() for p in range(t.partitions))
        assert owned == wanted
        fresh = GroupCoordinator(GroupConfig())
        for key, value in self.log:
            fresh.replay(decode(key, value), self.now)
        assert fresh.durable_state() == self.c.durable_state()


ConsumerGroupMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
TestConsumerGroup = ConsumerGroupMachine.TestCase


# The two fencing paths, each reached for certain (the random runs reach them only sometimes).


def test_a_slow_revoker_is_fenced_after_its_rebalance_timeout() -> None:
    m = ConsumerGroupMachine()
    m.join(0, None)
    m.heartbeat_one(0)  # m0 owns every partition
    m.slow_revocation(0, True)
    m.join(1, None)  # m0 is told to give half up; it does not
    for _ in range(5):  # time_passes checks: fenced once past the rebalance timeout
        m.time_passes()
        m.nobody_shares_a_partition()
    assert m.fenced[:1] == ["m0-1"]
    m.teardown()


def test_a_paused_member_dropped_by_the_coordinator_is_a_fenced_zombie() -> None:
    m = ConsumerGroupMachine()
    m.join(0, None)
    m.join(1, None)
    for _ in range(3):
        m.time_passes()
    m.pause(0)  # still believes it owns its partitions
    for _ in range(3):  # its session expires; m1 takes everything
        m.time_passes()
        m.nobody_shares_a_partition()
    zombie = m.paused["m0"]
    assert zombie.owned and zombie.member_id not in m.member_ids()
    m.zombies_cannot_commit()
    m.resume(0)
    assert m.fenced == [zombie.member_id]
    m.teardown()
