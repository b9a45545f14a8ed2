"""Writing: each Spark task writes in a broker transaction the driver commits exactly once.

Protocol (exactly-once, the default)
------------------------------------
* A task for Spark partition ``p`` opens a transactional producer with transactional id
  ``<prefix>-<p>``. Its ``init_transactions`` fences every earlier producer with that id: the
  open transaction of a failed attempt of the same task (or of the same partition in a batch
  that the driver never committed) is aborted by the coordinator, so partial output of a
  failed attempt never becomes visible.
* The task writes its rows, flushes, and hands the open transaction to the driver in its
  commit message: (transactional id, producer id, epoch).
* The driver's ``commit`` resumes every transaction. For a streaming batch it first reads the
  marker offsets: for each Spark partition, the group ``<prefix>.batches`` has on partition
  ``p`` of the marker topic the id of the next batch to commit. A transaction whose marker
  already says that this batch was committed is a replay (the driver crashed after the sink
  committed but before Spark wrote its commit log, or commit ran twice): it is aborted.
  Otherwise the marker ``batch id + 1`` is added to the same transaction with
  ``send_offsets_to_transaction`` and the transaction commits: output and marker become
  visible together or not at all.
* With ``kafka.transaction.two.phase.commit.enable=true`` (KIP-939, on brokers that allow it)
  the hand-off is Kafka's two-phase commit: the tasks' transactions have no timeout, and the
  driver takes each over with InitProducerId ``keep_prepared_txn`` (which fences the task and
  checks that the transaction is the one the task prepared) instead of ending it under the
  task's identity, the protocol Kafka 4.1+ clusters accept.
* ``abort`` aborts the transactions it is given, and fences the transactional ids of the
  tasks that reported nothing so that no transaction stays open holding back the last stable
  offset until its timeout.

The prefix must be the same across driver restarts: it is derived from the query's
checkpoint location (or query name), or set with ``transactionalIdPrefix``. Replays must
produce the same rows per Spark partition (Spark's deterministic re-execution of a batch from
its offset log and state store). Speculative execution (``spark.speculation``) is not
supported with this sink.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from samsa.client import (
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    BatchMetadata,
    KafkaError,
    NewTopic,
    PreparedTransaction,
    Producer,
)
from samsa.protocol.errors import ErrorCode
from samsa.spark._options import MARKER_TOPIC, SinkOptions, SparkOptionError, marker_partition

log = logging.getLogger("samsa.spark")


class InjectedTaskFailure(RuntimeError):
    """Raised by the ``injectTaskFailure`` test hook (a task attempt dying mid-write)."""


class InjectedDriverCrash(RuntimeError):
    """Raised by the ``injectCommitFailure`` test hook after the sink committed a batch."""


@dataclass
class SinkCommit:
    """What a task hands the driver (pickled; a WriterCommitMessage in the Spark layer)."""

    spark_partition: int
    attempt: int
    records: int
    transactional_id: str | None = None
    producer_id: int = -1
    epoch: int = -1
    started: bool = False


@dataclass
class CommitReport:
    """What a driver-side commit did (the stream sink keeps the last one for inspection)."""

    batch_id: int
    committed: int = 0
    replayed: int = 0
    records: int = 0


def validate_columns(names: Sequence[str], types: dict[str, str], opts: SinkOptions) -> None:
    """Check the DataFrame's columns as Spark's Kafka sink does (``types``: simpleString)."""
    if "value" not in types:
        raise SparkOptionError("required attribute 'value' not found in the DataFrame")
    if opts.topic is None and "topic" not in types:
        raise SparkOptionError(
            "topic option required when no 'topic' attribute is present; use the option "
            "topic or add a string column topic"
        )
    for col, allowed in (
        ("value", ("string", "binary")),
        ("key", ("string", "binary")),
        ("topic", ("string",)),
        ("partition", ("int", "smallint", "tinyint")),
        ("headers", ("array<struct<key:string,value:binary>>",)),
    ):
        if col in types and types[col] not in allowed:
            raise SparkOptionError(
                f"{col} attribute type must be {' or '.join(allowed)}, got {types[col]}"
            )


def check_topic(opts: SinkOptions) -> None:
    """Fail fast (on the driver) when the ``topic`` option names a topic that does not exist:
    the producer would otherwise wait ``max.block.ms`` for it in every task."""
    if opts.topic is None:
        return
    from samsa.client import Admin

    with Admin(_common(opts)) as admin:
        if opts.topic not in admin.list_topics(internal=True):
            raise SparkOptionError(f"topic {opts.topic!r} does not exist; create it first")


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    idx = batch.schema.get_field_index(name)
    return batch.column(idx) if idx >= 0 else None


def _by_topic(batch: pa.RecordBatch, opts: SinkOptions) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows per destination topic (the ``topic`` option, else the column), each
    in row order."""
    if batch.num_rows == 0:
        return
    if opts.topic is not None:
        yield opts.topic, batch
        return
    topics = _column(batch, "topic")
    if topics is None or topics.null_count:
        raise ValueError("null topic in a row and no topic option")
    names = pc.unique(topics).to_pylist()
    if len(names) == 1:
        yield names[0], batch
        return
    for name in names:  # a Spark partition seldom writes many topics
        yield name, batch.filter(pc.equal(topics, name))


