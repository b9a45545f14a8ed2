"""The one owner of committed offsets (Kafka's ``OffsetMetadataManager``): plain and
transactional commits, their order, fetches, deletion, and the replay of transaction markers.

Theory of operation
-------------------
A committed offset is a record of ``__consumer_offsets`` (docs/semantics.md, rule 24). The
store builds the records for OffsetCommit and TxnOffsetCommit (checking only what is about
offsets: the metadata size; whether the member may commit is the group coordinator's
question, asked first), and changes only when records are replayed.

Every committed offset remembers its record's offset in the log, and a commit of a partition
replaces the committed one only if it is *later* in the log. That orders transactional against
plain commits as Kafka does: a TxnOffsetCommit is appended as a *transactional* batch carrying
the producer id (so the partition's last stable offset holds while the transaction is open),
and its records are staged under (offsets partition, producer id) until the transaction's
marker reaches that partition (rule 15): at a COMMIT they are replayed at their own log
offsets, so a plain OffsetCommit appended after them (before the marker) stays; an ABORT drops
them. While staged they are *pending*: a fetch with ``require_stable`` answers
UNSTABLE_OFFSET_COMMIT for the partition, a plain fetch the previously committed offset. An
offset tombstone (OffsetDelete, expiry, group deletion) also drops the pending offsets of that
partition, so a later COMMIT marker does not bring a deleted offset back.

Start-up reads each partition the same way (:meth:`OffsetStore.load_batch`): records of a
transactional batch wait for their producer's marker further on, and those still undecided
at the end stay staged, so a transaction committed after the restart still makes them visible.
Plain commits, nearly all of a log, are not replayed one by one: a run of them (up to the next
marker, transactional batch, record of another kind, or the partition's end) keeps only the
last record of each key, and only those are decoded and replayed, in log order. Each record
holds its key's whole state, so that leaves what replaying every record leaves; what the
earlier ones did besides (a tombstone dropping the key's pending transactional offsets, a
commit making its group one storing offsets) is redone for the key. A value that cannot be
read is skipped as before (told by its bytes for version 3 without metadata, decoded else).
A run holds at most :data:`MAX_RUN_KEYS` keys (then it is replayed and a new one begins).
Live markers reach :meth:`OffsetStore.replay_marker` through the marker listener the group
runtime registers.

This module is pure: no I/O and no clock.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from samsa.coordinator.offsets_records import (
    Key,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    Value,
    decode_key,
    decode_offset_value,
    decode_value,
    offset_value_readable,
)
from samsa.coordinator.ports import StoredBatch
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import ControlType

log = logging.getLogger("samsa.coordinator")

OFFSETS_TOPIC = "__consumer_offsets"

TopicPartition = tuple[str, int]

# Keys a partition's run of plain commits holds at most while it loads (OffsetStore.load_batch).
MAX_RUN_KEYS = 100_000


@dataclass(frozen=True, slots=True)
class CoordinatorRecord:
    """One record of ``__consumer_offsets``."""

    key: Key
    value: Value | None  # None: tombstone

    @property
    def group_id(self) -> str:
        return self.key.group


@dataclass(frozen=True, slots=True)
class OffsetToCommit:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""
    topic_id: uuid.UUID | None = None  # what a consumer group's assignments name it by


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    error: ErrorCode = ErrorCode.NONE


# A record of __consumer_offsets with its offset in the partition's log.
Positioned = tuple[int, CoordinatorRecord]


def decode(key: bytes, value: bytes | None) -> CoordinatorRecord:
    k = decode_key(key)
    return CoordinatorRecord(k, decode_value(k, value))


class OffsetStore:
    def __init__(self, metadata_max_bytes: int) -> None:
        self.metadata_max_bytes = metadata_max_bytes
        self._committed: dict[str, dict[TopicPartition, OffsetCommitValue]] = {}
        # (group, topic, partition) -> log offset of the record holding the committed offset.
        self._positions: dict[tuple[str, str, int], int] = {}
        # (offsets partition, producer id) -> staged transactional records, in commit order.
        self._staged: dict[tuple[int, int], list[Positioned]] = {}
        self._pending: dict[tuple[str, str, int], int] = {}  # (group, topic, partition) -> n
        # Start-up: each loading partition's plain commits not yet replayed (load_batch).
        self._runs: dict[int, _Run] = {}
        # A run is replayed once it holds this many keys: what it holds stays bounded.
        self.max_run_keys = MAX_RUN_KEYS

    # -- building records ---------------------------------------------------------------------

    def commit(
        self, group_id: str, offsets: Iterable[OffsetToCommit], error: ErrorCode, now_ms: int
    ) -> tuple[dict[TopicPartition, ErrorCode], list[CoordinatorRecord]]:
        """The per-partition errors and the records of a commit the group coordinator
        answered ``error`` for (NONE: the member may commit)."""
        errors: dict[TopicPartition, ErrorCode] = {}
        records: list[CoordinatorRecord] = []
        for o in offsets:
            tp = (o.topic, o.partition)
            if error != ErrorCode.NONE:
                errors[tp] = error
            elif len((o.metadata or "").encode()) > self.metadata_max_bytes:
                errors[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                errors[tp] = ErrorCode.NONE
                records.append(
                    CoordinatorRecord(
                        OffsetCommitKey(group_id, o.topic, o.partition),
                        OffsetCommitValue(o.offset, o.metadata or "", now_ms, o.leader_epoch),
                    )
                )
        return errors, records

    def tombstones(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> list[CoordinatorRecord]:
        """Records deleting the committed offsets of ``partitions`` that exist."""
        committed = self._committed.get(group_id, {})
        return [
            CoordinatorRecord(OffsetCommitKey(group_id, t, p), None)
            for t, p in sorted(partitions)
            if (t, p) in committed
        ]

    # -- reading ------------------------------------------------------------------------------

    def committed(self, group_id: str) -> dict[TopicPartition, OffsetCommitValue]:
        """The group's committed offsets (do not change the answer)."""
        return self._committed.get(group_id, {})

    def has_offsets(self, group_id: str) -> bool:
        return bool(self._committed.get(group_id))

    def fetch(
        self,
        group_id: str,
        topics: list[tuple[str, list[int]]] | None,
        require_stable: bool = False,
    ) -> list[FetchedOffset]:
        """Committed offsets; unknown ones are offset -1 with no error, as in Kafka. ``topics``
        None means every offset of the group. With ``require_stable``, a partition with
        pending transactional offsets answers UNSTABLE_OFFSET_COMMIT."""
        stored = self._committed.get(group_id, {})
        if topics is None:
            wanted = sorted(stored)
        else:
            wanted = [(t, p) for t, partitions in topics for p in partitions]
        out = []
        for t, p in wanted:
            v = stored.get((t, p))
            if require_stable and (group_id, t, p) in self._pending:
                out.append(FetchedOffset(t, p, -1, -1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT))
            elif v is None:
                out.append(FetchedOffset(t, p, -1, -1, ""))
            else:
                out.append(FetchedOffset(t, p, v.offset, v.leader_epoch, v.metadata))
        return out

    def state(self) -> dict[str, object]:
        """Everything the store holds (tests compare two replays by it): committed offsets,
        the log offset of each, staged transactional records and the pending counts."""
        return {
            "committed": {g: dict(sorted(v.items())) for g, v in sorted(self._committed.items())},
            "positions": dict(sorted(self._positions.items())),
            "staged": {k: list(v) for k, v in sorted(self._staged.items())},
            "pending": dict(sorted(self._pending.items())),
        }

    def held(self, partition: int) -> int:
        """Keys whose plain commits start-up holds back for ``partition`` (at most
        :attr:`max_run_keys`)."""
        run = self._runs.get(partition)
        return 0 if run is None else len(run.last)

    def is_pending(self, group_id: str, topic: str, partition: int) -> bool:
        return (group_id, topic, partition) in self._pending

    def pending_count(self) -> int:
        return sum(len(v) for v in self._staged.values())

    # -- replay -------------------------------------------------------------------------------

    def replay(self, record: CoordinatorRecord, log_offset: int | None = None) -> bool:
        """Apply one offset record; whether it changed the committed offset. ``log_offset``
        orders it (see the module docstring); without it the record applies as it is."""
        key, value = record.key, record.value
        assert isinstance(key, OffsetCommitKey)
        tp = (key.topic, key.partition)
        pos_key = (key.group, key.topic, key.partition)
        if value is None:
            group = self._committed.get(key.group)
            if group is not None:
                group.pop(tp, None)
                if not group:
                    del self._committed[key.group]
            self._positions.pop(pos_key, None)
            self._drop_pending(pos_key)
            return True
        assert isinstance(value, OffsetCommitValue)
        group = self._committed.setdefault(key.group, {})
        if log_offset is None:
            self._positions.pop(pos_key, None)
        else:
            current = self._positions.get(pos_key)
            if current is not None and current > log_offset and tp in group:
                log.info(
                    "group %s: offset of %s-%d at %d not applied: the committed one is later "
                    "in the log (%d)",
                    key.group,
                    key.topic,
                    key.partition,
                    log_offset,
                    current,
                )
                return False
            self._positions[pos_key] = log_offset
        group[tp] = value
        return True

    def forget_group(self, group_id: str) -> None:
        """Drop every committed offset of a group (its records were tombstoned)."""
        for tp in list(self._committed.pop(group_id, {})):
            self._positions.pop((group_id, *tp), None)

    def stage(self, partition: int, producer_id: int, positioned: Iterable[Positioned]) -> None:
        """Stage transactional records written to ``partition`` at their log offsets."""
        staged = self._staged.setdefault((partition, producer_id), [])
        for offset, r in positioned:
            staged.append((offset, r))
            k = _tp_key(r)
            if k is not None:
                self._pending[k] = self._pending.get(k, 0) + 1

    def replay_marker(self, partition: int, producer_id: int, commit: bool) -> list[Positioned]:
        """The marker of ``producer_id``'s transaction reached offsets partition ``partition``:
        the staged records it made visible (commit) with their log offsets, or none (abort).
        The caller replays them."""
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

    def load_batch(self, partition: int, batch: StoredBatch) -> Iterator[Positioned]:
        """One stored batch of offsets partition ``partition`` at start-up: the records that
        take effect here, with their log offsets, in log order (transactional ones at their
        COMMIT marker; undecided ones are staged). Plain offset commits are held in the
        partition's run instead and come out, collapsed, before whatever must follow them:
        a marker, a transactional batch, a record of another kind, :meth:`end_load`."""
        if batch.control is not None:
            yield from self._end_run(partition)
            yield from self.replay_marker(
                partition, batch.producer_id, batch.control == ControlType.COMMIT
            )
            return
        if batch.transactional and batch.producer_id >= 0:
            yield from self._end_run(partition)
            self.stage(partition, batch.producer_id, _decoded(batch.rows()))
            return
        run = self._runs.get(partition)
        if run is None:
            run = self._runs[partition] = _Run()
        last = run.last
        for offset, key, value in batch.rows():
            if key not in last:  # a key new to the run: is it an offset commit's, is there room
                if key is None:
                    continue
                if len(key) < 2 or key[0] or key[1] > 1:  # not key version 0/1: another kind
                    yield from self._end_run(partition)
                    yield from _decoded([(offset, key, value)])
                    run = self._runs[partition] = _Run()
                    last = run.last
                    continue
                if len(last) >= self.max_run_keys:
                    yield from self._end_run(partition)
                    run = self._runs[partition] = _Run()
                    last = run.last
            if value is None:
                prior = last.get(key)
                if prior is not None and prior[1] is not None:
                    run.committed_before[key] = prior
                run.tombstoned.add(key)
            elif not offset_value_readable(value):  # by its bytes for nearly every value
                log.warning("skipping %s record at %d: unreadable value", OFFSETS_TOPIC, offset)
                continue
            last[key] = (offset, value)

    def end_load(self, partition: int) -> Iterator[Positioned]:
        """``partition`` is read to its end: what its run still holds."""
        return self._end_run(partition)

    def _end_run(self, partition: int) -> Iterator[Positioned]:
        """The plain commits held for ``partition``, the last of each key, in log order.

        Replaying only the last record of a key leaves what replaying them all leaves: each
        record holds the key's whole state and, read in log order, is always applied
        (:meth:`replay`). What earlier ones also did is done here: a tombstone dropped the
        key's pending transactional offsets; a commit made its group one storing offsets,
        so a key ending in a tombstone replays its last commit before it."""
        run = self._runs.pop(partition, None)
        if run is None or not run.last:
            return
        for raw, (offset, value) in sorted(run.last.items(), key=_by_offset):
            try:
                key = decode_key(raw)
            except RecordFormatError as exc:
                log.warning("skipping %s records of a key: %s", OFFSETS_TOPIC, exc)
                continue
            assert isinstance(key, OffsetCommitKey)
            if raw in run.tombstoned:
                self._drop_pending((key.group, key.topic, key.partition))
                committed = run.committed_before.get(raw)
                if value is None and committed is not None:
                    yield committed[0], CoordinatorRecord(key, decode_offset_value(committed[1]))
            record = CoordinatorRecord(key, None if value is None else decode_offset_value(value))
            yield offset, record

    def _drop_pending(self, k: tuple[str, str, int]) -> None:
        if k not in self._pending:
            return
        for staged_key, staged in list(self._staged.items()):
            kept = [(o, r) for o, r in staged if _tp_key(r) != k]
            if len(kept) != len(staged):
                if kept:
                    self._staged[staged_key] = kept
                else:
                    del self._staged[staged_key]
        del self._pending[k]


