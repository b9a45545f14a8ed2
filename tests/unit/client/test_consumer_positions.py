"""Positions looked up for one assignment never land in a later one.

A fetch round first looks up unknown positions (OffsetFetch, then ListOffsets); the
consumer may rejoin the group while that lookup waits on a lost response. If its answer
were then written into the new assignment's positions, a partition meanwhile consumed and
committed by another member would be fetched again from the stale (earliest) offset: the
duplicate delivery a chaos run once showed (a partition handed out again from offset 0).
"""

from __future__ import annotations

import asyncio

import pytest

from samsa.client import AsyncConsumer, KafkaError, TopicPartition
from samsa.client._subscription import OffsetAndEpoch
from samsa.protocol.errors import ErrorCode

T = "t"
P0, P1, P2 = (TopicPartition(T, p) for p in range(3))


def _consumer(
    answered: asyncio.Event, stalled: str, committed_at: int | None = None
) -> AsyncConsumer:
    """Committed offset ``committed_at`` (None: nothing), earliest offset 0; the ``stalled``
    lookup's answer is in flight until ``answered`` is set."""
    c = AsyncConsumer({"group.id": "g", "auto.offset.reset": "earliest"})

    async def committed(tps: list[TopicPartition], **_: object) -> dict:
        if stalled == "committed":
            await answered.wait()
        return {tp: None if committed_at is None else OffsetAndEpoch(committed_at) for tp in tps}

    async def list_offsets(tps: list[TopicPartition], *_: object, **__: object) -> dict:
        if stalled == "list_offsets":
            await answered.wait()
        return {tp: 0 for tp in tps}

    c._fetch_committed = committed  # type: ignore[method-assign]
    c.list_offsets = list_offsets  # type: ignore[method-assign]
    return c


@pytest.mark.parametrize("stalled", ["committed", "list_offsets"])
def test_lookup_answered_after_a_rebalance_is_dropped(stalled: str) -> None:
    async def run() -> AsyncConsumer:
        answered = asyncio.Event()
        c = _consumer(answered, stalled)
        c.assign([P0, P1, P2])
        lookup = asyncio.create_task(c._init_positions([P0, P1, P2]))
        for _ in range(3):
            await asyncio.sleep(0)  # the lookup reaches the stalled request
        # the rebalance (as a classic join after SyncGroup): P2 went to another member,
        # which consumes and commits it; P0 and P1 stay but their offsets must be fetched anew
        c.subscriptions.assign([P0, P1], keep_positions=False)
        answered.set()
        await lookup
        return c

    c = asyncio.run(run())
    assert P2 not in c.subscriptions.positions, "a partition no longer assigned got a position"
    assert c.subscriptions.positions == {P0: None, P1: None}
    assert c.fetcher.fetchable() == [P0, P1]


@pytest.mark.parametrize(("stalled", "committed_at"), [("committed", 7), ("list_offsets", None)])
def test_lookup_does_not_override_a_seek(stalled: str, committed_at: int | None) -> None:
    async def run() -> AsyncConsumer:
        answered = asyncio.Event()
        c = _consumer(answered, stalled, committed_at)
        c.assign([P0, P1])
        lookup = asyncio.create_task(c._init_positions([P0, P1]))
        for _ in range(3):
            await asyncio.sleep(0)
        c.seek(P1, 42)  # the application seeks while the lookup is in flight
        answered.set()
        await lookup
        return c

    c = asyncio.run(run())
    assert c.subscriptions.positions == {P0: 0 if committed_at is None else committed_at, P1: 42}


def test_position_of_an_unassigned_partition_is_refused() -> None:
    async def run() -> None:
        answered = asyncio.Event()
        answered.set()
        c = _consumer(answered, "committed", 3)
        c.assign([P0])
        assert await c.position(P0) == 3
        with pytest.raises(KafkaError, match="not assigned") as err:
            await c.position(P1)
        assert err.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert P1 not in c.subscriptions.positions

    asyncio.run(run())
