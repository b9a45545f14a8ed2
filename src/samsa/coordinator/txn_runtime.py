"""The transaction coordinator's runtime: the log, the clock, marker writing and timers around
the pure state machine of ``transaction_coordinator.py``.

Theory of operation
-------------------
Every operation runs on the event-loop thread, start to finish with no await in between:

1. the state machine computes an :class:`Outcome` (records, response, marker jobs);
2. the records are appended to their transactional id's partition of
   ``__transaction_state`` (``abs(hashCode(id)) % transaction.state.log.num.partitions``,
   topic created on first write) through :mod:`samsa.coordinator.internal_topic`;
3. only if the append succeeded are they replayed into the state machine; otherwise the
   caller gets COORDINATOR_NOT_AVAILABLE and nothing changed;
4. marker jobs (a Prepare{Commit,Abort} record is now durable: the decision is final) start
   as tasks: each writes the COMMIT/ABORT marker to every partition of the transaction
   through ``write_marker`` (``Broker.write_txn_marker``), retrying transient errors, and
   then runs ``complete`` (step 1-3 again) for the Complete{Commit,Abort} record.

Start-up (``load``) replays every partition of ``__transaction_state`` (CRC-checked, see
``internal_topic``). Where a record may have been lost (the partition's tail was cut when it
was opened, or replay skipped damage), every transactional id whose newest surviving record
precedes the loss is fenced at the top epoch (``TransactionCoordinator.fence_lost_state``),
durably (flushed) before anything is served: after a fence record follows the damage, the
next start finds those ids unaffected, so a damage that stays in the log fences once. ``start`` then
resumes the marker jobs of transactions left in a Prepare state by a crash (markers are
idempotent in effect: a second COMMIT for an already completed transaction on a partition
changes nothing visible) and starts the timer that aborts timed-out transactions and expires
idle transactional ids.

Test-only fault hook: ``SAMSA_TXN_FAULT=after-prepare`` makes the process exit at once after
a PrepareCommit record is written, ``after-first-marker`` after a commit's first marker: the
chaos tests' way to kill the broker between two steps that are otherwise never apart.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from samsa.broker.topics import TopicError, TopicManager
from samsa.coordinator import txn_offsets
from samsa.coordinator.group_coordinator import CoordinatorRecord
from samsa.coordinator.internal_topic import append_records, ensure_topic, read_key_values
from samsa.coordinator.offsets_records import OffsetCommitKey, OffsetCommitValue
from samsa.coordinator.offsets_records import encode_key as encode_offsets_key
from samsa.coordinator.offsets_records import encode_value as encode_offsets_value
from samsa.coordinator.transaction_coordinator import (
    InitPidResult,
    MarkerJob,
    Outcome,
    TransactionCoordinator,
    TxnConfig,
    TxnDescription,
    TxnListing,
    TxnRecord,
)
from samsa.coordinator.txn_offsets import OFFSETS_TOPIC
from samsa.coordinator.txn_records import (
    TxnRecordFormatError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from samsa.protocol.errors import ErrorCode

log = logging.getLogger("samsa.coordinator.txn")

TXN_TOPIC = "__transaction_state"
TICK_SECONDS = 0.1
MARKER_RETRY_SECONDS = 0.1
FAULT_ENV = "SAMSA_TXN_FAULT"

# A marker that cannot be written for these reasons never will be: the job goes on.
_MARKER_GIVE_UP = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,  # the topic was deleted
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.TRANSACTION_COORDINATOR_FENCED,
}

WriteMarker = Callable[[str, int, int, int, int, bool], ErrorCode]


class TransactionCoordinatorRuntime:
    def __init__(
        self,
        topics: TopicManager,
        config: TxnConfig,
        allocate_producer_id: Callable[[], int],
        write_marker: WriteMarker,
        clock: Callable[[], int],
        groups: Any = None,
    ) -> None:
        self.topics = topics
        self.clock = clock
        self.coordinator = TransactionCoordinator(config, allocate_producer_id)
        self._write_marker = write_marker
        self.groups = groups  # GroupCoordinatorRuntime, for transactional offsets
        self._timer: asyncio.Task[None] | None = None
        self._jobs: dict[str, asyncio.Task[None]] = {}
        self._started = False
        self._fault = os.environ.get(FAULT_ENV, "")

    # -- lifecycle ----------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the coordinator by replaying ``__transaction_state``."""
        topic = self.topics.topics.get(TXN_TOPIC)
        if topic is None:
            return
        coord = self.coordinator
        if len(topic.partitions) != coord.config.num_partitions:
            # Placement follows the partition count the topic was created with.
            log.warning(
                "%s has %d partitions, transaction.state.log.num.partitions says %d: using %d",
                TXN_TOPIC,
                len(topic.partitions),
                coord.config.num_partitions,
                len(topic.partitions),
            )
            coord.config = replace(coord.config, num_partitions=len(topic.partitions))
        count = 0
        uncertain: set[str] = set()  # ids whose newest record may have been lost
        coord.begin_load()
        try:
            for partition in topic.partitions:
                seen: set[str] = set()  # ids with a record so far in this partition

                def lost(_what: str, seen: set[str] = seen) -> None:
                    uncertain.update(seen)

                for key, value in read_key_values(partition.log, lost):
                    try:
                        record = TxnRecord(decode_key(key), decode_value(value))
                    except (TxnRecordFormatError, ValueError) as exc:
                        log.error("a %s record is unreadable, not applied: %s", TXN_TOPIC, exc)
                        lost(str(exc))
                        continue
                    coord.replay(record)
                    seen.add(record.transactional_id)
                    uncertain.discard(record.transactional_id)  # its whole state is newer
                    count += 1
                if partition.log.load_report.lost_records:
                    uncertain.update(seen)  # the cut tail may have held newer records of any
        finally:
            coord.end_load()
        log.info(
            "transaction coordinator loaded %d records: %d transactional ids, %d to complete",
            count,
            len(coord.txns),
            len(coord.pending_marker_jobs()),
        )
        if uncertain:
            self._fence_lost_state(uncertain)

    def _fence_lost_state(self, uncertain: set[str]) -> None:
        coord = self.coordinator
        outcome = coord.fence_lost_state(sorted(uncertain), self.clock())
        if not outcome.records:
            return
        fenced = [r.transactional_id for r in outcome.records]
        log.error(
            "%s may have lost records: fencing %d transactional id(s) at the top epoch, so "
            "their next InitProducerId gets a fresh producer id: %s",
            TXN_TOPIC,
            len(fenced),
            ", ".join(fenced[:20]) + (" ..." if len(fenced) > 20 else ""),
        )
        if self._run(outcome) != ErrorCode.NONE:
            log.error("cannot write the fence records to %s", TXN_TOPIC)
            return
        # As durable as the cut that called for them: a power loss must not undo the fence.
        topic = self.topics.topics[TXN_TOPIC]
        for index in {coord.partition_for(tid) for tid in fenced}:
            topic.partitions[index].log.flush()

    def start(self) -> None:
        self._started = True
        loop = asyncio.get_running_loop()
        for job in self.coordinator.pending_marker_jobs():
            log.info(
                "resuming %s markers of %s",
                "commit" if job.commit else "abort",
                job.transactional_id,
            )
            self._start_job(job)
        self._timer = loop.create_task(self._tick_forever())

    def close(self) -> None:
        self._started = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._jobs.values():
            task.cancel()  # a restart resumes them from the Prepare record
        self._jobs.clear()

    def ensure_topic(self) -> None:
        ensure_topic(self.topics, TXN_TOPIC, self.coordinator.config.num_partitions, self.clock())

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                self._run(self.coordinator.tick(self.clock()))
            except Exception:
                log.exception("transaction coordinator tick failed")

    # -- the operation cycle ------------------------------------------------------------------

    def _run(self, outcome: Outcome) -> ErrorCode:
        error = self._write(outcome.records) if outcome.records else ErrorCode.NONE
        if error == ErrorCode.NONE:
            for job in outcome.markers:
                self._after_prepare(job)
        return error

    def _write(self, records: list[TxnRecord]) -> ErrorCode:
        coord = self.coordinator
        try:
            self.ensure_topic()
        except TopicError as exc:  # e.g. a full disk: created whole on a later try
            log.error("cannot create %s: %s", TXN_TOPIC, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        by_partition: dict[int, list[TxnRecord]] = {}
        for rec in records:
            by_partition.setdefault(coord.partition_for(rec.transactional_id), []).append(rec)
        now = self.clock()
        worst = ErrorCode.NONE
        for index, recs in sorted(by_partition.items()):
            kvs = [
                (
                    encode_key(r.transactional_id),
                    None if r.value is None else encode_value(r.value),
                )
                for r in recs
            ]
            error = append_records(self.topics, TXN_TOPIC, index, kvs, now)
            if error != ErrorCode.NONE:
                worst = ErrorCode.COORDINATOR_NOT_AVAILABLE
                continue
            for r in recs:
                coord.replay(r)
        return worst

    def _after_prepare(self, job: MarkerJob) -> None:
        if job.commit and self._fault == "after-prepare":
            log.error("fault injection: exiting after PrepareCommit of %s", job.transactional_id)
            os._exit(137)
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
                    error = self._write_marker(
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
                if n == 0 and job.commit and self._fault == "after-first-marker":
                    log.error("fault injection: exiting after the first marker")
                    os._exit(137)
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

    def on_marker(self, topic: str, partition: int, producer_id: int, commit: bool) -> None:
        """``Broker.txn_marker_listeners`` hook: transactional offsets become visible (or are
        dropped) when their marker reaches the group's ``__consumer_offsets`` partition."""
        if self.groups is not None:
            txn_offsets.on_marker(self.groups, topic, partition, producer_id, commit, self.clock())

    # -- operations (what handlers call) ------------------------------------------------------

    def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None
    ) -> InitPidResult:
        outcome = self.coordinator.init_producer_id(
            transactional_id, timeout_ms, expected, self.clock()
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
    ) -> ErrorCode:
        outcome = self.coordinator.add_partitions(
            transactional_id, producer_id, producer_epoch, partitions, self.clock()
        )
        error = self._run(outcome)
        return ErrorCode.COORDINATOR_NOT_AVAILABLE if error != ErrorCode.NONE else outcome.response

    def offsets_partition(self, group_id: str) -> tuple[str, int]:
        if self.groups is not None:
            return (OFFSETS_TOPIC, int(self.groups.coordinator.partition_for(group_id)))
        return self.coordinator.offsets_partition(group_id, 50)

    def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> ErrorCode:
        if self.groups is not None:
            try:
                self.groups.ensure_topic()
            except TopicError:
                return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return self.add_partitions(
            transactional_id, producer_id, producer_epoch, [self.offsets_partition(group_id)]
        )

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> ErrorCode:
        outcome = self.coordinator.end_txn(
            transactional_id, producer_id, producer_epoch, commit, self.clock()
        )
        error = self._run(outcome)
        return ErrorCode.COORDINATOR_NOT_AVAILABLE if error != ErrorCode.NONE else outcome.response

    def verify(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        partition: tuple[str, int],
    ) -> ErrorCode:
        return self.coordinator.verify(transactional_id, producer_id, producer_epoch, partition)

    def commit_offsets(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[tuple[str, int, int, int, str | None]],
    ) -> dict[tuple[str, int], ErrorCode]:
        """TxnOffsetCommit: ``offsets`` are (topic, partition, offset, leader epoch, metadata).
        They are written as a transactional batch and stay pending until the marker."""
        tps = [(t, p) for t, p, *_ in offsets]
        groups = self.groups
        if groups is None:
            return dict.fromkeys(tps, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        offsets_tp = self.offsets_partition(group_id)
        error = self.verify(transactional_id, producer_id, producer_epoch, offsets_tp)
        if error == ErrorCode.INVALID_PRODUCER_ID_MAPPING:
            error = ErrorCode.INVALID_PRODUCER_EPOCH  # what TxnOffsetCommit clients know
        if error == ErrorCode.NONE and (generation >= 0 or member_id):
            # KIP-447: a consumer-group-aware producer is fenced by the group generation.
            error = groups.coordinator.validate_commit(
                group_id, generation, member_id, group_instance_id, self.clock()
            )
        if error != ErrorCode.NONE:
            return dict.fromkeys(tps, error)
        now = self.clock()
        max_meta = groups.coordinator.config.offset_metadata_max_bytes
        errors: dict[tuple[str, int], ErrorCode] = {}
        records: list[CoordinatorRecord] = []
        for topic, partition, offset, leader_epoch, metadata in offsets:
            if len((metadata or "").encode()) > max_meta:
                errors[(topic, partition)] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            errors[(topic, partition)] = ErrorCode.NONE
            records.append(
                CoordinatorRecord(
                    OffsetCommitKey(group_id, topic, partition),
                    OffsetCommitValue(offset, metadata or "", now, leader_epoch),
                )
            )
        if not records:
            return errors
        try:
            groups.ensure_topic()
        except TopicError:
            return dict.fromkeys(tps, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        kvs = [
            (encode_offsets_key(r.key), encode_offsets_value(r.value))  # type: ignore[arg-type]
            for r in records
        ]
        write_error = append_records(
            self.topics,
            OFFSETS_TOPIC,
            offsets_tp[1],
            kvs,
            now,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            transactional=True,
        )
        if write_error != ErrorCode.NONE:
            return dict.fromkeys(tps, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        groups.txn_offsets.stage(offsets_tp[1], producer_id, records)
        return errors

    def describe(self, transactional_ids: Iterable[str]) -> list[TxnDescription]:
        return self.coordinator.describe(transactional_ids)

    def list(
        self,
        states: Iterable[str],
        producer_ids: Iterable[int],
        duration_ms: int = -1,
        pattern: str | None = None,
    ) -> tuple[ErrorCode, list[str], list[TxnListing]]:
        return self.coordinator.list(states, producer_ids, duration_ms, pattern, self.clock())
