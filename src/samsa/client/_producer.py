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
import collections
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from samsa.client import _describe_configs as describe
from samsa.client._accumulator import (
    EXTRAS,
    KEY,
    SEQ_MOD,
    SIZE,
    TOPIC,
    VALUE,
    Batch,
    BatchMetadata,
    Columns,
    Headers,
    Item,
    Sink,
    Tally,
    assign_column_partitions,
    assign_partitions,
    columnar_ready,
    encode_sealed,
    fail_items,
    group_by_partition,
    make_columns,
    make_item,
    take,
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
from samsa.client._idempotence import (
    Idempotence,
    PartitionSequences,
)
from samsa.client._partitioner import StickyPartitioner
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
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import HEADER_SIZE

log = logging.getLogger("samsa.client.producer")

_Batch = Batch  # the sender's name for it
__all__ = ["AsyncProducer", "Headers"]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _settle(fut: asyncio.Future[RecordMetadata], err: BaseException | None, md: Any) -> None:
    """The sink of a record sent with :meth:`AsyncProducer.send`."""
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err)
    else:
        fut.set_result(md)


class _Partition(PartitionSequences):
    """A partition's sequences (see ``_idempotence``) and its batches not yet drained."""

    __slots__ = ("queue", "tp")

    def __init__(self, tp: TopicPartition, producer_id: int, epoch: int, next_seq: int) -> None:
        super().__init__(producer_id, epoch, next_seq)
        self.tp = tp
        self.queue: collections.deque[_Batch] = collections.deque()  # no sequence yet


