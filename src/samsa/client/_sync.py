"""Synchronous facades: each runs its asyncio core on a private event loop thread.

The facade methods hand work to the loop (``run_coroutine_threadsafe``) and wait for it.
``Producer.produce`` does not wait: it checks the record, adds it to an inbox and
returns (no future per record unless :meth:`Producer.send` asks for one). The thread that
made the producer adds its plain records (bytes, one topic, one callback or none, a few in
a row) to its open run, value and key only, no object per record; other records are one
tuple each, and
``produce_batch`` adds a chunk of Arrow columns, each after the owner's open run, so all
keep their order. The loop drains the inbox in one call per burst (a run as columns,
partitioned and encoded per burst, see ``_accumulator``), and delivery callbacks are
served from :meth:`Producer.poll` / :meth:`Producer.flush` in the caller's thread, as
confluent-kafka does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import queue
import threading
import time
import typing
from _thread import get_ident
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, Self, TypeVar

from samsa.client._accumulator import (
    RECORD_OVERHEAD,
    BatchMetadata,
    Columns,
    Extras,
    Item,
    RowSink,
    Tally,
    columnar_ready,
    fail_items,
    make_columns,
    make_item,
    plain_columns,
    register_sink,
    row_sink,
    run_columns,
    unregister_sink,
)
from samsa.client._admin import (
    AlterConfigOp,
    AsyncAdmin,
    ClientQuotaEntity,
    ClientQuotaFilterComponent,
    ConfigEntry,
    ConfigResource,
    DeletedRecords,
    FeatureMetadata,
    FeatureUpdate,
    GroupDescription,
    GroupListing,
)
from samsa.client._consumer import AsyncConsumer
from samsa.client._errors import (
    ClosedError,
    KafkaError,
    KafkaTimeoutError,
    TransactionStateError,
)
from samsa.client._producer import AsyncProducer, Headers
from samsa.client._transactions import AsyncResumedTransaction, TransactionState
from samsa.client._types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    NewTopic,
    PreparedTransaction,
    ProducerInfo,
    ProducerState,
    ProducerStats,
    RecordMetadata,
    TopicMetadata,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from samsa.protocol.errors import ErrorCode

if typing.TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")
DeliveryCallback = Callable[[BaseException | None, RecordMetadata | None], None]
BatchCallback = Callable[[BaseException | None, BatchMetadata], None]
log = logging.getLogger("samsa.client.producer")
# produce(on_delivery=...) serves callbacks itself beyond this many, if nobody polls
_MAX_UNSERVED_CALLBACKS = 100_000
# A burst of at least this many plain records takes the columnar intake (_append_plain):
# below it, its fixed cost per call (~0.7 ms, one encode for every partition) and the short
# batch it leaves per partition cost more than the per-record path saves (measured on the
# loop thread, 4 partitions: 1.3 ms against 2.9 ms for 2,048 records; 0.7 against 0.7 for
# 512)
_COLUMNAR_MIN = 2_048
# buffer.memory the owner thread reserves ahead for its next plain records (at most a
# sixteenth of it), so that produce() counts a record with one subtraction
_CREDIT = 64 * 1024
# The owner's plain records of one topic (and callback) in a row that open a run for the
# next ones; before, and for a producer alternating topics, one tuple a record
_RUN_MIN = 8
# Records handed to the core per loop callback (see _drain_inbox): 16k, 32k and unbounded
# were within noise of each other (on a loaded 2-core machine), 16k a little ahead.
_DRAIN_MAX = 16_384


def _no_outcome(err: BaseException | None, md: BatchMetadata) -> None:
    """produce() without on_delivery: nobody to tell (as confluent-kafka)."""


def _run_items(
    topic: str,
    extras: Extras | None,
    values: list[bytes | None],
    keys: list[bytes | None],
) -> list[Item]:
    """A run's records as the general path's intake items (a short run, or no columns)."""
    return [
        (topic, v, k, RECORD_OVERHEAD + len(v) + (0 if k is None else len(k)), extras)  # type: ignore[arg-type]
        for v, k in zip(values, keys, strict=True)
    ]


def _settle_future(
    cf: concurrent.futures.Future[RecordMetadata],
    put: Callable[[tuple[DeliveryCallback, Any, Any]], None],
    cb: DeliveryCallback | None,
    err: BaseException | None,
    md: RecordMetadata | None,
) -> None:
    if not cf.done():
        if err is not None:
            cf.set_exception(err)
        else:
            cf.set_result(md)  # type: ignore[arg-type]
    if cb is not None:
        put((cb, err, md))


class _Landed:
    """The records of one batch for one delivery callback, served from poll() one by one
    (``next``: the first not served yet)."""

    __slots__ = ("append_time", "base", "duplicate", "next", "partition", "rows", "stamps", "topic")

    def __init__(
        self,
        topic: str,
        partition: int,
        base: int,
        rows: Sequence[int],
        stamps: list[int] | None,
        append_time: int,
        duplicate: bool,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.base = base
        self.rows = rows
        self.stamps = stamps
        self.append_time = append_time
        self.duplicate = duplicate
        self.next = 0


class _CallbackSink(RowSink):
    """produce(on_delivery=cb)'s sink, one per callback: it queues the outcome for poll(),
    a whole batch's records as one entry (see :class:`RowSink`)."""

    __slots__ = ("callback", "counted", "put")

    def __init__(
        self,
        callback: DeliveryCallback,
        put: Callable[[tuple[DeliveryCallback, Any, Any]], None],
        counted: Callable[[int], None],
    ) -> None:
        self.callback = callback
        self.put = put
        self.counted = counted

    def __call__(self, err: BaseException | None, md: RecordMetadata | None) -> None:
        self.counted(1)
        self.put((self.callback, err, md))

    def landed_rows(
        self,
        topic: str,
        partition: int,
        base_offset: int,
        rows: Sequence[int],
        timestamps: list[int] | None,
        append_time: int,
        duplicate: bool,
    ) -> None:
        self.counted(len(rows))
        landed = _Landed(topic, partition, base_offset, rows, timestamps, append_time, duplicate)
        self.put((self.callback, None, landed))


