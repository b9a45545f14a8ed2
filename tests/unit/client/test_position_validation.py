"""Positions validated with the leader by OffsetForLeaderEpoch (KIP-320), as Java's consumer.

A position carries the leader epoch of the record before it. When the metadata names a
leader or epoch the position was not checked against, the partition awaits validation: no
record fetched from the old leader is handed out and nothing is fetched until the leader
says where that epoch ends in its log. A position beyond the end lies in a truncated part of
the log: with a reset policy it moves back to the end (Kafka's "first offset known to
diverge"), with ``auto.offset.reset=none`` poll raises LogTruncationError until a seek.
Commits carry the position's epoch, and a committed offset restored with one is validated.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from samsa.client import AsyncConsumer, KafkaError, LogTruncationError, TopicPartition
from samsa.client._cluster import PartitionInfo, TopicInfo
from samsa.client._fetcher import CompletedFetch, end_offset
from samsa.client._subscription import FetchState, OffsetAndEpoch, SubscriptionState
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch

TP = TopicPartition("t", 0)
E = OffsetAndEpoch


def subs_at(offset: int, epoch: int) -> SubscriptionState:
    s = SubscriptionState()
    s.assign([TP])
    s.seek_unvalidated(TP, offset, epoch)
    return s


def test_a_position_with_an_epoch_awaits_validation_until_the_leader_confirms_it() -> None:
    s = subs_at(10, 3)
    assert s.state(TP).state is FetchState.AWAIT_VALIDATION  # type: ignore[union-attr]
    assert not s.fetching(TP)
    assert s.maybe_validate(TP, (1, 3))
    assert s.awaiting_validation() == {TP: E(10, 3)}
    assert s.complete_validation(TP, E(10, 3), E(12, 3), can_reset=False) is None
    assert s.fetching(TP) and s.position(TP) == 10
    # the same leader and epoch again: nothing to check
    assert not s.maybe_validate(TP, (1, 3))
    # records handed out in epoch 4, then the leader moves: checked again
    s.advance(TP, 15, 4)
    assert s.maybe_validate(TP, (2, 4)) and s.awaiting_validation() == {TP: E(15, 4)}


def test_positions_without_an_epoch_are_fetched_unvalidated() -> None:
    s = SubscriptionState()
    s.assign([TP])
    s.seek(TP, 5)  # the application's seek carries no epoch (Java's seek(tp, long))
    assert not s.maybe_validate(TP, (0, 7)) and s.fetching(TP)
    s.reset(TP, 0)  # auto.offset.reset's answer neither
    assert not s.maybe_validate(TP, (1, 8)) and s.fetching(TP)
    s.seek_unvalidated(TP, 9, -1)  # a commit that recorded none
    assert s.fetching(TP)
    s.advance(TP, 12, 2)
    assert not s.maybe_validate(TP, (2, -1)), "a leader epoch unknown to the metadata"


@pytest.mark.parametrize("can_reset", [True, False])
def test_a_truncation_below_the_position_moves_it_back_or_is_reported(can_reset: bool) -> None:
    s = subs_at(20, 3)
    s.maybe_validate(TP, (2, 4))
    found = s.complete_validation(TP, E(20, 3), E(17, 3), can_reset=can_reset)
    if can_reset:
        assert found is None and s.fetching(TP)
        assert s.committable() == {TP: E(17, 3)}, "back to the first offset known to diverge"
    else:
        assert found is not None and found.divergent == E(17, 3) and found.position == E(20, 3)
        assert s.awaiting_validation() == {TP: E(20, 3)}, "kept until the application seeks"
        s.seek(TP, 17)
        assert s.fetching(TP)


@pytest.mark.parametrize("can_reset", [True, False])
def test_an_epoch_the_leader_does_not_know_resets_by_the_policy(can_reset: bool) -> None:
    s = subs_at(20, 9)
    s.maybe_validate(TP, (2, 4))
    found = s.complete_validation(TP, E(20, 9), E(-1, -1), can_reset=can_reset)
    state = s.state(TP)
    assert state is not None
    if can_reset:
        assert found is None and state.state is FetchState.AWAIT_RESET and state.offset is None
    else:
        assert found is not None and found.divergent is None
        assert state.state is FetchState.AWAIT_VALIDATION


def test_an_answer_for_a_position_that_moved_meanwhile_is_dropped() -> None:
    s = subs_at(20, 3)
    s.maybe_validate(TP, (2, 4))
    s.seek_unvalidated(TP, 30, 4)  # e.g. a new committed offset
    s.maybe_validate(TP, (2, 4))
    assert s.complete_validation(TP, E(20, 3), E(5, 3), can_reset=True) is None
    assert s.awaiting_validation() == {TP: E(30, 4)}


# --- the consumer ---------------------------------------------------------------------------


def consumer(reset: str = "earliest", **extra: Any) -> tuple[AsyncConsumer, list[Any]]:
    """A consumer of TP with no broker: the metadata names a leader and epoch (see
    :func:`lead`), Fetch waits and returns nothing, and OffsetForLeaderEpoch is answered from
    the ``answers`` queue (end offset, epoch, error code); the requests are returned."""
    c = AsyncConsumer({"bootstrap.servers": "127.0.0.1:9", "auto.offset.reset": reset,
                       "retry.backoff.ms": 10, **extra})  # fmt: skip
    c._started = True
    c.assign([TP])
    c.answers = deque()  # type: ignore[attr-defined]
    sent: list[Any] = []

    async def send(node: int, api_key: int, versions: Any, cls: str, fields: Any,
                   **_: Any) -> Any:  # fmt: skip
        assert api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH and node == c.cluster.leader(*TP)
        sent.append(make_request(api_key, 4, cls, **fields(4)))
        end, epoch, code = c.answers.popleft()  # type: ignore[attr-defined]
        part = SimpleNamespace(partition=0, error_code=code, leader_epoch=epoch, end_offset=end)
        return SimpleNamespace(topics=[SimpleNamespace(topic="t", partitions=[part])])

    async def refresh(*_: Any, **__: Any) -> None:
        return None

    async def fetch_node(node: int, tps: Any, max_wait: float) -> None:
        await asyncio.sleep(max_wait)

    c.cluster.send = send  # type: ignore[method-assign]
    c.cluster.refresh = refresh  # type: ignore[method-assign]
    c.fetcher._fetch_node = fetch_node  # type: ignore[method-assign]
    lead(c, 0, 3)
    return c, sent


def lead(c: AsyncConsumer, node: int, epoch: int) -> None:
    c.cluster.brokers = {n: SimpleNamespace() for n in range(3)}  # type: ignore[misc]
    c.cluster.topics = {"t": TopicInfo("t", {0: PartitionInfo(0, node, epoch)})}


def fetched(c: AsyncConsumer, start: int, n: int, epoch: int) -> None:
    data = build_batch([NewRecord(value=b"v%d" % i) for i in range(n)], base_offset=start)
    # the batch as the leader stored it: its partition leader epoch (bytes 12-16)
    data = data[:12] + epoch.to_bytes(4, "big") + data[16:]
    q = c.fetcher.buffer.fetches.setdefault(TP, deque())
    q.append(CompletedFetch(data, start, end_offset(data, start), []))


async def poll(c: AsyncConsumer) -> list[int]:
    return [r.offset for r in await c.poll(timeout_ms=100)]


def test_the_consumer_validates_after_a_leader_change_and_fetches_on() -> None:
    async def run() -> None:
        c, sent = consumer()
        c.seek(TP, 0)
        fetched(c, 0, 5, 3)
        assert await poll(c) == [0, 1, 2, 3, 4]
        assert c.subscriptions.committable() == {TP: E(5, 3)}, "the records' epoch"
        fetched(c, 5, 5, 3)  # fetched ahead from the old leader
        lead(c, 1, 4)  # the leader dies: node 1 leads in epoch 4
        c.answers.append((5, 3, 0))  # type: ignore[attr-defined]  # epoch 3 ends at 5
        assert await poll(c) == [], "what the old leader sent is not handed out"
        ((t,),) = [r.topics for r in sent]
        (p,) = t.partitions
        assert (p.current_leader_epoch, p.leader_epoch) == (4, 3)
        assert c.subscriptions.fetching(TP) and await c.position(TP) == 5
        assert not c.fetcher.buffer.fetches
        await c.close()

    asyncio.run(run())


async def read_eight_then_move(reset: str) -> tuple[AsyncConsumer, list[Any]]:
    """Records 0-7 consumed in epoch 3; then node 1 leads in epoch 4."""
    c, sent = consumer(reset)
    c.seek(TP, 0)
    fetched(c, 0, 8, 3)
    await poll(c)
    lead(c, 1, 4)
    return c, sent


def test_a_truncation_moves_the_position_back_to_where_the_logs_diverge() -> None:
    async def run() -> None:
        c, sent = await read_eight_then_move("latest")
        c.answers.append((6, 3, 0))  # type: ignore[attr-defined]  # 6 and 7 were lost
        await poll(c)
        assert len(sent) == 1 and c.subscriptions.committable() == {TP: E(6, 3)}
        await c.close()

    asyncio.run(run())


def test_a_truncation_without_a_reset_policy_is_raised_until_a_seek() -> None:
    async def run() -> None:
        c, sent = await read_eight_then_move("none")
        c.answers.extend([(6, 3, 0)] * 3)  # type: ignore[attr-defined]
        for _ in range(2):  # raised again at the next poll: the position did not move
            with pytest.raises(LogTruncationError) as err:
                await poll(c)
            assert err.value.divergent_offsets == {TP: 6}
            assert err.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
            assert not err.value.retriable
        with pytest.raises(LogTruncationError):  # as Java's position(): not a valid one
            await c.position(TP)
        assert c.subscriptions.committable() == {TP: E(8, 3)}, "nothing lost meanwhile"
        c.seek(TP, 6)
        assert await poll(c) == [] and len(sent) == 3 and await c.position(TP) == 6
        await c.close()

    asyncio.run(run())


def test_a_stale_leader_answer_is_asked_again() -> None:
    async def run() -> None:
        c, sent = consumer()
        c.subscriptions.seek_unvalidated(TP, 4, 3)  # a committed offset with its epoch
        fenced = (-1, -1, ErrorCode.FENCED_LEADER_EPOCH)
        c.answers.extend([fenced, fenced, (9, 3, 0)])  # type: ignore[attr-defined]
        await poll(c)
        assert len(sent) == 3 and c.subscriptions.fetching(TP) and await c.position(TP) == 4
        await c.close()

    asyncio.run(run())


def test_commits_carry_the_epoch_of_the_position_and_restored_ones_are_validated() -> None:
    async def run() -> None:
        c = AsyncConsumer(
            {"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "enable.auto.commit": False}
        )
        c._started = True
        c.assign([TP])
        c.seek(TP, 0)
        fetched(c, 0, 5, 7)
        await poll(c)
        seen: list[tuple[int, int]] = []

        async def request(api_key: int, *_: Any, topics: Any, **__: Any) -> Any:
            for t in topics(8):
                seen.extend((p.committed_offset, p.committed_leader_epoch) for p in t.partitions)
            return SimpleNamespace(topics=[])

        m = c.membership
        assert m is not None
        m.group.request = request  # type: ignore[method-assign]
        await c.commit()  # the position, with the epoch of the last record consumed
        await c.commit({TP: 5})  # a bare offset carries none, as OffsetAndMetadata(5)
        await c.commit({TP: E(3, 6)})  # the epoch given with it
        await c._auto_commit({TP: 5})  # auto-commit of a position (a revoked partition's)
        assert seen == [(5, 7), (5, -1), (3, 6), (5, 7)]

        async def fetch_committed(tps: list[TopicPartition], **_: Any) -> dict:
            return {TP: E(5, 7)}

        c._fetch_committed = fetch_committed  # type: ignore[method-assign]
        c.seek(TP, None)  # type: ignore[arg-type]  # looked up again
        await c._init_positions([TP])
        assert c.subscriptions.awaiting_validation() == {TP: E(5, 7)}
        await c.close()

    asyncio.run(run())


def test_position_reports_a_position_once_it_is_validated() -> None:
    async def run() -> None:
        c, sent = consumer()
        c.subscriptions.seek_unvalidated(TP, 4, 3)
        c.answers.append((2, 3, 0))  # type: ignore[attr-defined]  # epoch 3 ends at 2
        assert await c.position(TP) == 2 and len(sent) == 1
        await c.close()

    asyncio.run(run())


@pytest.mark.parametrize("reset", ["earliest", "none"])
def test_an_offset_out_of_range_resets_by_the_policy_not_to_the_committed_offset(
    reset: str,
) -> None:
    """As Java's consumer: the committed offset may be the very one out of range (its records
    deleted); the fetch position resets by ``auto.offset.reset``, or the error is raised."""

    async def run() -> None:
        c = AsyncConsumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g",
                           "auto.offset.reset": reset, "enable.auto.commit": False})  # fmt: skip
        c.assign([TP])
        asked: list[str] = []

        async def committed(tps: list[TopicPartition], **_: Any) -> dict:
            asked.append("committed")
            return {TP: E(5, 0)}

        async def list_offsets(tps: list[TopicPartition], which: int, **_: Any) -> dict:
            asked.append("list_offsets")
            return {TP: 40}

        c._fetch_committed = committed  # type: ignore[method-assign]
        c.list_offsets = list_offsets  # type: ignore[method-assign]
        c.seek(TP, 5)
        out_of_range = SimpleNamespace(error_code=ErrorCode.OFFSET_OUT_OF_RANGE)
        if reset == "none":
            with pytest.raises(KafkaError) as err:
                c.fetcher._on_partition(TP, out_of_range, {TP: 5})
            assert err.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
            assert await c.position(TP) == 5, "kept until the application seeks"
        else:
            c.fetcher._on_partition(TP, out_of_range, {TP: 5})
            assert await c.position(TP) == 40 and asked == ["list_offsets"]
        await c.close()

    asyncio.run(run())


def test_consume_arrow_moves_the_position_with_the_records_epoch() -> None:
    async def run() -> None:
        c, _ = consumer()
        c.seek(TP, 0)
        fetched(c, 0, 3, 5)
        fetched(c, 3, 4, 6)
        assert (await c.consume_arrow(5, 100)).num_rows == 5
        assert c.subscriptions.committable() == {TP: E(5, 6)}
        await c.close()

    asyncio.run(run())