class AsyncProducer:
    """Asyncio Kafka producer; idempotent by default. See the module docstring."""

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
        # per topic: the largest batch produce_batch() forms (see _column_limit)
        self._column_limits: dict[str, int] = {}
        self._learning_limits: set[str] = set()
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
        self._partitioner = StickyPartitioner()
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._awaiting_metadata: dict[str, list[tuple[Any, ...]]] = {}
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
        self._buffered = 0
        self.released_bytes = 0  # ever given back (monotonic; see _sync.Producer)
        self.stats = ProducerStats()
        self.on_release: Callable[[], None] | None = None
        self._space = asyncio.Event()
        self._space.set()
        self._outstanding = 0  # batches not yet completed
        self._idle = asyncio.Event()
        self._idle.set()
        self._wake = asyncio.Event()
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._sender_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        # --- transactions (see the module docstring) ---
        self.txn = TransactionManager(self)
        self.sender = Sender(self)  # last: it reads the settings and state above

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

    async def close(self, timeout: float | None = None) -> None:
        """Flush what is buffered (up to ``timeout`` seconds), then disconnect."""
        if self._closed:
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
        self._closed = True
        self._fail_all(ClosedError("producer closed"))
        self._wake.set()
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
        self._flushing += 1
        self._wake.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        finally:
            self._flushing -= 1

    def state(self) -> ProducerState:
        """Producer id, epoch and next sequence per partition (meaningful after flush())."""
        seqs: dict[TopicPartition, int] = {}
        for tp, ps in self._partitions.items():
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
        if not self._space.is_set():
            try:
                await asyncio.wait_for(self._space.wait(), self.max_block)
            except TimeoutError:
                raise BufferExhaustedError(self.buffer_memory, self.max_block) from None
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
        """Add records (intake tuples, see :func:`make_item`) to their partitions' batches,
        in order (loop thread; never blocks)."""
        self._buffered += sum(map(SIZE, items))
        if self._buffered >= self.buffer_memory:
            self._space.clear()
        err = self._intake_error()
        if err is not None:
            self._drop_items(items, err)
            return
        topic = items[0][0]
        if len(items) == 1 or len(set(map(TOPIC, items))) == 1:
            self._append_topic(topic, items)
            return
        by_topic: dict[str, list[Item]] = {}
        for item in items:
            by_topic.setdefault(item[0], []).append(item)
        for topic, group in by_topic.items():
            self._append_topic(topic, group)

    def _drop_items(self, items: Sequence[Item], err: BaseException) -> None:
        """Records that never reach a batch: fail them and give their bytes back."""
        fail_items(items, err)
        self._release_bytes(sum(map(SIZE, items)))

    def _append_topic(self, topic: str, items: list[Item]) -> None:
        if topic in self._awaiting_metadata or self.cluster.partition_count(topic) is None:
            waiting = self._awaiting_metadata.setdefault(topic, [])
            if not waiting:
                self._outstanding += 1  # flush() waits for the metadata too
                self._idle.clear()
                self._spawn(self._await_metadata(topic))
            waiting.extend(items)
            return
        self._append_records(topic, items)

    def _append_records(self, topic: str, items: list[Item]) -> None:
        """Partition a burst of one topic's records and add them to their batches."""
        if self.transactional_id is not None and self.txn.state not in (
            TransactionState.IN_TRANSACTION,
            TransactionState.COMMITTING,  # it was sent in the transaction, before commit
        ):
            self._drop_items(items, self.txn.send_error())
            return
        n = self.cluster.partition_count(topic)
        assert n is not None
        # Columns by itemgetter: no object per row (zip(*items) makes one, and the GC runs)
        values = list(map(VALUE, items))
        keys = list(map(KEY, items))
        sizes = list(map(SIZE, items))
        extras = list(map(EXTRAS, items))
        now = _now_ms()
        explicit = ts = hdrs = sinks = None
        if extras.count(None) != len(extras):
            none = (None, None, None, None)
            filled = [e or none for e in extras]  # four columns, no object per row (as above)
            explicit, stamps, hdrs, sinks = ([e[k] for e in filled] for k in range(4))
            if stamps.count(None) != len(stamps):
                ts = [now if t is None else t for t in stamps]
            if hdrs.count(None) == len(hdrs):
                hdrs = None
            if sinks.count(None) == len(sinks):
                sinks = None
        parts = assign_partitions(keys, explicit, n, lambda: self._partitioner.partition(topic, n))
        if isinstance(parts, int):
            self._accumulate(
                TopicPartition(topic, parts),
                values,
                keys,
                ts if ts is not None else now,
                hdrs,
                sinks,
                sizes,
            )
            return
        for p, rows in group_by_partition(parts).items():
            if p < 0:  # an explicit partition the topic does not have
                assert explicit is not None
                err = KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{topic} has no partition {take(explicit, rows)[0]}",
                )
                self._drop_items(take(items, rows), err)
                if self.transactional_id is not None:
                    self.txn.fail(err, bump=False)
                continue
            self._accumulate(
                TopicPartition(topic, p),
                take(values, rows),
                take(keys, rows),
                take(ts, rows) if ts is not None else now,
                take(hdrs, rows) if hdrs is not None else None,
                take(sinks, rows) if sinks is not None else None,
                take(sizes, rows),
            )

    def _accumulate(
        self,
        tp: TopicPartition,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None],
        timestamps: int | Sequence[int],
        headers: Sequence[Any] | None,
        sinks: Sequence[Sink | None] | None,
        sizes: Sequence[int],
    ) -> None:
        """Append one partition's records to its open batch; seal the whole batches."""
        ps = self._partition(tp)
        batch = ps.queue[-1] if ps.queue else None
        if batch is None or batch.full:
            batch = Batch(tp, asyncio.get_running_loop().time())
            ps.queue.append(batch)
            self._outstanding += 1
            self._idle.clear()
            self._wake.set()  # as Java's sender is woken for a new batch (its linger starts)
        batch.extend(values, keys, timestamps, headers, sinks, sizes)
        if batch.size >= self.batch_size - HEADER_SIZE:
            sealed = batch.seal_full(self.batch_size, self.codec, asyncio.get_running_loop().time())
            if sealed:
                if batch.count:
                    ps.queue.pop()
                    ps.queue.extend(sealed)
                    ps.queue.append(batch)
                    self._outstanding += len(sealed)
                else:  # all of it sealed: the open batch object is not needed any more
                    ps.queue.pop()
                    ps.queue.extend(sealed)
                    self._outstanding += len(sealed) - 1
                self._wake.set()

    def _partition(self, tp: TopicPartition) -> _Partition:
        """The partition's state (made on its first record), added to the transaction."""
        ps = self._partitions.get(tp)
        if ps is None:
            resumed = (
                self._resume is not None
                and tp in self._resume.sequences
                and (self._resume.producer_id, self._resume.epoch) == (self.producer_id, self.epoch)
            )
            seq = self._resume.sequences[tp] if resumed and self._resume else 0
            ps = self._partitions[tp] = _Partition(tp, self.producer_id, self.epoch, seq)
            ps.skip_known = not resumed
        if self.transactional_id is not None and tp not in self.txn.added:
            self.txn.add_partition(tp)
        return ps

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
            if self._buffered + size > self.buffer_memory and self._buffered:
                self._space.clear()
                try:
                    await asyncio.wait_for(self._space.wait(), self.max_block)
                except TimeoutError:
                    err = BufferExhaustedError(self.buffer_memory, self.max_block)
                    tally.failed(err, sum(len(c) for c in chunks[i:]))
                    raise err from None
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
        deadline = asyncio.get_running_loop().time() + self.max_block
        while self.cluster.partition_count(topic) is None:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic} not in metadata after max.block.ms",
                )
            try:
                await self.cluster.refresh([topic], timeout=left)
            except KafkaError as exc:
                log.debug("metadata for %s: %s", topic, exc)
            if self.cluster.partition_count(topic) is None:
                await asyncio.sleep(self.retry_backoff)
        if topic not in self._column_limits:
            await self._learn_column_limit(topic)

    async def _learn_column_limit(self, topic: str) -> None:
        """How large a produce_batch() batch of ``topic`` may be: the topic's
        max.message.bytes (less what a codec may add to incompressible data), at most
        max.request.size, at least batch.size. Unknown: batch.size (never refused)."""
        if topic in self._learning_limits:
            return
        self._learning_limits.add(topic)
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
            self._learning_limits.discard(topic)
        self._column_limits[topic] = limit
        log.debug("%s: produce_batch() batches up to %d bytes", topic, limit)

    def append_columns(self, topic: str, cols: Columns, tally: Tally) -> None:
        """Partition a chunk of a produce_batch() call, encode it per partition as sealed
        batches and queue them after the partition's earlier records (loop thread)."""
        n_rows = len(cols)
        size = int(cols.sizes.sum())
        self._buffered += size
        if self._buffered >= self.buffer_memory:
            self._space.clear()
        err = self._intake_error()
        n = self.cluster.partition_count(topic)
        if err is None and n is None:
            err = KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic} unknown")
        if err is not None:
            tally.failed(err, n_rows)
            self._release_bytes(size)
            return
        assert n is not None
        waiting = self._awaiting_metadata.pop(topic, None)
        if waiting:  # send()'s records that waited for this metadata come first
            self._append_records(topic, waiting)
        parts = assign_column_partitions(
            cols,
            n,
            self.batch_size,
            lambda: self._partitioner.partition(topic, n),
            lambda p: self._partitioner.batch_closed(topic, p, n),
        )
        first, last = int(parts.min()), int(parts.max())
        if first == last:
            groups = [(first, cols)]
        else:
            order = np.argsort(parts, kind="stable")  # each partition's rows in call order
            ordered = parts[order]
            cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
            bounds = [0, *cuts.tolist(), n_rows]
            groups = [
                (int(ordered[a]), cols.take(order[a:b])) for a, b in itertools.pairwise(bounds)
            ]
        now = asyncio.get_running_loop().time()
        limit = self._column_limits.get(topic)
        if limit is None:  # learnt meanwhile for the next calls
            limit = self.batch_size
            if topic not in self._learning_limits:
                self._spawn(self._learn_column_limit(topic))
        for p, part_cols in groups:
            if p < 0:  # explicit partitions the topic does not have
                assert part_cols.partitions is not None
                bad = KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{topic} has no partition {int(part_cols.partitions[0])}",
                )
                tally.failed(bad, len(part_cols))
                self._release_bytes(int(part_cols.sizes.sum()))
                if self.transactional_id is not None:
                    self.txn.fail(bad, bump=False)
                continue
            tp = TopicPartition(topic, p)
            sealed = encode_sealed(tp, part_cols, self.codec, limit, now, tally)
            ps = self._partition(tp)
            # after the partition's open batch, if any: its records stay ahead, and the
            # next send() starts a new batch (the last one is sealed, full)
            ps.queue.extend(sealed)
            self._outstanding += len(sealed)
        self._idle.clear()
        self._wake.set()

    async def _await_metadata(self, topic: str) -> None:
        deadline = asyncio.get_running_loop().time() + self.max_block
        error: KafkaError | None = None
        while self.cluster.partition_count(topic) is None:
            if asyncio.get_running_loop().time() > deadline:
                error = KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic} not in metadata after max.block.ms",
                )
                break
            try:
                left = deadline - asyncio.get_running_loop().time()
                await self.cluster.refresh([topic], timeout=max(0.0, left))
            except KafkaError as exc:
                log.debug("metadata for %s: %s", topic, exc)
            if self.cluster.partition_count(topic) is None:
                await asyncio.sleep(self.retry_backoff)
        waiting = self._awaiting_metadata.pop(topic, [])
        if waiting:
            if error is not None or self._fatal is not None:
                self._drop_items(waiting, error or self._fatal)  # type: ignore[arg-type]
                if error is not None and self.transactional_id is not None:
                    # As Java's doSend: a record lost in a transaction makes it abortable.
                    self.txn.fail(error, bump=False)
            else:
                self._append_records(topic, waiting)
        self._batch_done()

    def queued_records(self) -> int:
        """Records given to the producer and not yet acknowledged or failed."""
        n = sum(len(w) for w in self._awaiting_metadata.values())
        for ps in self._partitions.values():
            n += sum(b.count for b in ps.pending) + sum(b.count for b in ps.queue)
        return n

    # --- identity --------------------------------------------------------------------------

    # --- the sender ------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("producer task failed: %s", task.exception())
        self._wake.set()

    def _release(self, b: _Batch) -> None:
        self._release_bytes(b.size)
        self._batch_done()

    def _release_bytes(self, size: int) -> None:
        self._buffered -= size
        self.released_bytes += size  # the sync facade's buffer.memory bound reads it
        if self._buffered < self.buffer_memory:
            self._space.set()
        if self.on_release is not None:
            self.on_release()

    def _batch_done(self) -> None:
        self._outstanding -= 1
        if self._outstanding <= 0:
            self._outstanding = 0
            self._idle.set()

    def _set_fatal(self, err: KafkaError) -> None:
        if self._fatal is None:
            log.error("producer failed: %s", err)
            self._fatal = err
        if self.transactional_id is not None:
            self.txn.state = TransactionState.FATAL_ERROR
        self._fail_all(err)

    def _fail_all(self, err: BaseException) -> None:
        for ps in self._partitions.values():
            for b in list(ps.pending) + list(ps.queue):
                b.fail(err)
                self._release(b)
            ps.pending.clear()
            ps.queue.clear()
        self._drop_waiting(err)
        self._wake.set()

    def drop_unsent(self, err: BaseException) -> None:
        """Fail every record not yet sent (Kafka's abortUndrainedBatches)."""
        for ps in self._partitions.values():
            while ps.queue:
                b = ps.queue.popleft()
                b.fail(err)
                self._release(b)
        self._drop_waiting(err)
        self._wake.set()

    def _drop_waiting(self, err: BaseException) -> None:
        """Fail the records waiting for their topic's metadata."""
        for waiting in self._awaiting_metadata.values():
            self._drop_items(waiting, err)
            waiting.clear()

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
