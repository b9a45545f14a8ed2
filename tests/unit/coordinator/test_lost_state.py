"""Damaged coordinator logs: bytes flipped in the files of ``__consumer_offsets`` and
``__transaction_state`` between two runs of the coordinators on real logs. A record that fails
its CRC is never applied (the previous state stands), and a transactional id whose newest
record may be lost is fenced: its previous instances can do nothing, and the next
InitProducerId gets a producer id nobody held (docs/semantics.md, rule 26)."""

from __future__ import annotations

import asyncio
import itertools
import struct
from pathlib import Path

import pytest

from samsa.broker.coordinator_log import CoordinatorLogs
from samsa.broker.topics import TopicManager
from samsa.coordinator.group_coordinator import GroupConfig, OffsetToCommit
from samsa.coordinator.group_runtime import GroupCoordinatorRuntime
from samsa.coordinator.transaction import MAX_EPOCH, TxnState
from samsa.coordinator.transaction_coordinator import TransactionCoordinator, TxnConfig
from samsa.coordinator.txn_runtime import TXN_TOPIC, TransactionCoordinatorRuntime
from samsa.log.log import LogConfig
from samsa.protocol.errors import ErrorCode as E
from samsa.protocol.records import HEADER_SIZE, RecordBatchView

# One batch per segment: the newest batch is the active segment (checked when the log is
# opened after a clean shutdown), every other one a sealed segment (checked by replay only).
ONE_BATCH_SEGMENTS = LogConfig(segment_bytes=1)
G, T = "g", "t"


class Node:
    """The coordinators of one broker, over the logs in ``path``, one partition each."""

    def __init__(self, path: Path, pids: itertools.count[int]) -> None:
        clock = itertools.count(1_000_000, 10)
        self.markers: list[tuple[str, int, int, int, bool]] = []
        self.topics = TopicManager(path, ONE_BATCH_SEGMENTS)
        self.topics.load(0)
        store = CoordinatorLogs(self.topics, lambda: next(clock))
        store.write_marker = self.write_marker  # type: ignore[method-assign]
        self.txns = TransactionCoordinatorRuntime(
            store, TxnConfig(num_partitions=1), lambda: next(pids), lambda: next(clock)
        )
        self.groups = GroupCoordinatorRuntime(
            store, GroupConfig(num_partitions=1), lambda: next(clock), self.txns.verify
        )
        self.groups.load()
        self.txns.load()

    def write_marker(
        self, topic: str, partition: int, pid: int, epoch: int, coord_epoch: int, commit: bool
    ) -> E:
        self.markers.append((topic, partition, pid, epoch, commit))
        return E.NONE

    def init(self, tid: str) -> tuple[int, int]:
        r = self.txns.init_producer_id(tid, 60_000, None)
        assert r.error == E.NONE
        return r.producer_id, r.producer_epoch

    def commit(self, offset: int, partition: int = 0) -> None:
        errors = self.groups.commit(G, -1, "", None, [OffsetToCommit(T, partition, offset)])
        assert errors == {(T, partition): E.NONE}

    def committed(self, partition: int = 0) -> int:
        (f,) = self.groups.fetch_offsets(G, [(T, [partition])])
        return int(f.offset)

    def close(self) -> None:
        self.txns.close()
        self.groups.close()
        self.topics.close(0)


def segment_files(path: Path, topic: str) -> list[Path]:
    return sorted((path / f"{topic}-0").glob("*.log"))


def flip_in_last_batch(log_file: Path, needle: bytes) -> None:
    """Flip the lowest bit of the last byte of ``needle`` inside the records of the file's
    last batch (one flip: the record still decodes, only its CRC tells)."""
    data = bytearray(log_file.read_bytes())
    pos = 0
    while pos + RecordBatchView(data, pos).size < len(data):
        pos += RecordBatchView(data, pos).size
    at = data.index(needle, pos + HEADER_SIZE)
    data[at + len(needle) - 1] ^= 0x01
    log_file.write_bytes(bytes(data))


def pid_bytes(pid: int) -> bytes:
    return struct.pack(">q", pid)


# -- __consumer_offsets -------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["active", "sealed"])
def test_a_flipped_committed_offset_is_not_believed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    pids = itertools.count(0)
    node = Node(tmp_path, pids)
    node.commit(12000)
    node.commit(12345)
    target = segment_files(tmp_path, "__consumer_offsets")[-1]
    if where == "sealed":
        node.commit(7, partition=1)  # another key, in a newer segment
    node.close()
    flip_in_last_batch(target, struct.pack(">q", 12345))  # now says 12344

    node = Node(tmp_path, pids)
    try:
        # Never 12344: the damaged record is dropped and the previous commit stands.
        assert node.committed() == 12000
        if where == "sealed":
            assert node.committed(partition=1) == 7  # records after the damage still count
            assert "fails its CRC-32C check; not applied" in caplog.text
    finally:
        node.close()


# -- __transaction_state ------------------------------------------------------------------------


