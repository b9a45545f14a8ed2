"""Reading: offset resolution on the driver, offset ranges read into Arrow batches on executors.

The driver side (planning, ``latestOffset``) asks the broker for topics and offsets with
:class:`OffsetReader`; each Spark task reads one half-open offset range ``[start, until)`` of
one partition with :func:`read_range`, which yields ``pyarrow.RecordBatch`` objects in the
column layout of Spark's Kafka source. With ``read_committed`` (the default) ``until`` is at
most the last stable offset, records of aborted transactions and control records are skipped,
and a range may therefore yield fewer rows than it spans offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from samsa.client import Admin, Consumer, ConsumerRecord, KafkaError, TopicPartition
from samsa.protocol.columnar import ARROW_SCHEMA, ARROW_SCHEMA_HEADERS, HEADERS_TYPE
from samsa.protocol.constants import EARLIEST, LATEST
from samsa.protocol.errors import ErrorCode
from samsa.spark._options import SourceOptions, SparkOptionError

log = logging.getLogger("samsa.spark")

ROWS_PER_BATCH = 10_000

SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
SPARK_SCHEMA_HEADERS = SPARK_SCHEMA + ", headers array<struct<key: string, value: binary>>"


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (deleted by retention, or the topic was recreated).
    Raised only with ``failOnDataLoss`` true (the default); otherwise the gap is skipped."""


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    until: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(0, self.until - self.start)


def to_arrow(records: Sequence[ConsumerRecord], include_headers: bool) -> pa.RecordBatch:
    """Records as one Arrow batch with the columns of Spark's Kafka source."""
    n = len(records)
    first = records[0] if n else None
    same_tp = first is not None and all(
        r.topic == first.topic and r.partition == first.partition for r in records
    )
    if same_tp and first is not None:
        topic = pa.array([first.topic] * n, pa.string())
        part = pa.array([first.partition] * n, pa.int32())
    else:
        topic = pa.array([r.topic for r in records], pa.string())
        part = pa.array([r.partition for r in records], pa.int32())
    arrays: list[pa.Array] = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        topic,
        part,
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")),
        pa.array([r.timestamp_type for r in records], pa.int32()),
    ]
    if include_headers:
        arrays.append(
            pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in records], HEADERS_TYPE
            )
        )
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA_HEADERS)
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _data_loss(opts: SourceOptions, message: str) -> None:
    if opts.fail_on_data_loss:
        raise DataLossError(
            message + ". Some data may have been lost; if that is expected, set the option "
            "failOnDataLoss to false to go on from the earliest available offset."
        )
    log.warning("%s; skipping (failOnDataLoss=false)", message)


