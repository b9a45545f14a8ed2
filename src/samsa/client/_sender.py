"""The producer's sender: the only place its batches meet the network.

One task (:meth:`Sender.run`) drains the partitions' batches whose ``linger.ms`` elapsed
(or that are full, or when flushing), groups them per leader broker into one Produce
request per node and pass (one batch per partition per request, as Java's sender), writes
each request on that node's connection without waiting, and turns each answer into the
decisions of ``_idempotence`` (succeed, retry in sequence order, bump the epoch, fail the
batch, fail the producer). It also owns the producer's other identity requests:
InitProducerId for an idempotent producer (and its KIP-360 bump) and DescribeProducers for
a resumed one. Connections are reached only through :class:`Cluster`'s methods.

The accumulator (``_accumulator.RecordAccumulator``) owns the partitions' batches and the
buffer accounting: the sender drains its partitions and gives each completed batch back to
it (:meth:`RecordAccumulator.release`). Everything else it needs comes in at construction,
as the small protocols below: the producer's settings and :class:`ProducerHost` (spawn a
task, fail the producer), the identity (:class:`Idempotence`, changed through its methods)
and :class:`SenderTransaction` (the transaction manager's view of a partition or a failed
batch).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from samsa.client._accumulator import Batch, ProducerHost, ProducerPartition, RecordAccumulator
from samsa.client._aconn import AsyncConnection
from samsa.client._errors import (
    AbortableTransactionError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortedError,
)
from samsa.client._idempotence import (
    SEQ_MOD,
    Action,
    Decision,
    Idempotence,
    decide,
    on_failure,
    on_lost,
)
from samsa.client._types import ProducerStats, TopicPartition
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import HEADER_SIZE

if TYPE_CHECKING:
    from samsa.client._cluster import Cluster
    from samsa.client._config import Config

log = logging.getLogger("samsa.client.producer")


def _wake_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class SenderHost(ProducerHost, Protocol):
    """The producer as the sender sees it: :class:`ProducerHost`, its settings (read
    once), its connections and its counters."""

    cluster: Cluster
    config: Config
    stats: ProducerStats
    acks: int
    idempotent: bool
    transactional_id: str | None
    max_in_flight: int
    linger: float
    codec: int
    delivery_timeout: float
    request_timeout: float
    retry_backoff: float
    retry_backoff_max: float
    max_block: float
    max_request_size: int


class SenderTransaction(Protocol):
    """What the sender asks of the transaction manager."""

    tv2: bool  # transactions v2: Produce v12 adds the partitions itself

    def includes(self, tp: TopicPartition) -> bool:
        """The partition is in the open transaction: its batches may go."""

    def aborting_with_bump(self) -> bool:
        """An abort that ends with an epoch bump is under way: unresolved batches may
        simply fail."""

    def fail(self, err: BaseException, *, bump: bool) -> None:
        """A batch of the transaction failed: it can only abort."""


class Sender:
    """Drains, sends and resolves the accumulator's batches (see the module docstring);
    settings are the host's, read once."""

    def __init__(
        self,
        host: SenderHost,
        accumulator: RecordAccumulator,
        idem: Idempotence,
        txn: SenderTransaction,
    ) -> None:
        self.host = host
        self.acc = accumulator
        self.idem = idem
        self.txn = txn
        self.stats = host.stats
        self.cluster = host.cluster
        self.config = host.config
        self.partitions = accumulator.partitions
        self.partitioner = accumulator.partitioner
        self.acks = host.acks
        self.idempotent = host.idempotent
        self.transactional_id = host.transactional_id
        self.max_in_flight = host.max_in_flight
        self.linger = host.linger
        self.codec = host.codec
        self.delivery_timeout = host.delivery_timeout
        self.request_timeout = host.request_timeout
        self.retry_backoff = host.retry_backoff
        self.retry_backoff_max = host.retry_backoff_max
        self.max_block = host.max_block
        self.max_request_size = host.max_request_size
        self._checking: set[TopicPartition] = set()  # resumed partitions being described
        # wakeup() since the pass began, and the pass's wait: a future and a timer, not
        # wait_for() on an Event (a task per wait, once per request answered)
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None

    def wakeup(self) -> None:
        """Look at the partitions again now (a new batch, an answer, a partition added)."""
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def init_producer_id(self, *, bump: bool = False) -> None:
        """InitProducerId; with ``bump`` (KIP-360, v3+) for a transactional producer.
        Retried (lost connections, retriable errors) until ``max.block.ms``."""

        async def attempt() -> None:
            conn = await self.cluster.any_connection()
            v = conn.version(ApiKey.INIT_PRODUCER_ID, 0, 4)
            req = make_request(
                ApiKey.INIT_PRODUCER_ID,
                v,
                "InitProducerIdRequest",
                transactional_id=self.transactional_id,
                transaction_timeout=self.config.int("transaction.timeout.ms"),
                producer_id=self.idem.producer_id if bump else -1,
                producer_epoch=self.idem.epoch if bump else -1,
            )
            resp = await conn.request(ApiKey.INIT_PRODUCER_ID, req, version=v)
            code = int(resp.error_code)
            if code:
                raise KafkaError(code, "InitProducerId")
            self.idem.set_identity(int(resp.producer_id), int(resp.producer_epoch))
            log.debug("producer id %d epoch %d", self.idem.producer_id, self.idem.epoch)

        await self.cluster.retry(attempt, what="InitProducerId", timeout=self.max_block)

    def request_bump(self, ps: ProducerPartition, reason: str, *, new_id: bool = False) -> None:
        log.info("%s: epoch bump needed (%s)", ps.tp, reason)
        self.idem.request_bump(ps.tp, new_id=new_id)

    async def _bump(self) -> None:
        """Move to a new epoch (or producer id) and renumber the partitions that need it."""
        self.stats.epoch_bumps += 1
        ident = self.idem.local_bump()
        if ident is None:
            self.idem.set_identity(-1, -1)
            await self.init_producer_id()
            ident = (self.idem.producer_id, self.idem.epoch)
        self.idem.bumped(*ident, self.partitions.items())

    async def _check_resumed(self, ps: ProducerPartition, node: int) -> None:
        """Find how many of a resumed partition's records the previous incarnation wrote.
        Until that is known (the answer may be lost) nothing of the partition is sent:
        resending a written record under a new batching could not be recognised."""
        known = False
        try:

            async def attempt() -> Any:
                return await self.cluster.send(
                    node,
                    ApiKey.DESCRIBE_PRODUCERS,
                    (0, 0),
                    "DescribeProducersRequest",
                    lambda v: {
                        "topics": (
                            make_request(
                                ApiKey.DESCRIBE_PRODUCERS,
                                v,
                                "TopicRequest",
                                name=ps.tp.topic,
                                partition_indexes=(ps.tp.partition,),
                            ),
                        )
                    },
                )

            conn = await self.cluster.connection(node)
            if not conn.supports(ApiKey.DESCRIBE_PRODUCERS):
                known = True
                return
            resp = await self.cluster.retry(
                attempt, what="DescribeProducers", timeout=self.request_timeout
            )
            part = resp.topics[0].partitions[0]
            if part.error_code:
                raise KafkaError(int(part.error_code), "DescribeProducers")
            for p in part.active_producers:
                if int(p.producer_id) == ps.producer_id and int(p.producer_epoch) == ps.epoch:
                    ahead = (int(p.last_sequence) + 1 - ps.next_seq) % SEQ_MOD
                    if ahead < SEQ_MOD // 2:
                        ps.skip = ahead
                        log.info("%s: %d records already written before resume", ps.tp, ahead)
            known = True
        except KafkaError as exc:
            log.info("%s: last written sequence not known yet: %s", ps.tp, exc)
        finally:
            ps.skip_known = known
            self._checking.discard(ps.tp)
            self.wakeup()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.acc.closed:
                self._woken = False
                now = loop.time()
                wake_at = now + 0.5
                self.expire(now)
                if self.idem.bump_requested:
                    if not any(ps.in_flight for ps in self.partitions.values()):
                        try:
                            await self._bump()
                        except KafkaError as exc:
                            self.host.fail_fatal(exc)
                            return
                        continue
                    await self._wait(wake_at - now)
                    continue
                requests: dict[int, list[Batch]] = {}
                sizes: dict[int, int] = {}
                for ps in self.partitions.values():
                    when = self._ready_batch(ps, now, requests, sizes)
                    if when is not None:
                        wake_at = min(wake_at, when)
                for node, batches in requests.items():
                    self._send(node, batches)
                await self._wait(max(0.0, wake_at - loop.time()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not leave futures hanging forever
            log.exception("producer sender failed")
            self.host.fail_fatal(
                KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"sender crashed: {exc}")
            )

    async def _wait(self, timeout: float) -> None:
        if self._woken:
            return
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout, _wake_up, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _ready_batch(
        self,
        ps: ProducerPartition,
        now: float,
        requests: dict[int, list[Batch]],
        sizes: dict[int, int],
    ) -> float | None:
        """Put ps's next sendable batch into ``requests`` (``sizes``: their bytes per
        node, kept within max.request.size: a batch that would not fit goes in the next
        request, at once); return when to look again."""
        if not ps.pending and not ps.queue:
            return None
        leader = self.cluster.leader(*ps.tp)
        if leader is None:
            self.host.spawn(self.refresh_metadata(ps.tp.topic))
            return now + self.retry_backoff
        if self.cluster.connected(leader) is None:
            self.host.spawn(self._connect(leader))
            return now + self.retry_backoff
        if ps.in_flight >= self.max_in_flight:
            return None
        retry = ps.unresolved()
        if retry is not None:
            # Unresolved sequences: one batch at a time, lowest sequence first (rule 20).
            when = ps.retry_ready(retry, now)
            if when is None:
                return self._add(requests, sizes, leader, retry, now)
            return None if when == float("inf") else when
        if self.idempotent and not self.idem.adopt(ps):
            return None  # old-epoch batches still unresolved
        if not ps.queue:
            return None
        batch = ps.queue[0]
        ready = (
            batch.full
            or len(ps.queue) > 1
            or self.acc.flushing
            or self.acc.closed
            or now - batch.created >= self.linger
        )
        if not ready:
            return batch.created + self.linger
        used = sizes.get(leader, 0)
        if used and used + batch.size + HEADER_SIZE > self.max_request_size:
            return now  # the next request
        if self.transactional_id is not None and not self.txn.includes(ps.tp):
            return None  # AddPartitionsToTxn first (rule 19); its task wakes the sender
        if not ps.skip_known:
            if ps.tp not in self._checking:
                self._checking.add(ps.tp)
                self.host.spawn(self._check_resumed(ps, leader))
            return now + 0.5
        ps.queue.popleft()
        n = self.cluster.partition_count(ps.tp.topic) or 1
        self.partitioner.batch_closed(ps.tp.topic, ps.tp.partition, n)
        if ps.skip and not ps.skip_written(batch):
            self.acc.release(batch)
            return now  # the whole batch was already written; look at the next one
        ps.assign(batch, self.idempotent)
        return self._add(requests, sizes, leader, batch, now)

    def _add(
        self,
        requests: dict[int, list[Batch]],
        sizes: dict[int, int],
        node: int,
        batch: Batch,
        now: float,
    ) -> float | None:
        used = sizes.get(node, 0)
        size = batch.size + HEADER_SIZE
        if used and used + size > self.max_request_size:
            return now  # a retry that does not fit: the next request
        requests.setdefault(node, []).append(batch)
        sizes[node] = used + size
        return None

    async def _connect(self, node: int) -> None:
        try:
            await self.cluster.connection(node)
        except KafkaError as exc:
            log.debug("connect to node %d: %s", node, exc)
            await asyncio.sleep(self.retry_backoff)
            await self.refresh_metadata(None)

    async def refresh_metadata(self, topic: str | None) -> None:
        # One attempt: the sender asks again on its next pass.
        try:
            await self.cluster.refresh([topic] if topic else [], timeout=0)
        except KafkaError as exc:
            log.debug("metadata refresh: %s", exc)
            await asyncio.sleep(self.retry_backoff)

    def _send(self, node: int, batches: list[Batch]) -> None:
        conn = self.cluster.connected(node)
        assert conn is not None  # checked by ready_batch in the same pass
        # Transactions v2: Produce v12 adds each partition to the transaction itself.
        v = conn.version(ApiKey.PRODUCE, 3, 12 if self.txn.tv2 else 9)
        by_topic: dict[str, list[Any]] = {}
        for b in batches:
            if b.payload is None:
                b.payload = b.build(
                    b.producer_id,
                    b.epoch,
                    b.base_sequence,
                    self.transactional_id is not None,
                    self.codec,
                )
            by_topic.setdefault(b.tp.topic, []).append(
                make_request(
                    ApiKey.PRODUCE,
                    v,
                    "PartitionProduceData",
                    index=b.tp.partition,
                    records=b.payload,
                )
            )
            self.partitions[b.tp].sent(b)
            if b.attempts > 1:
                self.stats.resends += 1
        req = make_request(
            ApiKey.PRODUCE,
            v,
            "ProduceRequest",
            transactional_id=self.transactional_id,
            acks=self.acks,
            timeout=int(self.request_timeout * 1000),
            topic_data=tuple(
                make_request(ApiKey.PRODUCE, v, "TopicProduceData", name=t, partition_data=tuple(p))
                for t, p in by_topic.items()
            ),
        )
        fut = conn.send_nowait(ApiKey.PRODUCE, req, version=v, expect_response=self.acks != 0)
        self.host.spawn(self._complete(conn, fut, batches))

    async def _complete(
        self, conn: AsyncConnection, fut: asyncio.Future[Any], batches: list[Batch]
    ) -> None:
        try:
            await conn.drain()
            resp = await conn.wait_response(fut, ApiKey.PRODUCE)
        except KafkaError as exc:
            for b in batches:
                ps = self.partitions[b.tp]
                ps.landed(b)
                d = on_lost(ps, b, retriable=exc.retriable, idempotent=self.idempotent)
                self._apply(b, ps, d, exc)
            return
        finally:
            self.wakeup()
        if resp is None:  # acks=0
            for b in batches:
                self.partitions[b.tp].landed(b)
                self._succeed(b, -1, -1)
            return
        results: dict[TopicPartition, Any] = {}
        for t in resp.responses:
            for p in t.partition_responses:
                results[TopicPartition(t.name, int(p.index))] = p
        for b in batches:
            self.partitions[b.tp].landed(b)
            p = results.get(b.tp)
            if p is None:
                missing = KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, "partition missing")
                ps = self.partitions[b.tp]
                d = on_lost(ps, b, retriable=True, idempotent=self.idempotent)
                self._apply(b, ps, d, missing)
                continue
            self._handle(b, p)

    def _handle(self, b: Batch, p: Any) -> None:
        code = int(p.error_code)
        ps = self.partitions[b.tp]
        if code == ErrorCode.NONE:  # the common case first: no error object, no decision
            if ps.is_pending(b):
                append_time = -1
                if getattr(p, "log_append_time", None) is not None:
                    append_time = int(p.log_append_time.timestamp() * 1000)
                self._succeed(b, int(p.base_offset), append_time)
            return
        message = getattr(p, "error_message", None) or ""
        err = KafkaError(code, message)
        d = decide(
            code,
            err.retriable,
            b,
            ps,
            idempotent=self.idempotent,
            transactional=self.transactional_id is not None,
            bump_pending=self.idem.bump_requested,
            first_epoch=self.idem.first_epoch,
        )
        if d.fenced:
            stale = code == ErrorCode.INVALID_PRODUCER_EPOCH
            why = "producer epoch is stale" if stale else "fenced by a newer producer"
            err = ProducerFencedError(code, message or why)
        self._apply(b, ps, d, err)

    def _apply(self, b: Batch, ps: ProducerPartition, d: Decision, err: KafkaError) -> None:
        """Carry out a decision of ``_idempotence`` about batch ``b``."""
        action = d.action
        if action is Action.IGNORE:
            return  # already resolved (fatal error or expiry) while in flight
        if action is Action.SUCCEED or action is Action.DUPLICATE:
            if action is Action.DUPLICATE:
                self.stats.duplicate_sequence += 1
            self._succeed(b, -1, -1)
            return
        if action is Action.FATAL:
            self.host.fail_fatal(err)
            return
        if d.new_id:
            self.idem.require_new_id()
        if d.bump and action is Action.RETRY:
            self.request_bump(ps, err.name, new_id=d.new_id)
        if d.refresh:
            self.host.spawn(self.refresh_metadata(b.tp.topic))
        if action is Action.RETRY:
            self._retry(b, ps, err)
        elif action is Action.ABORTABLE:
            self.fail_batch(b, AbortableTransactionError(err.code, str(err)), bump=d.bump)
        else:
            self.fail_batch(b, err, bump=d.bump)

    def _succeed(self, b: Batch, base_offset: int, append_time: int) -> None:
        if b.attempts > 1:
            self.stats.retried_acknowledged += 1
        self.partitions[b.tp].acknowledged(b)
        b.succeed(base_offset, append_time, base_offset < 0 and self.acks != 0)
        self.acc.release(b)

    def _retry(self, b: Batch, ps: ProducerPartition, err: KafkaError) -> None:
        """Back to pending, untouched, for another attempt in sequence order."""
        if self.txn.aborting_with_bump():
            # The epoch is bumped after this abort anyway, so an unresolved batch of the
            # aborted transaction need not be resolved: drop it.
            self.fail_batch(b, TransactionAbortedError(), bump=True)
            return
        ps.retry(b, asyncio.get_running_loop().time(), self.retry_backoff, self.retry_backoff_max)
        log.debug("%r: retry after %s", b, err)

    def fail_batch(self, b: Batch, err: BaseException, *, bump: bool) -> None:
        ps = self.partitions[b.tp]
        if ps.remove(b) and bump:
            if self.transactional_id is not None:
                # Its sequences left a gap that only a new epoch closes; meanwhile the
                # transaction lost a record and must not commit.
                self.txn.fail(err, bump=True)
            elif not self.acc.closed:
                self.request_bump(ps, f"batch failed: {err}")  # its sequences left a gap
        b.fail(err)
        self.acc.release(b)

    def expire(self, now: float) -> None:
        for ps in self.partitions.values():
            while ps.queue and now - ps.queue[0].created > self.delivery_timeout:
                b = ps.queue.popleft()
                expired = KafkaTimeoutError("delivery.timeout.ms expired")
                b.fail(expired)
                self.acc.release(b)
                if self.transactional_id is not None:
                    self.txn.fail(expired, bump=False)
            for b in ps.expired(now, self.delivery_timeout):
                d = on_failure(
                    ps,
                    b,
                    idempotent=self.idempotent,
                    transactional=self.transactional_id is not None,
                )
                self.fail_batch(b, KafkaTimeoutError("delivery.timeout.ms expired"), bump=d.bump)
