"""What the log does to a client's batch before writing it, by the topic's configs (Kafka's
``LogValidator``; docs/semantics.md rules 39 and 41).

Timestamps (rule 41): under CreateTime every record's timestamp must lie within
``[now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms]`` (records
without a timestamp, -1, are not checked); one record outside refuses the whole batch with
INVALID_TIMESTAMP. Under LogAppendTime the broker's clock replaces them, so nothing is checked.

Codec (rule 39): with ``compression.type`` other than ``producer`` a batch in another codec is
re-encoded in the topic's: its records section is decompressed and compressed again (at the
topic's ``compression.<codec>.level``), the header kept but for the codec bits, the batch
length and the CRC-32C. Records are never decoded into objects, offsets and sequences do not
change, so producer state (which keys on sequences) treats a retry of the original batch as the
duplicate it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from samsa.protocol.records import (
    Compression,
    RecordBatchView,
    compress,
    record_timestamps,
    records_section,
    with_records_section,
)

if TYPE_CHECKING:
    from samsa.log.log import LogConfig

LONG_MAX = 2**63 - 1

# compression.type -> codec id; "producer" keeps the batch's own.
CODECS = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


def target_codec(config: LogConfig) -> int | None:
    """The codec the topic stores batches in; None for ``producer`` (the batch's own)."""
    return CODECS.get(config.compression_type)


def _level(config: LogConfig, codec: int) -> int | None:
    if codec == Compression.GZIP:
        # Kafka's -1 is java.util.zip's default level (6), which is also cramjam's.
        return None if config.compression_gzip_level < 0 else config.compression_gzip_level
    if codec == Compression.LZ4:
        return config.compression_lz4_level
    if codec == Compression.ZSTD:
        return config.compression_zstd_level
    return None


def recompressed(batch: RecordBatchView, config: LogConfig) -> RecordBatchView:
    """The batch in the topic's codec (itself when it already is, or the topic keeps the
    producer's). ValueError if its records cannot be decompressed."""
    codec = target_codec(config)
    if codec is None or codec == batch.compression:
        return batch
    try:
        records = records_section(batch)
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise ValueError(f"records cannot be decompressed: {exc}") from None
    body = compress(codec, records, _level(config, codec))
    return RecordBatchView(with_records_section(batch, codec, body))


def timestamp_problem(batch: RecordBatchView, config: LogConfig, now_ms: int) -> str | None:
    """Why the batch's CreateTime timestamps are out of the topic's window, or None."""
    if config.log_append_time:
        return None
    before = config.message_timestamp_before_max_ms
    after = config.message_timestamp_after_max_ms
    low = now_ms - before if before < now_ms else -1  # unbounded below: any timestamp >= 0
    high = now_ms + after if after < LONG_MAX - now_ms else LONG_MAX
    # The header's max timestamp bounds every record's from above (clients compute it; a
    # batch claiming less than one of its records has would break the time index anyway),
    # so the records are read only when the lower bound can matter.
    if batch.max_timestamp > high:
        return _out_of_range(batch.max_timestamp, low, high)
    if low < 0:
        return None
    try:
        timestamps = record_timestamps(batch)
    except Exception as exc:
        return f"records cannot be read: {exc}"
    for ts in timestamps:
        if ts != -1 and not low <= ts <= high:
            return _out_of_range(ts, low, high)
    return None


def _out_of_range(ts: int, low: int, high: int) -> str:
    return f"timestamp {ts} is out of range: it must be within [{low}, {high}]"
