"""What the coordinators need from the broker, and nothing more (Kafka's coordinator-common
``PartitionWriter`` and ``CoordinatorLoader``).

The coordinators keep their state in internal topics (``__consumer_offsets``,
``__transaction_state``) but never touch a log, a topic manager or a file: they see the
storage only through :class:`CoordinatorLog`, which ``broker/coordinator_log.py`` implements
over the broker's partitions. So the coordinator package imports nothing above
``protocol/`` (docs/architecture.md), and a test can hand a coordinator any storage.

- :meth:`CoordinatorLog.ensure_topic` creates an internal topic on first use with the
  configured partition count; it raises :class:`StoreUnavailable` when it cannot (nothing is
  created then, so the count is fixed by the first use that succeeds).
- :meth:`CoordinatorLog.append` writes key/value records as one batch and answers the offsets
  it wrote (:class:`Appended`); the coordinators replay them at those offsets.
- :meth:`CoordinatorLog.read` gives a partition back for replay, batch by batch, CRC-checked:
  damage is skipped and reported, never applied (docs/semantics.md, rule 26).
- :meth:`CoordinatorLog.write_marker` writes a transaction's COMMIT/ABORT marker to any
  partition and tells the marker listeners (rule 16).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import NO_PRODUCER_ID


class StoreUnavailable(Exception):
    """An internal topic cannot be created now (e.g. a full disk); a later try may succeed."""


@dataclass(frozen=True, slots=True)
class Appended:
    """The answer to an append: NONE and where the batch went (record i at ``base_offset +
    i``), or the error that kept it from being written (nothing was)."""

    error: ErrorCode
    base_offset: int = -1


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One intact batch of an internal topic as replay sees it: its records as columns
    (record i: ``offsets[i]``, ``keys[i]``, ``values[i]``), no object per record, as
    replay reads millions of them (``protocol.records.record_columns``)."""

    base_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: int | None  # ControlType (ABORT 0 / COMMIT 1) for a marker, else None
    offsets: Sequence[int] = ()
    keys: Sequence[bytes | None] = ()
    values: Sequence[bytes | None] = ()  # None: a tombstone

    def rows(self) -> Iterator[tuple[int, bytes | None, bytes | None]]:
        """(offset, key, value) of each record, in order."""
        return zip(self.offsets, self.keys, self.values, strict=True)


# Told what was skipped (damage), in log order, while a partition is read.
OnDamage = Callable[[str], None]

# (topic, partition, producer id, committed): a marker was written.
MarkerListener = Callable[[str, int, int, bool], None]

# (topic, partition): NONE if a marker may be written there now, else the error to answer
# (a coordinator partition still being replayed: COORDINATOR_LOAD_IN_PROGRESS).
MarkerGate = Callable[[str, int], ErrorCode]


class PartitionWriter(Protocol):
    def ensure_topic(self, topic: str, num_partitions: int) -> None:
        """Create ``topic`` with ``num_partitions`` unless it exists; StoreUnavailable if
        it cannot be created now."""

    def partition_count(self, topic: str) -> int | None:
        """The partitions ``topic`` has, or None if it does not exist."""

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes | None]],
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = -1,
        transactional: bool = False,
    ) -> Appended:
        """Append ``(key, value)`` records (value None: a tombstone) as one batch, durable
        against a crash of the process once this returns. A transactional batch carries the
        producer id: the marker on the partition decides it."""

    def write_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
    ) -> ErrorCode:
        """Write a COMMIT/ABORT marker to a partition unless a marker gate refuses it (its
        error is answered, nothing written); the marker listeners are told."""

    def add_marker_listener(self, listener: MarkerListener) -> None:
        """Call ``listener`` after every marker written (by any coordinator)."""

    def add_marker_gate(self, gate: MarkerGate) -> None:
        """Ask ``gate`` before every marker is written."""

    def flush(self, topic: str, partition: int) -> None:
        """Make the partition durable against a power loss (fsync)."""


class CoordinatorLoader(Protocol):
    def read(self, topic: str, partition: int, on_damage: OnDamage) -> Iterator[StoredBatch]:
        """Every intact batch of the partition from its log start, markers included, in
        order. ``on_damage`` is told, in order, wherever something was skipped (a batch
        failing its CRC, bytes that are not a batch) and, at the end, if the partition's
        tail was cut when it was opened: what follows may have been lost."""


class CoordinatorLog(PartitionWriter, CoordinatorLoader, Protocol):
    """Both ports: what a coordinator runtime is given."""
