"""The per-record reference decoder of fetched data, for tests and benchmarks: the batches
that :class:`samsa.protocol.fetched.KeptBatches` keeps, decoded record by record into
ConsumerRecords. The consumer decodes column-wise (:func:`samsa.protocol.columnar.
decode_fetched`); the two must agree on any bytes (tests/property/test_columnar.py)."""

from __future__ import annotations

from collections.abc import Iterable

from samsa.client import ConsumerRecord, CorruptRecordError, TopicPartition
from samsa.protocol.constants import READ_UNCOMMITTED
from samsa.protocol.fetched import AbortedTxn, KeptBatches
from samsa.protocol.records import TIMESTAMP_TYPE_FLAG, InvalidBatchError, decode_records


def parse_fetched(
    tp: TopicPartition,
    data: bytes | memoryview | None,
    position: int,
    *,
    isolation_level: int = READ_UNCOMMITTED,
    aborted: Iterable[AbortedTxn] = (),
    check_crcs: bool = True,
) -> tuple[list[ConsumerRecord], int]:
    """Records at or after ``position`` in a fetched partition, and the next position.

    A batch failing its checks raises CorruptRecordError carrying the records before it."""
    out: list[ConsumerRecord] = []
    batches = KeptBatches(
        data,
        position,
        name=f"{tp.topic}-{tp.partition}",
        isolation_level=isolation_level,
        aborted=aborted,
        check_crcs=check_crcs,
    )
    try:
        for batch in batches:
            ts_type = 1 if batch.attributes & TIMESTAMP_TYPE_FLAG else 0
            for r in decode_records(batch):
                if r.offset < position:
                    continue
                out.append(
                    ConsumerRecord(
                        tp.topic,
                        tp.partition,
                        r.offset,
                        batch.max_timestamp if ts_type else r.timestamp,
                        r.key,
                        r.value,
                        r.headers,
                        ts_type,
                        batch.producer_id,
                        batch.partition_leader_epoch,
                    )
                )
    except InvalidBatchError as exc:
        at = batches.next_offset
        err = CorruptRecordError(f"{exc}; seek past it to skip it", tp.topic, tp.partition, at)
        err.records = out
        raise err from None
    return out, batches.next_offset
