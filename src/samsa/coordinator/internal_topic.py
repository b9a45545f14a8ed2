"""Plumbing shared by the coordinators' internal topics (``__consumer_offsets``,
``__transaction_state``): create on demand, append key/value records as one batch, read a
partition back for replay.

Appends go through the partition's own :class:`~samsa.log.log.Log` with ``append_raw``: one
batch, in the kernel before the call returns (so it survives ``kill -9``), and producer state
is not validated (the coordinator is the writer, as Kafka's ``AppendOrigin.COORDINATOR``).
A batch can carry a producer id and the transactional flag: TxnOffsetCommit writes its
offsets that way, so the commit/abort marker on the partition decides them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from samsa.broker.topics import TopicError, TopicManager
from samsa.log.log import Log, OffsetOutOfRangeError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    NO_PRODUCER_ID,
    NewRecord,
    Record,
    RecordBatchView,
    build_batch,
    control_type_of,
    decode_records,
)

log = logging.getLogger("samsa.coordinator")

_READ_CHUNK = 1 << 20


def ensure_topic(topics: TopicManager, name: str, num_partitions: int, now_ms: int) -> None:
    """Create the internal topic with ``num_partitions`` unless it exists."""
    if name in topics.topics:
        return
    try:
        topics.create(name, num_partitions, now_ms)
    except TopicError as exc:
        if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
            raise


def append_records(
    topics: TopicManager,
    name: str,
    partition: int,
    records: Sequence[tuple[bytes, bytes | None]],
    now_ms: int,
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    transactional: bool = False,
) -> ErrorCode:
    """Append ``(key, value)`` records (value None: tombstone) to one partition as one batch
    and wake its fetchers. The topic must exist."""
    p = topics.get_partition(name, partition)
    if p is None:
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        log.error("cannot write %s-%d: %s", name, partition, error.name)
        return error
    batch = build_batch(
        [NewRecord(value=v, key=k, timestamp=now_ms) for k, v in records],
        now_ms=now_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        # A transactional batch needs a sequence; the coordinator's never repeat one.
        base_sequence=0 if producer_id >= 0 else -1,
        transactional=transactional,
    )
    result = p.log.append_raw(RecordBatchView(batch), now_ms)
    if result.error != ErrorCode.NONE:
        log.error("cannot write %s-%d: %s", name, partition, result.error.name)
        return result.error
    p.notify()
    return ErrorCode.NONE


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One batch of an internal topic as replay sees it."""

    producer_id: int
    producer_epoch: int
    transactional: bool
    control: int | None  # ControlType (ABORT 0 / COMMIT 1) for a marker, else None
    records: list[Record]


def read_batches(plog: Log) -> Iterator[StoredBatch]:
    """Every batch of the partition from its log start, markers included, in order."""
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        try:
            result = plog.read(offset, _READ_CHUNK)
        except OffsetOutOfRangeError:
            return
        if not result.chunks:
            return
        for chunk in result.chunks:
            pos = 0
            while pos < len(chunk):
                view = RecordBatchView(chunk, pos)
                pos += view.size
                offset = view.next_offset
                try:
                    control = control_type_of(view) if view.is_control else None
                    records = [] if view.is_control else decode_records(view)
                except ValueError as exc:
                    log.warning("skipping an unreadable batch of %s: %s", plog.directory, exc)
                    continue
                yield StoredBatch(
                    view.producer_id,
                    view.producer_epoch,
                    view.is_transactional,
                    control,
                    records,
                )


def read_key_values(plog: Log) -> Iterator[tuple[bytes, bytes | None]]:
    """The (key, value) of every keyed, non-control record, in order (plain replay)."""
    for batch in read_batches(plog):
        for rec in batch.records:
            if rec.key is not None:
                yield rec.key, rec.value
