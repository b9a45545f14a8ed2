"""What the log does to a client's batch before writing it, by the topic's configs (Kafka's
``LogValidator``; docs/semantics.md rules 39 and 41).

Records (``check_client_batch``): every record is read, streamed and bounded, by
``protocol/record_check.py``; a malformed one, or a count other than declared, refuses the
batch (INVALID_RECORD; UNKNOWN_SERVER_ERROR for bytes the codec cannot read, as Kafka), and so
do records inflating past ``message.max.inflated.bytes`` (MESSAGE_TOO_LARGE, D-REC-2). Refused
records are reported by batch index, in Kafka's words: a keyless record on a compacted topic,
a timestamp out of the window.

Timestamps (rule 41): under CreateTime every record's timestamp must lie within
``[now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms]`` (records
without a timestamp, -1, are not checked); one record outside refuses the whole batch with
INVALID_TIMESTAMP. Under LogAppendTime the broker's clock replaces them, so nothing is checked.

Codec (rule 39): with ``compression.type`` other than ``producer`` a batch in another codec is
re-encoded in the topic's as it streams through the check (at the topic's
``compression.<codec>.level``), the header kept but for the codec bits, the batch length and
the CRC-32C, the output refused past ``max.message.bytes``. Offsets and sequences do not
change, so producer state (which keys on sequences) treats a retry of the original batch as the
duplicate it is.
"""

from __future__ import annotations

import threading
import zlib
from typing import TYPE_CHECKING, Any, NamedTuple

import lz4.frame
import zstandard

from samsa.protocol.errors import ErrorCode
from samsa.protocol.record_check import (
    RecordRules,
    RecordsSummary,
    Unfinished,
    check_records,
    new_scratch,
)
from samsa.protocol.records import (
    XERIAL_BLOCK,
    XERIAL_HEADER,
    Compression,
    InvalidBatchError,
    RecordBatchView,
    with_records_section,
    xerial_block,
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


class _Recompressor:
    """Inflated chunks in, the records section in ``codec`` out, refused past ``cap`` bytes
    (the batch could not be stored anyway: max.message.bytes)."""

    def __init__(self, codec: int, level: int | None, cap: int) -> None:
        self.codec = codec
        self.cap = cap
        self.out: list[bytes] = []
        self.size = 0
        self._pending = bytearray()  # snappy: the next xerial block's bytes
        if codec == Compression.GZIP:
            self._z: Any = zlib.compressobj(6 if level is None else level, zlib.DEFLATED, 31)
        elif codec == Compression.ZSTD:
            self._z = zstandard.ZstdCompressor(level=3 if level is None else level).compressobj()
        elif codec == Compression.LZ4:
            self._z = lz4.frame.LZ4FrameCompressor(
                compression_level=0 if level is None else level, block_linked=False
            )
            self._emit(self._z.begin())
        elif codec == Compression.SNAPPY:
            self._emit(XERIAL_HEADER)

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        self.size += len(data)
        if self.size > self.cap:
            raise InvalidBatchError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"the batch re-encoded in the topic's codec exceeds {self.cap} bytes",
            )
        self.out.append(data)

    def feed(self, chunk: bytes) -> None:
        if self.codec == Compression.NONE:
            self._emit(chunk)
        elif self.codec == Compression.SNAPPY:
            self._pending += chunk
            while len(self._pending) >= XERIAL_BLOCK:
                self._emit(xerial_block(bytes(self._pending[:XERIAL_BLOCK])))
                del self._pending[:XERIAL_BLOCK]
        else:
            self._emit(self._z.compress(chunk))

    def finish(self) -> bytes:
        if self.codec == Compression.SNAPPY:
            if self._pending:
                self._emit(xerial_block(bytes(self._pending)))
        elif self.codec != Compression.NONE:
            self._emit(self._z.flush())
        return b"".join(self.out)


