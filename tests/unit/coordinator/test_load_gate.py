"""A restarted broker serves while its coordinators replay (issue 23): every operation on a
group or transactional id whose partition is still loading answers COORDINATOR_LOAD_IN_PROGRESS
(a classic Heartbeat NONE, as Kafka answers one blindly), writes nothing, and is served as
usual once that partition is replayed, before the others are; listings wait for every
partition; a marker for a loading ``__consumer_offsets`` partition is refused."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from _coordinators import MemoryLog
from samsa.coordinator.group_coordinator import GroupConfig, JoinRequest, OffsetToCommit
from samsa.coordinator.group_runtime import GroupCoordinatorRuntime
from samsa.coordinator.offsets import OFFSETS_TOPIC
from samsa.coordinator.transaction_coordinator import TxnConfig
from samsa.coordinator.txn_runtime import TXN_TOPIC, TransactionCoordinatorRuntime
from samsa.protocol.errors import ErrorCode as E

LOADING = E.COORDINATOR_LOAD_IN_PROGRESS
T = "t"


def _clock() -> Callable[[], int]:
    ticks = itertools.count(1_000_000, 10)
    return lambda: next(ticks)


def _groups(log: MemoryLog) -> GroupCoordinatorRuntime:
    return GroupCoordinatorRuntime(log, GroupConfig(num_partitions=2), _clock())


def _ids(place: Callable[[str], int], prefix: str) -> tuple[str, str]:
    """Two ids, the first placed on partition 0, the second on partition 1."""
    first = next(f"{prefix}{i}" for i in itertools.count() if place(f"{prefix}{i}") == 0)
    second = next(f"{prefix}{i}" for i in itertools.count() if place(f"{prefix}{i}") == 1)
    return first, second


def _replay(rt: GroupCoordinatorRuntime | TransactionCoordinatorRuntime, partition: int) -> None:
    for _ in rt.runtime.load_partition(partition):
        pass


def _join(group_id: str) -> JoinRequest:
    return JoinRequest(
        group_id, "", None, "c", "h", 10_000, 10_000, "consumer", (("r", b""),), False
    )


def test_group_operations_wait_for_their_partition() -> None:
    log = MemoryLog()
    before = _groups(log)
    a, b = _ids(before.coordinator.partition_for, "g")
    for group in (a, b):
        assert before.commit(group, -1, "", None, [OffsetToCommit(T, 0, 5)]) == {(T, 0): E.NONE}
    written = len(log.entries)

    rt = _groups(log)
    rt.runtime.begin_load()
    assert rt.commit(a, -1, "", None, [OffsetToCommit(T, 0, 9)]) == {(T, 0): LOADING}
    assert rt.validate_fetch(a, None, -1) == LOADING  # OffsetFetch's group error
    assert rt.join(_join(a)).error == LOADING  # type: ignore[union-attr]
    assert rt.leave(a, [("m", None)]) == (LOADING, [])
    assert rt.delete_offsets(a, [(T, [0])]) == (LOADING, {})
    assert rt.describe_group(a).error == LOADING
    assert rt.describe_consumer_group(a).error == LOADING
    assert rt.describe_share_group(a).error == LOADING
    assert rt.delete_groups([a, b]) == {a: LOADING, b: LOADING}
    assert rt.heartbeat(a, 1, "m", None) == E.NONE  # Kafka's blind answer
    assert rt.loading() == LOADING  # ListGroups
    assert rt.marker_gate(OFFSETS_TOPIC, 0) == LOADING
    assert rt.marker_gate("other", 0) == E.NONE
    assert len(log.entries) == written  # nothing refused was written

    _replay(rt, 0)  # a's partition is served, b's is not yet
    assert rt.validate_fetch(a, None, -1) == E.NONE
    assert [f.offset for f in rt.fetch_offsets(a, [(T, [0])])] == [5]
    assert rt.commit(a, -1, "", None, [OffsetToCommit(T, 0, 9)]) == {(T, 0): E.NONE}
    assert rt.marker_gate(OFFSETS_TOPIC, 0) == E.NONE
    assert rt.validate_fetch(b, None, -1) == LOADING
    assert rt.marker_gate(OFFSETS_TOPIC, 1) == LOADING
    assert rt.loading() == LOADING

    _replay(rt, 1)
    assert [f.offset for f in rt.fetch_offsets(b, [(T, [0])])] == [5]
    assert [f.offset for f in rt.fetch_offsets(a, [(T, [0])])] == [9]
    assert rt.loading() == E.NONE
    assert rt.delete_groups([b]) == {b: E.NONE}


def test_a_marker_for_a_loading_offsets_partition_is_refused_and_not_written() -> None:
    log = MemoryLog()
    _groups(log).commit("g", -1, "", None, [OffsetToCommit(T, 0, 5)])
    rt = _groups(log)
    rt.runtime.begin_load()
    part = rt.coordinator.partition_for("g")
    held = len(log.batches[OFFSETS_TOPIC][part])
    assert log.write_marker(OFFSETS_TOPIC, part, 7, 0, 0, True) == LOADING
    assert len(log.batches[OFFSETS_TOPIC][part]) == held
    _replay(rt, 0)
    _replay(rt, 1)
    assert log.write_marker(OFFSETS_TOPIC, part, 7, 0, 0, True) == E.NONE


def test_transaction_operations_wait_for_their_partition() -> None:
    log = MemoryLog()
    pids = itertools.count(100)

    def txns() -> TransactionCoordinatorRuntime:
        return TransactionCoordinatorRuntime(
            log, TxnConfig(num_partitions=2), lambda: next(pids), _clock()
        )

    before = txns()
    a, b = _ids(before.coordinator.partition_for, "tx")
    started = {t: before.init_producer_id(t, 60_000, None) for t in (a, b)}
    assert {r.error for r in started.values()} == {E.NONE}
    written = sum(len(p) for p in log.batches[TXN_TOPIC])

    rt = txns()
    rt.runtime.begin_load()
    pid, epoch = started[a].producer_id, started[a].producer_epoch
    assert rt.init_producer_id(a, 60_000, None).error == LOADING
    assert rt.add_partitions(a, pid, epoch, [(T, 0)]) == LOADING
    assert rt.end_txn(a, pid, epoch, True) == LOADING
    assert rt.end_txn_v2(a, pid, epoch, True).error == LOADING
    assert rt.verify(a, pid, epoch, (T, 0)) == LOADING
    assert [d.error for d in rt.describe([a, b])] == [LOADING, LOADING]
    assert rt.list([], [])[0] == LOADING
    assert sum(len(p) for p in log.batches[TXN_TOPIC]) == written

    _replay(rt, 0)
    assert rt.add_partitions(a, pid, epoch, [(T, 0)]) == E.NONE
    assert [d.error for d in rt.describe([a, b])] == [E.NONE, LOADING]
    assert rt.list([], [])[0] == LOADING
    _replay(rt, 1)
    assert [d.error for d in rt.describe([a, b])] == [E.NONE, E.NONE]
    assert rt.list([], [])[0] == E.NONE
