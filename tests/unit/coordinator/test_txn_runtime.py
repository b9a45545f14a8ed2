"""The transaction runtime on real logs: records reach ``__transaction_state``, markers are
written to every partition and then the transaction completes; a restart replays the topic
and finishes a transaction it finds prepared; transient marker errors are retried
(docs/semantics.md, rules 16 and 26)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from samsa.broker.coordinator_log import CoordinatorLogs
from samsa.broker.topics import TopicManager
from samsa.coordinator.transaction import TxnState
from samsa.coordinator.transaction_coordinator import TxnConfig
from samsa.coordinator.txn_runtime import TXN_TOPIC, TransactionCoordinatorRuntime
from samsa.log.log import LogConfig
from samsa.protocol.errors import ErrorCode as E

CONFIG = TxnConfig(num_partitions=3)


class Markers:
    def __init__(self, failures: int = 0) -> None:
        self.calls: list[tuple[str, int, int, int, bool]] = []
        self.failures = failures

    def __call__(
        self, topic: str, partition: int, pid: int, epoch: int, coord_epoch: int, commit: bool
    ) -> E:
        if self.failures:
            self.failures -= 1
            return E.KAFKA_STORAGE_ERROR
        self.calls.append((topic, partition, pid, epoch, commit))
        return E.NONE


def _runtime(
    path: Path, markers: Markers, pids: itertools.count[int]
) -> TransactionCoordinatorRuntime:
    topics = TopicManager(path, LogConfig())
    topics.load(0)
    clock = itertools.count(1_000_000, 10)
    store = CoordinatorLogs(topics, lambda: next(clock))
    store.write_marker = markers  # type: ignore[method-assign]
    return TransactionCoordinatorRuntime(store, CONFIG, lambda: next(pids), lambda: next(clock))


def _topics(rt: TransactionCoordinatorRuntime) -> TopicManager:
    assert isinstance(rt.store, CoordinatorLogs)
    return rt.store.topics


async def _settle(rt: TransactionCoordinatorRuntime, tid: str, state: TxnState) -> None:
    for _ in range(200):
        if rt.coordinator.txns[tid].state == state:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(rt.coordinator.txns[tid])


def test_commit_writes_markers_then_completes_and_survives_restart(tmp_path: Path) -> None:
    async def run() -> None:
        markers, pids = Markers(failures=2), itertools.count(7)
        rt = _runtime(tmp_path, markers, pids)
        rt.load()
        rt.start()
        r = rt.init_producer_id("tx", 60_000, None)
        assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, 7, 0)
        assert rt.add_partitions("tx", 7, 0, [("a", 0), ("b", 1)]) == E.NONE
        assert rt.end_txn("tx", 7, 0, True) == E.NONE
        await _settle(rt, "tx", TxnState.COMPLETE_COMMIT)
        assert markers.calls == [("a", 0, 7, 0, True), ("b", 1, 7, 0, True)]
        assert len(_topics(rt).topics[TXN_TOPIC].partitions) == 3
        state = rt.coordinator.durable_state()
        rt.close()
        _topics(rt).close(0)

        again = _runtime(tmp_path, Markers(), pids)
        again.load()
        assert again.coordinator.durable_state() == state
        _topics(again).close(0)

    asyncio.run(run())


def test_prepared_transaction_is_finished_after_a_restart(tmp_path: Path) -> None:
    async def run() -> None:
        pids = itertools.count(1)
        rt = _runtime(tmp_path, Markers(), pids)
        rt.load()  # never started: the Prepare record is written, no marker job runs
        rt.init_producer_id("tx", 60_000, None)
        rt.add_partitions("tx", 1, 0, [("a", 2)])
        assert rt.end_txn("tx", 1, 0, False) == E.NONE
        assert rt.coordinator.txns["tx"].state == TxnState.PREPARE_ABORT
        _topics(rt).close(0)

        markers = Markers()
        again = _runtime(tmp_path, markers, pids)
        again.load()
        assert again.coordinator.txns["tx"].state == TxnState.PREPARE_ABORT
        again.start()
        await _settle(again, "tx", TxnState.COMPLETE_ABORT)
        assert markers.calls == [("a", 2, 1, 0, False)]
        again.close()
        _topics(again).close(0)

    asyncio.run(run())
