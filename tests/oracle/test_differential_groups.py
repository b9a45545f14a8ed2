"""Differential scenarios of consumer groups: the classic protocol's errors (unknown member,
illegal generation, rebalance in progress, static members, group.max.size) and the consumer
protocol's (ConsumerGroupHeartbeat epochs and errors, ConsumerGroupDescribe), answered by
samsa as by Apache Kafka. The module runs its own brokers, both with group.max.size=2 and no
initial rebalance delay."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing.kafka import KafkaNode
from samsa.testing.oracle import TRANSIENT, Deviation, Outcome, Rule, Side

Run = Callable[..., Outcome]
GROUPS = {"group.max.size": "2", "group.initial.rebalance.delay.ms": "0"}
# D-GROUP-2: Kafka computes a consumer group's target at most once per this interval (default
# 1 s), samsa at every bump; 60 s makes Kafka's side of the deviation certain in a scenario.
KAFKA_GROUPS = {
    **GROUPS,
    "group.consumer.assignment.interval.ms": "60000",
    "group.consumer.max.assignment.interval.ms": "60000",
}
# Member ids are made by each broker: compared as identities, in order of appearance.
RULES = {"member_id": Rule.NODE, "leader": Rule.NODE}


@pytest.fixture(scope="module")
def differential_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    """Overrides the shared node of tests/oracle/conftest.py: these scenarios need GROUPS."""
    node = KafkaNode(tmp_path_factory.mktemp("kafka-groups"), overrides=KAFKA_GROUPS).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("samsa-groups"), GROUPS).start()
    yield broker
    broker.stop()


def _retry(resp: Any) -> bool:
    return int(getattr(resp, "error_code", 0)) in TRANSIENT


def _join_request(group: str, member: str = "", instance: str | None = None) -> Any:
    k, v = ApiKey.JOIN_GROUP, 5
    protocol = make_request(k, v, "JoinGroupRequestProtocol", name="range", metadata=b"m")
    return make_request(k, v, "JoinGroupRequest", group_id=group, session_timeout=10_000,
                        rebalance_timeout=10_000, member_id=member, group_instance_id=instance,
                        protocol_type="consumer", protocols=(protocol,))  # fmt: skip


def join(s: Side, label: str, group: str, member: str = "", instance: str | None = None) -> Any:
    return s.call(label, ApiKey.JOIN_GROUP, 5, _join_request(group, member, instance), retry=_retry)


def send_join(conn: BlockingConnection, group: str, member: str) -> int:
    """A JoinGroup that will wait for the rebalance: sent now, its answer read later."""
    return conn.send(ApiKey.JOIN_GROUP, 5, _join_request(group, member))


def sync(s: Side, label: str, group: str, gen: int, member: str, leader: bool = True) -> Any:
    k, v = ApiKey.SYNC_GROUP, 3
    assignments = (
        (make_request(k, v, "SyncGroupRequestAssignment", member_id=member, assignment=b"a"),)
        if leader
        else ()
    )
    req = make_request(k, v, "SyncGroupRequest", group_id=group, generation_id=gen,
                       member_id=member, group_instance_id=None,
                       assignments=assignments)  # fmt: skip
    return s.call(label, k, v, req)


def heartbeat(
    s: Side, label: str, group: str, gen: int, member: str, instance: str | None = None
) -> Any:
    k, v = ApiKey.HEARTBEAT, 3
    req = make_request(k, v, "HeartbeatRequest", group_id=group, generation_id=gen,
                       member_id=member, group_instance_id=instance)  # fmt: skip
    return s.call(label, k, v, req)


def commit(
    s: Side, label: str, group: str, gen: int, member: str, topic: str, *, v: int = 8
) -> Any:
    """OffsetCommit of offset 3 of the topic's partition 0 (v9+: ``gen`` is a member epoch)."""
    k = ApiKey.OFFSET_COMMIT
    part = make_request(k, v, "OffsetCommitRequestPartition", partition_index=0,
                        committed_offset=3, committed_leader_epoch=-1,
                        committed_metadata="m")  # fmt: skip
    req = make_request(k, v, "OffsetCommitRequest", group_id=group,
                       generation_id_or_member_epoch=gen, member_id=member,
                       group_instance_id=None,
                       topics=(make_request(k, v, "OffsetCommitRequestTopic", name=topic,
                                            partitions=(part,)),))  # fmt: skip
    return s.call(label, k, v, req)


def fetch_offsets(s: Side, label: str, group: str, topic: str) -> Any:
    k, v = ApiKey.OFFSET_FETCH, 7
    req = make_request(k, v, "OffsetFetchRequest", group_id=group, require_stable=False,
                       topics=(make_request(k, v, "OffsetFetchRequestTopic", name=topic,
                                            partition_indexes=(0,)),))  # fmt: skip
    return s.call(label, k, v, req)


