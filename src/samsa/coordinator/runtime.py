"""One coordinator runtime for both coordinators (Kafka's ``CoordinatorRuntime`` over a
``CoordinatorShard``): the internal topic, the clock and the timer around a pure state machine.

Theory of operation
-------------------
A *shard* (``GroupCoordinator``, ``TransactionCoordinator``) is a state machine whose
operations never change durable state: they return an :class:`Outcome` (Kafka's
``CoordinatorResult``), the records to write and the typed response. The runtime runs every
operation the same way, on the event-loop thread, start to finish with no await in between,
so operations never interleave (docs/semantics.md, rule 26):

1. the shard computes the outcome at ``clock()``;
2. the records are grouped by the partition of the internal topic their key maps to, and
   each group is appended as one batch through the
   :class:`~samsa.coordinator.ports.CoordinatorLog` port, which answers the offsets it wrote
   (the topic is created with the configured partition count on first write);
3. only the records of a batch that was written are replayed into the shard, at their
   offsets: the only way durable state changes; the shard is told of a batch that was not
   (``write_failed``), and the caller gets the error.

Start-up is the same replay, one partition of the topic at a time, each read from its log
start, CRC-checked, and each batch handed to the shard (``load_batch``) in log order, damage
too (``load_damaged``); then ``end_load`` of that partition may answer records to write at
once (the transaction coordinator's fences after damage), which are written and flushed
before the partition is served: as durable as the damage that called for them. The partition
count is the one the topic was created with, whatever the configuration says now: placement
follows it.

The broker serves as soon as its logs are open, as Kafka does: ``begin_load`` marks every
partition of the topic loading, and until a partition is replayed, :meth:`gate` answers
COORDINATOR_LOAD_IN_PROGRESS for it (Kafka's CoordinatorRuntime answers so for any operation
on a shard still loading; clients back off and retry). The concrete runtimes ask the gate at
the entry of every operation, so nothing is applied to state that has not finished replaying.
``load_in_background`` replays on the event loop, yielding to other connections every
:data:`LOAD_SLICE_SECONDS`: replay mutates the shard, which the loop's operations on loaded
partitions mutate too, so it stays on the loop's thread (and its cost is Python, which a
thread would not run in parallel anyway). ``load`` does the same at once (tests, tools).

Timers: ``start`` calls a concrete runtime's tick every :data:`TICK_SECONDS` (the
transaction coordinator); ``schedule`` instead wakes up once at the shard's earliest
deadline, rescheduled after every operation (the group coordinator, whose shard keeps a
timer per group in ``timer.py``, as Kafka's coordinator timer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

from samsa.coordinator.ports import CoordinatorLog, StoredBatch, StoreUnavailable
from samsa.protocol.errors import ErrorCode

log = logging.getLogger("samsa.coordinator")

TICK_SECONDS = 0.05
# Replay yields to the event loop this often, so other connections wait at most about this.
LOAD_SLICE_SECONDS = 0.005

RecT = TypeVar("RecT")
R = TypeVar("R")


@dataclass
class Outcome(Generic[RecT, R]):
    """What an operation asks for: ``records`` to write, and the ``response`` once they are
    written (Kafka's ``CoordinatorResult``)."""

    records: list[RecT]
    response: R


class CoordinatorShard(Protocol[RecT]):
    """The state machine a :class:`CoordinatorRuntime` runs."""

    @property
    def topic(self) -> str:
        """The internal topic holding its state."""
        ...

    @property
    def num_partitions(self) -> int: ...

    def use_partitions(self, num_partitions: int) -> None:
        """The topic exists with ``num_partitions``: place keys by it."""

    def partition_of(self, record: RecT) -> int: ...

    def serialize(self, record: RecT) -> tuple[bytes, bytes | None]: ...

    def begin_load(self, partition: int) -> None:
        """``partition`` is about to be replayed from its log start."""

    def load_batch(self, partition: int, batch: StoredBatch, now_ms: int) -> Iterable[None]:
        """Replay one stored batch of ``partition`` (start-up) as the result is iterated; it
        may pause in between (a replay applying much at once lets other work in there)."""
        ...

    def load_held(self, partition: int, now_ms: int) -> Iterable[None]:
        """After the last batch of ``partition``: replay what :meth:`load_batch` held back,
        as the result is iterated (pausing as it does)."""
        ...

    def load_damaged(self, partition: int, what: str) -> None:
        """Something of ``partition`` was skipped here (start-up)."""

    def end_load(self, partition: int, now_ms: int) -> list[RecT]:
        """``partition`` is replayed: the records to write (and flush) before serving it."""
        ...

    def replay(self, record: RecT, now_ms: int, offset: int | None = None) -> None:
        """Apply one record written at ``offset``: the only way durable state changes."""

    def write_failed(self, records: Sequence[RecT], error: ErrorCode) -> None:
        """``records`` were not written."""


class TransactionalShard(CoordinatorShard[RecT], Protocol):
    """A shard some of whose records are written inside a producer's transaction (the group
    coordinator's TxnOffsetCommit)."""

    def stage(self, partition: int, producer_id: int, written: list[tuple[int, RecT]]) -> None:
        """``written`` (offset, record) are in the log, undecided until the producer's
        marker reaches ``partition`` (``replay_marker``)."""


class CoordinatorRuntime(Generic[RecT]):
    def __init__(
        self,
        shard: CoordinatorShard[RecT],
        store: CoordinatorLog,
        clock: Callable[[], int],
        name: str,
        summary: Callable[[], str] = str,
    ) -> None:
        self.shard = shard
        self.store = store
        self.clock = clock
        self.name = name
        self._timer: asyncio.Task[None] | None = None
        self._wakeup: asyncio.TimerHandle | None = None  # the shard's next deadline
        self._wakeup_at: int | None = None
        self.loading: set[int] = set()  # partitions not yet replayed (``gate``)
        self.batches_loaded = 0
        self.summary = summary  # what the shard holds, said once it is loaded
        # Called with each partition once it is replayed and served.
        self.on_loaded: list[Callable[[int], object]] = []

    # -- lifecycle ----------------------------------------------------------------------------

    def begin_load(self) -> list[int]:
        """Mark every partition of the topic loading (answered COORDINATOR_LOAD_IN_PROGRESS
        by :meth:`gate` until replayed); the partitions to load, in order."""
        shard = self.shard
        topic = shard.topic
        count = self.store.partition_count(topic)
        if count is None:
            return []
        if count != shard.num_partitions:
            log.warning(
                "%s has %d partitions, the configuration says %d: using %d",
                topic,
                count,
                shard.num_partitions,
                count,
            )
            shard.use_partitions(count)
        self.loading = set(range(count))
        return list(range(count))

    def load_partition(self, index: int) -> Iterator[None]:
        """Replay partition ``index``, yielding after each batch (and wherever the shard
        pauses) so that a driver may let other work in between; once exhausted the
        partition is served."""
        shard = self.shard
        now = self.clock()

        def damaged(what: str) -> None:
            shard.load_damaged(index, what)

        shard.begin_load(index)
        for batch in self.store.read(shard.topic, index, damaged):
            yield from shard.load_batch(index, batch, now)
            self.batches_loaded += 1
            yield
        yield from shard.load_held(index, now)
        records = shard.end_load(index, now)
        if records:
            if self.write(records) == ErrorCode.NONE:
                self.flush(records)
            else:
                log.error(
                    "%s: cannot write the records loading asked for to %s", self.name, shard.topic
                )
        self.loading.discard(index)
        for listener in self.on_loaded:
            listener(index)

    def load(self) -> int:
        """Replay the whole topic into the shard at once; the number of batches replayed."""
        for index in self.begin_load():
            for _ in self.load_partition(index):
                pass
        self._log_loaded()
        return self.batches_loaded

    async def load_in_background(self, batch_delay_s: float = 0.0) -> int:
        """Replay the partitions :meth:`begin_load` marked, on the event loop, yielding to
        it every :data:`LOAD_SLICE_SECONDS`; the number of batches replayed.
        ``batch_delay_s``: a test setting that sleeps after every batch (a slow replay)."""
        for index in sorted(self.loading):
            started = time.perf_counter()
            for _ in self.load_partition(index):
                if batch_delay_s:
                    await asyncio.sleep(batch_delay_s)
                elif time.perf_counter() - started >= LOAD_SLICE_SECONDS:
                    await asyncio.sleep(0)
                    started = time.perf_counter()
            await asyncio.sleep(0)
        self._log_loaded()
        return self.batches_loaded

    def _log_loaded(self) -> None:
        log.info("%s loaded %d batches: %s", self.name, self.batches_loaded, self.summary())

    def gate(self, partition: int) -> ErrorCode:
        """Whether an operation on ``partition`` may run now: NONE, or
        COORDINATOR_LOAD_IN_PROGRESS while it is being replayed."""
        if partition in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    def gate_all(self) -> ErrorCode:
        """:meth:`gate` for what spans every partition (listings): NONE once all are
        replayed, else COORDINATOR_LOAD_IN_PROGRESS (a listing would miss the loading ones)."""
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if self.loading else ErrorCode.NONE

    @property
    def loaded(self) -> bool:
        """Every partition is replayed (what spans them all, timers and listings, may run)."""
        return not self.loading

    def start(self, tick: Callable[[], object]) -> None:
        """Call ``tick`` every :data:`TICK_SECONDS` until :meth:`close`."""
        self._timer = asyncio.get_running_loop().create_task(self._tick_forever(tick))

    async def _tick_forever(self, tick: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                tick()
            except Exception:
                log.exception("%s tick failed", self.name)

    def schedule(self, deadline_ms: int | None, fire: Callable[[], object]) -> None:
        """Call ``fire`` at ``deadline_ms`` (the shard's earliest timer; None: none), instead
        of any call scheduled before: one loop handle, moved as the deadline moves."""
        handle = self._wakeup
        if handle is not None and self._wakeup_at == deadline_ms and not handle.cancelled():
            return
        if handle is not None:
            handle.cancel()
        self._wakeup = None
        self._wakeup_at = deadline_ms
        if deadline_ms is None:
            return
        # At least 1 ms on: a deadline a firing leaves in the past does not spin the loop.
        delay = max(deadline_ms - self.clock(), 1) / 1000
        self._wakeup = asyncio.get_running_loop().call_later(delay, self._fire, fire)

    def _fire(self, fire: Callable[[], object]) -> None:
        self._wakeup = None
        self._wakeup_at = None
        try:
            fire()
        except Exception:
            log.exception("%s timer failed", self.name)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup = None

    def ensure_topic(self) -> None:
        """Create the topic unless it exists; StoreUnavailable if it cannot be now."""
        self.store.ensure_topic(self.shard.topic, self.shard.num_partitions)

    # -- the operation cycle ------------------------------------------------------------------

    def write(self, records: Sequence[RecT]) -> ErrorCode:
        """Append ``records`` (one batch per partition) and replay those written: NONE, or
        the worst error (COORDINATOR_NOT_AVAILABLE, or the log's own: MESSAGE_TOO_LARGE)."""
        if not records:
            return ErrorCode.NONE
        shard = self.shard
        try:
            self.ensure_topic()
        except StoreUnavailable:  # e.g. a full disk: created whole on a later try
            shard.write_failed(records, ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        by_partition: dict[int, list[RecT]] = {}
        for rec in records:
            by_partition.setdefault(shard.partition_of(rec), []).append(rec)
        worst = ErrorCode.NONE
        now = self.clock()
        for index, recs in sorted(by_partition.items()):
            appended = self.store.append(shard.topic, index, [shard.serialize(r) for r in recs])
            if appended.error != ErrorCode.NONE:
                shard.write_failed(recs, ErrorCode.COORDINATOR_NOT_AVAILABLE)
                worst = appended.error
                continue
            for i, r in enumerate(recs):
                shard.replay(r, now, appended.base_offset + i)
        return worst

    def write_transactional(
        self, records: Sequence[RecT], producer_id: int, producer_epoch: int
    ) -> ErrorCode:
        """Append ``records`` as transactional batches of the producer (one per partition)
        and have the shard stage those written; the log's error otherwise. Nothing is
        replayed: the marker decides them. StoreUnavailable if the topic cannot be created.
        The shard is not told of a failed write: nothing it holds waits on these records."""
        shard = cast(TransactionalShard[RecT], self.shard)
        self.ensure_topic()
        by_partition: dict[int, list[RecT]] = {}
        for rec in records:
            by_partition.setdefault(shard.partition_of(rec), []).append(rec)
        for index, recs in sorted(by_partition.items()):
            appended = self.store.append(
                shard.topic,
                index,
                [shard.serialize(r) for r in recs],
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                transactional=True,
            )
            if appended.error != ErrorCode.NONE:
                return appended.error
            shard.stage(
                index, producer_id, [(appended.base_offset + i, r) for i, r in enumerate(recs)]
            )
        return ErrorCode.NONE

    def flush(self, records: Sequence[RecT]) -> None:
        """fsync the partitions ``records`` went to."""
        for index in sorted({self.shard.partition_of(r) for r in records}):
            self.store.flush(self.shard.topic, index)
