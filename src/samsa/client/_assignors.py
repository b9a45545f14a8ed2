"""The client-side assignors of classic groups: the leader's plan, from every member's
subscription (decoded by :mod:`samsa.protocol.consumer_protocol`) to each member's partitions.

This module is pure.
"""

from __future__ import annotations

from collections.abc import Callable

from samsa.client._types import TopicPartition
from samsa.protocol.consumer_protocol import (
    ASSIGNMENT_VERSION,
    decode_assignment,
    encode_assignment,
)

Plan = dict[str, dict[str, list[int]]]  # member id -> topic -> partitions


def range_assign(
    subscriptions: dict[str, list[str]], partitions: dict[str, int]
) -> dict[str, dict[str, list[int]]]:
    """Kafka's RangeAssignor: per topic, consecutive ranges to members in id order."""
    result: dict[str, dict[str, list[int]]] = {m: {} for m in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        n = partitions.get(topic, 0)
        if not members or not n:
            continue
        per, extra = divmod(n, len(members))
        start = 0
        for i, m in enumerate(members):
            count = per + (1 if i < extra else 0)
            if count:
                result[m][topic] = list(range(start, start + count))
            start += count
    return result


def roundrobin_assign(
    subscriptions: dict[str, list[str]], partitions: dict[str, int]
) -> dict[str, dict[str, list[int]]]:
    """Kafka's RoundRobinAssignor: all partitions, sorted, dealt to subscribed members."""
    result: dict[str, dict[str, list[int]]] = {m: {} for m in subscriptions}
    members = sorted(subscriptions)
    if not members:
        return result
    i = 0
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        for p in range(partitions.get(topic, 0)):
            for _ in range(len(members)):
                m = members[i % len(members)]
                i += 1
                if topic in subscriptions[m]:
                    result[m].setdefault(topic, []).append(p)
                    break
    return result


ASSIGNORS: dict[str, Callable[[dict[str, list[str]], dict[str, int]], Plan]] = {
    "range": range_assign,
    "roundrobin": roundrobin_assign,
}


def encode_plan(plan: Plan) -> list[tuple[str, bytes]]:
    """Each member's assignment as the leader sends it in SyncGroup."""
    return [(m, encode_assignment(a, version=ASSIGNMENT_VERSION)) for m, a in plan.items()]


def assigned_partitions(data: bytes) -> list[TopicPartition]:
    """The partitions of an assignment as read from SyncGroup or DescribeGroups."""
    return [TopicPartition(t, p) for t, ps in decode_assignment(data).items() for p in sorted(ps)]
