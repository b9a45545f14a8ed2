"""Record batch v2 (magic 2): a view over the bytes, and a builder.

Theory of operation
-------------------
The broker never decodes records one by one. A batch on the wire, on disk and in a Fetch
response is the same byte string; the broker only reads the 61-byte header (with one
``struct`` call), checks the CRC-32C over the bytes after the CRC field, and rewrites the
base offset, which lies *outside* the CRC, so assigning offsets costs no re-encoding.

Layout of the header (big-endian)::

    0  baseOffset int64          27 baseTimestamp int64
    8  batchLength int32         35 maxTimestamp int64
    12 partitionLeaderEpoch i32  43 producerId int64
    16 magic int8                51 producerEpoch int16
    17 crc uint32                53 baseSequence int32
    21 attributes int16          57 recordCount int32
    23 lastOffsetDelta int32     61 records...

``batchLength`` counts the bytes after itself, so a batch occupies ``batchLength + 12``
bytes. The builder and :func:`decode_records` exist for clients, tests and control batches;
they are not on the broker's produce path.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import cramjam
import crc32c

from samsa.protocol.errors import ErrorCode

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part of a batch that batchLength does not count
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # batchLength of a batch without records
CRC_START = 21
MAGIC_V2 = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_FLAG = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1


class Compression:
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class ControlType:
    ABORT = 0
    COMMIT = 1


class InvalidBatchError(Exception):
    """A batch that must be refused; ``code`` is the Kafka error for the response.

    ``by_validator``: an intact batch refused by the rules Kafka's LogValidator checks (its
    answer then carries the partition's log start offset), not bytes refused before that.
    """

    def __init__(self, code: ErrorCode, message: str, *, by_validator: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.by_validator = by_validator


_U16 = struct.Struct(">h")
_I64 = struct.Struct(">q")


class RecordBatchView:
    """The header of one v2 batch at ``buf[pos:]``; records stay as bytes."""

    __slots__ = (
        "attributes",
        "base_offset",
        "base_sequence",
        "base_timestamp",
        "batch_length",
        "buf",
        "crc",
        "last_offset_delta",
        "magic",
        "max_timestamp",
        "partition_leader_epoch",
        "pos",
        "producer_epoch",
        "producer_id",
        "record_count",
    )

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0) -> None:
        if len(buf) - pos < HEADER_SIZE:
            raise InvalidBatchError(
                ErrorCode.CORRUPT_MESSAGE, "record batch shorter than its header"
            )
        (
            self.base_offset,
            self.batch_length,
            self.partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.record_count,
        ) = HEADER.unpack_from(buf, pos)
        self.buf = buf
        self.pos = pos

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF

    def crc_is_valid(self) -> bool:
        end = self.pos + self.batch_length + LOG_OVERHEAD
        return crc32c.crc32c(memoryview(self.buf)[self.pos + CRC_START : end]) == self.crc

    def to_bytes(self) -> bytes:
        return bytes(memoryview(self.buf)[self.pos : self.pos + self.size])

    def __repr__(self) -> str:
        return (
            f"RecordBatchView(base_offset={self.base_offset}, count={self.record_count}, "
            f"pid={self.producer_id}, epoch={self.producer_epoch}, seq={self.base_sequence}, "
            f"attrs={self.attributes:#x})"
        )


def validate_produce_batch(data: bytes | memoryview) -> RecordBatchView:
    """Check a Produce partition's records, which must be exactly one client v2 batch.

    Raises :class:`InvalidBatchError` with CORRUPT_MESSAGE for bytes that do not form an
    intact batch (bad length, bad CRC) and INVALID_RECORD for an intact batch that breaks
    the rules (Kafka's LogValidator and rule 1 of docs/semantics.md).
    """
    if len(data) < HEADER_SIZE:
        raise InvalidBatchError(ErrorCode.CORRUPT_MESSAGE, "records shorter than a batch header")
    view = RecordBatchView(data, 0)
    if view.magic != MAGIC_V2:
        raise InvalidBatchError(
            ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, f"magic {view.magic}; only v2 is supported"
        )
    if view.batch_length < MIN_BATCH_LENGTH or view.size > len(data):
        raise InvalidBatchError(ErrorCode.CORRUPT_MESSAGE, "batch length exceeds the records")
    if view.size != len(data):
        raise InvalidBatchError(
            ErrorCode.INVALID_RECORD, "produce carries more than one record batch per partition"
        )
    if not view.crc_is_valid():
        raise InvalidBatchError(ErrorCode.CORRUPT_MESSAGE, "record batch CRC-32C mismatch")
    problem = _validator_problem(view)
    if problem is not None:
        raise InvalidBatchError(ErrorCode.INVALID_RECORD, problem, by_validator=True)
    return view


def _validator_problem(view: RecordBatchView) -> str | None:
    """What an intact client batch breaks of Kafka's LogValidator rules (rule 1), if any."""
    if view.is_control:
        return "clients may not write control batches"
    if view.last_offset_delta < 0 or view.record_count != view.last_offset_delta + 1:
        return (
            f"record count {view.record_count} does not match last offset delta "
            f"{view.last_offset_delta}"
        )
    if view.compression > Compression.ZSTD:
        return f"unknown codec {view.compression}"
    if view.has_producer_id and view.base_sequence < 0:
        return "a batch with a producer id needs a base sequence"
    if view.is_transactional and not view.has_producer_id:
        return "transactional batch without producer id"
    return None


def set_base_offset(batch: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Assign offsets in place: the base offset is outside the CRC, nothing else changes."""
    _I64.pack_into(batch, pos, base_offset)


_STORED_PREFIX = struct.Struct(">qii")


def stored_prefix(base_offset: int, batch_length: int, leader_epoch: int) -> bytes:
    """The 16 bytes a leader rewrites as it appends a batch, all outside the CRC: the assigned
    base offset, the (unchanged) batch length and its own leader epoch, which Kafka stamps on
    every batch it appends and consumers commit with their positions."""
    return _STORED_PREFIX.pack(base_offset, batch_length, leader_epoch)


def base_offset_prefix(base_offset: int) -> bytes:
    """The 8 bytes that replace a batch's first 8, for gathering writes (``os.writev``)."""
    return _I64.pack(base_offset)


@dataclass(frozen=True, slots=True)
class ScanResult:
    batches: list[RecordBatchView]
    valid_bytes: int  # length of the prefix made of whole, CRC-valid batches
    problem: str | None  # why scanning stopped before the end, if it did


def scan_batches(buf: bytes | memoryview, *, check_crc: bool = True) -> ScanResult:
    """Walk consecutive batches from the start of ``buf``, stopping at the first torn or
    corrupt one. Used by log recovery: everything after ``valid_bytes`` is truncated."""
    batches: list[RecordBatchView] = []
    pos = 0
    end = len(buf)
    problem: str | None = None
    while pos < end:
        if end - pos < HEADER_SIZE:
            problem = f"torn batch header at byte {pos}"
            break
        view = RecordBatchView(buf, pos)
        if view.magic != MAGIC_V2 or view.batch_length < MIN_BATCH_LENGTH:
            problem = f"invalid batch header at byte {pos}"
            break
        if pos + view.size > end:
            problem = f"torn batch at byte {pos}"
            break
        if view.last_offset_delta < 0 or (batches and view.base_offset < batches[-1].next_offset):
            problem = f"non-monotonic offsets at byte {pos}"
            break
        if check_crc and not view.crc_is_valid():
            problem = f"CRC mismatch at byte {pos}"
            break
        batches.append(view)
        pos += view.size
    return ScanResult(batches, pos, problem)


def iter_batches(buf: bytes | memoryview) -> Iterator[RecordBatchView]:
    """Batches of a buffer known to be whole (a Fetch response's records), no CRC check."""
    pos = 0
    end = len(buf)
    while end - pos >= HEADER_SIZE:
        view = RecordBatchView(buf, pos)
        if pos + view.size > end:
            return  # a partial batch at the end of a fetch response is normal
        yield view
        pos += view.size


# --- records: building and decoding (clients, tests, control batches) ---------------------


def _zigzag_varint(value: int, out: bytearray) -> None:
    v = (value << 1) ^ (value >> 63)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (result >> 1) ^ -(result & 1), pos


@dataclass(frozen=True, slots=True)
class Record:
    """One record as a client sees it."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(slots=True)
class NewRecord:
    value: bytes | None
    key: bytes | None = None
    timestamp: int | None = None
    headers: Sequence[tuple[str, bytes | None]] = field(default_factory=tuple)


def _encode_bytes(data: bytes | None, out: bytearray) -> None:
    if data is None:
        _zigzag_varint(-1, out)
    else:
        _zigzag_varint(len(data), out)
        out += data


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    body = bytearray(b"\x00")  # record attributes, unused
    _zigzag_varint(timestamp_delta, body)
    _zigzag_varint(offset_delta, body)
    _encode_bytes(key, body)
    _encode_bytes(value, body)
    _zigzag_varint(len(headers), body)
    for name, hvalue in headers:
        _encode_bytes(name.encode(), body)
        _encode_bytes(hvalue, body)
    out = bytearray()
    _zigzag_varint(len(body), out)
    out += body
    return bytes(out)


def compress(codec: int, data: bytes, level: int | None = None) -> bytes:
    """``data`` in ``codec``; ``level`` None is the library's default (snappy has none)."""
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data, level=level))
    if codec == Compression.SNAPPY:
        # Kafka's Java client writes snappy in xerial framing; librdkafka reads both.
        return _xerial_snappy(data)
    if codec == Compression.LZ4:
        return bytes(cramjam.lz4.compress(data, level=level))
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise ValueError(f"unknown compression codec {codec}")


XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
XERIAL_BLOCK = 32 * 1024  # inflated bytes per block, as Kafka's Java client writes them


def xerial_block(data: bytes) -> bytes:
    """One xerial snappy block: its length, then ``data`` in raw snappy."""
    chunk = bytes(cramjam.snappy.compress_raw(data))
    return struct.pack(">i", len(chunk)) + chunk


def _xerial_snappy(data: bytes) -> bytes:
    out = bytearray(XERIAL_HEADER)
    for i in range(0, len(data), XERIAL_BLOCK):
        out += xerial_block(data[i : i + XERIAL_BLOCK])
    return bytes(out)


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.decompress(bytes(data)))
    if codec == Compression.SNAPPY:
        raw = bytes(data)
        if raw.startswith(XERIAL_HEADER[:8]):
            out = bytearray()
            pos = 16
            while pos < len(raw):
                (n,) = struct.unpack_from(">i", raw, pos)
                out += bytes(cramjam.snappy.decompress_raw(raw[pos + 4 : pos + 4 + n]))
                pos += 4 + n
            return bytes(out)
        return bytes(cramjam.snappy.decompress_raw(raw))
    if codec == Compression.LZ4:
        return bytes(cramjam.lz4.decompress(bytes(data)))
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.decompress(bytes(data)))
    raise ValueError(f"unknown compression codec {codec}")