def read_range(
    opts: SourceOptions, rng: OffsetRange, rows_per_batch: int = ROWS_PER_BATCH
) -> Iterator[pa.RecordBatch]:
    """The records of ``[rng.start, rng.until)`` as Arrow batches of up to ``rows_per_batch``
    rows (executor side), decoded column-wise by ``Consumer.consume_arrow``: no Python object
    per record, and the next fetch on its way while Spark handles a batch."""
    if rng.size == 0:
        return
    tp = rng.tp
    consumer = Consumer(opts.consumer_config())
    try:
        consumer.assign([tp])
        consumer.seek(tp, rng.start)
        pending: list[pa.RecordBatch] = []
        rows = 0
        pos = rng.start
        idle_since = time.monotonic()
        while pos < rng.until:
            try:
                got = consumer.consume_arrow(
                    rows_per_batch - rows, 0.5, include_headers=opts.include_headers
                )
            except KafkaError as exc:
                if exc.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise
                earliest = consumer.list_offsets([tp], EARLIEST)[tp]
                _data_loss(
                    opts,
                    f"{tp.topic}-{tp.partition}: offset {pos} is no longer "
                    f"available (earliest is {earliest})",
                )
                if earliest >= rng.until or earliest <= pos:
                    break
                consumer.seek(tp, earliest)
                pos = earliest
                continue
            if got.num_rows:
                # one partition: offsets ascend, so the rows of the range are a prefix
                n = int(np.searchsorted(got.column(4).to_numpy(), rng.until))
                if n:
                    pending.append(got if n == got.num_rows else got.slice(0, n))
                    rows += n
            new_pos = consumer.position(tp)
            if new_pos != pos:
                pos = new_pos
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > opts.poll_timeout_s:
                raise TimeoutError(
                    f"reading {tp.topic}-{tp.partition}: no progress at offset {pos} "
                    f"(reading up to {rng.until}) for {opts.poll_timeout_s:.0f} s"
                )
            if rows >= rows_per_batch:
                yield _concat(pending)
                pending, rows = [], 0
        if pending:
            yield _concat(pending)
    finally:
        consumer.close()


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    if hasattr(pa, "concat_batches"):  # pyarrow >= 19
        return pa.concat_batches(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class OffsetReader:
    """Driver-side metadata and offset look-ups; clients are created on first use."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._admin: Admin | None = None
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self.opts.consumer_config())
        return self._consumer

    def topic_partitions(self) -> list[TopicPartition]:
        if self._admin is None:
            self._admin = Admin(dict(self.opts.client))
        topics = self._admin.describe_topics(None)
        counts = {t.name: len(t.partitions) for t in topics if not t.error}
        return self.opts.subscription.resolve(counts)

    def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return self.consumer.list_offsets(list(tps), EARLIEST) if tps else {}

    def latest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """Latest readable offsets: the last stable offset under read_committed."""
        return self.consumer.list_offsets(list(tps), LATEST) if tps else {}

    def resolve(
        self,
        spec: Any,
        tps: Sequence[TopicPartition],
        name: str,
        default: int,
    ) -> dict[TopicPartition, int]:
        """Concrete offsets for ``tps`` from an option value (earliest/latest/JSON)."""
        if isinstance(spec, dict):
            unknown = sorted(set(spec) - set(tps))
            if unknown:
                names = ", ".join(f"{t.topic}-{t.partition}" for t in unknown)
                raise SparkOptionError(
                    f"option {name} names partitions that are not read by this query or do "
                    f"not exist: {names}"
                )
            wanted = {tp: spec.get(tp, default) for tp in tps}
        else:
            wanted = dict.fromkeys(tps, EARLIEST if spec == "earliest" else LATEST)
        need_e = [tp for tp, o in wanted.items() if o == EARLIEST]
        need_l = [tp for tp, o in wanted.items() if o == LATEST]
        found = {**self.earliest(need_e), **self.latest(need_l)}
        return {tp: found.get(tp, o) for tp, o in wanted.items()}

    def close(self) -> None:
        for client in (self._consumer, self._admin):
            if client is not None:
                try:
                    client.close()
                except Exception:
                    log.debug("closing a client failed", exc_info=True)
        self._consumer = self._admin = None


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split big ranges so that there are at least ``min_partitions`` tasks (minPartitions)."""
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    if total == 0:
        return ranges
    out: list[OffsetRange] = []
    for r in ranges:
        pieces = max(1, min(r.size, round(min_partitions * r.size / total)))
        step, extra = divmod(r.size, pieces)
        start = r.start
        for i in range(pieces):
            end = start + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return out


def plan_batch(opts: SourceOptions) -> list[OffsetRange]:
    """The offset ranges of a batch query (startingOffsets .. endingOffsets)."""
    reader = OffsetReader(opts)
    try:
        tps = reader.topic_partitions()
        starts = reader.resolve(opts.starting, tps, "startingOffsets", EARLIEST)
        ends = reader.resolve(opts.ending, tps, "endingOffsets", LATEST)
        earliest = reader.earliest(tps)
        latest = reader.latest(tps)
        ranges: list[OffsetRange] = []
        for tp in tps:
            start, end = starts[tp], ends[tp]
            if start < earliest[tp]:
                _data_loss(
                    opts,
                    f"{tp.topic}-{tp.partition}: starting offset {start} is before the "
                    f"earliest available offset {earliest[tp]}",
                )
                start = earliest[tp]
            if end > latest[tp]:
                raise SparkOptionError(
                    f"endingOffsets: {tp.topic}-{tp.partition} offset {end} is beyond the "
                    f"latest offset {latest[tp]}"
                )
            if end < start:
                raise SparkOptionError(
                    f"{tp.topic}-{tp.partition}: ending offset {end} is before the starting "
                    f"offset {start}"
                )
            if end > start:
                ranges.append(OffsetRange(tp.topic, tp.partition, start, end))
        return split_ranges(ranges, opts.min_partitions)
    finally:
        reader.close()


def rate_limit(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int], limit: int
) -> dict[TopicPartition, int]:
    """Admission control: at most ``limit`` offsets in all, shared in proportion to each
    partition's backlog (largest remainders get the leftover offsets)."""
    sizes = {tp: max(0, end[tp] - start.get(tp, end[tp])) for tp in end}
    total = sum(sizes.values())
    if total <= limit:
        return dict(end)
    shares = {tp: limit * s / total for tp, s in sizes.items()}
    taken = {tp: int(v) for tp, v in shares.items()}
    left = limit - sum(taken.values())
    for tp in sorted(shares, key=lambda t: (taken[t] - shares[t], t))[:left]:
        if taken[tp] < sizes[tp]:
            taken[tp] += 1
    return {tp: start.get(tp, end[tp]) + taken[tp] for tp in end}
