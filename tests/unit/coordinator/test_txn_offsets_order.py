"""Transactional (TxnOffsetCommit) against plain (OffsetCommit) offsets of one group partition
are ordered by their records' positions in ``__consumer_offsets``, as in Kafka: at the COMMIT
marker a transactional offset replaces the committed one only if that one's record is earlier
in the log. A plain commit made after the TxnOffsetCommit and before the marker wins; one made
before the TxnOffsetCommit loses. Replaying the topic at start-up gives the same answer, also
for a transaction still open at the restart and committed after it (docs/semantics.md, rules
15 and 24).

The coordinators run on real logs, wired as the broker wires them: one ``CoordinatorLogs``
appends markers to the partition and tells the listeners (the group runtime's ``on_marker``)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from samsa.broker.coordinator_log import CoordinatorLogs
from samsa.broker.topics import TopicManager
from samsa.coordinator.group_coordinator import (
    CoordinatorRecord,
    GroupConfig,
    GroupCoordinator,
    OffsetToCommit,
)
from samsa.coordinator.group_runtime import GroupCoordinatorRuntime
from samsa.coordinator.offsets_records import OffsetCommitKey, OffsetCommitValue
from samsa.coordinator.transaction import TxnState
from samsa.coordinator.transaction_coordinator import TxnConfig
from samsa.coordinator.txn_runtime import TransactionCoordinatorRuntime
from samsa.log.log import LogConfig
from samsa.protocol.errors import ErrorCode as E

G, T, TX = "g", "t", "tx"


class Node:
    """The two coordinators of one broker over the logs in ``path``."""

    def __init__(self, path: Path, pids: itertools.count[int]) -> None:
        clock = itertools.count(1_000_000, 10)
        self.topics = TopicManager(path, LogConfig())
        self.topics.load(0)
        store = CoordinatorLogs(self.topics, lambda: next(clock))
        self.txns = TransactionCoordinatorRuntime(
            store, TxnConfig(num_partitions=3), lambda: next(pids), lambda: next(clock)
        )
        self.groups = GroupCoordinatorRuntime(
            store, GroupConfig(num_partitions=3), lambda: next(clock), self.txns.verify
        )
        self.groups.load()
        self.txns.load()
        self.txns.start()

    def begin(self) -> tuple[int, int]:
        r = self.txns.init_producer_id(TX, 60_000, None)
        assert r.error == E.NONE
        tp = self.groups.offsets_partition(G)
        assert not isinstance(tp, E)
        assert self.txns.add_partitions(TX, r.producer_id, r.producer_epoch, [tp]) == E.NONE
        return r.producer_id, r.producer_epoch

    def txn_commit(self, pid: int, epoch: int, offset: int, partition: int = 0) -> None:
        errors = self.groups.commit_transactional(
            TX, G, pid, epoch, -1, "", None, [OffsetToCommit(T, partition, offset, -1, "txn")]
        )
        assert errors == {(T, partition): E.NONE}

    def plain_commit(self, offset: int, partition: int = 0) -> None:
        errors = self.groups.commit(G, -1, "", None, [OffsetToCommit(T, partition, offset)])
        assert errors == {(T, partition): E.NONE}

    async def end(self, pid: int, epoch: int, commit: bool) -> None:
        assert self.txns.end_txn(TX, pid, epoch, commit) == E.NONE
        want = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        for _ in range(300):
            if self.txns.coordinator.txns[TX].state == want:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(self.txns.coordinator.txns[TX])

    def committed(self, partition: int = 0) -> int:
        (f,) = self.groups.fetch_offsets(G, [(T, [partition])])
        return int(f.offset)

    def stable(self, partition: int = 0) -> bool:
        return not self.groups.coordinator.offsets.is_pending(G, T, partition)

    def close(self) -> None:
        self.txns.close()
        self.groups.close()
        self.topics.close(0)


def _restart(node: Node, path: Path, pids: itertools.count[int]) -> Node:
    state = node.groups.coordinator.durable_state()
    node.close()
    again = Node(path, pids)
    assert again.groups.coordinator.durable_state() == state
    return again


def test_plain_commit_between_txn_offset_commit_and_marker_wins(tmp_path: Path) -> None:
    async def run() -> None:
        pids = itertools.count(1)
        node = Node(tmp_path, pids)
        pid, epoch = node.begin()
        node.txn_commit(pid, epoch, 42)
        node.plain_commit(50)  # later in the log than the transactional record
        assert node.committed() == 50 and not node.stable()
        await node.end(pid, epoch, True)
        assert node.committed() == 50 and node.stable()
        node = _restart(node, tmp_path, pids)
        assert node.committed() == 50
        node.close()

    asyncio.run(run())


def test_plain_commit_before_txn_offset_commit_loses(tmp_path: Path) -> None:
    async def run() -> None:
        pids = itertools.count(1)
        node = Node(tmp_path, pids)
        node.plain_commit(10)
        pid, epoch = node.begin()
        node.txn_commit(pid, epoch, 42)
        assert node.committed() == 10
        await node.end(pid, epoch, True)
        assert node.committed() == 42
        node = _restart(node, tmp_path, pids)
        assert node.committed() == 42
        node.close()

    asyncio.run(run())


def test_offset_delete_drops_pending_transactional_offsets(tmp_path: Path) -> None:
    """As Kafka: an offset tombstone also removes the pending transactional offsets of that
    group partition, so the later COMMIT marker does not bring the deleted offset back;
    live, and when the tombstone and the marker are replayed at start-up."""

    async def run() -> None:
        pids = itertools.count(1)
        node = Node(tmp_path, pids)
        node.plain_commit(10)
        pid, epoch = node.begin()
        node.txn_commit(pid, epoch, 42)
        node.txn_commit(pid, epoch, 7, partition=1)
        assert not node.stable()
        top, errors = node.groups.delete_offsets(G, [(T, [0])])
        assert top == E.NONE and errors == {(T, 0): E.NONE}
        assert node.stable() and node.committed() == -1
        await node.end(pid, epoch, True)
        assert node.committed() == -1  # deleted, not revived by the marker
        assert node.committed(1) == 7  # the other partition's offset commits as usual
        node = _restart(node, tmp_path, pids)
        assert (node.committed(), node.committed(1)) == (-1, 7)
        node.close()

    asyncio.run(run())


def test_mixed_history_replays_to_the_same_state(tmp_path: Path) -> None:
    """Several transactions, commits and aborts, with plain commits before, between and
    after, over two partitions; one transaction is still open at the restart and committed
    after it, with a plain commit made after its TxnOffsetCommit (before the restart)."""

    async def run() -> None:
        pids = itertools.count(1)
        node = Node(tmp_path, pids)
        pid, epoch = node.begin()  # 1: p0 plain later wins, p1 transactional wins
        node.plain_commit(5, partition=1)
        node.txn_commit(pid, epoch, 100, partition=0)
        node.txn_commit(pid, epoch, 101, partition=1)
        node.plain_commit(7, partition=0)
        await node.end(pid, epoch, True)
        assert (node.committed(0), node.committed(1)) == (7, 101)

        pid, epoch = node.begin()  # 2: aborted, nothing changes
        node.txn_commit(pid, epoch, 200, partition=0)
        await node.end(pid, epoch, False)
        assert (node.committed(0), node.committed(1)) == (7, 101)

        pid, epoch = node.begin()  # 3: two TxnOffsetCommits of p0, a plain one between
        node.txn_commit(pid, epoch, 300, partition=0)
        node.plain_commit(8, partition=0)
        node.txn_commit(pid, epoch, 301, partition=0)  # later than the plain one: wins
        node.txn_commit(pid, epoch, 302, partition=1)
        node.plain_commit(9, partition=1)
        await node.end(pid, epoch, True)
        assert (node.committed(0), node.committed(1)) == (301, 9)
        node = _restart(node, tmp_path, pids)
        assert (node.committed(0), node.committed(1)) == (301, 9)

        pid, epoch = node.begin()  # 4: open across a restart
        node.txn_commit(pid, epoch, 400, partition=0)
        node.txn_commit(pid, epoch, 401, partition=1)
        node.plain_commit(10, partition=0)
        node = _restart(node, tmp_path, pids)
        assert (node.committed(0), node.committed(1)) == (10, 9)
        assert not node.stable(0) and not node.stable(1)
        await node.end(pid, epoch, True)
        assert (node.committed(0), node.committed(1)) == (10, 401)
        assert node.stable(0) and node.stable(1)
        node = _restart(node, tmp_path, pids)
        assert (node.committed(0), node.committed(1)) == (10, 401)
        node.close()

    asyncio.run(run())


def test_replay_orders_offset_commits_by_log_offset() -> None:
    """The state machine alone: a record earlier in the log than the committed offset's does
    not replace it; without log offsets every record applies (as before)."""
    c = GroupCoordinator(GroupConfig())
    key = OffsetCommitKey(G, T, 0)

    def put(offset: int, at: int | None) -> None:
        c.replay(CoordinatorRecord(key, OffsetCommitValue(offset)), 0, at)

    def committed() -> int:
        return c.offsets.committed(G)[(T, 0)].offset

    put(1, 5)
    put(2, 3)  # a transactional record at 3 committed after the plain one at 5
    assert committed() == 1
    put(3, 8)
    assert committed() == 3
    c.replay(CoordinatorRecord(key, None), 0, 9)  # tombstone: forgotten
    put(4, 6)
    assert committed() == 4
    put(5, None)
    put(6, 2)
    assert committed() == 6