class _CallbackTally(Tally):
    """A columnar burst whose records share one delivery callback: each run of records
    written (a batch) is queued for poll() as one entry, as a batch's RowSink delivery is;
    the records of one partition are in offset order, so a run's records are its offsets.
    Every record of the burst has the same timestamp (``now``), unless the batch's log
    append time replaces it."""

    __slots__ = ("_now", "_sink")

    def __init__(self, topic: str, count: int, sink: _CallbackSink, now: int) -> None:
        super().__init__(topic, count, _no_outcome)
        self._sink = sink
        self._now = now

    def landed(
        self,
        partition: int,
        base_offset: int,
        count: int,
        append_time: int = -1,
        duplicate: bool = False,
    ) -> None:
        super().landed(partition, base_offset, count)
        at = append_time if append_time >= 0 else self._now
        self._sink.landed_rows(
            self.topic, partition, base_offset, range(count), None, at, duplicate
        )

    def failed(self, err: BaseException, count: int) -> None:
        super().failed(err, count)
        for _ in range(count):
            self._sink(err, None)


class _Chunk:
    """A chunk of a produce_batch() call, queued in the inbox among produce()'s records."""

    __slots__ = ("columns", "tally", "topic")

    def __init__(self, topic: str, columns: Columns, tally: Tally) -> None:
        self.topic = topic
        self.columns = columns
        self.tally = tally


class _Run(list[bytes | None]):
    """The owner thread's plain records of one topic and one delivery callback (or none),
    in order and flat: value, key, value, key... An entry of the inbox from its first
    record; the owner appends to it while it is the producer's ``_run`` and starts another
    (also for anything else it queues) to keep its order. Records come in pairs through
    one ``extend``, so a drain that slices an even length cuts between records.

    No object per record: a tuple per record waiting in the inbox cost the loop thread a
    third of its intake (itemgetter passes to make columns of them) and handed the cyclic
    collector a million tracked objects a second (0.1-0.2 s of collections per million
    records, in the producing thread)."""

    __slots__ = ("extras", "topic")

    def __init__(self, topic: str | None, extras: tuple[None, None, None, int] | None) -> None:
        super().__init__()
        self.topic = topic
        self.extras = extras


_NO_RUN = _Run(None, None)  # the owner has no open run: its next plain record starts one


class LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self.loop.is_closed():
            coro.close()
            raise ClosedError("client is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise KafkaTimeoutError("operation timed out") from None

    def run_sync(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` on the loop thread and wait for its result."""

        async def call() -> T:
            return fn()

        return self.run(call())

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


def start_core(name: str, make: Callable[[], Awaitable[T]]) -> tuple[LoopThread, T]:
    lt = LoopThread(name)

    async def build() -> T:
        return await make()

    try:
        return lt, lt.run(build())
    except BaseException:
        lt.stop()
        raise


class _Core(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


C = TypeVar("C", bound=_Core)


def start_client(name: str, new: Callable[[], C]) -> tuple[LoopThread, C]:
    """:func:`start_core` for a core with ``start``/``close``: built and started on the loop
    thread, closed again if ``start`` fails."""

    async def make() -> C:
        core = new()
        try:
            await core.start()
        except BaseException:
            await core.close()
            raise
        return core

    return start_core(name, make)


class _Facade(Generic[C]):
    """A core running on a private loop thread: context manager, ``close`` once."""

    _lt: LoopThread
    _core: C
    _closed: bool

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._core.close(), 30)
        finally:
            self._lt.stop()


class Producer(_Facade[AsyncProducer]):
    """Synchronous idempotent producer (see :class:`AsyncProducer`).

    :meth:`produce` is confluent-kafka's: it queues the record and returns nothing; the
    outcome goes to ``on_delivery``, called from :meth:`poll` / :meth:`flush` in the
    caller's thread. :meth:`send` returns a future instead, for callers that want one.
    """

    def __init__(
        self, config: dict[str, Any] | None = None, *, state: ProducerState | None = None
    ) -> None:
        columnar_ready()  # load the codec (pyarrow, numpy) while we connect...
        self._lt, self._core = start_client(
            "samsa-producer", lambda: AsyncProducer(config, state=state)
        )
        # ...and return once it is loaded: an import running behind the first produce()
        # calls fights them for the GIL (measured: ~0.3 s of CPU that starved the loop
        # thread, which then sent nothing until flush(); 200k records went at 0.6x the rate
        # they go at with the codec loaded)
        columnar_ready(wait=True)
        core = self._core
        # Producing threads append to the inbox (the owner to its open run); the loop thread
        # takes them without a lock (see _drain_inbox), so a producing thread never waits for
        # the loop thread. Each record's bytes are reserved in the core's buffer.memory
        # account first: without a lock from the thread that made the producer (the owner),
        # see BufferMemory.
        self._owner = threading.get_ident()
        self._lock = threading.Lock()  # guards _marks
        self._inbox: list[Item | _Run | _Chunk] = []
        self._marks = 0  # runs and produce_batch() chunks in the inbox (under _lock)
        self._run = _NO_RUN  # the owner's open run (owner thread; the drain only reads it)
        self._credit = 0  # buffer.memory the owner reserved ahead (owner thread)
        # the owner's plain records of one topic and callback in a row, before a run opens
        self._streak_topic: str | None = None
        self._streak_extras: tuple[None, None, None, int] | None = None
        self._streak = 0
        # runs parked for their topic's partitions (loop thread; see _drain_marked)
        self._topic_waits: set[str] = set()
        self._no_metadata: dict[str, KafkaError] = {}
        self._scheduled = False
        self._buffer = core.buffer
        self._buffer.set_owner(self._owner)
        self._transactional = core.transactional_id is not None
        self._callbacks: queue.SimpleQueue[tuple[DeliveryCallback, Any, Any]] = queue.SimpleQueue()
        # Delivery callbacks: one sink per callback, records carry its handle (no object per
        # record); outcomes queued (records; loop thread only) against served (under
        # _poll_lock) bound what waits.
        self._sinks: dict[DeliveryCallback, tuple[None, None, None, int]] = {}  # extras
        self._queued_outcomes = 0
        self._served = 0
        self._serving: tuple[DeliveryCallback, _Landed] | None = None
        self._poll_lock = threading.RLock()
        self._closed = False
        # produce()'s fast path: open and not transactional (close() clears it)
        self._fast = not self._transactional

    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Headers = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Queue a record; ``on_delivery(err, metadata)`` is called from poll()/flush().

        Blocks while ``buffer.memory`` is full, at most ``max.block.ms``, then raises
        :class:`BufferExhaustedError`; an invalid record raises TypeError/ValueError here.
        """
        # The common case first, inline: bytes value and key (or no key), at most a delivery
        # callback, from the owner thread, the topic and callback of its open run: two
        # references added to the run, buffer.memory taken from bytes reserved ahead (a
        # reservation per record was a quarter of this path), no lock, no object kept per
        # record, no call into asyncio unless the loop thread has no drain coming.
        tk = type(key)
        if (
            self._fast
            and type(value) is bytes
            and (tk is bytes or key is None)
            and partition is None
            and timestamp is None
            and headers is None
            and get_ident() == self._owner
        ):
            run = self._run
            if on_delivery is None:
                extras = None
            else:
                try:  # a known callback: its record extras, made once
                    extras = self._sinks[on_delivery]
                except (KeyError, TypeError):
                    extras = _NO_RUN  # matches no run: the general path below
                if self._queued_outcomes - self._served >= _MAX_UNSERVED_CALLBACKS:
                    self.poll()  # nobody polls: serve them here rather than hold them all
            if extras is run.extras and (
                topic is run.topic or (type(topic) is str and topic == run.topic)
            ):
                size = RECORD_OVERHEAD + len(value) + (len(key) if tk is bytes else 0)
                credit = self._credit - size
                if credit >= 0:  # buffer.memory reserved ahead (see _reserve_owned)
                    self._credit = credit
                else:
                    self._reserve_owned(size)  # more credit, or waits (max.block.ms)
                run.extend((value, key))
                if not self._scheduled:
                    self._scheduled = True
                    self._lt.call(self._drain_inbox)
                return
            elif extras is not _NO_RUN and type(topic) is str and topic:
                # Another topic or callback than the open run's: one tuple in the inbox, and
                # _RUN_MIN of them in a row (one topic, one callback) open a run for the
                # next ones. (A run per switch would cost a producer that alternates topics
                # an object, a lock and a call into the core per record.)
                size = RECORD_OVERHEAD + len(value) + (len(key) if tk is bytes else 0)
                credit = self._credit - size
                if credit >= 0:
                    self._credit = credit
                else:
                    self._reserve_owned(size)
                if topic == self._streak_topic and extras is self._streak_extras:
                    self._streak += 1
                else:
                    self._streak_topic, self._streak_extras, self._streak = topic, extras, 1
                if self._streak >= _RUN_MIN:
                    self._open_run(topic, extras).extend((value, key))
                else:
                    self._run = _NO_RUN  # its later records go after this one
                    self._inbox.append((topic, value, key, size, extras))
                if not self._scheduled:
                    self._scheduled = True
                    self._lt.call(self._drain_inbox)
                return
        if self._closed:
            raise ClosedError("producer is closed")
        if self._transactional:
            self._core.check_can_send()
        sink = None
        if on_delivery is not None:
            sink = self._sink(on_delivery)
            if self._queued_outcomes - self._served >= _MAX_UNSERVED_CALLBACKS:
                self.poll()  # nobody polls: serve them here rather than hold them all
        item = make_item(topic, value, key, partition, timestamp, headers, sink)
        run, extras = self._run, item[4]
        if (
            self._fast
            and item[1] is not None
            and run.topic == item[0]
            and (extras is None or extras[:3] == (None, None, None))
            and run.extras is (self._sinks.get(on_delivery) if type(sink) is int else sink)
            and get_ident() == self._owner
        ):  # the open run's topic and callback (a str value, or buffer.memory was full)
            self._reserve_owned(item[3])  # waits while buffer.memory is full (max.block.ms)
            run.extend((item[1], item[2]))
            self._schedule()
            return
        self._enqueue(item, item[3])

    def _open_run(self, topic: str, extras: tuple[None, None, None, int] | None) -> _Run:
        run = _Run(topic, extras)
        # Open before it is in the inbox: a drain that finds it there then keeps it.
        self._run = run
        with self._lock:
            self._marks += 1
            self._inbox.append(run)
        return run

    def _sink(self, callback: DeliveryCallback) -> _CallbackSink | int:
        """The sink of a record with this callback: the handle of the callback's sink (made
        once), or a sink of its own for an unhashable callable or beyond 64 callables (a
        new callable per record: not kept)."""
        try:
            extras = self._sinks.get(callback)
        except TypeError:
            return _CallbackSink(callback, self._callbacks.put, self._count_outcomes)
        if extras is not None:
            return extras[3]
        sink = _CallbackSink(callback, self._callbacks.put, self._count_outcomes)
        if len(self._sinks) >= 64:
            return sink
        handle = register_sink(sink)
        self._sinks[callback] = (None, None, None, handle)
        return handle

    def _count_outcomes(self, n: int) -> None:
        self._queued_outcomes += n  # loop thread only

    def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Headers = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """:meth:`produce`, returning a future of the record's RecordMetadata (a future
        costs a lock and a condition per record: use produce() when you do not need it)."""
        if self._closed:
            raise ClosedError("producer is closed")
        if self._transactional:
            self._core.check_can_send()
        cf: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        sink = functools.partial(_settle_future, cf, self._callbacks.put, on_delivery)
        item = make_item(topic, value, key, partition, timestamp, headers, sink)
        self._enqueue(item, item[3])
        return cf

    def produce_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        *,
        partition: Any = None,
        headers: Any = None,
        timestamps: Any = None,
        on_delivery: BatchCallback | None = None,
    ) -> concurrent.futures.Future[BatchMetadata]:
        """Queue a whole column of records (see :meth:`AsyncProducer.produce_batch`); one
        future for the call resolves with a :class:`BatchMetadata` once every record is
        acknowledged, or fails with the first error. ``on_delivery(err, metadata)`` is
        called once for the call, from poll()/flush().

        Invalid input raises here and queues nothing. A call larger than a quarter of
        ``buffer.memory`` is queued in chunks, each waiting for space (``max.block.ms``); if
        one cannot be queued, BufferExhaustedError is raised, the chunks already queued are
        still sent and the future fails.
        """
        if self._closed:
            raise ClosedError("producer is closed")
        if self._transactional:
            self._core.check_can_send()
        if type(topic) is not str or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        cols = make_columns(values, keys, partition, headers, timestamps)
        cf: concurrent.futures.Future[BatchMetadata] = concurrent.futures.Future()
        tally = Tally(
            topic,
            len(cols),
            functools.partial(_settle_future, cf, self._callbacks.put, on_delivery),
        )
        core = self._core
        if not len(cols):
            return cf  # nothing to send: the tally resolved already
        if core.cluster.partition_count(topic) is None:
            try:
                self._lt.run(core.wait_metadata(topic))
            except KafkaError as exc:
                tally.failed(exc, len(cols))
                raise
        chunks = core.column_chunks(cols)
        for i, chunk in enumerate(chunks):
            size = int(chunk.sizes.sum())
            try:
                self._buffer.reserve(size, min(size, self._buffer.limit))
            except KafkaError as exc:
                self._lt.call(tally.failed, exc, sum(len(c) for c in chunks[i:]))
                raise
            # into the inbox, in order with produce()'s records (a chunk, not a record)
            self._close_run()
            with self._lock:
                self._marks += 1  # before the append: a drain that sees it sees the count
                self._inbox.append(_Chunk(topic, chunk, tally))
            self._schedule()
        return cf

    def _enqueue(self, item: Item, size: int) -> None:
        self._buffer.reserve(size)  # blocks while buffer.memory is full (max.block.ms)
        self._close_run()
        self._inbox.append(item)
        self._schedule()

    def _reserve_owned(self, size: int) -> None:
        """Reserve a record's bytes for the owner: from its credit, else with _CREDIT bytes
        more when they fit (the next records take theirs with one subtraction), else as any
        caller does (waits while buffer.memory is full). The credit is counted as held, so
        buffer.memory is never exceeded; flush() gives it back."""
        if self._credit >= size:
            self._credit -= size
            return
        buf = self._buffer
        credit = min(_CREDIT, buf.limit >> 4)
        if buf.try_reserve(size + credit):
            self._credit += credit
        else:
            buf.reserve(size)

    def _return_credit(self) -> None:
        if self._credit and get_ident() == self._owner:
            self._buffer.give_back(self._credit)
            self._credit = 0

    def _close_run(self) -> None:
        """The owner queues something else: its later records go to a new run, after it.
        (Another thread's entries keep no order with the owner's.)"""
        if get_ident() == self._owner:
            self._run = _NO_RUN

    def _schedule(self) -> None:
        # Unlocked: two threads may both schedule a drain (harmless, the second finds less
        # or nothing); none can miss one, as a flag seen set was set by a thread whose
        # drain resets it, and takes the inbox, only after this thread's append.
        if not self._scheduled:
            self._scheduled = True
            self._lt.call(self._drain_inbox)

    def _drain_inbox(self, chained: bool = True) -> None:
        """Hand the inbox to the core, in order, at most _DRAIN_MAX records a call: with
        more, the call chains another after whatever the loop has ready, so the sender ships
        the first batches of a large backlog while the rest is encoded (the broker works
        meanwhile)."""
        # Reset the flag first: a record queued after it schedules another drain, one
        # queued before it is taken below (or left for the drain chained at the end).
        self._scheduled = False
        inbox = self._inbox
        n = len(inbox)
        if not n:
            return
        budget = _DRAIN_MAX if chained else n + (1 << 62)
        # Read after len(): a run or chunk among the first n entries counted itself first.
        if not self._marks:
            # Slicing and deleting the first n are single operations under the GIL, so an
            # append meanwhile lands after them, kept.
            m = min(n, budget)
            items = inbox[:m]
            del inbox[:m]
            self._append_many(items)  # type: ignore[arg-type]
            more = m < n
        else:
            more = self._drain_marked(inbox, n, budget, park=chained)
        if more and chained and not self._scheduled:
            self._scheduled = True  # ours to reset
            self._lt.loop.call_soon(self._drain_inbox)

    def _drain_marked(
        self, inbox: list[Item | _Run | _Chunk], n: int, budget: int, park: bool
    ) -> bool:
        """_drain_inbox's first n entries, runs and chunks among them; True if some are
        left (the budget ran out). A run stays in the inbox while it is the owner's open
        one (it grows), or if it grew after it was taken; entries after an open run are
        other threads', which keep no order with the owner's records.

        ``park``: a run of a topic whose partitions are not known yet stays in the inbox
        until they are (see _await_topic), with every later entry of that topic (their
        order), rather than going to the core record by record to wait there: the records
        queued meanwhile then reach the core as one columnar burst. Other topics' entries
        go on. A flush hands everything over (the core waits for it)."""
        kept: list[Item | _Run | _Chunk] = []
        parked: set[str] = set()
        # records for the core's per-record intake, handed over together (order kept):
        # short runs among records of other topics are one call, not one each
        pending: list[Item] = []
        i = 0
        while i < n and budget > 0:
            entry = inbox[i]
            kind = type(entry)
            if kind is _Run:
                run: _Run = entry  # type: ignore[assignment]
                topic = run.topic
                assert topic is not None
                i += 1
                if topic in parked:
                    kept.append(run)
                    continue
                if park and run and self._core.cluster.partition_count(topic) is None:
                    err = self._no_metadata.get(topic)
                    if err is None:
                        self._await_topic(topic)
                        parked.add(topic)
                        kept.append(run)
                        continue
                    # max.block.ms passed without them: what waited fails, as in the core
                    flat = run[: len(run)]
                    del run[: len(flat)]
                    values, keys = flat[0::2], flat[1::2]
                    items = _run_items(topic, run.extras, values, keys)  # type: ignore[arg-type]
                    self._core.accumulator.drop_items(items, err)
                take = min(len(run), 2 * budget)  # even: whole records
                flat = run[:take]
                del run[:take]
                budget -= take >> 1
                if take >> 1 >= _COLUMNAR_MIN and self._columnar_ok(topic):
                    pending = self._flush_pending(pending)
                    self._append_run(run, flat)
                elif flat:
                    pending += _run_items(topic, run.extras, flat[0::2], flat[1::2])  # type: ignore[arg-type]
                # Open first: a run that is no longer open gets nothing more, so it is
                # then empty for good or holds records appended after the slice above.
                if run is self._run or run:
                    kept.append(run)
                    if budget <= 0:
                        break  # what it holds goes before the entries after it
                else:
                    with self._lock:
                        self._marks -= 1
            elif kind is _Chunk:
                i += 1
                if entry.topic in parked:  # type: ignore[union-attr]
                    kept.append(entry)
                    continue
                budget -= 1
                with self._lock:
                    self._marks -= 1
                pending = self._flush_pending(pending)
                self._append_columns(entry)  # type: ignore[arg-type]
            else:  # records of the general path, up to the next run or chunk
                j = i + 1
                stop = min(n, i + budget)
                while j < stop and type(inbox[j]) is not _Run and type(inbox[j]) is not _Chunk:
                    j += 1
                items = inbox[i:j]
                if parked:  # a parked topic's records wait behind its run
                    kept += [x for x in items if x[0] in parked]  # type: ignore[index]
                    items = [x for x in items if x[0] not in parked]  # type: ignore[index]
                pending += items  # type: ignore[arg-type]
                budget -= j - i
                i = j
        self._flush_pending(pending)
        inbox[:i] = kept  # one operation: entries appended meanwhile stay after
        if i >= n:  # every run that waited met its error: records queued later wait anew
            self._no_metadata.clear()
        return i < n or any(type(x) is _Run and x and x.topic not in parked for x in kept)

    def _flush_pending(self, pending: list[Item]) -> list[Item]:
        if pending:
            self._append_many(pending)
        return []

    def _await_topic(self, topic: str) -> None:
        """Learn a parked topic's partitions (one request at a time), then drain again;
        after max.block.ms without them, the parked records fail (see _drain_marked)."""
        if topic in self._topic_waits:
            return
        self._topic_waits.add(topic)
        core = self._core
        task = core.spawn(core.accumulator.wait_metadata(topic, core.max_block))

        def known(t: asyncio.Task[None]) -> None:
            self._topic_waits.discard(topic)
            if not t.cancelled() and isinstance(t.exception(), KafkaError):
                self._no_metadata[topic] = t.exception()  # type: ignore[assignment]
            self._drain_inbox()

        task.add_done_callback(known)

    def _append_many(self, items: list[Item]) -> None:
        try:
            topic = items[0][0]
            if len(items) >= _COLUMNAR_MIN and self._columnar_ok(topic):
                now = time.time_ns() // 1_000_000
                cols = plain_columns(items, now)
                if cols is not None and self._append_plain(topic, items[0][4], cols, now):
                    return
            self._core.append_many(items)
        except Exception as exc:  # a bug here must not leave records unresolved
            self._intake_failed(exc, items)

    def _append_run(self, run: _Run, flat: list[bytes | None]) -> None:
        """Records taken from a run (values and keys alternate in ``flat``)."""
        topic, extras = run.topic, run.extras
        assert topic is not None
        values, keys = flat[0::2], flat[1::2]
        try:
            if len(values) >= _COLUMNAR_MIN and self._columnar_ok(topic):
                now = time.time_ns() // 1_000_000
                cols = run_columns(values, keys, now)  # type: ignore[arg-type]
                if self._append_plain(topic, extras, cols, now):
                    return
            self._core.append_many(_run_items(topic, extras, values, keys))
        except Exception as exc:  # a bug here must not leave records unresolved
            self._intake_failed(exc, _run_items(topic, extras, values, keys))

    def _intake_failed(self, exc: Exception, items: list[Item]) -> None:
        log.exception("producer intake failed")
        err = KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"intake failed: {exc}")
        self._core.fail_fatal(err)
        fail_items(items, err)

    def _columnar_ok(self, topic: str) -> bool:
        return not self._transactional and self._core.accumulator.metadata_ready(topic)

    def _append_plain(self, topic: str, extras: Extras | None, cols: Columns, now: int) -> bool:
        """A large burst of plain records of one topic (the caller ahead of the loop
        thread) goes the columnar way: hashed, grouped and encoded a column at a time into
        sealed batches, as produce_batch's rows (per partition, the last batch may be short:
        the next burst starts another). False: not such a burst, nothing done."""
        if extras is None:
            tally = Tally(topic, len(cols), _no_outcome)
        else:  # one delivery callback for every record: per-record outcomes from the runs
            sink = row_sink(extras[3])
            if not isinstance(sink, _CallbackSink):
                return False
            tally = _CallbackTally(topic, len(cols), sink, now)
        self._core.append_columns(topic, cols, tally)
        return True

    def _append_columns(self, chunk: _Chunk) -> None:
        try:
            self._core.append_columns(chunk.topic, chunk.columns, chunk.tally)
        except Exception as exc:  # a bug here must not leave the call unresolved
            log.exception("producer intake failed")
            err = KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"intake failed: {exc}")
            self._core.fail_fatal(err)
            if chunk.tally.remaining:
                chunk.tally.failed(err, chunk.tally.remaining)

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks; waits up to ``timeout`` seconds for the first one.
        A callback that raises stops poll() there; the next poll() goes on after it."""
        with self._poll_lock:
            served = 0
            if self._serving is not None:
                served += self._serve_landed(*self._serving)
            try:
                item = self._callbacks.get(timeout=timeout) if timeout > 0 and not served else None
            except queue.Empty:
                return 0
            while True:
                if item is None:
                    try:
                        item = self._callbacks.get_nowait()
                    except queue.Empty:
                        return served
                cb, err, md = item
                item = None
                if type(md) is _Landed:
                    served += self._serve_landed(cb, md)
                else:
                    self._served += 1
                    served += 1
                    cb(err, md)

    def _serve_landed(self, cb: DeliveryCallback, landed: _Landed) -> int:
        """A batch's callbacks, in order (under _poll_lock); if one raises, the rest wait in
        _serving for the next poll()."""
        rows = landed.rows
        start = k = landed.next
        if start >= len(rows):
            self._serving = None
            return 0
        self._serving = (cb, landed)
        topic, partition, base, stamps = landed.topic, landed.partition, landed.base, landed.stamps
        at, dup = landed.append_time, landed.duplicate
        new, md_type = tuple.__new__, RecordMetadata  # skips the named tuple's __new__
        try:
            for k in range(start, len(rows)):  # k is read after the loop
                row = rows[k]
                md = new(
                    md_type,
                    (
                        topic,
                        partition,
                        base + row if base >= 0 else -1,
                        stamps[row] if stamps is not None else at,
                        dup,
                    ),
                )
                cb(None, md)
        finally:  # the callback of row k ran (or raised): served
            landed.next = k + 1
            self._served += k + 1 - start
        self._serving = None
        return len(rows) - start

    def flush(self, timeout: float | None = None) -> int:
        """Wait for every queued record's outcome and serve callbacks; returns how many
        records are still undelivered (0 unless ``timeout`` expired)."""
        self._return_credit()
        self._wait_inbox_drained()
        try:
            self._lt.run(self._core.flush(), timeout)
        except (KafkaTimeoutError, TimeoutError):
            pass
        self.poll()
        return len(self)

    def __len__(self) -> int:
        """Records queued and not yet delivered or failed (confluent-kafka's len())."""
        inbox = self._inbox_records()
        if self._lt.loop.is_closed():
            return inbox
        return inbox + self._lt.run_sync(self._core.queued_records)

    def _inbox_records(self) -> int:
        """Records queued and not yet handed to the core."""
        if not self._marks:
            return len(self._inbox)
        n = 0
        for x in list(self._inbox):
            kind = type(x)
            if kind is _Run:
                n += len(x) >> 1  # type: ignore[arg-type]
            elif kind is _Chunk:
                n += len(x.columns)  # type: ignore[union-attr]
            else:
                n += 1
        return n

    def _wait_inbox_drained(self) -> None:
        """Until the core has every record queued before this call (a chained drain may
        still be pending: hand over the rest now, on the loop thread)."""
        self._lt.run_sync(functools.partial(self._drain_inbox, False))

    def state(self) -> ProducerState:
        """Producer id, epoch and next sequence per partition; call after flush()."""
        self._wait_inbox_drained()
        return self._lt.run_sync(self._core.state)

    @property
    def producer_id(self) -> int:
        return self._core.producer_id

    def stats(self) -> ProducerStats:
        """A copy of the retry counters (:class:`ProducerStats`)."""
        return self._lt.run_sync(lambda: dataclasses.replace(self._core.stats))

    # --- transactions (see AsyncProducer; every call first hands over queued records) --

    @property
    def transaction_state(self) -> TransactionState | None:
        return self._core.transaction_state

    def init_transactions(self, timeout: float | None = None) -> None:
        self._lt.run(self._core.init_transactions(timeout))

    def begin_transaction(self) -> None:
        self._wait_inbox_drained()
        self._lt.run_sync(self._core.begin_transaction)

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int],
        group: str | ConsumerGroupMetadata,
        timeout: float | None = None,
    ) -> None:
        self._wait_inbox_drained()
        self._lt.run(self._core.send_offsets_to_transaction(offsets, group, timeout))

    def _end_transaction(
        self, end: Callable[[float | None], Coroutine[Any, Any, T]], timeout: float | None
    ) -> T:
        """Hand over queued records, run ``end`` (commit, abort, prepare), then serve the
        delivery callbacks whatever the outcome."""
        self._wait_inbox_drained()
        try:
            return self._lt.run(end(timeout))
        finally:
            self.poll()

    def commit_transaction(self, timeout: float | None = None) -> None:
        self._end_transaction(self._core.commit_transaction, timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._end_transaction(self._core.abort_transaction, timeout)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTransaction:
        return self._end_transaction(self._core.prepare_transaction, timeout)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Producer]:
        """``with producer.transaction():`` commits on success, aborts on an exception."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            if self.transaction_state is not TransactionState.FATAL_ERROR:
                with contextlib.suppress(KafkaError, TransactionStateError):
                    self.abort_transaction()
            raise
        self.commit_transaction()

    @staticmethod
    def resume_transaction(
        config: Mapping[str, Any] | None,
        transactional_id: str | PreparedTransaction,
        producer_id: int = -1,
        epoch: int = -1,
    ) -> ResumedTransaction:
        """Finish a transaction opened by another producer (see
        :meth:`AsyncProducer.prepare_transaction`): add offsets, commit or abort."""
        return ResumedTransaction(config, transactional_id, producer_id, epoch)

    @property
    def epoch(self) -> int:
        return self._core.epoch

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        self._fast = False
        self._closed = True
        try:
            self._wait_inbox_drained()
            self._lt.run(self._core.close(timeout))
        finally:
            self._lt.stop()
            self.poll()
            for extras in self._sinks.values():  # every record is resolved by now
                unregister_sink(extras[3])


class ResumedTransaction(_Facade[AsyncResumedTransaction]):
    """Synchronous :class:`AsyncResumedTransaction`; use as a context manager or close()."""

    def __init__(
        self,
        config: Mapping[str, Any] | None,
        transactional_id: str | PreparedTransaction,
        producer_id: int = -1,
        epoch: int = -1,
    ) -> None:
        self._lt, self._core = start_core(
            "samsa-txn",
            lambda: AsyncProducer.resume_transaction(config, transactional_id, producer_id, epoch),
        )
        self._closed = False

    @property
    def transactional_id(self) -> str:
        return self._core.transactional_id

    @property
    def producer_id(self) -> int:
        return self._core.producer_id

    @property
    def epoch(self) -> int:
        return self._core.epoch

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int],
        group: str | ConsumerGroupMetadata,
    ) -> None:
        self._lt.run(self._core.send_offsets_to_transaction(offsets, group))

    def commit(self) -> None:
        self._lt.run(self._core.commit())

    def abort(self) -> None:
        self._lt.run(self._core.abort())


class Consumer(_Facade[AsyncConsumer]):
    """Synchronous consumer (see :class:`AsyncConsumer`)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self._lt, self._core = start_client("samsa-consumer", lambda: AsyncConsumer(config))
        self._closed = False

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        tps = list(partitions)
        self._lt.run_sync(lambda: self._core.assign(tps))

    def assignment(self) -> list[TopicPartition]:
        return self._lt.run_sync(self._core.assignment)

    def subscribe(self, topics: Iterable[str]) -> None:
        names = list(topics)
        self._lt.run_sync(lambda: self._core.subscribe(names))

    def unsubscribe(self) -> None:
        self._lt.run(self._core.unsubscribe())

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        self._lt.run_sync(lambda: self._core.seek(tp, offset))

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self._lt.run(self._core.seek_to_beginning(*tps))

    def seek_to_end(self, *tps: TopicPartition) -> None:
        self._lt.run(self._core.seek_to_end(*tps))

    def position(self, tp: TopicPartition | tuple[str, int]) -> int:
        return self._lt.run(self._core.position(TopicPartition(*tp)))

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records available within ``timeout`` seconds (possibly none)."""
        return self._lt.run(self._core.poll(int(timeout * 1000), max_records))

    def consume(self, num_messages: int = 500, timeout: float = 1.0) -> list[ConsumerRecord]:
        return self.poll(timeout, num_messages)

    def getmany(
        self, timeout: float = 1.0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        return self._lt.run(self._core.getmany(int(timeout * 1000), max_records))

    def consume_arrow(
        self, max_records: int = 100_000, timeout: float = 1.0, *, include_headers: bool = False
    ) -> pa.RecordBatch:
        """Up to ``max_records`` records as one Arrow batch in Spark's Kafka columns (see
        :meth:`AsyncConsumer.consume_arrow`); an empty batch if none came within ``timeout``."""
        return self._lt.run(
            self._core.consume_arrow(
                max_records, int(timeout * 1000), include_headers=include_headers
            )
        )

    def commit(
        self, offsets: dict[TopicPartition, int] | None = None, *, asynchronous: bool = False
    ) -> concurrent.futures.Future[None] | None:
        """Commit positions (or ``offsets``); with ``asynchronous`` return a future."""
        if asynchronous:
            return asyncio.run_coroutine_threadsafe(self._core.commit(offsets), self._lt.loop)
        self._lt.run(self._core.commit(offsets))
        return None

    def committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return self._lt.run(self._core.committed(list(tps)))

    def group_metadata(self) -> ConsumerGroupMetadata:
        """For ``Producer.send_offsets_to_transaction`` (consume-transform-produce)."""
        return self._lt.run_sync(self._core.group_metadata)

    def list_offsets(
        self, tps: Iterable[TopicPartition], timestamp: int
    ) -> dict[TopicPartition, int]:
        return self._lt.run(self._core.list_offsets(list(tps), timestamp))


class Admin(_Facade[AsyncAdmin]):
    """Synchronous admin client (see :class:`AsyncAdmin`)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self._lt, self._core = start_client("samsa-admin", lambda: AsyncAdmin(config))
        self._closed = False

    def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, KafkaError | None]:
        return self._lt.run(self._core.create_topics(list(topics), validate_only=validate_only))

    def create_topic(self, name: str, num_partitions: int = 1, **config: str) -> None:
        self._lt.run(self._core.create_topic(name, num_partitions, **config))

    def delete_topics(self, names: Iterable[str]) -> dict[str, KafkaError | None]:
        return self._lt.run(self._core.delete_topics(list(names)))

    def list_topics(self, *, internal: bool = False) -> list[str]:
        return self._lt.run(self._core.list_topics(internal=internal))

    def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicMetadata]:
        return self._lt.run(self._core.describe_topics(None if names is None else list(names)))

    def describe_producers(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, list[ProducerInfo]]:
        return self._lt.run(self._core.describe_producers(list(partitions)))

    def list_groups(self) -> list[GroupListing]:
        return self._lt.run(self._core.list_groups())

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        return self._lt.run(self._core.describe_groups(list(group_ids)))

    def list_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        return self._lt.run(self._core.list_group_offsets(group_id))

    def list_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timestamp: int = -1
    ) -> dict[TopicPartition, int]:
        return self._lt.run(self._core.list_offsets(list(partitions), timestamp))

    def describe_client_quotas(
        self, components: Iterable[ClientQuotaFilterComponent] = (), *, strict: bool = False
    ) -> dict[ClientQuotaEntity, dict[str, float]]:
        return self._lt.run(self._core.describe_client_quotas(list(components), strict=strict))

    def alter_client_quotas(
        self,
        alterations: Mapping[ClientQuotaEntity, Mapping[str, float | None]],
        *,
        validate_only: bool = False,
    ) -> dict[ClientQuotaEntity, KafkaError | None]:
        return self._lt.run(
            self._core.alter_client_quotas(dict(alterations), validate_only=validate_only)
        )

    def describe_configs(
        self, resources: Iterable[ConfigResource], *, include_synonyms: bool = True
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        return self._lt.run(
            self._core.describe_configs(list(resources), include_synonyms=include_synonyms)
        )

    def incremental_alter_configs(
        self,
        changes: dict[ConfigResource, Iterable[AlterConfigOp]],
        *,
        validate_only: bool = False,
    ) -> dict[ConfigResource, KafkaError | None]:
        return self._lt.run(
            self._core.incremental_alter_configs(
                {r: list(c) for r, c in changes.items()}, validate_only=validate_only
            )
        )

    def alter_configs(
        self, configs: dict[ConfigResource, dict[str, str]], *, validate_only: bool = False
    ) -> dict[ConfigResource, KafkaError | None]:
        return self._lt.run(self._core.alter_configs(configs, validate_only=validate_only))

    def create_partitions(
        self, new_counts: dict[str, int], *, validate_only: bool = False
    ) -> dict[str, KafkaError | None]:
        return self._lt.run(self._core.create_partitions(new_counts, validate_only=validate_only))

    def delete_records(
        self, offsets: dict[TopicPartition, int]
    ) -> dict[TopicPartition, DeletedRecords]:
        return self._lt.run(self._core.delete_records(offsets))

    def describe_cluster(self) -> dict[str, Any]:
        return self._lt.run(self._core.describe_cluster())

    def describe_features(self) -> FeatureMetadata:
        return self._lt.run(self._core.describe_features())

    def update_features(
        self, updates: Mapping[str, FeatureUpdate], *, validate_only: bool = False
    ) -> None:
        self._lt.run(self._core.update_features(dict(updates), validate_only=validate_only))

    def abort_transaction(
        self,
        tp: TopicPartition | tuple[str, int],
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
    ) -> None:
        """Abort ``producer_id``'s open transaction on one partition (a hanging one):
        see ``AsyncAdmin.abort_transaction``."""
        self._lt.run(
            self._core.abort_transaction(
                TopicPartition(*tp), producer_id, producer_epoch, coordinator_epoch
            )
        )

    def list_transactions(
        self, *, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
    ) -> list[TransactionListing]:
        return self._lt.run(
            self._core.list_transactions(states=list(states), producer_ids=list(producer_ids))
        )

    def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, TransactionDescription]:
        return self._lt.run(self._core.describe_transactions(list(transactional_ids)))
