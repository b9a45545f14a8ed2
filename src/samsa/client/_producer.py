"""The asyncio producer: accumulator, sender, idempotence and resumable identity.

Theory of operation
-------------------
``send()`` never waits for the network. Records reach :meth:`AsyncProducer.append_many` in
bursts (the sync facade hands over everything its callers queued since the last burst), and
the accumulator (``_accumulator``) partitions a burst at once (murmur2 of the key like the
Java client, sticky for unkeyed records) and appends it to the open batch of each
partition; whole ``batch.size`` batches are encoded together from columns, and what is left
stays open until ``linger.ms`` elapses. The sender (``_sender``, the only part that does
I/O for batches) drains batches whose ``linger.ms`` elapsed (or that are full, or when
flushing), groups them per leader broker into Produce requests (one batch per partition per
request) and writes the requests in order on that broker's connection. A batch's header
(producer id, epoch, sequence) is written when it is sent: a renumbered batch gets a new
header over the same encoded records.

The parts talk through narrow interfaces, each given its collaborators when the producer
makes it: the accumulator (``_accumulator.RecordAccumulator``) owns the partitions, the
records waiting for metadata and ``buffer.memory``'s one account (``BufferMemory``, which
the sync facade reserves in from its threads); the sender and the transaction manager see
the producer only as a host protocol (wake the sender, spawn a task, fail the producer),
and change the identity only through :class:`~samsa.client._idempotence.Idempotence`'s
methods.

Idempotence (rules 20-21 of docs/semantics.md; the bookkeeping and what each Produce
answer means are the pure module ``_idempotence``, the producer applies its decisions).
The producer gets a producer id and epoch
from InitProducerId. Each partition keeps, in ``pending``, the batches that have a sequence
and are not yet acknowledged, ordered by sequence. A batch gets its sequence once, when it is
first drained, and keeps it, with the same encoded bytes, on every retry. At most
``max.in.flight.requests.per.connection`` (5) batches of a partition are in flight. When a
request fails without a definite answer (connection reset, timeout) or with a retriable
error, its batches go back to ``pending`` untouched; the sender then sends the lowest-sequence
unresolved batch of that partition alone, and only when nothing else of the partition is in
flight, so a retry can never overtake or be overtaken. The broker recognises a batch it
already wrote (same first and last sequence among its last five) and answers with the
original offset, so each record is written once and every future gets the real offset.

OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID for the *next* expected batch (all earlier
ones acknowledged) means the broker's state diverged from ours: the producer stops sending,
waits for in-flight requests to finish, bumps its epoch locally (KIP-360; a new producer id
from InitProducerId when the epoch is exhausted or the broker refused a bump) and renumbers
that partition's unacknowledged batches from sequence 0. None of them can have been
written, as the broker refused the first. Other partitions move to the new epoch (sequence
0) once their own in-flight batches are resolved. The same renumbering follows a batch that
failed for good (expired or non-retriable), which would otherwise leave a sequence gap.
DUPLICATE_SEQUENCE_NUMBER is success without an offset. PRODUCER_FENCED and authorization
errors are fatal: every pending future fails and further sends raise.

Resumable identity. :meth:`AsyncProducer.state` gives (producer id, epoch, next sequence per
partition). A producer created from it reuses the identity instead of asking for a new one.
Before its first batch to such a partition it asks the leader (DescribeProducers) for the
last sequence written under that identity; records whose sequence is at or below it were
written by the previous incarnation after its checkpoint, so they are resolved as
duplicates instead of being sent again. Sequences are per record, so this holds however the
records are batched, as long as the records after the checkpoint are sent again in the same
order.

Transactions (rules 10-21; ``_transactions.TransactionManager``, modelled on Kafka's). With
``transactional.id`` the identity comes from ``init_transactions()``: InitProducerId, with
the transactional id, to the coordinator FindCoordinator (key type 1) names; it fences older
producers of the id. The state machine (``_transactions.TransactionState``) is Uninitialized
-> Ready -> InTransaction -> Committing | Aborting -> Ready, with AbortableError (the
transaction can only abort) and FatalError (fenced: every pending future fails, every call
raises :class:`ProducerFencedError`). The coordinator requests (AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit to the group's coordinator, EndTxn) go one at a time, in
call order, under the manager's lock, and are retried on CONCURRENT_TRANSACTIONS, load and
NOT_COORDINATOR errors. A partition's first record of a transaction queues it for
AddPartitionsToTxn; the sender holds the partition's batches until it is added, so the
broker never sees a transactional batch for a partition outside the transaction (rule 19).
Batches carry the transactional flag and sequences continue across transactions of one
epoch. The epoch belongs to the coordinator, so there is no local bump: a batch that fails
for good (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, expiry, ...) leaves the
transaction abortable and asks for a bump, which ``abort_transaction()`` does after EndTxn
with InitProducerId carrying our (producer id, epoch) (KIP-360: refused if we are stale);
partitions then renumber from 0. Commit flushes, then sends EndTxn (none when nothing
reached the coordinator); abort fails the records not sent yet, waits for those in flight,
then EndTxn. An operation that times out keeps running; calling it again waits for it.
``prepare_transaction()`` flushes and hands the open transaction to another process as
(transactional id, producer id, epoch), which ``resume_transaction()`` commits or aborts:
the coordinator checks only those three, not the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import numpy as np

from samsa.client import _describe_configs as describe
from samsa.client._accumulator import (
    BatchMetadata,
    BufferMemory,
    Columns,
    Headers,
    Item,
    RecordAccumulator,
    Tally,
    columnar_ready,
    make_columns,
    make_item,
)
from samsa.client._cluster import Cluster
from samsa.client._config import PRODUCER, Config
from samsa.client._errors import (
    BufferExhaustedError,
    ClosedError,
    ConfigError,
    KafkaConnectionError,
    KafkaError,
    TransactionStateError,
)
from samsa.client._idempotence import SEQ_MOD, Idempotence
from samsa.client._sender import Sender
from samsa.client._transactions import (
    AsyncResumedTransaction,
    TransactionManager,
    TransactionState,
)
from samsa.client._types import (
    ConsumerGroupMetadata,
    PreparedTransaction,
    ProducerState,
    ProducerStats,
    RecordMetadata,
    TopicPartition,
)
from samsa.protocol.messages import ApiKey

log = logging.getLogger("samsa.client.producer")
T = TypeVar("T")

__all__ = ["AsyncProducer", "Headers"]


def _settle(fut: asyncio.Future[RecordMetadata], err: BaseException | None, md: Any) -> None:
    """The sink of a record sent with :meth:`AsyncProducer.send`."""
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err)
    else:
        fut.set_result(md)


class ColumnLimits:
    """Per topic, the largest batch produce_batch() forms: the topic's max.message.bytes
    (less what a codec may add to incompressible data), at most max.request.size, at least
    batch.size; asked once per topic (DescribeConfigs), batch.size until it answers."""

    def __init__(
        self,
        cluster: Cluster,
        spawn: Callable[[Coroutine[Any, Any, None]], Any],
        *,
        batch_size: int,
        max_request_size: int,
        codec: int,
        request_timeout: float,
    ) -> None:
        self.cluster = cluster
        self.spawn = spawn
        self.batch_size = batch_size
        self.max_request_size = max_request_size
        self.codec = codec
        self.request_timeout = request_timeout
        self._limits: dict[str, int] = {}
        self._learning: set[str] = set()

    def known(self, topic: str) -> bool:
        return topic in self._limits

    def get(self, topic: str) -> int:
        """The topic's limit; batch.size while unknown (learnt meanwhile for the next calls)."""
        limit = self._limits.get(topic)
        if limit is None:
            limit = self.batch_size
            if topic not in self._learning:
                self.spawn(self.learn(topic))
        return limit

    async def learn(self, topic: str) -> None:
        """Ask the topic's max.message.bytes; unknown: batch.size (never refused)."""
        if topic in self._learning:
            return
        self._learning.add(topic)
        limit = self.batch_size
        try:
            conn = await self.cluster.any_connection()
            if conn.supports(ApiKey.DESCRIBE_CONFIGS):
                resp = await self.cluster.send(
                    None,
                    ApiKey.DESCRIBE_CONFIGS,
                    describe.VERSIONS,
                    describe.REQUEST,
                    describe.describe_configs_body(
                        describe.TOPIC,
                        topic,
                        ("max.message.bytes",),
                        include_synonyms=False,
                    ),
                    timeout=self.request_timeout,
                )
                (res,) = resp.results
                if res.error_code:
                    raise KafkaError(int(res.error_code), "DescribeConfigs")
                for cfg in res.configs:
                    if cfg.name == "max.message.bytes" and cfg.value:
                        topic_max = int(cfg.value)
                        if self.codec:  # lz4's worst case grows a block by 1/255
                            topic_max -= topic_max // 128 + 1024
                        limit = max(self.batch_size, min(self.max_request_size, topic_max))
        except (KafkaError, ValueError) as exc:
            log.info("%s: max.message.bytes unknown (%s); batches of batch.size", topic, exc)
            if isinstance(exc, KafkaError) and exc.retriable:
                return  # asked again by the next call
        finally:
            self._learning.discard(topic)
        self._limits[topic] = limit
        log.debug("%s: produce_batch() batches up to %d bytes", topic, limit)


