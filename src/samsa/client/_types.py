"""Public value types of the client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndEpoch(NamedTuple):
    """An offset and the leader epoch of the record before it (-1: unknown), as Kafka's
    OffsetCommit, TxnOffsetCommit and OffsetFetch carry them."""

    offset: int
    leader_epoch: int = -1


class RecordMetadata(NamedTuple):
    """Where a produced record landed. ``offset`` is -1 when the broker answered
    DUPLICATE_SEQUENCE_NUMBER without an offset, or when a resumed producer skipped a
    record its previous incarnation had already written (``duplicate`` is then True).

    A named tuple rather than a dataclass: one is made per delivered record, and a frozen
    dataclass cost ~0.5 us each, 40% of the caller's time with a delivery callback."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    duplicate: bool = False


class ConsumerRecord(NamedTuple):
    """A fetched record. A named tuple, as RecordMetadata: poll() makes one per record, and
    a frozen dataclass's __init__ (one object.__setattr__ per field) cost ~1.6 us each, 60% of
    the consumer thread's time in benchmarks/client.py. protocol/_records.c makes them
    (tuple-subclass instances filled in C, ~0.15 us with their bytes); its layout, a tuple
    subclass with no storage of its own, is what lets it."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_type: int = 0  # 0 CreateTime, 1 LogAppendTime
    producer_id: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ProducerState:
    """An idempotent producer's identity, enough to resume it in another process.

    ``sequences`` maps (topic, partition) to the sequence the next record would get. Take
    it with :meth:`Producer.state` after :meth:`Producer.flush`, store it atomically with
    the input position it corresponds to, and pass it to ``Producer(config, state=...)``.
    """

    producer_id: int
    epoch: int
    sequences: dict[TopicPartition, int] = field(default_factory=dict)
    transactional_id: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "transactional_id": self.transactional_id,
            "sequences": [[tp.topic, tp.partition, s] for tp, s in self.sequences.items()],
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProducerState:
        seqs = data.get("sequences") or []
        assert isinstance(seqs, list)
        return cls(
            producer_id=int(data["producer_id"]),  # type: ignore[call-overload]
            epoch=int(data["epoch"]),  # type: ignore[call-overload]
            sequences={TopicPartition(str(t), int(p)): int(s) for t, p, s in seqs},
            transactional_id=data.get("transactional_id"),  # type: ignore[arg-type]
        )


@dataclass(slots=True)
class ProducerStats:
    """What a producer's retries came to, counted as batches: how a caller sees that the
    broker deduplicated a resend (Kafka answers a retry of a batch it has already written
    with that batch's offsets and no error; samsa's broker and old Kafka answer
    DUPLICATE_SEQUENCE_NUMBER). Written by the producer's loop thread only."""

    resends: int = 0  # Produce attempts of a batch after its first
    retried_acknowledged: int = 0  # batches acknowledged after more than one attempt
    duplicate_sequence: int = 0  # of those, answered DUPLICATE_SEQUENCE_NUMBER
    epoch_bumps: int = 0  # idempotent epoch bumps (a sequence gap or divergence)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error: int = 0


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    partitions: tuple[PartitionMetadata, ...]
    topic_id: str | None = None
    internal: bool = False
    error: int = 0


@dataclass(frozen=True, slots=True)
class ProducerInfo:
    """One active producer on a partition, as DescribeProducers reports it."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create; ``replication_factor`` -1 takes the broker's
    default.replication.factor (as Kafka's admin clients do), so that the same code makes
    replicated topics on a cluster."""

    name: str
    num_partitions: int = 1
    replication_factor: int = -1
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """What ``send_offsets_to_transaction`` needs to know of a consumer's group membership.

    With a generation and member id the group coordinator refuses the offsets of a member
    that was fenced by a rebalance (zombie consumers); a bare group id (generation -1) is
    accepted unconditionally, which is what a driver committing for its tasks wants.
    """

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedTransaction:
    """An open transaction handed to another process to finish (``Producer.resume_transaction``).

    ``started`` is False when nothing reached the coordinator (no record, no offsets): there
    is then no transaction to end there, and committing or aborting it is a no-op.
    """

    transactional_id: str
    producer_id: int
    epoch: int
    started: bool = True

    def to_json(self) -> dict[str, object]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "started": self.started,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> PreparedTransaction:
        return cls(
            transactional_id=str(data["transactional_id"]),
            producer_id=int(data["producer_id"]),  # type: ignore[call-overload]
            epoch=int(data["epoch"]),  # type: ignore[call-overload]
            started=bool(data.get("started", True)),
        )


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """One transactional id as ListTransactions reports it."""

    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """A transactional id's coordinator state, as DescribeTransactions reports it."""

    transactional_id: str
    state: str
    producer_id: int
    epoch: int
    timeout_ms: int
    start_time_ms: int
    partitions: tuple[TopicPartition, ...]
    error: int = 0
