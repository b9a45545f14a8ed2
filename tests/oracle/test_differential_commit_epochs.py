"""Differential scenario of KIP-1251 (Kafka 4.4): which member epochs an OffsetCommit of a
consumer-protocol member may carry (docs/semantics.md, rule 34). The member's current epoch,
or an older one no older than the epoch it was given each committed partition at, passes;
an epoch ahead of the member's, or older than a partition's assignment epoch, is refused the
whole commit; OffsetFetch wants the current epoch. Runs on the shared Kafka node, whose
target assignment may lag a bump by its assignment interval: heartbeats are repeated until
the member's epoch moves, and only the last answer is compared."""

from __future__ import annotations

import time
from typing import Any

from test_differential_groups import commit

from samsa.protocol.messages import ApiKey, make_request
from samsa.testing.oracle import TRANSIENT, Rule, Side

RULES = {"member_id": Rule.NODE}


def _transient(resp: Any) -> bool:
    return int(resp.error_code) in TRANSIENT


def heartbeat_request(
    group: str,
    member: str,
    epoch: int,
    *,
    topics: tuple[str, ...] | None = None,
    assignor: str | None = None,
    owned: tuple[Any, ...] | None = None,
) -> Any:
    k, v = ApiKey.CONSUMER_GROUP_HEARTBEAT, 0
    return make_request(k, v, "ConsumerGroupHeartbeatRequest", group_id=group, member_id=member,
                       member_epoch=epoch, instance_id=None, rack_id=None,
                       rebalance_timeout=30_000 if epoch == 0 else -1,
                       subscribed_topic_names=topics, server_assignor=assignor,
                       topic_partitions=owned)  # fmt: skip


def heartbeat(s: Side, label: str, req: Any, until: Any = None) -> Any:
    """A heartbeat, repeated while ``until(response)``; the last answer is compared."""
    return s.call(label, ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, req, retry=until, timeout=15.0)


def fetch(s: Side, label: str, group: str, member: str, epoch: int, topic: str) -> Any:
    k, v = ApiKey.OFFSET_FETCH, 9
    t = make_request(k, v, "OffsetFetchRequestTopics", name=topic, partition_indexes=(0,))
    g = make_request(k, v, "OffsetFetchRequestGroup", group_id=group, member_id=member,
                     member_epoch=epoch, topics=(t,))  # fmt: skip
    return s.call(label, k, v, make_request(k, v, "OffsetFetchRequest", groups=(g,),
                                            require_stable=False))  # fmt: skip


def test_commit_at_an_older_epoch_for_partitions_owned_since(differential: Any) -> None:
    def scenario(s: Side) -> None:
        group, topic = s.unique("g"), s.unique("t")
        s.create_topic(topic, 2)
        s.find_coordinator("coordinator", group, key_type=0)
        a = heartbeat(s, "a-joins", heartbeat_request(group, "", 0, topics=(topic,), owned=()),
                      until=_transient)  # fmt: skip
        if not a.assignment:  # Kafka may give the partitions at a later heartbeat
            a = heartbeat(s, "a-assigned", heartbeat_request(group, a.member_id, a.member_epoch),
                          until=lambda r: r.error_code == 0 and not r.assignment)  # fmt: skip
        me, first = a.member_id, a.member_epoch
        owned = tuple(
            make_request(
                ApiKey.CONSUMER_GROUP_HEARTBEAT,
                0,
                "TopicPartitions",
                topic_id=tp.topic_id,
                partitions=tp.partitions,
            )
            for tp in a.assignment.topic_partitions
        )
        commit(s, "commit-current", group, first, me, topic, v=9)
        # b's preferred assignor bumps the group; a moves to the new epoch, keeping both. b's
        # own answer is not compared: Kafka may defer its target (D-GROUP-2).
        b = heartbeat_request(group, "", 0, topics=(), assignor="range", owned=())
        while _transient(s.conn.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, b)):
            time.sleep(0.05)
        bumped = heartbeat_request(group, me, first, owned=owned)
        later = heartbeat(s, "a-bumped", bumped, until=lambda r: r.member_epoch == first)
        s.note("a-epochs", [first, later.member_epoch])
        commit(s, "commit-older-owned-since", group, first, me, topic, v=9)
        commit(s, "commit-older-than-assigned", group, first - 1, me, topic, v=9)
        commit(s, "commit-ahead", group, later.member_epoch + 1, me, topic, v=9)
        commit(s, "commit-new-current", group, later.member_epoch, me, topic, v=9)
        fetch(s, "fetch-older", group, me, first, topic)
        fetch(s, "fetch-current", group, me, later.member_epoch, topic)

    differential(scenario, rules=RULES)
