"""Eager rebalance: a member that rejoins gives up its partitions before JoinGroup.

A chaos run once delivered the first 10 records of a partition twice: the member had
fetched them ahead, rejoined, its SyncGroup then failed (the group rebalanced again: C
joined while B's assignment already gave the partition to B), and the next poll handed out
the records fetched under the old assignment, which B was consuming too. As Java's
ConsumerCoordinator.onJoinPrepare (eager protocol), the assignment and everything fetched
for it are dropped when the member rejoins, whatever the join's outcome.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from samsa.client import AsyncConsumer, TopicPartition
from samsa.client._fetcher import CompletedFetch
from samsa.client._membership import ClassicMembership, ClassicState
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import NewRecord, build_batch

P2 = TopicPartition("t", 2)


def _member_with_fetched_ahead(sync_error: int) -> AsyncConsumer:
    """Generation 1 owns P2 with records 0-9 fetched ahead; the group is rebalancing and
    the member's SyncGroup of generation 2 is answered ``sync_error``."""
    c = AsyncConsumer({"group.id": "g", "enable.auto.commit": False})
    c._started = True
    c.subscribe(["t"])
    m = c.membership
    assert isinstance(m, ClassicMembership)
    # generation 1 owned P2; its heartbeat was answered REBALANCE_IN_PROGRESS
    m.member_id, m.generation, m.state = "m-a", 1, ClassicState.REJOIN_NEEDED
    c.subscriptions.assign([P2])
    data = build_batch([NewRecord(value=b"v%d" % i) for i in range(10)], base_offset=0)
    c.seek(P2, 0)
    c.fetcher.buffer.fetches[P2] = deque([CompletedFetch(data, 0, 10, [])])
    assert m.needs_join

    async def group_request(api_key: int, *_: Any, **__: Any) -> Any:
        if api_key == ApiKey.JOIN_GROUP:
            return SimpleNamespace(error_code=0, member_id="m-a", generation_id=2,
                                   leader="m-b", protocol_name="range", members=())  # fmt: skip
        assert api_key == ApiKey.SYNC_GROUP
        return SimpleNamespace(error_code=sync_error, assignment=b"")

    async def refresh(*_: Any, **__: Any) -> None:
        return None

    m.group.request = group_request  # type: ignore[method-assign]
    c.cluster.refresh = refresh  # type: ignore[method-assign]
    return c


@pytest.mark.parametrize(
    "sync_error", [ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION]
)
def test_records_fetched_for_the_old_assignment_are_not_handed_out(sync_error: int) -> None:
    async def run() -> tuple[list[Any], AsyncConsumer]:
        c = _member_with_fetched_ahead(sync_error)
        return await c.poll(0), c

    records, c = asyncio.run(run())
    assert records == [], "records of a partition given up by rejoining were handed out"
    assert c.assignment() == []
    assert c.membership is not None and c.membership.needs_join  # the next poll joins again