class AsyncProducer:
    """Asyncio Kafka producer; idempotent by default. See the module docstring.

    Its parts, each given what it needs when made: the accumulator (records, batches,
    buffer.memory), the transaction manager and the sender; they reach the producer only
    through :class:`ProducerHost` (wake, spawn, fail_fatal, fatal_error)."""

    def __init__(
        self, config: dict[str, Any] | None = None, *, state: ProducerState | None = None
    ) -> None:
        self.config = c = Config(PRODUCER, config)
        self.acks = c.acks()
        self.idempotent = c.bool("enable.idempotence")
        self.transactional_id: str | None = c["transactional.id"]
        if self.acks != -1:
            if self.idempotent and "enable.idempotence" in c.explicit:
                raise ConfigError("enable.idempotence requires acks=all")
            self.idempotent = False
        if self.transactional_id is not None and not self.idempotent:
            raise ConfigError("transactional.id requires enable.idempotence")
        self.max_in_flight = c.int("max.in.flight.requests.per.connection")
        if self.idempotent and not 1 <= self.max_in_flight <= 5:
            raise ConfigError("idempotence needs max.in.flight.requests.per.connection in 1..5")
        self.linger = c.seconds("linger.ms")
        self.batch_size = c.int("batch.size")
        self.max_request_size = c.int("max.request.size")
        if self.max_request_size < self.batch_size:
            raise ConfigError("max.request.size must be at least batch.size")
        self.codec = c.codec()
        self.delivery_timeout = c.seconds("delivery.timeout.ms")
        self.request_timeout = c.seconds("request.timeout.ms")
        self.retry_backoff = c.seconds("retry.backoff.ms")
        self.retry_backoff_max = c.seconds("retry.backoff.max.ms")
        self.max_block = c.seconds("max.block.ms")
        self.buffer_memory = c.int("buffer.memory")
        self.cluster = Cluster.from_config(
            c,
            api_timeout=self.max_block,
            allow_auto_create_topics=c.bool("allow.auto.create.topics"),
        )
        self._idem = Idempotence()
        self._resume = state
        if state is not None:
            if not self.idempotent:
                raise ConfigError("a producer state can only resume an idempotent producer")
            if self.transactional_id is not None:
                raise ConfigError(
                    "a transactional producer gets its identity from init_transactions(); "
                    "use prepare_transaction() / resume_transaction() to hand one over"
                )
            self._idem = Idempotence(state.producer_id, state.epoch, first_epoch=state.epoch)
        self._fatal: KafkaError | None = None
        self.stats = ProducerStats()
        self._closing = False
        self._sender_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        self.column_limits = ColumnLimits(
            self.cluster,
            self.spawn,
            batch_size=self.batch_size,
            max_request_size=self.max_request_size,
            codec=self.codec,
            request_timeout=self.request_timeout,
        )
        self.txn = TransactionManager(self, self._idem)
        self.buffer = BufferMemory(self.buffer_memory, self.max_block)
        self.accumulator = RecordAccumulator(
            self,
            self.cluster,
            self._idem,
            self.buffer,
            batch_size=self.batch_size,
            codec=self.codec,
            retry_backoff=self.retry_backoff,
            txn=self.txn if self.transactional_id is not None else None,
            resume=state,
            column_limit=self.column_limits.get,
        )
        self.sender = Sender(self, self.accumulator, self._idem, self.txn)

    @property
    def producer_id(self) -> int:
        return self._idem.producer_id

    @property
    def epoch(self) -> int:
        return self._idem.epoch

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, and get a producer id unless resuming one."""
        if self._started:
            return
        self._started = True
        if self.transactional_id is not None:
            await self.cluster.refresh([])  # the identity comes with init_transactions()
        elif self.idempotent and self.producer_id < 0:
            await self.sender.init_producer_id()
        elif self.idempotent:
            await self.cluster.refresh([])
        self._sender_task = asyncio.get_running_loop().create_task(self.sender.run())
        columnar_ready()  # start loading the codec now, while we connect, not mid-burst

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def running(self) -> bool:
        """Started and not closed."""
        return self._started and not self.accumulator.closed

    async def close(self, timeout: float | None = None) -> None:
        """Flush what is buffered (up to ``timeout`` seconds), then disconnect."""
        if self.accumulator.closed:
            return
        if self._started and self._fatal is None:
            open_txn = (TransactionState.IN_TRANSACTION, TransactionState.ABORTABLE_ERROR)
            if self.txn.state in open_txn:
                # As Kafka's producer does: an unfinished transaction would otherwise stay
                # open (and block read_committed readers) until transaction.timeout.ms.
                log.info("aborting the open transaction on close")
                with contextlib.suppress(KafkaError, TransactionStateError, TimeoutError):
                    await self.abort_transaction(timeout)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush(), timeout)
        self._closing = True
        self.accumulator.close(ClosedError("producer closed"))
        if self._sender_task is not None:
            self._sender_task.cancel()
            with contextlib.suppress(BaseException):
                await self._sender_task
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
        await self.cluster.close()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is acknowledged or failed."""
        await self.accumulator.flush(timeout)

    def state(self) -> ProducerState:
        """Producer id, epoch and next sequence per partition (meaningful after flush())."""
        seqs: dict[TopicPartition, int] = {}
        for tp, ps in self.accumulator.partitions.items():
            if (ps.producer_id, ps.epoch) == (self.producer_id, self.epoch):
                seqs[tp] = (ps.next_seq + ps.skip) % SEQ_MOD
        if self._resume is not None:
            for tp, s in self._resume.sequences.items():
                seqs.setdefault(tp, s)
        return ProducerState(self.producer_id, self.epoch, seqs, self.transactional_id)

    # --- sending ---------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record; the returned future resolves with its RecordMetadata."""
        self.check_can_send()
        fut: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        item = make_item(
            topic, value, key, partition, timestamp_ms, headers, functools.partial(_settle, fut)
        )
        await self.buffer.wait_async()
        self.buffer.add_from_loop(item[3])
        self.append_many([item])
        return fut

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        **kwargs: Any,
    ) -> RecordMetadata:
        return await (await self.send(topic, value, key, **kwargs))

    def _intake_error(self) -> BaseException | None:
        if self._fatal is not None:
            return self._fatal
        if self._closing:
            return ClosedError("producer closed")
        if not self._started:
            return ClosedError("producer not started")
        if (
            self.transactional_id is not None
            and self.txn.state is not TransactionState.IN_TRANSACTION
        ):
            return self.txn.send_error()
        return None

    def append_many(self, items: list[Item]) -> None:
        """Add records (intake tuples, see :func:`make_item`), their bytes reserved in
        :attr:`buffer`, to their partitions' batches, in order (loop thread; never blocks)."""
        err = self._intake_error()
        if err is not None:
            self.accumulator.drop_items(items, err)
            return
        self.accumulator.append_many(items)

    def append_columns(self, topic: str, cols: Columns, tally: Tally) -> None:
        """Partition a chunk of a produce_batch() call (its bytes reserved), encode it per
        partition as sealed batches and queue them after the partition's earlier records
        (loop thread)."""
        err = self._intake_error()
        if err is not None:
            self.accumulator.drop_columns(cols, tally, err)
            return
        self.accumulator.append_columns(topic, cols, tally)

    def queued_records(self) -> int:
        """Records given to the producer and not yet acknowledged or failed."""
        return self.accumulator.queued_records()

    # --- columnar intake -------------------------------------------------------------------

    async def produce_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        *,
        partition: Any = None,
        headers: Any = None,
        timestamps: Any = None,
    ) -> asyncio.Future[BatchMetadata]:
        """Queue a whole column of records; the returned future resolves, once every record
        of the call is acknowledged, with a :class:`BatchMetadata` (or fails with the first
        error: records of the call in other batches may have been written).

        ``values``/``keys``: Arrow binary/string arrays or sequences of bytes, str or None.
        ``partition``: None (keys hash as Java's partitioner, unkeyed records are sticky per
        ``batch.size``), one int, or a column of them (None/-1: any). ``headers``: an Arrow
        ``list<struct<key: string, value: binary>>`` column or one mapping/pairs per row.
        ``timestamps``: ms, one int or a column. Encoded with vectorised code, with the
        same sequences, retries and transactions as send(). The caller hands over whole
        columns, so nothing is gained by waiting for more: a partition's rows of a call form
        batches as large as the broker takes, ``max.request.size`` or the topic's
        ``max.message.bytes`` (DescribeConfigs, asked once per topic; ``batch.size``
        until it answers, or if it cannot), rather than of ``batch.size``, which the
        sticky partitioner of unkeyed rows still goes by.
        Invalid input raises here and queues nothing. Waits for ``buffer.memory`` space (at
        most ``max.block.ms`` per chunk of the call).
        """
        self.check_can_send()
        if type(topic) is not str or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        cols = make_columns(values, keys, partition, headers, timestamps)
        fut: asyncio.Future[BatchMetadata] = asyncio.get_running_loop().create_future()
        tally = Tally(topic, len(cols), functools.partial(_settle, fut))
        if not len(cols):
            return fut  # nothing to send: the tally resolved already
        await self.wait_metadata(topic)
        chunks = self.column_chunks(cols)
        for i, chunk in enumerate(chunks):
            size = int(chunk.sizes.sum())
            try:
                await self.buffer.wait_async_for(size)
            except BufferExhaustedError as err:
                tally.failed(err, sum(len(c) for c in chunks[i:]))
                raise
            self.buffer.add_from_loop(size)
            self.append_columns(topic, chunk, tally)
        return fut

    def column_chunks(self, cols: Columns) -> list[Columns]:
        """A call's rows in chunks that fit buffer.memory (each waits for space alone) and
        are small enough that the sender starts before the whole call is encoded."""
        limit = max(self.batch_size, min(self.buffer_memory // 4, 4 << 20))
        cum = np.cumsum(cols.sizes)
        if not len(cum) or cum[-1] <= limit:
            return [cols]
        cuts = np.searchsorted(cum, np.arange(limit, int(cum[-1]), limit), side="right")
        bounds = sorted({0, *cuts.tolist(), len(cols)})
        return [cols.slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]

    async def wait_metadata(self, topic: str) -> None:
        """Until the topic's partition count is known (max.block.ms, then an error)."""
        if self.cluster.partition_count(topic) is not None:
            return
        await self.accumulator.wait_metadata(topic, self.max_block)
        if not self.column_limits.known(topic):
            await self.column_limits.learn(topic)

    # --- the producer's parts (ProducerHost) -----------------------------------------------

    def wake(self) -> None:
        self.sender.wakeup()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("producer task failed: %s", task.exception())
        self.wake()

    def fail_fatal(self, err: KafkaError) -> None:
        if self._fatal is None:
            log.error("producer failed: %s", err)
            self._fatal = err
        if self.transactional_id is not None:
            self.txn.enter_fatal()
        self.accumulator.fail_all(err)

    def drop_unsent(self, err: BaseException) -> None:
        """Fail every record not yet sent (Kafka's abortUndrainedBatches)."""
        self.accumulator.drop_unsent(err)

    # --- transactions ----------------------------------------------------------------------

    @property
    def transaction_state(self) -> TransactionState | None:
        """Where the transaction state machine is (None without ``transactional.id``)."""
        return self.txn.state if self.transactional_id is not None else None

    async def init_transactions(self, timeout: float | None = None) -> None:
        """Get the transactional id's producer id and epoch from its coordinator.

        This fences every older producer with the same ``transactional.id`` and aborts
        (through the coordinator) the transaction one of them left open. After a
        KafkaTimeoutError, call it again to go on waiting for the same request.
        """
        await self.txn.init_transactions(timeout)

    def begin_transaction(self) -> None:
        """Start a transaction (local only: the coordinator hears of it with the first
        partition or offsets added)."""
        self.txn.begin_transaction()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int] | Mapping[tuple[str, int], int],
        group: str | ConsumerGroupMetadata,
        timeout: float | None = None,
    ) -> None:
        """Commit a consumer group's ``offsets`` (next offset to read) with the transaction.

        ``group`` is a consumer's :meth:`group_metadata` (the group coordinator then refuses
        offsets of a member fenced by a rebalance) or a bare group id. The offsets become
        visible to ``committed()`` only when the transaction commits.
        """
        await self.txn.send_offsets_to_transaction(offsets, group, timeout)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit. Raises AbortableTransactionError if a record or offset of
        the transaction failed (abort then), ProducerFencedError if fenced, and
        KafkaTimeoutError when ``timeout`` passes first (call again to go on waiting)."""
        await self.txn.commit_transaction(timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop the records not sent yet, wait for those in flight, abort."""
        await self.txn.abort_transaction(timeout)

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTransaction:
        """Flush and hand the open transaction over: another process commits or aborts it
        with ``resume_transaction(config, prepared)``. This producer leaves it open (also
        on close); it must be finished before ``transaction.timeout.ms``, after which the
        coordinator aborts it."""
        return await self.txn.prepare_transaction(timeout)

    @staticmethod
    async def resume_transaction(
        config: Mapping[str, Any] | None,
        transactional_id: str | PreparedTransaction,
        producer_id: int = -1,
        epoch: int = -1,
    ) -> AsyncResumedTransaction:
        """A handle on a transaction another producer opened (see :meth:`prepare_transaction`)
        that adds offsets to it and commits or aborts it; close it after use."""
        if isinstance(transactional_id, PreparedTransaction):
            txn = AsyncResumedTransaction.from_prepared(config, transactional_id)
        else:
            txn = AsyncResumedTransaction(config, transactional_id, producer_id, epoch)
        try:
            await txn.start()
        except BaseException:
            await txn.close()
            raise
        return txn

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncProducer]:
        """``async with producer.transaction():`` commits on success, aborts on an exception."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            if self.txn.state is not TransactionState.FATAL_ERROR:
                with contextlib.suppress(KafkaError, TransactionStateError):
                    await self.abort_transaction()
            raise
        await self.commit_transaction()

    def check_can_send(self) -> None:
        """Raise TransactionStateError when a transactional producer has no open transaction."""
        if self.transactional_id is None or self._fatal is not None:
            return
        if self.txn.state not in (
            TransactionState.IN_TRANSACTION,
            TransactionState.ABORTABLE_ERROR,  # the record's future fails with the cause
        ):
            raise self.txn.send_error()

    # --- helpers for the sync facade ------------------------------------------------------

    @property
    def fatal_error(self) -> KafkaError | None:
        return self._fatal

    def on_delivery(
        self,
        fut: asyncio.Future[RecordMetadata],
        callback: Callable[[BaseException | None, RecordMetadata | None], None],
    ) -> None:
        def done(f: asyncio.Future[RecordMetadata]) -> None:
            if f.cancelled():
                callback(KafkaConnectionError("cancelled"), None)
            elif f.exception() is not None:
                callback(f.exception(), None)
            else:
                callback(None, f.result())

        fut.add_done_callback(done)
