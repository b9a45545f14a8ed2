"""Plumbing shared by the coordinators' internal topics (``__consumer_offsets``,
``__transaction_state``): create on demand, append key/value records as one batch, read a
partition back for replay.

Appends go through the partition's own :class:`~samsa.log.log.Log` as ``COORDINATOR``: one
batch, in the kernel before the call returns (so it survives ``kill -9``), and producer state
is not validated (the coordinator is the writer, as Kafka's ``AppendOrigin.COORDINATOR``).
A batch can carry a producer id and the transactional flag: TxnOffsetCommit writes its
offsets that way, so the commit/abort marker on the partition decides them.

Replay checks every batch's CRC-32C, whatever the shutdown was: a coordinator record that is
not what was written (a flipped bit can turn a committed offset or a producer id into another
valid-looking number) is never applied. It is skipped with an error naming where it is, as
are bytes that are not a batch at all (the rest of that segment), and the caller is told, in
order, so it can tell which of its keys may have lost a newer record: every record holds a
key's whole state, so a key with a surviving record after the damage is unaffected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from samsa.broker.topics import TopicError, TopicManager
from samsa.log.log import Log
from samsa.log.producer_state import AppendOrigin
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
    result = p.log.append(RecordBatchView(batch), now_ms, AppendOrigin.COORDINATOR)
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


OnDamage = Callable[[str], None]


def read_batches(plog: Log, on_damage: OnDamage | None = None) -> Iterator[StoredBatch]:
    """Every intact batch of the partition from its log start, markers included, in order;
    ``on_damage`` is called where something is skipped (see the module docstring)."""

    def damaged(what: str) -> None:
        log.error("replay of %s: %s; not applied", plog.directory, what)
        if on_damage is not None:
            on_damage(what)

    for view in plog.verified_batches(damaged):
        try:
            control = control_type_of(view) if view.is_control else None
            records = [] if view.is_control else decode_records(view)
        except ValueError as exc:
            # Intact but not understood: as unusable as a corrupt one.
            damaged(f"unreadable batch at offset {view.base_offset}: {exc}")
            continue
        yield StoredBatch(
            view.producer_id,
            view.producer_epoch,
            view.is_transactional,
            control,
            records,
        )


def read_key_values(
    plog: Log, on_damage: OnDamage | None = None
) -> Iterator[tuple[bytes, bytes | None]]:
    """The (key, value) of every keyed, non-control record, in order (plain replay)."""
    for batch in read_batches(plog, on_damage):
        for rec in batch.records:
            if rec.key is not None:
                yield rec.key, rec.value