def test_the_previous_instance_is_fenced_when_its_init_record_was_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pids = itertools.count(7)
    node = Node(tmp_path, pids)
    assert node.init("other") == (7, 0)
    assert node.init("tx") == (8, 0)  # instance 1
    assert node.init("tx") == (8, 1)  # instance 2: its record is the one that gets damaged
    node.close()
    flip_in_last_batch(segment_files(tmp_path, TXN_TOPIC)[-1], pid_bytes(8))

    node = Node(tmp_path, pids)
    try:
        assert node.topics.topics[TXN_TOPIC].partitions[0].log.load_report.lost_records
        assert "fencing 2 transactional id(s)" in caplog.text
        # Instance 2 (8, 1) and instance 1 (8, 0) are both fenced...
        for epoch in (0, 1):
            assert node.txns.add_partitions("tx", 8, epoch, [(T, 0)]) == E.PRODUCER_FENCED
            assert node.txns.verify("tx", 8, epoch, (T, 0)) == E.INVALID_PRODUCER_EPOCH
        # ... and a new instance never gets the epoch instance 2 may hold: a fresh id.
        pid, epoch = node.init("tx")
        assert pid not in (7, 8) and epoch == 0
        assert node.txns.add_partitions("tx", pid, epoch, [(T, 0)]) == E.NONE
        # An id fenced with no successor yet stays fenced across a restart, once.
        caplog.clear()
        node.close()
        node = Node(tmp_path, pids)
        assert "fencing" not in caplog.text
        assert node.txns.add_partitions("other", 7, 0, [(T, 0)]) == E.PRODUCER_FENCED
        assert node.txns.coordinator.txns["tx"].producer_id == pid
        assert node.init("other")[1] == 0  # rotated
    finally:
        node.close()


def test_init_producer_id_never_returns_another_producers_id(tmp_path: Path) -> None:
    pids = itertools.count(6)
    node = Node(tmp_path, pids)
    assert node.init("a") == (6, 0)
    assert node.init("b") == (7, 0)
    target = segment_files(tmp_path, TXN_TOPIC)[-1]
    assert node.init("c") == (8, 0)  # so that b's record is in a sealed segment
    node.close()
    flip_in_last_batch(target, pid_bytes(7))  # b's record now names producer 6, a's

    node = Node(tmp_path, pids)
    try:
        pid, _ = node.init("b")
        assert pid not in (6, 8)
        # a's newest record precedes the damage (which could have been a newer one of a's):
        # fenced. c's follows it: untouched.
        assert node.txns.add_partitions("a", 6, 0, [(T, 0)]) == E.PRODUCER_FENCED
        assert node.txns.add_partitions("c", 8, 0, [(T, 0)]) == E.NONE
        node.close()
        node = Node(tmp_path, pids)  # the damage is still there: nothing is fenced again
        assert node.txns.add_partitions("b", pid, 0, [(T, 1)]) == E.NONE
    finally:
        node.close()


def test_an_open_transaction_of_a_fenced_id_is_aborted_at_the_top_epoch(tmp_path: Path) -> None:
    async def run() -> None:
        pids = itertools.count(5)
        node = Node(tmp_path, pids)
        assert node.init("tx") == (5, 0)
        assert node.txns.add_partitions("tx", 5, 0, [(T, 0), (T, 1)]) == E.NONE
        assert node.init("later") == (6, 0)
        node.close()
        flip_in_last_batch(segment_files(tmp_path, TXN_TOPIC)[-1], pid_bytes(6))

        node = Node(tmp_path, pids)
        try:
            node.txns.start()
            for _ in range(200):
                if node.txns.coordinator.txns["tx"].state == TxnState.COMPLETE_ABORT:
                    break
                await asyncio.sleep(0.01)
            assert node.markers == [(T, 0, 5, MAX_EPOCH, False), (T, 1, 5, MAX_EPOCH, False)]
            assert node.txns.coordinator.txns["tx"].state == TxnState.COMPLETE_ABORT
            pid, epoch = node.init("tx")
            assert pid not in (5, 6) and epoch == 0
        finally:
            node.close()

    asyncio.run(run())


# -- the rule, on the state machine ---------------------------------------------------------------


def test_fence_lost_state_by_state() -> None:
    pids = itertools.count(100)
    c = TransactionCoordinator(TxnConfig(num_partitions=1), lambda: next(pids))

    def apply(outcome: object) -> None:
        for r in outcome.records:  # type: ignore[attr-defined]
            c.replay(r)

    for tid in ("empty", "ongoing", "prepared"):
        apply(c.init_producer_id(tid, 60_000, None, 0))
    apply(c.add_partitions("ongoing", 101, 0, [(T, 0)], 0))
    apply(c.add_partitions("prepared", 102, 0, [(T, 1)], 0))
    apply(c.end_txn("prepared", 102, 0, True, 0))

    outcome = c.fence_lost_state(["empty", "ongoing", "prepared", "unknown"], 5)
    apply(outcome)
    assert {tid: (m.producer_id, m.producer_epoch, m.state) for tid, m in c.txns.items()} == {
        "empty": (100, MAX_EPOCH, TxnState.EMPTY),
        "ongoing": (101, MAX_EPOCH, TxnState.PREPARE_ABORT),
        "prepared": (102, MAX_EPOCH, TxnState.PREPARE_COMMIT),  # the decision stands
    }
    assert sorted((j.transactional_id, j.producer_epoch, j.commit) for j in outcome.markers) == [
        ("ongoing", MAX_EPOCH, False),
        ("prepared", MAX_EPOCH, True),
    ]
    # Fenced already: nothing more to write.
    assert c.fence_lost_state(["empty"], 6).records == []
    # The next InitProducerId: the epoch is exhausted, so a fresh producer id.
    r = c.init_producer_id("empty", 60_000, None, 7).response
    assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, 103, 0)
    # A KIP-360 retry naming the old id and an epoch it held is fenced.
    r = c.init_producer_id("empty", 60_000, (100, 3), 7).response
    assert r.error == E.PRODUCER_FENCED