def leave(s: Side, label: str, group: str, *members: str) -> Any:
    k, v = ApiKey.LEAVE_GROUP, 3
    ids = tuple(make_request(k, v, "MemberIdentity", member_id=m, group_instance_id=None)
                for m in members)  # fmt: skip
    return s.call(label, k, v, make_request(k, v, "LeaveGroupRequest", group_id=group, members=ids))


def test_classic_member_errors(differential: Run) -> None:
    def scenario(s: Side) -> None:
        group, topic = s.unique("g"), s.unique("t")
        s.create_topic(topic)
        s.find_coordinator("coordinator", group, key_type=0)
        first = join(s, "join-unknown", group)  # KIP-394: the id comes first
        joined = join(s, "join", group, first.member_id)
        me, gen = joined.member_id, joined.generation_id
        sync(s, "sync-old-generation", group, gen + 1, me)
        sync(s, "sync-unknown-member", group, gen, "nobody")
        sync(s, "sync", group, gen, me)
        heartbeat(s, "heartbeat", group, gen, me)
        heartbeat(s, "heartbeat-old-generation", group, gen - 1, me)
        heartbeat(s, "heartbeat-unknown-member", group, gen, "nobody")
        commit(s, "commit", group, gen, me, topic)
        commit(s, "commit-old-generation", group, gen - 1, me, topic)
        commit(s, "commit-unknown-member", group, gen, "nobody", topic)
        fetch_offsets(s, "committed", group, topic)
        leave(s, "leave-unknown-member", group, "nobody")
        leave(s, "leave", group, me)
        heartbeat(s, "heartbeat-after-leave", group, gen, me)
        commit(s, "commit-after-leave", group, gen, me, topic)

    differential(scenario, rules=RULES)


def test_rebalance_in_progress_and_group_max_size(differential: Run) -> None:
    def scenario(s: Side) -> None:
        group = s.unique("g")
        s.find_coordinator("coordinator", group, key_type=0)
        a = join(s, "a-join", group, join(s, "a-id", group).member_id)
        sync(s, "a-sync", group, a.generation_id, a.member_id)
        b_id = join(s, "b-id", group).member_id
        second = s.connect()
        pending = send_join(second, group, b_id)  # waits for a to rejoin
        time.sleep(0.5)  # the coordinator has taken it before a's heartbeat
        heartbeat(s, "a-heartbeat-during-rebalance", group, a.generation_id, a.member_id)
        join(s, "c-id-during-rebalance", group)  # a third member: the group is full
        a2 = join(s, "a-rejoin", group, a.member_id)
        s.note("b-join", second.receive(ApiKey.JOIN_GROUP, 5, pending))
        # b's answer came: the join phase is over, so the group is full (its two members; the
        # pending KIP-394 id of c-id-during-rebalance does not count) and a new member is
        # refused before it gets an id, by both brokers in every run since.
        join(s, "d-new-member-after", group)
        leads = a2.leader == a.member_id
        sync(s, "a-sync-2", group, a2.generation_id, a.member_id, leader=leads)
        heartbeat(s, "a-heartbeat-old-generation", group, a.generation_id, a.member_id)

    differential(scenario, rules=RULES)


def test_static_member_replaced_and_fenced(differential: Run) -> None:
    def scenario(s: Side) -> None:
        group = s.unique("g")
        s.find_coordinator("coordinator", group, key_type=0)
        old = join(s, "join", group, instance="i1")
        sync(s, "sync", group, old.generation_id, old.member_id)
        new = join(s, "rejoin-same-instance", group, instance="i1")
        heartbeat(s, "old-member-heartbeat", group, old.generation_id, old.member_id, "i1")
        heartbeat(s, "new-member-heartbeat", group, new.generation_id, new.member_id, "i1")
        heartbeat(s, "wrong-instance", group, new.generation_id, new.member_id, "i2")

    differential(scenario, rules=RULES)


def _consumer_heartbeat(
    s: Side,
    label: str,
    group: str,
    member: str,
    epoch: int,
    topics: tuple[str, ...] | None,
    assignor: str | None = None,
) -> Any:
    k, v = ApiKey.CONSUMER_GROUP_HEARTBEAT, 0
    req = make_request(k, v, "ConsumerGroupHeartbeatRequest", group_id=group, member_id=member,
                       member_epoch=epoch, instance_id=None, rack_id=None,
                       rebalance_timeout=30_000 if epoch == 0 else -1,
                       subscribed_topic_names=topics, server_assignor=assignor,
                       topic_partitions=() if epoch == 0 else None)  # fmt: skip
    return s.call(label, k, v, req, retry=_retry)


