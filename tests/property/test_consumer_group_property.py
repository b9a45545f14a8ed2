"""A KIP-848 consumer group under random joins, leaves, heartbeats, crashes and topic growth
(docs/semantics.md, rules 34-35): no partition is ever owned by two members, neither in the
coordinator's view nor in what the clients believe they own; once everyone heartbeats, every
partition is assigned exactly once and the group is Stable; and replaying the records
rebuilds the same group."""

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


class ConsumerGroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        cfg = GroupConfig(consumer=ConsumerConfig(session_timeout_ms=SESSION))
        self.c = GroupCoordinator(cfg)
        self.log: list[tuple[bytes, bytes | None]] = []
        self.now = 0
        self.topics = {"t": TopicInfo("t", TID, 5), "s": TopicInfo("s", TID2, 2)}
        self.clients: dict[str, Client] = {}
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
            rebalance_timeout_ms=60_000 if joining else -1,
            subscribed_topic_names=("t", "s") if joining else None,
            server_assignor=client.assignor if joining else None,
            owned=dict(client.owned),
        )
        r = self.run(self.c.consumer_heartbeat(req, self.topics, self.now))
        if r.error in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
            client.epoch, client.owned = 0, {}  # gives everything up and rejoins
            return
        assert r.error == E.NONE, r
        client.epoch = r.member_epoch
        if r.assignment is not None:
            client.owned = dict(r.assignment)  # revokes, then takes what is new

    @rule(i=st.integers(0, len(MEMBERS) - 1), assignor=st.sampled_from([None, "range"]))
    def join(self, i: int, assignor: str | None) -> None:
        if MEMBERS[i] in self.clients:
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
    def nobody_shares_a_partition(self) -> None:
        seen: set[tuple[uuid.UUID, int]] = set()
        for client in self.clients.values():
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
