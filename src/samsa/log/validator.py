"""What the log does to a client's batch before writing it, by the topic's configs (Kafka's
``LogValidator``; docs/semantics.md rule 38).

Codec (rule 38): with ``compression.type`` other than ``producer`` a batch in another codec is
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
