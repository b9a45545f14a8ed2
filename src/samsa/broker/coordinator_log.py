"""The broker's side of the coordinators' ports (``coordinator/ports.py``): their internal
topics are ordinary partitions of :class:`~samsa.broker.topics.TopicManager`.

Appends go through the partition's own :class:`~samsa.log.log.Log` with the coordinator as
the append's origin (``AppendOrigin.COORDINATOR``, as in Kafka): one batch, in the kernel
before the call returns (so it survives ``kill -9``), producer state not validated because the
coordinator is the writer. A batch can carry a producer id and the transactional flag:
TxnOffsetCommit writes its offsets that way, so the marker on the partition decides them.

Replay checks every batch's CRC-32C, whatever the shutdown was: a coordinator record that is
not what was written (a flipped bit can turn a committed offset or a producer id into another
valid-looking number) is never applied. It is skipped with an error naming where it is, as
are bytes that are not a batch at all (the rest of that segment), and the caller is told, in
order, so it can tell which of its keys may have lost a newer record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from samsa.broker.topics import TopicError, TopicManager
from samsa.coordinator.ports import (
    Appended,
    MarkerGate,
    MarkerListener,
    OnDamage,
    StoredBatch,
    StoreUnavailable,
)
from samsa.log.producer_state import AppendOrigin
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    NO_PRODUCER_ID,
    NewRecord,
    RecordBatchView,
    build_batch,
    control_type_of,
    record_columns,
)

log = logging.getLogger("samsa.coordinator")


class CoordinatorLogs:
    """:class:`~samsa.coordinator.ports.CoordinatorLog` over the broker's topics."""

    def __init__(self, topics: TopicManager, clock: Callable[[], int]) -> None:
        self.topics = topics
        self.clock = clock
        self.marker_listeners: list[MarkerListener] = []
        self.marker_gates: list[MarkerGate] = []

    # -- PartitionWriter ----------------------------------------------------------------------

    def ensure_topic(self, topic: str, num_partitions: int) -> None:
        if topic in self.topics.topics:
            return
        try:
            self.topics.create(topic, num_partitions, self.clock())
        except TopicError as exc:
            if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                log.error("cannot create %s: %s", topic, exc)
                raise StoreUnavailable(str(exc)) from None

    def partition_count(self, topic: str) -> int | None:
        t = self.topics.topics.get(topic)
        return None if t is None else len(t.partitions)

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
        p = self.topics.get_partition(topic, partition)
        if p is None:
            log.error("cannot write %s-%d: it is not served", topic, partition)
            return Appended(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        now = self.clock()
        batch = build_batch(
            [NewRecord(value=v, key=k, timestamp=now) for k, v in records],
            now_ms=now,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            # A transactional batch needs a sequence; the coordinator's never repeat one.
            base_sequence=0 if producer_id >= 0 else -1,
            transactional=transactional,
        )
        result = p.log.append(RecordBatchView(batch), now, AppendOrigin.COORDINATOR)
        if result.error != ErrorCode.NONE:
            log.error("cannot write %s-%d: %s", topic, partition, result.error.name)
            return Appended(result.error)
        p.notify()
        return Appended(ErrorCode.NONE, result.base_offset)

    def write_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
    ) -> ErrorCode:
        p = self.topics.get_partition(topic, partition)
        if p is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        for gate in self.marker_gates:
            # A coordinator partition still replaying: the marker job retries, so the marker
            # lands after the replay and is applied by the live path, never half of both.
            if (refused := gate(topic, partition)) != ErrorCode.NONE:
                return refused
        result = p.log.append_end_txn_marker(
            producer_id, producer_epoch, coordinator_epoch, commit, self.clock()
        )
        if result.error == ErrorCode.NONE:
            p.notify()
            for listener in list(self.marker_listeners):
                listener(topic, partition, producer_id, commit)
        return result.error

    def add_marker_listener(self, listener: MarkerListener) -> None:
        self.marker_listeners.append(listener)

    def add_marker_gate(self, gate: MarkerGate) -> None:
        self.marker_gates.append(gate)

    def flush(self, topic: str, partition: int) -> None:
        p = self.topics.get_partition(topic, partition)
        if p is not None:
            p.log.flush()

    # -- CoordinatorLoader --------------------------------------------------------------------

    def read(self, topic: str, partition: int, on_damage: OnDamage) -> Iterator[StoredBatch]:
        p = self.topics.get_partition(topic, partition)
        if p is None:
            return
        plog = p.log

        def damaged(what: str) -> None:
            log.error("replay of %s: %s; not applied", plog.directory, what)
            on_damage(what)

        for view in plog.verified_batches(damaged):
            try:
                control = control_type_of(view) if view.is_control else None
                columns = ([], [], []) if view.is_control else record_columns(view)
            except ValueError as exc:
                # Intact but not understood: as unusable as a corrupt one.
                damaged(f"unreadable batch at offset {view.base_offset}: {exc}")
                continue
            yield StoredBatch(
                view.base_offset,
                view.producer_id,
                view.producer_epoch,
                view.is_transactional,
                control,
                *columns,
            )
        if plog.load_report.lost_records:
            on_damage("the log's tail was cut when it was opened")
