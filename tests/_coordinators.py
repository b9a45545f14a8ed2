"""The coordinators' unit-test harness: one in-memory port, and the real runtime around a shard.

:class:`MemoryLog` is the :class:`~samsa.coordinator.ports.CoordinatorLog` port in memory: an
append is one batch of the records' bytes at the partition's next offsets, a marker one control
batch, and ``read`` gives the batches back as start-up reads a log. :class:`CoordinatorHarness`
runs a shard's outcomes through the broker's own
:class:`~samsa.coordinator.runtime.CoordinatorRuntime` over it, so a test sees what the broker
does: records serialised, appended, and replayed at the offsets they were written at (the
order :meth:`OffsetStore.replay <samsa.coordinator.offsets.OffsetStore.replay>` keeps);
:meth:`CoordinatorHarness.rebuilt` replays the log into a fresh shard as a restart does.

Tests import it as ``from _coordinators import CoordinatorHarness`` (tests/ is on the path, as
for ``_broker``). It lives here, not in ``samsa.testing``, because ``testing/`` may not import
``coordinator/`` (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from samsa.coordinator.ports import Appended, MarkerGate, MarkerListener, OnDamage, StoredBatch
from samsa.coordinator.runtime import CoordinatorRuntime, CoordinatorShard, Outcome
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import NO_PRODUCER_ID, ControlType

RecT = TypeVar("RecT")
R = TypeVar("R")
ShardT = TypeVar("ShardT", bound=CoordinatorShard)  # type: ignore[type-arg]


class MemoryLog:
    """Internal topics in memory: batches per partition, offsets counted as a log counts them."""

    def __init__(self) -> None:
        self.batches: dict[str, list[list[StoredBatch]]] = {}
        self.entries: list[tuple[bytes, bytes | None]] = []  # every record appended, in order
        self.flushes: list[tuple[str, int]] = []
        self._ends: dict[tuple[str, int], int] = {}
        self._listeners: list[MarkerListener] = []
        self._gates: list[MarkerGate] = []

    def ensure_topic(self, topic: str, num_partitions: int) -> None:
        self.batches.setdefault(topic, [[] for _ in range(num_partitions)])

    def partition_count(self, topic: str) -> int | None:
        partitions = self.batches.get(topic)
        return None if partitions is None else len(partitions)

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
        base = self._ends.get((topic, partition), 0)
        self._add(
            topic,
            partition,
            StoredBatch(
                base,
                producer_id,
                producer_epoch,
                transactional,
                None,
                range(base, base + len(records)),
                [k for k, _ in records],
                [v for _, v in records],
            ),
            len(records),
        )
        self.entries += records
        return Appended(ErrorCode.NONE, base)

    def write_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
    ) -> ErrorCode:
        for gate in self._gates:
            if (refused := gate(topic, partition)) != ErrorCode.NONE:
                return refused
        control = ControlType.COMMIT if commit else ControlType.ABORT
        base = self._ends.get((topic, partition), 0)
        self._add(
            topic, partition, StoredBatch(base, producer_id, producer_epoch, True, control), 1
        )
        for listener in self._listeners:
            listener(topic, partition, producer_id, commit)
        return ErrorCode.NONE

    def add_marker_listener(self, listener: MarkerListener) -> None:
        self._listeners.append(listener)

    def add_marker_gate(self, gate: MarkerGate) -> None:
        self._gates.append(gate)

    def flush(self, topic: str, partition: int) -> None:
        self.flushes.append((topic, partition))

    def read(self, topic: str, partition: int, on_damage: OnDamage) -> Iterator[StoredBatch]:
        yield from self.batches[topic][partition]

    def _add(self, topic: str, partition: int, batch: StoredBatch, size: int) -> None:
        self.batches[topic][partition].append(batch)
        self._ends[(topic, partition)] = batch.base_offset + size


class CoordinatorHarness(Generic[RecT]):
    """A shard run by the real runtime over a :class:`MemoryLog`, at the fake time ``now``."""

    def __init__(self, shard: CoordinatorShard[RecT], now: int = 1_000_000) -> None:
        self.log = MemoryLog()
        self.now = now
        self.runtime = CoordinatorRuntime(shard, self.log, lambda: self.now, "test")

    def run(self, outcome: Outcome[RecT, R]) -> R:
        """Write the outcome's records as the runtime does; its response."""
        assert self.runtime.write(outcome.records) == ErrorCode.NONE
        return outcome.response

    def rebuilt(self, fresh: ShardT) -> ShardT:
        """``fresh`` (a new shard) after the start-up replay of everything written so far."""
        CoordinatorRuntime(fresh, self.log, lambda: self.now, "rebuilt").load()
        return fresh

    def restart(self, fresh: ShardT) -> ShardT:
        """As :meth:`rebuilt`, and outcomes run on ``fresh`` from now on: a broker restarted."""
        self.runtime = CoordinatorRuntime(fresh, self.log, lambda: self.now, "test")
        self.runtime.load()
        return fresh