def _tp_key(record: CoordinatorRecord) -> tuple[str, str, int] | None:
    key = record.key
    if isinstance(key, OffsetCommitKey):
        return (key.group, key.topic, key.partition)
    return None


class _Run:
    """The plain offset commits of a partition read at start-up and not yet replayed:
    the last (log offset, value) of each key, by its bytes (two spellings of one key are
    two entries, replayed in log order), and what earlier records of a key did that its
    last does not say."""

    __slots__ = ("committed_before", "last", "tombstoned")

    def __init__(self) -> None:
        self.last: dict[bytes, tuple[int, bytes | None]] = {}
        self.tombstoned: set[bytes] = set()  # keys with a tombstone in the run
        # key -> its last commit before a tombstone
        self.committed_before: dict[bytes, tuple[int, bytes]] = {}


def _by_offset(entry: tuple[bytes, tuple[int, bytes | None]]) -> int:
    return entry[1][0]


def _decoded(rows: Iterable[tuple[int, bytes | None, bytes | None]]) -> list[Positioned]:
    """The records of ``rows`` one by one, those that cannot be read skipped (and said)."""
    out: list[Positioned] = []
    for offset, key, value in rows:
        if key is None:
            continue
        try:
            out.append((offset, decode(key, value)))
        except RecordFormatError as exc:
            log.warning("skipping %s record at %d: %s", OFFSETS_TOPIC, offset, exc)
    return out
