"""The server-side assignors of KIP-848 consumer groups: ``uniform`` and ``range``.

Theory of operation
-------------------
An assignor maps the members' subscriptions (member id -> subscribed topic ids) over the
topics' partition counts to a target assignment (member id -> topic id -> partitions). Both
are deterministic: the same input gives the same output, whatever the order of the mappings,
so a coordinator replaying the log and one computing afresh agree.

- ``range`` (Kafka's ``RangeAssignor``): per topic, the members subscribed to it, sorted by
  member id, get contiguous ranges; the first ``partitions % members`` get one more. Members
  with the same subscriptions get the same partition numbers of every topic (co-partitioning).
- ``uniform`` (Kafka's ``UniformAssignor``, the default): balances the number of partitions
  per member over all topics, and is sticky: a member keeps the partitions of its previous
  target up to its fair share, so a rebalance moves as few partitions as it can.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Set

from samsa.coordinator.consumer_group_records import Assignment

Subscriptions = Mapping[str, Set[uuid.UUID]]  # member id -> subscribed topic ids
Partitions = Mapping[uuid.UUID, int]  # topic id -> partition count
Target = dict[str, Assignment]


def _freeze(work: dict[str, dict[uuid.UUID, set[int]]]) -> Target:
    return {
        mid: {tid: frozenset(ps) for tid, ps in topics.items() if ps}
        for mid, topics in work.items()
    }


def range_assign(members: Subscriptions, topics: Partitions, previous: Target) -> Target:
    work: dict[str, dict[uuid.UUID, set[int]]] = {mid: {} for mid in members}
    for tid in sorted(topics, key=lambda t: t.bytes):
        subscribers = sorted(mid for mid, subs in members.items() if tid in subs)
        if not subscribers:
            continue
        n = topics[tid]
        quota, extra = divmod(n, len(subscribers))
        start = 0
        for i, mid in enumerate(subscribers):
            size = quota + (1 if i < extra else 0)
            if size:
                work[mid][tid] = set(range(start, start + size))
            start += size
    return _freeze(work)


def uniform_assign(members: Subscriptions, topics: Partitions, previous: Target) -> Target:
    order = sorted(members)
    work: dict[str, dict[uuid.UUID, set[int]]] = {mid: {} for mid in order}
    count = dict.fromkeys(order, 0)
    all_parts = [
        (tid, p)
        for tid in sorted(topics, key=lambda t: t.bytes)
        if any(tid in members[m] for m in order)
        for p in range(topics[tid])
    ]
    if not order or not all_parts:
        return _freeze(work)
    # A member's fair share: the partitions it could take, split with everyone who could too.
    share: dict[str, int] = {}
    for mid in order:
        mine = [tp for tp in all_parts if tp[0] in members[mid]]
        sharers = {m for m in order if any(tp[0] in members[m] for tp in mine)}
        share[mid] = -(-len(mine) // max(len(sharers), 1))
    taken: set[tuple[uuid.UUID, int]] = set()
    # Sticky pass: keep what the previous target gave, within the fair share.
    for mid in order:
        for tid, parts in sorted(previous.get(mid, {}).items(), key=lambda kv: kv[0].bytes):
            if tid not in members[mid] or tid not in topics:
                continue
            for p in sorted(parts):
                if p < topics[tid] and (tid, p) not in taken and count[mid] < share[mid]:
                    work[mid].setdefault(tid, set()).add(p)
                    taken.add((tid, p))
                    count[mid] += 1
    # The rest go, one by one, to the least loaded member that subscribes to their topic.
    for tid, p in all_parts:
        if (tid, p) in taken:
            continue
        mid = min((m for m in order if tid in members[m]), key=lambda m: (count[m], m))
        work[mid].setdefault(tid, set()).add(p)
        count[mid] += 1
    # Balance: move partitions from a member holding two or more than another member that
    # could take one of them. Each move lowers the sum of squared counts, so this ends.
    while True:
        move = _best_move(order, members, work, count)
        if move is None:
            return _freeze(work)
        src, dst, tid, p = move
        work[src][tid].discard(p)
        work[dst].setdefault(tid, set()).add(p)
        count[src] -= 1
        count[dst] += 1


def _best_move(
    order: list[str],
    members: Subscriptions,
    work: dict[str, dict[uuid.UUID, set[int]]],
    count: dict[str, int],
) -> tuple[str, str, uuid.UUID, int] | None:
    for src in sorted(order, key=lambda m: (-count[m], m)):
        for dst in sorted(order, key=lambda m: (count[m], m)):
            if count[src] - count[dst] < 2:
                break
            for tid in sorted(work[src], key=lambda t: t.bytes):
                if work[src][tid] and tid in members[dst]:
                    return src, dst, tid, max(work[src][tid])
    return None


ASSIGNORS = {"uniform": uniform_assign, "range": range_assign}