def describe(s: Side, label: str, group: str) -> Any:
    k, v = ApiKey.CONSUMER_GROUP_DESCRIBE, 0
    req = make_request(k, v, "ConsumerGroupDescribeRequest", group_ids=(group,),
                       include_authorized_operations=False)  # fmt: skip
    return s.call(label, k, v, req)


def test_consumer_protocol_epochs_and_errors(differential: Run) -> None:
    """A member joins subscribed to an existing topic (Kafka's first member epoch is then 2:
    the member's subscription and the topic metadata are two bumps), works at its epoch, is
    refused ahead of it or unknown, and leaves; the group's epochs are compared throughout."""

    def scenario(s: Side) -> None:
        group, topic = s.unique("g"), s.unique("t")
        s.create_topic(topic, 2)
        s.find_coordinator("coordinator", group, key_type=0)
        first = _consumer_heartbeat(s, "join", group, "", 0, (topic,))
        me, epoch = first.member_id, first.member_epoch
        describe(s, "describe-joined", group)
        _consumer_heartbeat(s, "steady", group, me, epoch, None)
        _consumer_heartbeat(s, "epoch-ahead", group, me, epoch + 5, None)
        _consumer_heartbeat(s, "unknown-member", group, "nobody-here-0000000000", 1, None)
        describe(s, "describe", group)
        describe(s, "describe-unknown", "no-such-group")
        _consumer_heartbeat(s, "leave", group, me, -1, None)
        describe(s, "describe-after-leave", group)

    differential(scenario, rules=RULES)


# D-GROUP-2: Kafka leaves the target of a's subscription for later (its assignment interval).
DEFERRED_TARGET = [
    Deviation("a-subscribes.member_epoch", 3, 2, "D-GROUP-2"),
    Deviation(
        "a-subscribes.assignment",
        {"topic_partitions": [{"topic_id": "topic#0", "partitions": [0, 1]}]},
        None,
        "D-GROUP-2",
    ),
    Deviation("describe-subscribed.groups[0].group_state", "Reconciling", "Assigning", "D-GROUP-2"),
    Deviation("describe-subscribed.groups[0].assignment_epoch", 3, 2, "D-GROUP-2"),
    Deviation("describe-subscribed.groups[0].members[0].member_epoch", 3, 2, "D-GROUP-2"),
    *(
        Deviation(
            f"describe-subscribed.groups[0].members[0].{f}.topic_partitions.len", 1, 0, "D-GROUP-2"
        )
        for f in ("assignment", "target_assignment")
    ),
    Deviation("describe-a-left.groups[0].assignment_epoch", 3, 2, "D-GROUP-2"),
    Deviation("epochs-seen[3]", 3, 2, "D-GROUP-2"),
]


def test_consumer_protocol_what_bumps_the_group_epoch(differential: Run) -> None:
    """Members joining with no subscription bump nothing (both at the new group's epoch 1);
    a member asking for another server assignor bumps the group (the preferred assignor
    changes), a subscription does, and each member leaving does. Kafka computes the target
    of the subscription later (D-GROUP-2); the group epochs are the same throughout."""

    def scenario(s: Side) -> None:
        group, topic = s.unique("g"), s.unique("t")
        s.create_topic(topic, 2)
        s.find_coordinator("coordinator", group, key_type=0)
        a = _consumer_heartbeat(s, "a-join-empty", group, "", 0, ())
        b = _consumer_heartbeat(s, "b-join-empty", group, "", 0, ())
        describe(s, "describe-two-empty", group)
        b2 = _consumer_heartbeat(s, "b-asks-range", group, b.member_id, b.member_epoch, None,
                                 "range")  # fmt: skip
        a2 = _consumer_heartbeat(s, "a-catches-up", group, a.member_id, a.member_epoch, None)
        describe(s, "describe-range", group)
        a3 = _consumer_heartbeat(s, "a-subscribes", group, a.member_id, a2.member_epoch,
                                 (topic,))  # fmt: skip
        describe(s, "describe-subscribed", group)
        _consumer_heartbeat(s, "a-leaves", group, a.member_id, -1, None)
        describe(s, "describe-a-left", group)
        _consumer_heartbeat(s, "b-leaves", group, b.member_id, -1, None)
        describe(s, "describe-empty", group)
        s.note("epochs-seen", [a.member_epoch, b.member_epoch, b2.member_epoch, a3.member_epoch])

    differential(scenario, rules=RULES, deviations=DEFERRED_TARGET)
