"""Start-up replay of plain offset commits held back and collapsed (``OffsetStore.load_batch``,
issue 23): what a run holds stays bounded, and replaying a long run does not keep the event
loop for itself (it pauses for the runtime to yield every ``LOAD_PAUSE`` records). That the
state is the one a record-by-record replay leaves is tests/property/test_offsets_replay.py."""

from __future__ import annotations

from _coordinators import MemoryLog
from samsa.coordinator.group_coordinator import LOAD_PAUSE, GroupConfig, OffsetToCommit
from samsa.coordinator.group_runtime import GroupCoordinatorRuntime

T = "t"


def _filled(partitions: int, commits: int) -> MemoryLog:
    """One group's offsets of ``partitions`` partitions, committed ``commits`` times."""
    log = MemoryLog()
    rt = GroupCoordinatorRuntime(log, GroupConfig(num_partitions=1), lambda: 1_000)
    for n in range(commits):
        offsets = [OffsetToCommit(T, p, n) for p in range(partitions)]
        assert set(rt.commit("g", -1, "", None, offsets).values()) == {0}
    return log


def _fresh(log: MemoryLog) -> GroupCoordinatorRuntime:
    return GroupCoordinatorRuntime(log, GroupConfig(num_partitions=1), lambda: 1_000)


def test_a_run_holds_at_most_max_run_keys() -> None:
    log = _filled(25, 3)
    rt = _fresh(log)
    store = rt.coordinator.offsets
    store.max_run_keys = 10
    rt.runtime.begin_load()
    held = []
    for _ in rt.runtime.load_partition(0):
        held.append(store.held(0))
    assert 0 < max(held) <= 10  # held back, and cut at the bound
    assert store.held(0) == 0
    assert [o.offset for o in rt.fetch_offsets("g", [(T, list(range(25)))])] == [2] * 25


def test_replaying_a_long_run_pauses_for_the_event_loop() -> None:
    keys = 4 * LOAD_PAUSE
    log = _filled(keys, 2)  # two batches of the same keys: one run
    rt = _fresh(log)
    rt.runtime.begin_load()
    pauses = sum(1 for _ in rt.runtime.load_partition(0))
    assert pauses >= 2 + keys // LOAD_PAUSE  # after each batch, and within the run's replay
    assert [o.offset for o in rt.fetch_offsets("g", [(T, list(range(keys)))])] == [1] * keys
