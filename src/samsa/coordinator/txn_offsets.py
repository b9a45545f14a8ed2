"""Transactional offsets (TxnOffsetCommit): staged until the transaction's marker decides them.

Theory of operation
-------------------
TxnOffsetCommit appends the offsets to the group's ``__consumer_offsets`` partition as a
*transactional* batch carrying the producer id (so the partition's last stable offset holds
while the transaction is open) and stages them here under (offsets partition, producer id).
When the transaction's COMMIT marker reaches that partition they are replayed into the
group coordinator; an ABORT marker drops them. Until then they are *pending*: OffsetFetch
with ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for them, and a plain OffsetFetch
still returns the previously committed offset.

Ordering against plain commits follows the log, as in Kafka: every staged record keeps its
own offset in ``__consumer_offsets``, and so does every committed offset (the group
coordinator's ``replay`` takes it). At the COMMIT marker a transactional offset replaces the
committed one only if that one's record is *earlier* in the log than the transactional
record; a plain OffsetCommit appended after the TxnOffsetCommit (before the marker) wins.

Start-up replays the partition the same way (:func:`replay_partition`): records of a
transactional batch wait for their producer's marker further on; those with no marker yet
stay pending, so a transaction committed after the restart still makes them visible. Replay
hands the same log offsets to the coordinator as the live path, so both decide alike.

The group coordinator's side is three calls:

- ``GroupCoordinatorRuntime.__init__``: ``self.txn_offsets = PendingTxnOffsets()``;
- ``GroupCoordinatorRuntime.load``: read each partition with
  ``replay_partition(partition.log, index, self.txn_offsets)`` instead of a plain read;
- a marker listener (:func:`on_marker`, registered by the transaction runtime) calls
  ``complete`` and replays what a commit made visible.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from samsa.coordinator.group_coordinator import CoordinatorRecord
from samsa.coordinator.internal_topic import read_batches
from samsa.coordinator.offsets_records import (
    OffsetCommitKey,
    RecordFormatError,
    decode_key,
    decode_value,
)
from samsa.log.log import Log
from samsa.protocol.records import ControlType

log = logging.getLogger("samsa.coordinator")

OFFSETS_TOPIC = "__consumer_offsets"


# A record of __consumer_offsets with its offset in the partition's log.
Positioned = tuple[int, CoordinatorRecord]


class PendingTxnOffsets:
    """(offsets partition, producer id) -> staged offset records with their log offsets, in
    commit order.

    ``log_end`` (partition -> its log end offset) lets :meth:`stage` place records that were
    just appended as one batch when the caller does not say where they are."""

    def __init__(self, log_end: Callable[[int], int] | None = None) -> None:
        self._log_end = log_end
        self._staged: dict[tuple[int, int], list[Positioned]] = {}
        self._pending: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> n

    def stage(
        self,
        partition: int,
        producer_id: int,
        records: list[CoordinatorRecord],
        base_offset: int | None = None,
    ) -> None:
        """Stage ``records``, one batch at ``base_offset`` of ``partition`` (record i at
        ``base_offset + i``). Without ``base_offset`` the batch must be the last one appended
        to the partition: it ends at the log end offset."""
        if base_offset is None:
            if self._log_end is None:
                raise ValueError("stage needs base_offset: no log_end to place the batch")
            base_offset = self._log_end(partition) - len(records)
        staged = self._staged.setdefault((partition, producer_id), [])
        for i, r in enumerate(records):
            staged.append((base_offset + i, r))
            k = _tp_key(r)
            if k is not None:
                self._pending[k] = self._pending.get(k, 0) + 1

    def complete(self, partition: int, producer_id: int, commit: bool) -> list[Positioned]:
        """The marker for ``producer_id`` reached ``partition``: the records to replay, with
        their log offsets (commit), or nothing (abort)."""
        records = self._staged.pop((partition, producer_id), [])
        for _, r in records:
            k = _tp_key(r)
            if k is not None:
                left = self._pending.get(k, 0) - 1
                if left > 0:
                    self._pending[k] = left
                else:
                    self._pending.pop(k, None)
        return records if commit else []

    def drop(self, record: CoordinatorRecord) -> None:
        """An offset tombstone (OffsetDelete, expiry, group deletion) was replayed: the
        pending transactional offsets of that group partition go too, as in Kafka, so a
        later COMMIT marker does not bring the deleted offset back."""
        k = _tp_key(record)
        if record.value is not None or k is None or k not in self._pending:
            return
        for staged_key, staged in list(self._staged.items()):
            kept = [(o, r) for o, r in staged if _tp_key(r) != k]
            if len(kept) != len(staged):
                if kept:
                    self._staged[staged_key] = kept
                else:
                    del self._staged[staged_key]
        del self._pending[k]

    def is_pending(self, group_id: str, topic: str, partition: int) -> bool:
        return (group_id, topic, partition) in self._pending

    def __len__(self) -> int:
        return sum(len(v) for v in self._staged.values())


def _tp_key(record: CoordinatorRecord) -> tuple[str, str, int] | None:
    key = record.key
    if isinstance(key, OffsetCommitKey):
        return (key.group, key.topic, key.partition)
    return None


def decode(key: bytes, value: bytes | None) -> CoordinatorRecord:
    k = decode_key(key)
    return CoordinatorRecord(k, decode_value(k, value))


def replay_partition(plog: Log, partition: int, pending: PendingTxnOffsets) -> Iterator[Positioned]:
    """The records of one ``__consumer_offsets`` partition, each with its log offset, in the
    order they take effect: plain records where they are, transactional ones at their COMMIT
    marker (dropped at an ABORT); those still undecided at the end are left staged in
    ``pending``. The coordinator's ``replay`` decides by the log offsets which of a
    transactional and a plain commit of the same partition is the newer."""
    for batch in read_batches(plog):
        if batch.control is not None:
            commit = batch.control == ControlType.COMMIT
            yield from pending.complete(partition, batch.producer_id, commit)
            continue
        decoded: list[Positioned] = []
        for rec in batch.records:
            if rec.key is None:
                continue
            try:
                decoded.append((rec.offset, decode(rec.key, rec.value)))
            except RecordFormatError as exc:
                log.warning("skipping %s record at %d: %s", OFFSETS_TOPIC, rec.offset, exc)
        if batch.transactional and batch.producer_id >= 0:
            for offset, r in decoded:  # one by one: compaction may leave gaps in a batch
                pending.stage(partition, batch.producer_id, [r], base_offset=offset)
        else:
            yield from decoded


def on_marker(
    groups: Any, topic: str, partition: int, producer_id: int, commit: bool, now_ms: int
) -> None:
    """A marker was written: make a committed transaction's offsets visible in the group
    coordinator (``groups`` is the ``GroupCoordinatorRuntime``)."""
    if topic != OFFSETS_TOPIC:
        return
    pending: PendingTxnOffsets | None = getattr(groups, "txn_offsets", None)
    if pending is None:
        return
    for offset, record in pending.complete(partition, producer_id, commit):
        groups.coordinator.replay(record, now_ms, offset)
