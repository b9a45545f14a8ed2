"""The transaction coordinator's runtime: :class:`~samsa.coordinator.runtime.CoordinatorRuntime`
over the ``TransactionCoordinator`` shard, plus the marker jobs and the timer.

Theory of operation
-------------------
Every operation is one cycle of the generic runtime (docs/semantics.md, rule 26): the shard
computes an outcome (records, typed response, marker jobs); the records are appended to their
transactional id's partition of ``__transaction_state`` (``abs(hashCode(id)) %
transaction.state.log.num.partitions``, topic created on first write) and replayed only if
the append succeeded; otherwise the caller gets COORDINATOR_NOT_AVAILABLE and nothing changed.
Then marker jobs start (a Prepare{Commit,Abort} record is now durable: the decision is final,
rule 16) as tasks: each writes the COMMIT/ABORT marker to every partition of the transaction
through the port's ``write_marker``, retrying transient errors, and then runs ``complete``
(one more cycle) for the Complete{Commit,Abort} record.

Start-up (``load``, or the runtime's ``begin_load`` then ``load_in_background`` in the broker,
which serves meanwhile) replays every partition of ``__transaction_state`` (CRC-checked). Until
a partition is replayed, every operation on a transactional id placed there answers
COORDINATOR_LOAD_IN_PROGRESS, as Kafka's TransactionStateManager does for its loading
partitions (ListTransactions too while any partition loads). Where a record may have been lost
(the partition's tail was cut when it was opened, or replay skipped damage), the shard fences
every transactional id whose newest surviving record precedes the loss at the top epoch
(``TransactionCoordinator.fence_lost_state``), and the runtime writes and flushes those records
before the partition is served: after a fence record follows the damage, the next start finds
those ids unaffected, so a damage that stays in the log fences once. Once ``start`` has been
called, each loaded partition resumes the marker jobs of its transactions left in a Prepare
state by a crash (markers are idempotent in effect: a second COMMIT for an already completed
transaction on a partition changes nothing visible), and once every partition is loaded the
timer starts that aborts timed-out transactions and expires idle transactional ids.

``on_step`` (given at construction, None in the broker) is called with each marker job at two
steps that are otherwise never apart: ``after-prepare`` once its Prepare record is written,
``after-first-marker`` once its first marker is. The crash tests pass one that exits the
process there (tests/chaos/test_txn_crash.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from samsa.coordinator.ports import CoordinatorLog
from samsa.coordinator.runtime import CoordinatorRuntime
from samsa.coordinator.transaction_coordinator import (
    TXN_TOPIC,
    EndTxnResult,
    InitPidResult,
    MarkerJob,
    TransactionCoordinator,
    TxnConfig,
    TxnDescription,
    TxnListing,
    TxnOutcome,
)
from samsa.protocol.errors import ErrorCode

log = logging.getLogger("samsa.coordinator.txn")

__all__ = ["TXN_TOPIC", "StepHook", "TransactionCoordinatorRuntime"]

MARKER_RETRY_SECONDS = 0.1

# (step, job): see ``on_step`` in the module docstring.
StepHook = Callable[[str, MarkerJob], None]

# A marker that cannot be written for these reasons never will be: the job goes on.
_MARKER_GIVE_UP = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,  # the topic was deleted
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.TRANSACTION_COORDINATOR_FENCED,
}


class TransactionCoordinatorRuntime:
    def __init__(
        self,
        store: CoordinatorLog,
        config: TxnConfig,
        allocate_producer_id: Callable[[], int],
        clock: Callable[[], int],
        on_step: StepHook | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.coordinator = TransactionCoordinator(config, allocate_producer_id)
        self.runtime = CoordinatorRuntime(
            self.coordinator, store, clock, "transaction coordinator", self._summary
        )
        self._jobs: dict[str, asyncio.Task[None]] = {}
        self._started = False
        self._ticking = False
        self._on_step = on_step
        self.runtime.on_loaded.append(self._partition_loaded)

    # -- lifecycle ----------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the coordinator by replaying ``__transaction_state`` at once (and fence
        what damage may have hidden); the broker instead replays it while serving
        (``runtime.begin_load``, ``load_in_background``)."""
        self.runtime.load()

    def _summary(self) -> str:
        coord = self.coordinator
        return (
            f"{len(coord.txns)} transactional ids, {len(coord.pending_marker_jobs())} to complete"
        )

    def start(self) -> None:
        """Run marker jobs from now on, resume those of the partitions loaded, and start the
        timer once every partition is (later partitions do so as they load)."""
        self._started = True
        for index in range(self.coordinator.num_partitions):
            if self.runtime.gate(index) == ErrorCode.NONE:
                self._resume(index)
        self._start_timer()

    def _partition_loaded(self, partition: int) -> None:
        if self._started:
            self._resume(partition)
            self._start_timer()

    def _resume(self, partition: int) -> None:
        coord = self.coordinator
        for job in coord.pending_marker_jobs():
            if coord.partition_for(job.transactional_id) != partition:
                continue
            log.info(
                "resuming %s markers of %s",
                "commit" if job.commit else "abort",
                job.transactional_id,
            )
            self._start_job(job)

    def _start_timer(self) -> None:
        # The timer scans every id: not before all of them are replayed.
        if self._ticking or not self.runtime.loaded:
            return
        self._ticking = True
        self.runtime.start(lambda: self._run(self.coordinator.tick(self.clock())))

    def gate(self, transactional_id: str | None) -> ErrorCode:
        """NONE if ``transactional_id``'s partition is served (or there is no id), else
        COORDINATOR_LOAD_IN_PROGRESS: it is still being replayed."""
        if not transactional_id:
            return ErrorCode.NONE
        return self.runtime.gate(self.coordinator.partition_for(transactional_id))

    def close(self) -> None:
        self._started = self._ticking = False
        self.runtime.close()
        for task in self._jobs.values():
            task.cancel()  # a restart resumes them from the Prepare record
        self._jobs.clear()

    def ensure_topic(self) -> None:
        self.runtime.ensure_topic()

    # -- the operation cycle ------------------------------------------------------------------

    def _run(self, outcome: TxnOutcome[Any]) -> ErrorCode:
        error = self.runtime.write(outcome.records)
        if error != ErrorCode.NONE:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        for job in outcome.markers:
            self._after_prepare(job)
        return error

    def _after_prepare(self, job: MarkerJob) -> None:
        if self._on_step is not None:
            self._on_step("after-prepare", job)
        if self._started:
            self._start_job(job)
        # Not started yet (load): start() picks it up from pending_marker_jobs.

    def _start_job(self, job: MarkerJob) -> None:
        old = self._jobs.get(job.transactional_id)
        if old is not None and not old.done():
            return
        self._jobs[job.transactional_id] = asyncio.get_running_loop().create_task(
            self._write_markers(job)
        )

    async def _write_markers(self, job: MarkerJob) -> None:
        coordinator_epoch = self.coordinator.config.coordinator_epoch
        try:
            for n, (topic, partition) in enumerate(job.partitions):
                while True:
                    error = self.store.write_marker(
                        topic,
                        partition,
                        job.producer_id,
                        job.producer_epoch,
                        coordinator_epoch,
                        job.commit,
                    )
                    if error == ErrorCode.NONE:
                        break
                    if error in _MARKER_GIVE_UP:
                        log.warning(
                            "marker of %s for %s-%d not written: %s",
                            job.transactional_id,
                            topic,
                            partition,
                            error.name,
                        )
                        break
                    log.warning(
                        "marker of %s for %s-%d failed (%s): retrying",
                        job.transactional_id,
                        topic,
                        partition,
                        error.name,
                    )
                    await asyncio.sleep(MARKER_RETRY_SECONDS)
                if n == 0 and self._on_step is not None:
                    self._on_step("after-first-marker", job)
                if n % 16 == 15:
                    await asyncio.sleep(0)  # let other work in between large transactions
            while True:
                error = self._run(self.coordinator.complete(job, self.clock()))
                if error == ErrorCode.NONE:
                    break
                await asyncio.sleep(MARKER_RETRY_SECONDS)
        finally:
            if self._jobs.get(job.transactional_id) is asyncio.current_task():
                del self._jobs[job.transactional_id]

    # -- operations (what handlers call) ------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        expected: tuple[int, int] | None,
        *,
        enable_2pc: bool = False,
        keep_prepared: bool = False,
    ) -> InitPidResult:
        if loading := self.gate(transactional_id):
            return InitPidResult(loading)
        outcome = self.coordinator.init_producer_id(
            transactional_id,
            timeout_ms,
            expected,
            self.clock(),
            enable_2pc=enable_2pc,
            keep_prepared=keep_prepared,
        )
        error = self._run(outcome)
        if error != ErrorCode.NONE:
            return InitPidResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return outcome.response  # type: ignore[no-any-return]

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[tuple[str, int]],
        *,
        implicit: bool = False,
    ) -> ErrorCode:
        if loading := self.gate(transactional_id):
            return loading
        outcome = self.coordinator.add_partitions(
            transactional_id,
            producer_id,
            producer_epoch,
            partitions,
            self.clock(),
            implicit=implicit,
        )
        error = self._run(outcome)
        return ErrorCode.COORDINATOR_NOT_AVAILABLE if error != ErrorCode.NONE else outcome.response

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> ErrorCode:
        if loading := self.gate(transactional_id):
            return loading
        outcome = self.coordinator.end_txn(
            transactional_id, producer_id, producer_epoch, commit, self.clock()
        )
        error = self._run(outcome)
        return ErrorCode.COORDINATOR_NOT_AVAILABLE if error != ErrorCode.NONE else outcome.response

    def end_txn_v2(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> EndTxnResult:
        """EndTxn v5 (KIP-890 part 2): the epoch is bumped; the answer names the new one."""
        if loading := self.gate(transactional_id):
            return EndTxnResult(loading)
        outcome = self.coordinator.end_txn(
            transactional_id, producer_id, producer_epoch, commit, self.clock(), tv2=True
        )
        if self._run(outcome) != ErrorCode.NONE:
            return EndTxnResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return outcome.response  # type: ignore[no-any-return]

    def verify(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        partition: tuple[str, int],
    ) -> ErrorCode:
        if loading := self.gate(transactional_id):
            return loading
        return self.coordinator.verify(transactional_id, producer_id, producer_epoch, partition)

    def describe(self, transactional_ids: Iterable[str]) -> list[TxnDescription]:
        out: list[TxnDescription] = []
        for tid in transactional_ids:
            loading = self.gate(tid)
            out += [TxnDescription(tid, loading)] if loading else self.coordinator.describe([tid])
        return out

    def list(
        self,
        states: Iterable[str],
        producer_ids: Iterable[int],
        duration_ms: int = -1,
        pattern: str | None = None,
    ) -> tuple[ErrorCode, list[str], list[TxnListing]]:
        if loading := self.runtime.gate_all():  # as Kafka's ListTransactions
            return loading, [], []
        return self.coordinator.list(states, producer_ids, duration_ms, pattern, self.clock())