def _refusal(summary: RecordsSummary) -> str:
    """The batch's error message, in Kafka's words (LogValidator.processRecordErrors)."""
    if summary.error == ErrorCode.INVALID_TIMESTAMP:
        return "One or more records have been rejected due to invalid timestamp"
    shown = ", ".join(
        f"RecordError(batchIndex={i}, message='{m}')" for i, m in summary.record_errors[:3]
    )
    return (
        f"One or more records have been rejected due to {summary.error_count} record errors "
        f"in total, and only showing the first three errors at most: [{shown}]"
    )


class CheckedBatch(NamedTuple):
    """A client batch after the checks (and in the topic's codec), or why it is refused (a
    tuple: one is made per batch)."""

    batch: RecordBatchView
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None
    # (batch index, message) of each refused record, as Kafka's ProduceResponse RecordError
    record_errors: tuple[tuple[int, str], ...] = ()


def record_rules(config: LogConfig, now_ms: int, partition: str = "") -> RecordRules:
    """Kafka's per-record checks for this topic (rules 40-41): keys on a compacted topic, the
    CreateTime window (none under LogAppendTime, where the broker's clock replaces them)."""
    if config.log_append_time:
        return RecordRules(need_key=config.compact, partition=partition)
    before = config.message_timestamp_before_max_ms
    after = config.message_timestamp_after_max_ms
    low = now_ms - before if before < now_ms else None
    high = now_ms + after if after < LONG_MAX - now_ms else None
    return RecordRules(config.compact, partition, low, high)


# Each thread's buffer to inflate a batch's records into (the event loop's, the checkers'):
# bounded, one per thread that checks, reused batch after batch.
_SCRATCH = threading.local()


def _scratch() -> memoryview:
    try:
        view: memoryview = _SCRATCH.view
    except AttributeError:
        view = _SCRATCH.view = new_scratch()
    return view


def check_client_batch(
    batch: RecordBatchView,
    config: LogConfig,
    now_ms: int,
    partition: str = "",
    *,
    give_up: int | None = None,
) -> CheckedBatch:
    """Read every record of a client batch as Kafka's LogValidator does (streamed, at most
    ``max_inflated_bytes`` inflated) and re-encode it in the topic's codec if that differs
    (rule 39). Heavy for a large compressed batch: the broker runs it in a worker thread, or
    tries it on the event loop first with ``give_up`` set (Unfinished past that many bytes)."""
    if batch.size > config.max_message_bytes:  # as Kafka: before reading the records
        return CheckedBatch(
            batch,
            ErrorCode.MESSAGE_TOO_LARGE,
            f"batch of {batch.size} bytes exceeds {config.max_message_bytes}",
        )
    codec = target_codec(config)
    sink = None
    if codec is not None and codec != batch.compression:
        sink = _Recompressor(codec, _level(config, codec), config.max_message_bytes)
    try:
        summary = check_records(
            batch,
            record_rules(config, now_ms, partition),
            config.max_inflated_bytes,
            sink.feed if sink is not None else None,
            give_up,
            _scratch() if sink is None and batch.compression != Compression.NONE else None,
        )
        if summary.error_count:
            return CheckedBatch(
                batch, summary.error, _refusal(summary), tuple(summary.record_errors)
            )
        if sink is not None:
            batch = RecordBatchView(with_records_section(batch, codec or 0, sink.finish()))
    except InvalidBatchError as exc:
        return CheckedBatch(batch, exc.code, str(exc))
    return CheckedBatch(batch)


def try_client_batch(
    batch: RecordBatchView, config: LogConfig, now_ms: int, partition: str, most: int
) -> CheckedBatch | None:
    """:func:`check_client_batch` if the records inflate to ``most`` bytes at most and their
    reading costs no more than the general path's over that many bytes, else None: the check
    is left for a worker thread, having cost about ``most`` bytes here."""
    try:
        return check_client_batch(batch, config, now_ms, partition, give_up=most)
    except Unfinished:
        return None