def _produce_rows(
    producer: Producer, topic: str, rows: pa.RecordBatch, delivered: Callable[..., None]
) -> None:
    """One produce_batch() call for a batch of rows: Arrow columns straight to the
    columnar encoder (string or binary key/value, nullable partition, headers)."""
    producer.produce_batch(
        topic,
        _column(rows, "value"),
        _column(rows, "key"),
        partition=_column(rows, "partition"),
        headers=_column(rows, "headers"),
        on_delivery=delivered,
    )


def _task_identity() -> tuple[int, int]:
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is what calls us
        return 0, 0
    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0
    return ctx.partitionId(), ctx.attemptNumber()


def _injected_failure(opts: SinkOptions, part: int, attempt: int) -> int | None:
    """Records after which this attempt must die (the injectTaskFailure test hook)."""
    spec = opts.inject_task_failure
    if spec is None or attempt != 0 or spec[0] != part:
        return None
    if spec[2] is not None:
        try:  # only once: the first task to create the file fails
            os.close(os.open(spec[2], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return None
    return spec[1]


def write_task(
    opts: SinkOptions,
    batches: Iterator[pa.RecordBatch],
    spark_partition: int | None = None,
    attempt: int | None = None,
) -> SinkCommit:
    """Write one Spark partition's rows (executor side)."""
    part, att = _task_identity()
    part = part if spark_partition is None else spark_partition
    att = att if attempt is None else attempt
    config: dict[str, Any] = {"linger.ms": 10, "batch.size": 256 * 1024, **opts.client}
    tid = f"{opts.transactional_id_prefix}-{part}" if opts.exactly_once else None
    if tid is not None:
        config["transactional.id"] = tid
    producer = Producer(config)
    errors: list[BaseException] = []

    def delivered(err: BaseException | None, _md: BatchMetadata | None) -> None:
        if err is not None and not errors:
            errors.append(err)

    crashed = False
    try:
        if tid is not None:
            producer.init_transactions()
            producer.begin_transaction()
        count = 0
        fail_after = _injected_failure(opts, part, att)
        for batch in batches:
            for topic, rows in _by_topic(batch, opts):
                if fail_after is not None and count + rows.num_rows >= fail_after:
                    rows = rows.slice(0, fail_after - count)
                _produce_rows(producer, topic, rows, delivered)
                count += rows.num_rows
                if fail_after is not None and count >= fail_after:
                    producer.flush()  # the partial output is really in the log
                    crashed = True
                    raise InjectedTaskFailure(
                        f"injected failure of partition {part} attempt {att} after {count} records"
                    )
        if tid is not None:
            prepared = producer.prepare_transaction()
            if errors:
                raise errors[0]
            return SinkCommit(
                part, att, count, tid, prepared.producer_id, prepared.epoch, prepared.started
            )
        producer.flush()
        if errors:
            raise errors[0]
        return SinkCommit(part, att, count)
    except BaseException:
        if tid is not None and not crashed:
            try:
                producer.abort_transaction(timeout=10)
            except Exception:
                log.debug("abort after a failed write", exc_info=True)
        raise
    finally:
        producer.close(timeout=10)


# --- the driver ----------------------------------------------------------------------------


async def _committed_markers(
    opts: SinkOptions, parts: list[int], deadline: float
) -> dict[int, int | None]:
    consumer = AsyncConsumer(
        {**_common(opts), "group.id": opts.marker_group, "enable.auto.commit": False}
    )
    try:
        await consumer.start()
        while True:
            try:
                got = await consumer.committed([marker_partition(p) for p in parts])
                return {tp.partition: off for tp, off in got.items()}
            except KafkaError as exc:
                # a marker still pending in an open transaction, or a coordinator moving
                if (
                    exc.code != ErrorCode.UNSTABLE_OFFSET_COMMIT and not exc.retriable
                ) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await consumer.close()


# Bootstrap servers -> partitions the marker topic is known to have (this process).
_marker_partitions: dict[str, int] = {}


async def _ensure_marker_partitions(opts: SinkOptions, count: int) -> None:
    """Give the marker topic at least ``count`` partitions (one per Spark partition).

    Kafka refuses a committed offset of a partition that does not exist (TxnOffsetCommit
    answers UNKNOWN_TOPIC_OR_PARTITION), so the topic must be real: made on first use,
    grown when a batch has more Spark partitions. It never holds a record; only the
    marker group's offsets name its partitions."""
    key = str(opts.client.get("bootstrap.servers"))
    if _marker_partitions.get(key, 0) >= count:
        return
    async with AsyncAdmin(_common(opts)) as admin:
        try:
            (meta,) = await admin.describe_topics([MARKER_TOPIC])
            have = len(meta.partitions)
        except KafkaError as exc:
            if exc.code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                raise
            err = (await admin.create_topics([NewTopic(MARKER_TOPIC, count)]))[MARKER_TOPIC]
            if err is not None and err.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise err from None
            have = count if err is None else 0
        if have < count:
            err = (await admin.create_partitions({MARKER_TOPIC: count}))[MARKER_TOPIC]
            # INVALID_PARTITIONS: another driver grew it meanwhile (re-checked next time)
            if err is not None and err.code != ErrorCode.INVALID_PARTITIONS:
                raise err
            if err is not None:
                return
    _marker_partitions[key] = count


def _common(opts: SinkOptions) -> dict[str, Any]:
    """The settings every client of the sink takes: where, who, and how it connects."""
    keep = ("bootstrap.servers", "client.id", "request.timeout.ms", "retry.backoff.ms")
    return {
        k: v
        for k, v in opts.client.items()
        if k in keep or k.startswith(("security.", "sasl.", "ssl."))
    }


def _txn_common(opts: SinkOptions) -> dict[str, Any]:
    """The driver's transactional settings: with 2PC, it takes the tasks' transactions over."""
    key = "transaction.two.phase.commit.enable"
    return {**_common(opts), **({key: opts.client[key]} if key in opts.client else {})}


_ALREADY_ENDED = frozenset({ErrorCode.INVALID_TXN_STATE, ErrorCode.PRODUCER_FENCED})


async def _finish(
    opts: SinkOptions, msg: SinkCommit, commit: bool, marker: tuple[int, str] | None
) -> None:
    assert msg.transactional_id is not None
    prepared = PreparedTransaction(msg.transactional_id, msg.producer_id, msg.epoch, msg.started)
    try:
        txn = await AsyncProducer.resume_transaction(_txn_common(opts), prepared)
    except KafkaError as exc:
        if exc.code != ErrorCode.UNSUPPORTED_VERSION:
            raise
        # KIP-939's take-over (keep_prepared_txn) refused: Apache Kafka 4.4 serves
        # InitProducerId v6 but not this. A 2PC transaction has no timeout, so abort it now
        # (fencing aborts it) rather than leave it holding back the last stable offset.
        await _fence(opts, msg.transactional_id)
        if not commit:
            return
        raise SparkOptionError(
            "the brokers refuse to take a prepared transaction over (InitProducerId "
            "keep_prepared_txn: UNSUPPORTED_VERSION); the tasks' output was aborted. Drop "
            "kafka.transaction.two.phase.commit.enable to use the default hand-off"
        ) from exc
    try:
        if not commit:
            try:
                await txn.abort()
            except KafkaError as exc:
                if exc.code not in _ALREADY_ENDED:
                    raise
                # ended before: committed by an earlier commit() call, or fenced and aborted
            return
        if marker is not None:
            batch_next, group = marker
            await txn.send_offsets_to_transaction(
                {marker_partition(msg.spark_partition): batch_next}, group
            )
        await txn.commit()
    finally:
        await txn.close()


async def _commit_async(
    opts: SinkOptions, messages: Sequence[SinkCommit | None], batch_id: int | None
) -> CommitReport:
    report = CommitReport(-1 if batch_id is None else batch_id)
    if not opts.exactly_once:
        report.records = sum(m.records for m in messages if m is not None)
        return report  # at-least-once: the tasks flushed already
    if any(m is None or m.transactional_id is None for m in messages):
        raise RuntimeError("exactly-once commit with a missing or non-transactional task result")
    msgs = [m for m in messages if m is not None]
    deadline = time.monotonic() + 60
    done: dict[int, int | None] = {}
    if batch_id is not None:
        done = await _committed_markers(opts, [m.spark_partition for m in msgs], deadline)
    if batch_id is not None and msgs:
        await _ensure_marker_partitions(opts, max(m.spark_partition for m in msgs) + 1)
    jobs = []
    for m in msgs:
        seen = done.get(m.spark_partition)
        if batch_id is not None and seen is not None and seen > batch_id:
            report.replayed += 1
            jobs.append(_finish(opts, m, False, None))
        elif not m.started:
            continue  # nothing written, nothing to commit (and nothing to replay)
        else:
            report.committed += 1
            report.records += m.records
            marker = None if batch_id is None else (batch_id + 1, opts.marker_group)
            jobs.append(_finish(opts, m, True, marker))
    results = await asyncio.gather(*jobs, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return report


def commit_job(
    opts: SinkOptions, messages: Sequence[SinkCommit | None], batch_id: int | None
) -> CommitReport:
    """Driver side: finish every task's transaction (streaming: with markers)."""
    report = asyncio.run(_commit_async(opts, messages, batch_id))
    if batch_id is not None and batch_id == opts.inject_commit_failure and report.committed:
        raise InjectedDriverCrash(
            f"injected driver crash after the sink committed batch {batch_id}"
        )
    return report


async def _abort_async(opts: SinkOptions, messages: Sequence[SinkCommit | None]) -> None:
    jobs: list[Any] = []
    for i, m in enumerate(messages):
        if m is not None and m.transactional_id is not None:
            jobs.append(_finish(opts, m, False, None))
        elif m is None and opts.exactly_once:
            jobs.append(_fence(opts, f"{opts.transactional_id_prefix}-{i}"))
    for r in await asyncio.gather(*jobs, return_exceptions=True):
        if isinstance(r, BaseException):
            log.warning("abort: %s", r)


async def _fence(opts: SinkOptions, tid: str) -> None:
    """InitProducerId for ``tid``: the coordinator aborts its open transaction, if any."""
    p = AsyncProducer({**_txn_common(opts), "transactional.id": tid})
    try:
        await p.start()
        await p.init_transactions(timeout=30)
    finally:
        await p.close(5)


def abort_job(opts: SinkOptions, messages: Sequence[SinkCommit | None]) -> None:
    if opts.exactly_once:
        asyncio.run(_abort_async(opts, messages))


def committed_batches(opts: SinkOptions, parts: list[int]) -> dict[int, int | None]:
    """Marker offsets per Spark partition: the next batch id to commit (for tests/tools)."""
    return asyncio.run(_committed_markers(opts, parts, time.monotonic() + 30))