def build_batch(
    records: Sequence[NewRecord],
    *,
    base_offset: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    compression: int = Compression.NONE,
    partition_leader_epoch: int = 0,
    now_ms: int = 0,
) -> bytes:
    """Encode a v2 batch. Records without a timestamp get ``now_ms``."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    timestamps = [r.timestamp if r.timestamp is not None else now_ms for r in records]
    base_ts = timestamps[0]
    body = b"".join(
        encode_record(i, ts - base_ts, r.key, r.value, r.headers)
        for i, (r, ts) in enumerate(zip(records, timestamps, strict=True))
    )
    body = compress(compression, body)
    attributes = compression
    if transactional:
        attributes |= TRANSACTIONAL_FLAG
    if control:
        attributes |= CONTROL_FLAG
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            len(records) - 1,
            base_ts,
            max(timestamps),
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
        + body
    )
    batch_length = len(after_crc) + 9  # partitionLeaderEpoch + magic + crc
    return (
        struct.pack(
            ">qiibI",
            base_offset,
            batch_length,
            partition_leader_epoch,
            MAGIC_V2,
            crc32c.crc32c(after_crc),
        )
        + after_crc
    )


def build_control_batch(
    control_type: int,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    base_offset: int = 0,
    now_ms: int = 0,
) -> bytes:
    """A transaction marker: key (version 0, type), value (version 0, coordinator epoch)."""
    key = struct.pack(">hh", 0, control_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    return build_batch(
        [NewRecord(value=value, key=key, timestamp=now_ms)],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        transactional=True,
        control=True,
        now_ms=now_ms,
    )


def control_type_of(view: RecordBatchView) -> int:
    """ABORT or COMMIT for a control batch (read from its single record's key)."""
    (record,) = decode_records(view)
    if record.key is None or len(record.key) < 4:
        raise ValueError("control record without a valid key")
    return _U16.unpack_from(record.key, 2)[0]


def decode_records(view: RecordBatchView) -> list[Record]:
    """Decode every record of a batch (decompressing it). Client side only."""
    start = view.pos + HEADER_SIZE
    end = view.pos + view.size
    raw = memoryview(view.buf)[start:end]
    data: bytes | memoryview = decompress(view.compression, raw) if view.compression else raw
    out: list[Record] = []
    pos = 0
    for _ in range(view.record_count):
        length, pos = _read_varint(data, pos)
        rec_end = pos + length
        pos += 1  # attributes
        ts_delta, pos = _read_varint(data, pos)
        off_delta, pos = _read_varint(data, pos)
        key, pos = _read_nullable(data, pos)
        value, pos = _read_nullable(data, pos)
        n_headers, pos = _read_varint(data, pos)
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(n_headers):
            hkey, pos = _read_nullable(data, pos)
            hval, pos = _read_nullable(data, pos)
            headers.append(((hkey or b"").decode(), hval))
        if pos != rec_end:
            raise ValueError("record length does not match its fields")
        out.append(
            Record(
                offset=view.base_offset + off_delta,
                timestamp=view.base_timestamp + ts_delta,
                key=key,
                value=value,
                headers=tuple(headers),
            )
        )
    return out


def record_columns(
    view: RecordBatchView,
) -> tuple[list[int], list[bytes | None], list[bytes | None]]:
    """The offsets, keys and values of a batch's records (decompressing it), checked as
    :func:`decode_records` checks them (the same batches raise ValueError), but with no
    object per record and headers only checked: what a replay of key/value records needs
    (the coordinators' start-up reads millions). Short varints are read inline."""
    start = view.pos + HEADER_SIZE
    data = decompress(view.compression, memoryview(view.buf)[start : view.pos + view.size])
    base = view.base_offset
    offsets: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    pos = 0
    try:
        for _ in range(view.record_count):
            b = data[pos]
            if b < 0x80:
                rec_end = pos + 1 + ((b >> 1) ^ -(b & 1))
                pos += 2  # and the attributes
            elif data[pos + 1] < 0x80:  # two bytes: records of 64-8191 bytes
                z = (b & 0x7F) | (data[pos + 1] << 7)
                rec_end = pos + 2 + ((z >> 1) ^ -(z & 1))
                pos += 3
            else:
                length, pos = _read_varint(data, pos)
                rec_end = pos + length
                pos += 1
            if data[pos] < 0x80:  # the timestamp delta, not kept
                pos += 1
            else:
                _, pos = _read_varint(data, pos)
            b = data[pos]
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:  # two bytes: records 64-8191 of a batch
                z = (b & 0x7F) | (data[pos + 1] << 7)
                delta = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                delta, pos = _read_varint(data, pos)
            key, pos = _nullable_bytes(data, pos)
            value, pos = _nullable_bytes(data, pos)
            if data[pos]:
                pos = _check_headers(data, pos)
            else:
                pos += 1
            if pos != rec_end:
                raise ValueError("record length does not match its fields")
            offsets.append(base + delta)
            keys.append(key)
            values.append(value)
    except IndexError:  # a varint past the end
        raise ValueError("truncated varint") from None
    return offsets, keys, values


def _nullable_bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    """:func:`_read_nullable` over bytes, a length of one byte read inline."""
    b = data[pos]
    if b >= 0x80:
        return _read_nullable(data, pos)
    n = (b >> 1) ^ -(b & 1)
    if n < 0:
        return None, pos + 1
    end = pos + 1 + n
    if end > len(data):
        raise ValueError("truncated record field")
    return data[pos + 1 : end], end


def _check_headers(data: bytes, pos: int) -> int:
    """Read past a record's headers as :func:`decode_records` reads them (keys UTF-8)."""
    count, pos = _read_varint(data, pos)
    for _ in range(count):
        hkey, pos = _read_nullable(data, pos)
        (hkey or b"").decode()
        _, pos = _read_nullable(data, pos)
    return pos


def with_records_section(view: RecordBatchView, codec: int, body: bytes) -> bytes:
    """The batch with ``body`` (records already in ``codec``) as its records: the header kept
    (producer id, epoch, sequence, transactional and control flags, timestamps), the codec
    bits, batch length and CRC-32C rewritten."""
    header = bytearray(memoryview(view.buf)[view.pos : view.pos + HEADER_SIZE])
    struct.pack_into(">i", header, 8, HEADER_SIZE - LOG_OVERHEAD + len(body))
    struct.pack_into(">h", header, CRC_START, (view.attributes & ~COMPRESSION_MASK) | codec)
    crc = crc32c.crc32c(body, crc32c.crc32c(memoryview(header)[CRC_START:]))
    struct.pack_into(">I", header, CRC_START - 4, crc)
    return bytes(header) + body


def _read_nullable(data: bytes | memoryview, pos: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(data, pos)
    if n < 0:
        return None, pos
    if pos + n > len(data):
        raise ValueError("truncated record field")
    return bytes(data[pos : pos + n]), pos + n
