"""The PySpark Python Data Source ``samsa``: Spark's Kafka source and sink, exactly once.

Option names and row schema are those of Spark's built-in Kafka connector, so a job moves
between Kafka and samsa by changing only ``format(...)``. See :mod:`samsa.spark._read` for
reading and :mod:`samsa.spark._write` for the exactly-once write protocol.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from samsa.client import TopicPartition
from samsa.protocol.constants import EARLIEST
from samsa.spark._options import (
    SinkOptions,
    SourceOptions,
    lower_keys,
    offsets_from_json,
    offsets_to_json,
)
from samsa.spark._read import (
    SPARK_SCHEMA,
    SPARK_SCHEMA_HEADERS,
    OffsetRange,
    OffsetReader,
    _data_loss,
    plan_batch,
    rate_limit,
    read_range,
)
from samsa.spark._write import (
    CommitReport,
    SinkCommit,
    abort_job,
    check_topic,
    commit_job,
    validate_columns,
    write_task,
)

log = logging.getLogger("samsa.spark")


class RangePartition(InputPartition):
    """One Spark task's input: offsets ``[start, until)`` of one partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)


def _range_of(partition: InputPartition) -> OffsetRange | None:
    """The range of a partition; None for the placeholder Spark reads when there is none."""
    rng = getattr(partition, "value", None)
    if rng is not None and not isinstance(rng, OffsetRange):
        raise TypeError(f"not a samsa input partition: {partition!r}")
    return rng


@dataclass
class SamsaCommitMessage(WriterCommitMessage):
    commit: SinkCommit


class SamsaDataSource(DataSource):
    """``spark.read/readStream/write/writeStream.format("samsa")``."""

    @classmethod
    def name(cls) -> str:
        return "samsa"

    def schema(self) -> str:
        opts = lower_keys(self.options)
        headers = opts.get("includeheaders", "false").strip().lower() == "true"
        return SPARK_SCHEMA_HEADERS if headers else SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        opts = SinkOptions.parse(self.options, streaming=False, job_id=uuid.uuid4().hex[:16])
        _check_schema(schema, opts)
        check_topic(opts)
        return BatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        opts = SinkOptions.parse(self.options, streaming=True, job_id=uuid.uuid4().hex[:16])
        if not opts.stable_prefix and opts.exactly_once:
            log.warning(
                "samsa sink: no checkpointLocation, queryName or transactionalIdPrefix option; "
                "transactional ids will not survive a restart of the query"
            )
        _check_schema(schema, opts)
        check_topic(opts)
        return StreamWriter(opts)


def _check_schema(schema: StructType, opts: SinkOptions) -> None:
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    validate_columns(list(types), types, opts)


# --- reading -------------------------------------------------------------------------------


class BatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        return [RangePartition(r) for r in plan_batch(self.opts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rng = _range_of(partition)
        if rng is not None:
            yield from read_range(self.opts, rng)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets are ``{"topic": {"partition": next offset}}``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._offsets: OffsetReader | None = None
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow

    @property
    def offsets(self) -> OffsetReader:
        if self._offsets is None:
            self._offsets = OffsetReader(self.opts)
        return self._offsets

    def initialOffset(self) -> dict[str, Any]:
        tps = self.offsets.topic_partitions()
        start = self.offsets.resolve(self.opts.starting, tps, "startingOffsets", EARLIEST)
        return offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self.offsets.topic_partitions()
        self._target = self.offsets.latest(tps)

    def _available(self, start: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Where each partition's readable data ends now (new partitions included)."""
        if self._target is not None:
            tps = sorted(set(self._target) | set(start))
            latest = dict(self._target)
        else:
            tps = sorted(set(self.offsets.topic_partitions()) | set(start))
            latest = self.offsets.latest(tps)
        end: dict[TopicPartition, int] = {}
        for tp in tps:
            if tp not in latest:  # a partition that went away: stay where we are
                end[tp] = start[tp]
                continue
            if tp in start and latest[tp] < start[tp]:
                _data_loss(
                    self.opts,
                    f"{tp.topic}-{tp.partition}: the latest offset {latest[tp]} is before the "
                    f"offset already read {start[tp]} (topic recreated or log truncated)",
                )
                end[tp] = start[tp] if self._target is None else latest[tp]
                continue
            end[tp] = latest[tp]
        return end

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets_from_json(start)
        end = self._available(begin)
        if isinstance(limit, ReadMaxRows):
            new = [tp for tp in end if tp not in begin]
            base = {**begin, **self.offsets.earliest(new)}
            end = rate_limit(base, end, limit.max_rows)
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = offsets_from_json(start)
        stop = offsets_from_json(end)
        new = [tp for tp in stop if tp not in begin]
        begin.update(self.offsets.earliest(new))  # new partitions are read from the start
        ranges = []
        for tp, until in sorted(stop.items()):
            s = begin[tp]
            if until < s:  # recreated partition, data loss already reported in latestOffset
                s = self.offsets.earliest([tp])[tp]
            if until > s:
                ranges.append(RangePartition(OffsetRange(tp.topic, tp.partition, s, until)))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rng = _range_of(partition)
        if rng is not None:
            yield from read_range(self.opts, rng)

    def commit(self, end: dict[str, Any]) -> None:
        return None  # positions live in Spark's checkpoint

    def stop(self) -> None:
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None


# --- writing -------------------------------------------------------------------------------


def _unwrap(messages: Sequence[WriterCommitMessage | None]) -> list[SinkCommit | None]:
    return [m.commit if isinstance(m, SamsaCommitMessage) else None for m in messages]


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        return SamsaCommitMessage(write_task(self.opts, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        commit_job(self.opts, _unwrap(messages), None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        abort_job(self.opts, _unwrap(messages))


class StreamWriter(DataSourceStreamArrowWriter):
    last_report: CommitReport | None = None

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
        return SamsaCommitMessage(write_task(self.opts, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        report = commit_job(self.opts, _unwrap(messages), batchId)
        StreamWriter.last_report = report
        log.info(
            "samsa sink: batch %d: %d transactions committed, %d replayed ones aborted",
            batchId,
            report.committed,
            report.replayed,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        abort_job(self.opts, _unwrap(messages))
