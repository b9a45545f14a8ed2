"""Record batches v2 <-> columns: a vectorised encoder, murmur2 partitioner and decoder.

Theory of operation
-------------------
The per-record paths in :mod:`samsa.protocol.records` cost a few microseconds of Python per
record. Here the unit of Python work is the *batch*; per-record work is done by numpy and
pyarrow over whole columns.

Encoding (:func:`encode_batches`). A record is
``len | attributes | tsDelta | offsetDelta | keyLen | key | valueLen | value | headers``,
every integer a zigzag varint. The split into batches is decided first, on a per-record size
bound (the deltas are not known yet), so that no batch exceeds ``max_batch_bytes``
uncompressed unless one record alone does. Then every varint field is computed for the whole
column (zigzag, size by comparisons, 7-bit groups written with masked scatters) into two
small byte arrays, ``prefix`` (len..keyLen) and ``mid`` (valueLen), and pyarrow's
``binary_join_element_wise`` interleaves ``prefix, key, mid, value, headers`` in C: the data
buffer of the result *is* the records section, in order, and its offsets give every record's
position, so a batch is one slice of it. Headers (a ``list<struct<key, value>>`` column, as in
Spark) are encoded the same way one level down: one joined element per header, and a record's
headers are a contiguous run of them. Headers given as Python objects (pairs or a mapping per
row) take one Python step per row to become that column; Arrow headers take none.

Decoding (:func:`decode_fetched`). The batches to keep are chosen one by one (a Python loop
per batch) by :class:`samsa.protocol.fetched.KeptBatches`: position, magic, CRC,
read_committed aborted transactions, control batches. Uncompressed records are read where
they lie in the fetched bytes; if any batch is compressed, the kept sections are
decompressed and joined. Finding where each record starts is a chain (record *i+1* starts
where record *i*'s length says); it is guessed for all records at once and the guess checked
at every guessed start, which settles batches of equal-sized records in a round or two of
numpy passes. Only batches whose record sizes keep changing are walked in Python, one varint
read per record (~0.2 us a record, profiled, against ~6 us for the per-record decoder). All
other fields are then decoded for all records together, and keys, values and headers are
gathered by ``pyarrow.compute.take`` from one binary array whose offsets mark every field of
the buffer, so no Python object is made per record. Every record's length is checked against
the next record's start, whatever found it, and every field against its record's end:
corrupt bytes raise :class:`InvalidBatchError`, and nothing is sized by a count the bytes
cannot hold. The decoding proper (:func:`decode_columns`) ends in numpy columns over the
fetched bytes (:class:`FetchedColumns`); :func:`decode_fetched` makes Arrow of all of them,
the consumer's ``poll()`` only of keys, values and headers (if any record has one). The
headers of the batches themselves (:func:`batch_headers`: base offset, producer id, leader
epoch) are read for all batches at once, after one walk of their lengths.

The Arrow layout is Spark's Kafka source's (``key``, ``value``, ``topic``, ``partition``,
``offset``, ``timestamp`` in microseconds UTC, ``timestampType``, optional ``headers``), as
in :mod:`samsa.spark._read`. pyarrow costs ~0.1 s to import: import this module lazily.

No pandas. pyarrow imports pandas (when installed: pyspark brings it) the first time
``pa.array``, ``pa.scalar``, ``Array.to_numpy`` or ``RecordBatch.from_pylist`` looks at a
Python object, to check for pandas types: ~0.25 s and ~50 MB per process. So arrays are built
from buffers here (:func:`binary_array`, :func:`int_array`) and read back through their
buffers (:func:`to_numpy`), and none of those four is called.
"""

from __future__ import annotations

import struct
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cramjam
import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from samsa.protocol.constants import READ_UNCOMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.fetched import KeptBatches, corrupt
from samsa.protocol.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_FLAG,
    TRANSACTIONAL_FLAG,
    Compression,
    InvalidBatchError,
    compress,
)

DEFAULT_MAX_BATCH_BYTES = 1024 * 1024

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
ARROW_SCHEMA = pa.schema(_FIELDS)
ARROW_SCHEMA_HEADERS = pa.schema([*_FIELDS, pa.field("headers", HEADERS_TYPE)])

_LARGE_HEADERS_TYPE = pa.list_(
    pa.struct([("key", pa.large_binary()), ("value", pa.large_binary())])
)
_AFTER_CRC = struct.Struct(">hiqqqhii")
_BEFORE_CRC = struct.Struct(">qiibI")
_U64 = np.uint64
_M = np.uint32(0x5BD1E995)
_MIN_RECORD = 7  # length, attributes, two deltas, key and value lengths, header count
_GUESS_ROUNDS = 4

_LEVELLED = {
    Compression.GZIP: cramjam.gzip.compress,
    Compression.LZ4: cramjam.lz4.compress,  # frame format, as Kafka's
    Compression.ZSTD: cramjam.zstd.compress,
}

_LEVELS = {  # Kafka's accepted ranges (CompressionType)
    Compression.GZIP: (1, 9),
    Compression.LZ4: (1, 17),
    Compression.ZSTD: (-131072, 22),
}

Column = pa.Array | pa.ChunkedArray | Sequence[Any] | np.ndarray


# --- columns -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Bytes:
    """A bytes column: a large_binary array with nulls made empty, and lengths (-1 = null)."""

    array: pa.LargeBinaryArray
    lengths: np.ndarray  # int64

    @property
    def offsets(self) -> np.ndarray:
        return _offsets(self.array)

    @property
    def data(self) -> np.ndarray:
        return _data(self.array)


def _offsets(arr: pa.Array) -> np.ndarray:
    dtype = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    raw = np.frombuffer(arr.buffers()[1], dtype=dtype)
    return raw[arr.offset : arr.offset + len(arr) + 1].astype(np.int64, copy=False)


def _data(arr: pa.Array) -> np.ndarray:
    buf = arr.buffers()[2]
    return np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)


def _validity(nulls: np.ndarray | None) -> pa.Buffer | None:
    if nulls is None or not nulls.any():
        return None
    return pa.py_buffer(np.packbits(~nulls, bitorder="little"))


def null_mask(arr: pa.Array) -> np.ndarray | None:
    """Which rows of ``arr`` are null (None: none is), read from its validity bitmap."""
    if arr.null_count == 0:
        return None
    bits = np.unpackbits(np.frombuffer(arr.buffers()[0], np.uint8), bitorder="little")
    return bits[arr.offset : arr.offset + len(arr)] == 0


def to_numpy(arr: pa.Array, fill: int = 0) -> np.ndarray:
    """An integer or timestamp array's values as int64 (nulls as ``fill``), read from its
    data buffer (``Array.to_numpy`` would import pandas)."""
    if pa.types.is_timestamp(arr.type) or pa.types.is_date64(arr.type):
        dtype: Any = np.int64
    elif pa.types.is_integer(arr.type):
        kind = "i" if pa.types.is_signed_integer(arr.type) else "u"
        dtype = np.dtype(f"<{kind}{arr.type.bit_width // 8}")
    else:
        raise TypeError(f"not an integer array: {arr.type}")
    raw = np.frombuffer(arr.buffers()[1], dtype)[arr.offset : arr.offset + len(arr)]
    out = raw.astype(np.int64)
    nulls = null_mask(arr)
    if nulls is not None:
        out[nulls] = fill
    return out


def int_array(values: np.ndarray, type_: pa.DataType, nulls: np.ndarray | None = None) -> pa.Array:
    """A fixed-width array (int32/int64/timestamp) over ``values`` (null where ``nulls``)."""
    width = type_.bit_width // 8
    data = np.ascontiguousarray(values, np.dtype(f"<i{width}"))
    return pa.Array.from_buffers(type_, len(data), [_validity(nulls), pa.py_buffer(data)])


def binary_array(seq: Sequence[Any], what: str) -> pa.LargeBinaryArray:
    """bytes, str (UTF-8) or None per row as large_binary. Plain bytes take two C loops
    (~60 ns a row for a key and a value column against ~45 for ``pa.array``, measured);
    other rows one Python step each."""
    n = len(seq)
    try:
        lengths = np.fromiter(map(len, seq), np.int64, n)  # TypeError: a None (or worse)
        data = b"".join(seq)  # TypeError: a str
        if len(data) != int(lengths.sum()):
            raise TypeError  # rows whose len() does not count bytes (memoryviews of ints)
        nulls = None
    except TypeError:
        rows = list(seq)
        nulls = np.zeros(n, np.bool_)
        for i, v in enumerate(rows):
            if type(v) is bytes:
                continue
            if v is None:
                rows[i], nulls[i] = b"", True
            elif isinstance(v, str):
                rows[i] = v.encode()
            elif isinstance(v, (bytes, bytearray, memoryview)):
                rows[i] = bytes(v)
            else:
                raise TypeError(
                    f"{what}: cannot be read as binary (row {i} is {type(v).__name__})"
                ) from None
        lengths = np.fromiter(map(len, rows), np.int64, n)
        data = b"".join(rows)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.large_binary(), n, [_validity(nulls), pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _int64_from_seq(data: Any, what: str) -> pa.Array:
    rows = data.tolist() if isinstance(data, np.ndarray) else list(data)
    nulls = np.fromiter((v is None for v in rows), np.bool_, len(rows))
    if nulls.any():
        rows = [0 if v is None else v for v in rows]
    try:
        arr = np.asarray(rows) if rows else np.zeros(0, np.int64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{what}: cannot be read as int64 ({exc})") from None
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise TypeError(f"{what}: cannot be read as int64 (values of type {arr.dtype})")
    if arr.dtype.kind == "u" and len(arr) and int(arr.max()) >= 1 << 63:
        raise TypeError(f"{what}: cannot be read as int64 (a value exceeds it)")
    return int_array(arr.astype(np.int64), pa.int64(), nulls)


def _headers_from_rows(rows: Sequence[Any], what: str) -> pa.ListArray:
    """Rows of (key, value) pairs or None as list<struct<key, value>> (large binary)."""
    keys: list[Any] = []
    values: list[Any] = []
    counts = np.zeros(len(rows), np.int64)
    nulls = np.zeros(len(rows), np.bool_)
    for i, r in enumerate(rows):
        if r is None:
            nulls[i] = True
            continue
        for kv in r:
            try:
                k, v = kv
            except (TypeError, ValueError):
                raise TypeError(f"a header must be a (key, value) pair, not {kv!r}") from None
            if k is None:
                raise ValueError(f"{what}: a header key is null")
            keys.append(k)
            values.append(v)
        counts[i] = len(r)
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    items = pa.StructArray.from_arrays(
        [binary_array(keys, f"{what} keys"), binary_array(values, f"{what} values")],
        fields=list(_LARGE_HEADERS_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(
        int_array(offsets.astype(np.int32), pa.int32()), items, mask=_mask_array(nulls)
    )


def _mask_array(nulls: np.ndarray) -> pa.Array | None:
    if not nulls.any():
        return None
    bits = pa.py_buffer(np.packbits(nulls, bitorder="little"))
    return pa.Array.from_buffers(pa.bool_(), len(nulls), [None, bits])


def _to_arrow(data: Column, what: str, type_: pa.DataType) -> pa.Array:
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks()
    try:
        if isinstance(data, pa.Array):
            return data.cast(type_)
        if type_ == pa.large_binary():
            if isinstance(data, np.ndarray):
                data = data.tolist()
            return binary_array(data, what)
        if type_ == pa.int64():
            return _int64_from_seq(data, what)
        if type_ == _LARGE_HEADERS_TYPE:
            return _headers_from_rows(data, what)
        raise TypeError(f"unsupported type {type_}")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError) as exc:
        raise TypeError(f"{what}: cannot be read as {type_} ({exc})") from None


def _bytes_column(data: Column, what: str) -> _Bytes:
    """bytes, str (UTF-8) or None per row; or a binary/string Arrow array."""
    if isinstance(data, (bytes, str)):
        raise TypeError(f"{what}: expected a column (a sequence or an Arrow array), not {data!r}")
    arr = _to_arrow(data, what, pa.large_binary())
    nulls = null_mask(arr)
    if nulls is not None:
        arr = pc.fill_null(arr, _empty_binary())
        lengths = np.diff(_offsets(arr))
        lengths[nulls] = -1
    else:
        lengths = np.diff(_offsets(arr))
    return _Bytes(arr, lengths)


def _from_parts(offsets: np.ndarray, data: np.ndarray | pa.Buffer) -> pa.LargeBinaryArray:
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    return pa.Array.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), buf]
    )


def _empty_binary() -> pa.Scalar:
    """b"" as a large_binary scalar (``pa.scalar`` would import pandas)."""
    return _from_parts(np.zeros(2, np.int64), b"")[0]


def _join(parts: Sequence[pa.Array]) -> pa.LargeBinaryArray:
    """Element-wise concatenation: its data buffer is every row's parts, row after row."""
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, _empty_binary())


# --- varints -------------------------------------------------------------------------------


def _zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(_U64)


def _varint_sizes(zz: np.ndarray) -> np.ndarray:
    sizes = np.ones(len(zz), np.int64)
    if len(zz) == 0:
        return sizes
    top = int(zz.max())
    k = 1
    while top >> (7 * k):
        sizes += zz >= _U64(1 << (7 * k))
        k += 1
    return sizes


def _put_varints(out: np.ndarray, pos: np.ndarray, zz: np.ndarray, sizes: np.ndarray) -> None:
    """Write varint ``zz[i]`` (``sizes[i]`` bytes) at ``out[pos[i]:]`` for every i at once."""
    if len(zz) == 0:
        return
    top = int(sizes.max())
    for k in range(top):
        byte = ((zz >> _U64(7 * k)) & _U64(0x7F)).astype(np.uint8)
        if k + 1 < top:
            byte |= (sizes > k + 1).astype(np.uint8) << np.uint8(7)
        if k == 0:
            out[pos] = byte
        else:
            m = sizes > k
            out[pos[m] + k] = byte[m]


def _varint_column(values: np.ndarray) -> tuple[pa.LargeBinaryArray, np.ndarray]:
    """Each value as its own zigzag varint, as a binary column; and the sizes."""
    zz = _zigzag(values)
    sizes = _varint_sizes(zz)
    offsets = np.zeros(len(zz) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    out = np.zeros(int(offsets[-1]), np.uint8)
    _put_varints(out, offsets[:-1], zz, sizes)
    return _from_parts(offsets, out), sizes


def _read_varints(
    buf: np.ndarray, pos: np.ndarray, *, strict: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints starting at every ``pos`` in ``buf``: (values, sizes).

    Reads are clipped to the buffer (a varint cut by its end reads as garbage, caught by the
    callers' length checks). ``strict=False`` is for guessed positions: a varint longer than
    10 bytes reads as a huge negative value instead of raising."""
    last = len(buf) - 1
    pos = np.clip(pos, 0, last)
    b0 = buf[pos]
    if not (b0 & 0x80).any():  # all one byte: attributes, small deltas, no headers
        raw = b0.astype(np.int64)
        return (raw >> 1) ^ -(raw & 1), np.ones(len(pos), np.int64)
    b1 = buf[np.minimum(pos + 1, last)]
    c0 = b0 >> 7
    c1 = (b1 >> 7) & c0
    raw = (b0 & 0x7F).astype(np.int64) | ((b1 & 0x7F).astype(np.int64) << 7) * c0
    sizes = 1 + c0.astype(np.int64) + c1  # bytes 0, 1 (if c0) and 2 (if c1) are in
    idx = np.flatnonzero(c1)
    k = 2
    while idx.size and k < 10:
        b = buf[np.minimum(pos[idx] + k, last)].astype(np.int64)
        raw[idx] |= (b & 0x7F) << (7 * k)
        idx = idx[b >= 0x80]
        sizes[idx] += 1  # byte k said another follows
        k += 1
    values = ((raw >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(raw & 1)
    if idx.size:
        if strict:
            raise InvalidBatchError(ErrorCode.CORRUPT_MESSAGE, "record varint longer than 10 bytes")
        values[idx] = -(1 << 62)
    return values, sizes


# --- encoding ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """One record batch, for the input rows ``[first, first + count)``."""

    data: bytes
    first: int
    count: int
    base_sequence: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _timestamps(timestamps: Any, n: int, now_ms: int | None) -> np.ndarray:
    now = _now_ms() if now_ms is None else now_ms
    if timestamps is None:
        return np.full(n, now, np.int64)
    if isinstance(timestamps, (int, np.integer)) and not isinstance(timestamps, bool):
        ts = np.full(n, int(timestamps), np.int64)
    elif isinstance(timestamps, np.ndarray) and timestamps.dtype.kind in "iu":
        ts = timestamps.astype(np.int64)
    elif isinstance(timestamps, np.ndarray) and timestamps.dtype.kind == "M":
        ts = timestamps.astype("datetime64[ms]").view(np.int64)
    else:
        if isinstance(timestamps, pa.ChunkedArray):
            timestamps = timestamps.combine_chunks()
        if isinstance(timestamps, pa.Array) and pa.types.is_timestamp(timestamps.type):
            timestamps = timestamps.cast(pa.timestamp("ms")).cast(pa.int64())
        arr = _to_arrow(timestamps, "timestamps", pa.int64())
        ts = to_numpy(arr, fill=now)
    if len(ts) != n:
        raise ValueError(f"timestamps: {len(ts)} given for {n} values")
    if n and int(ts.min()) < 0:
        raise ValueError(f"timestamps: invalid timestamp {int(ts.min())} (must be >= 0)")
    return ts


def _headers_list(headers: Any, n: int) -> pa.ListArray | None:
    """Headers as list<struct<key, value>>; None when no row has any."""
    if headers is None:
        return None
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if isinstance(headers, pa.Array):
        try:
            arr = headers.cast(_LARGE_HEADERS_TYPE)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TypeError(
                f"headers: expected {HEADERS_TYPE}, got {headers.type} ({exc})"
            ) from None
    else:
        if len(headers) != n:
            raise ValueError(f"headers: {len(headers)} given for {n} values")
        if not any(headers):
            return None
        rows: list[list[tuple[Any, Any]] | None] = []
        for h in headers:  # one step per row: pyarrow needs (key, value) tuples
            if not h:
                rows.append(None)
            elif isinstance(h, Mapping):
                rows.append(list(h.items()))
            else:
                rows.append([tuple(kv) for kv in h])
        arr = _to_arrow(rows, "headers", _LARGE_HEADERS_TYPE)
    if len(arr) != n:
        raise ValueError(f"headers: {len(arr)} given for {n} values")
    return arr


def _header_sections(arr: pa.ListArray) -> _Bytes | None:
    """Every row's encoded headers (count, then key/value pairs) as one binary column."""
    counts = to_numpy(pc.list_value_length(arr))
    if not counts.any():
        return None
    flat = arr.flatten()
    if flat.null_count:
        raise ValueError("headers: a header is null (it needs a key)")
    hkeys, hvalues = flat.flatten()
    if hkeys.null_count:
        raise ValueError("headers: a header key is null")
    k = _bytes_column(hkeys, "header keys")
    v = _bytes_column(hvalues, "header values")
    klen, _ = _varint_column(k.lengths)
    vlen, _ = _varint_column(v.lengths)
    each = _join([klen, k.array, vlen, v.array])
    row_ends = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=row_ends[1:])
    per_row = _from_parts(_offsets(each)[row_ends], each.buffers()[2])
    count_col, _ = _varint_column(counts)
    joined = _join([count_col, per_row])
    return _Bytes(joined, np.diff(_offsets(joined)))


def _split(est: np.ndarray, limit: int, cuts: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Greedy runs of rows whose estimated sizes sum to at most ``limit`` (at least one row);
    a run never spans a row index in ``cuts`` (ascending): one starts there."""
    cum = np.cumsum(est)
    out: list[tuple[int, int]] = []
    start, before = 0, 0
    for stop in (*cuts, len(est)):
        while start < stop:
            end = int(np.searchsorted(cum, before + limit, side="right"))
            end = min(max(end, start + 1), stop)
            out.append((start, end))
            before = int(cum[end - 1])
            start = end
    return out


def encode_batches(
    values: Column,
    keys: Column | None = None,
    *,
    headers: Any = None,
    timestamps: Any = None,
    now_ms: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    compression: int = Compression.NONE,
    compression_level: int | None = None,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    base_offset: int = 0,
    partition_leader_epoch: int = 0,
) -> list[EncodedBatch]:
    """Encode columns as v2 record batches of at most ``max_batch_bytes`` each (uncompressed).

    ``values`` and ``keys``: Arrow binary/string arrays or sequences of bytes, str or None.
    ``headers``: an Arrow ``list<struct<key: string, value: binary>>`` array or, per row,
    None, a mapping or (key, value) pairs. ``timestamps`` (ms): None (``now_ms``, default the
    clock), one int, a sequence (None means now), a numpy int/datetime64 or an Arrow
    integer/timestamp array. Batch *i* gets ``base_sequence`` plus the rows before it
    (wrapping at 2^31, as Kafka's sequences do). Equivalent, batch for batch, to
    :func:`samsa.protocol.records.build_batch` over the same rows. ``compression_level``
    (gzip 1-9, lz4 1-17, zstd up to 22; Kafka's ``compression.<codec>.level``) overrides
    the codec's default: LZ4's default is a high-compression level, ~25x slower than 1.
    """
    sections = encode_sections(
        values,
        keys,
        headers=headers,
        timestamps=timestamps,
        now_ms=now_ms,
        compression=compression,
        compression_level=compression_level,
        max_batch_bytes=max_batch_bytes,
    )
    attributes = compression | (TRANSACTIONAL_FLAG if transactional else 0)
    out: list[EncodedBatch] = []
    for es in sections:
        a, b, section = es.first, es.first + es.count, es.section
        first_ts, max_ts = es.first_timestamp, es.max_timestamp
        seq = (base_sequence + a) & 0x7FFFFFFF if base_sequence >= 0 else base_sequence
        tail = _AFTER_CRC.pack(
            attributes, b - a - 1, first_ts, max_ts, producer_id, producer_epoch, seq, b - a
        )
        crc = crc32c.crc32c(section, crc32c.crc32c(tail))
        head = _BEFORE_CRC.pack(
            base_offset, len(tail) + len(section) + 9, partition_leader_epoch, MAGIC_V2, crc
        )
        out.append(EncodedBatch(b"".join((head, tail, section)), a, b - a, seq))
    return out


@dataclass(frozen=True, slots=True)
class EncodedSection:
    """The records section of one batch (compressed with the codec asked for), for the
    input rows ``[first, first + count)``, with the batch's first and largest timestamps:
    what a producer needs to build the header (producer id, epoch, sequence, CRC) when it
    sends the batch."""

    section: memoryview
    first: int
    count: int
    first_timestamp: int
    max_timestamp: int


def encode_sections(
    values: Column,
    keys: Column | None = None,
    *,
    headers: Any = None,
    timestamps: Any = None,
    now_ms: int | None = None,
    compression: int = Compression.NONE,
    compression_level: int | None = None,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    cuts: Sequence[int] = (),
) -> list[EncodedSection]:
    """:func:`encode_batches` without the headers: each batch's records section, split and
    compressed alike, as a view of one buffer (no CRC computed, no copy made); the caller
    adds the header and its CRC once the producer fields are known. A batch starts at each
    row index of ``cuts`` (ascending): the rows of several partitions, grouped, are encoded
    in one call, each batch holding one partition's."""
    if compression not in (0, 1, 2, 3, 4):
        raise ValueError(f"unknown compression codec {compression}")
    if compression_level is not None:
        if compression not in _LEVELS:
            raise ValueError("compression_level applies to gzip, lz4 and zstd only")
        low, high = _LEVELS[compression]
        if not low <= compression_level <= high:
            raise ValueError(f"compression_level {compression_level} not in [{low}, {high}]")
    if max_batch_bytes <= HEADER_SIZE:
        raise ValueError(f"max_batch_bytes must exceed the {HEADER_SIZE}-byte batch header")
    vals = _bytes_column(values, "values")
    n = len(vals.lengths)
    if n == 0:
        if keys is not None and len(keys) != 0:
            raise ValueError(f"keys: {len(keys)} given for 0 values")
        return []
    key_col: _Bytes | None = None
    if keys is not None:
        key_col = _bytes_column(keys, "keys")
        if len(key_col.lengths) != n:
            raise ValueError(f"keys: {len(key_col.lengths)} given for {n} values")
        klen = key_col.lengths
    else:
        klen = np.full(n, -1, np.int64)
    ts = _timestamps(timestamps, n, now_ms)
    hlist = _headers_list(headers, n)
    hsec = _header_sections(hlist) if hlist is not None else None
    hlen = hsec.lengths if hsec is not None else np.ones(n, np.int64)

    klen_zz, vlen_zz = _zigzag(klen), _zigzag(vals.lengths)
    klen_sz, vlen_sz = _varint_sizes(klen_zz), _varint_sizes(vlen_zz)
    # the body without its two deltas, whose size depends on the split
    fixed = 1 + klen_sz + np.maximum(klen, 0) + vlen_sz + np.maximum(vals.lengths, 0) + hlen

    # split on a bound of each record's size: the deltas are not known before the split
    span = int(ts.max()) - int(ts.min())
    bound_zz = np.array([span, n - 1], np.int64)
    est = fixed + int(_varint_sizes(_zigzag(bound_zz)).sum())
    est += _varint_sizes(_zigzag(est))
    runs = _split(est, max_batch_bytes - HEADER_SIZE, cuts)

    starts = np.array([a for a, _ in runs], np.int64)
    counts = np.array([b - a for a, b in runs], np.int64)
    first = np.repeat(starts, counts)
    off_zz = _zigzag(np.arange(n, dtype=np.int64) - first)
    ts_zz = _zigzag(ts - ts[first])
    off_sz, ts_sz = _varint_sizes(off_zz), _varint_sizes(ts_zz)
    body = fixed + ts_sz + off_sz
    len_zz = _zigzag(body)
    len_sz = _varint_sizes(len_zz)

    # prefix: length, attributes (0), timestamp delta, offset delta, key length
    p_off = np.zeros(n + 1, np.int64)
    np.cumsum(len_sz + 1 + ts_sz + off_sz + klen_sz, out=p_off[1:])
    prefix = np.zeros(int(p_off[-1]), np.uint8)
    pos = p_off[:-1].copy()
    _put_varints(prefix, pos, len_zz, len_sz)
    pos += len_sz + 1
    _put_varints(prefix, pos, ts_zz, ts_sz)
    pos += ts_sz
    _put_varints(prefix, pos, off_zz, off_sz)
    pos += off_sz
    _put_varints(prefix, pos, klen_zz, klen_sz)
    mid, _ = _varint_column(vals.lengths)
    parts = [_from_parts(p_off, prefix)]
    if key_col is not None:
        parts.append(key_col.array)
    parts += [mid, vals.array]
    if hsec is not None:
        parts.append(hsec.array)
    else:
        parts.append(_from_parts(np.arange(n + 1, dtype=np.int64), np.zeros(n, np.uint8)))
    records = _join(parts)
    r_off = _offsets(records)
    r_data = memoryview(records.buffers()[2])

    max_ts = np.maximum.reduceat(ts, starts)
    out: list[EncodedSection] = []
    for i, (a, b) in enumerate(runs):
        section = r_data[r_off[a] : r_off[b]]
        if compression_level is not None:
            section = memoryview(_LEVELLED[compression](section, level=compression_level))
        elif compression:
            section = memoryview(compress(compression, section))
        out.append(EncodedSection(section, a, b - a, int(ts[a]), int(max_ts[i])))
    return out


# --- partitioning --------------------------------------------------------------------------


def murmur2_array(keys: Column) -> np.ndarray:
    """Kafka's ``Utils.murmur2`` of every key, as int32 (a null key hashes as empty)."""
    col = _bytes_column(keys, "keys")
    data = col.data
    starts = col.offsets[:-1]
    lengths = np.maximum(col.lengths, 0)
    h = (np.uint32(0x9747B28C) ^ lengths.astype(np.uint32)).astype(np.uint32)
    blocks = lengths // 4
    idx = np.flatnonzero(blocks)
    i = 0
    while idx.size:
        p = starts[idx] + 4 * i
        k = (
            data[p].astype(np.uint32)
            | (data[p + 1].astype(np.uint32) << np.uint32(8))
            | (data[p + 2].astype(np.uint32) << np.uint32(16))
            | (data[p + 3].astype(np.uint32) << np.uint32(24))
        )
        k *= _M
        k ^= k >> np.uint32(24)
        k *= _M
        h[idx] = (h[idx] * _M) ^ k
        i += 1
        idx = idx[blocks[idx] > i]
    rest = lengths & 3
    tail = starts + (lengths & ~3)
    m = rest == 3
    h[m] ^= data[tail[m] + 2].astype(np.uint32) << np.uint32(16)
    m = rest >= 2
    h[m] ^= data[tail[m] + 1].astype(np.uint32) << np.uint32(8)
    m = rest >= 1
    h[m] ^= data[tail[m]].astype(np.uint32)
    h[m] *= _M
    h ^= h >> np.uint32(13)
    h *= _M
    h ^= h >> np.uint32(15)
    return h.view(np.int32)


def partitions_for_keys(keys: Column, num_partitions: int) -> np.ndarray:
    """``toPositive(murmur2(key)) % num_partitions`` per key, as Java's default partitioner;
    -1 for a null key (those are placed by the sticky partitioner, not by hash)."""
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    col = _bytes_column(keys, "keys")
    parts = (murmur2_array(col.array).view(np.uint32) & np.uint32(0x7FFFFFFF)) % np.uint32(
        num_partitions
    )
    out = parts.astype(np.int32)
    out[col.lengths < 0] = -1
    return out


# --- decoding ------------------------------------------------------------------------------


# A v2 batch header as numpy reads it (big-endian, packed: 61 bytes)
_HEADER_DTYPE = np.dtype(
    [
        ("base_offset", ">i8"),
        ("batch_length", ">i4"),
        ("leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("record_count", ">i4"),
    ]
)
assert _HEADER_DTYPE.itemsize == HEADER_SIZE
_LENGTH_AT = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class BatchHeaders:
    """The whole batches of fetched data, one numpy column per header field used."""

    base_offset: np.ndarray  # int64, in buffer order
    next_offset: np.ndarray  # int64: base offset + last offset delta + 1
    producer_id: np.ndarray  # int64
    leader_epoch: np.ndarray  # int64 (partition leader epoch)

    def end_offset(self, start: int) -> int:
        """The offset after the last whole batch (``start`` if none is past it)."""
        return max(start, int(self.next_offset.max())) if len(self.next_offset) else start

    def owner(self, offsets: np.ndarray | int) -> Any:
        """The index of the batch holding each of ``offsets`` (-1 before the first)."""
        return np.searchsorted(self.base_offset, offsets, "right") - 1


def batch_headers(data: bytes | bytearray | memoryview | None) -> BatchHeaders:
    """The headers of the whole batches at the start of ``data``, read column-wise.

    Where batch *i+1* starts depends on batch *i*'s length, so only the starts are found
    one by one (a 4-byte read each); the fields are then gathered for every batch at once.
    The walk stops at a partial batch (normal at the end of a fetch) and at a length too
    short for a header: what follows is the decoder's to judge."""
    buf = memoryview(data or b"").cast("B")
    starts: list[int] = []
    pos, end = 0, len(buf)
    length_at = _LENGTH_AT.unpack_from
    while end - pos >= HEADER_SIZE:
        (length,) = length_at(buf, pos + 8)
        size = length + LOG_OVERHEAD
        if length < MIN_BATCH_LENGTH or pos + size > end:
            break
        starts.append(pos)
        pos += size
    nbuf = np.frombuffer(buf, np.uint8)
    at = np.array(starts, np.int64)[:, None] + np.arange(HEADER_SIZE, dtype=np.int64)
    heads = nbuf[at].view(_HEADER_DTYPE)[:, 0] if starts else np.zeros(0, _HEADER_DTYPE)
    base = heads["base_offset"].astype(np.int64)
    return BatchHeaders(
        base,
        base + heads["last_offset_delta"] + 1,
        heads["producer_id"].astype(np.int64),
        heads["leader_epoch"].astype(np.int64),
    )


@dataclass(frozen=True, slots=True)
class DecodedFetch:
    """The records of one fetched partition, and the position after them."""

    batch: pa.RecordBatch
    next_offset: int


@dataclass(slots=True)
class _Kept:
    base_offset: int
    count: int
    timestamp: int  # base timestamp, or max timestamp for LogAppendTime
    log_append: bool
    start: int  # where its records are in the buffer read
    end: int
    joined: int  # where they start once decompressed sections are joined


def _walk(buf: bytes, pos: int, count: int, out: array) -> None:
    """Append the starts of ``count`` records from ``pos``, reading only their lengths.

    Nothing is checked here: the caller checks every record's length against the next
    start, vectorised. ``count`` is bounded by the batch size; an index out of range means
    a corrupt batch."""
    append = out.append
    try:
        for _ in range(count):
            append(pos)
            b = buf[pos]
            if b < 0x80:
                pos += 1 + ((b >> 1) ^ -(b & 1))
                continue
            n = b & 0x7F
            c = buf[pos + 1]
            if c < 0x80:
                n |= c << 7
                pos += 2 + ((n >> 1) ^ -(n & 1))
                continue
            n |= (c & 0x7F) << 7
            q = pos + 2
            shift = 14
            while True:
                c = buf[q]
                q += 1
                n |= (c & 0x7F) << shift
                if c < 0x80 or shift > 63:
                    break
                shift += 7
            pos = q + ((n >> 1) ^ -(n & 1))
    except (IndexError, OverflowError):  # a length past the batch, or past any int64
        raise corrupt("record lengths run past the batch") from None


def _record_starts(
    buf: bytes | memoryview, nbuf: np.ndarray, kept: list[_Kept]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where every record of the kept batches starts, and its length varint (value, size).

    Record *i+1* starts where record *i*'s length says: a sequential chain. It is guessed
    for all batches at once: every record is assumed to have the size of the last record
    known for sure before it, give or take the growth of its offset delta's varint; the
    guess is checked at every guessed start, and each batch's first wrong guess becomes a
    known size for the next round. Equal-sized records settle in a round or two (another
    round wherever the timestamp delta's varint grows); batches still wrong
    after ``_GUESS_ROUNDS`` are walked in Python from their first unsettled record. The
    caller checks the result, so a corrupt batch cannot pass whichever way it was found.
    """
    counts = np.array([k.count for k in kept], np.int64)
    kstart = np.array([k.start for k in kept], np.int64)
    kend = np.array([k.end for k in kept], np.int64)
    if (counts <= 0).any() or (counts * _MIN_RECORD > kend - kstart).any():
        raise corrupt("record count does not fit the batch")
    n = int(counts.sum())
    first = np.zeros(len(kept), np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    which = np.repeat(np.arange(len(kept)), counts)
    at = np.arange(n, dtype=np.int64)
    length, lsz = _read_varints(nbuf, kstart)
    if (length < _MIN_RECORD - 1).any():
        raise corrupt("record length too small")
    # records usually differ only in the offset delta's varint, which grows at 64 and 8192
    grows = _varint_sizes(_zigzag(at - first[which]))
    sizes = (lsz + length - 1)[which] + grows
    base = kstart[which]
    for _ in range(_GUESS_ROUNDS):
        starts = np.cumsum(sizes)
        starts -= sizes
        starts += base - starts[first][which]
        length, lsz = _read_varints(nbuf, starts, strict=False)
        found = lsz + length
        wrong = np.where(found != sizes, at, n)
        bad = np.minimum.reduceat(wrong, first)  # first wrong guess of each batch (or n)
        if (bad == n).all():
            return starts, length, lsz
        from_bad = bad[which]
        later = at >= from_bad
        sizes[later] = (found - grows)[from_bad[later]] + grows[later]
        if (sizes < _MIN_RECORD).any():
            raise corrupt("record length too small")
    out = array("q")
    for i in range(len(kept)):
        a, b = int(first[i]), int(first[i] + counts[i])
        out.extend(starts[a : min(b, int(bad[i]))].tolist())
        if bad[i] < b:
            _walk(buf, int(starts[bad[i]]), b - int(bad[i]), out)
    starts = np.frombuffer(out, np.int64)
    length, lsz = _read_varints(nbuf, starts)
    return starts, length, lsz


def _segments(
    buf: pa.Buffer, starts: np.ndarray, ends: np.ndarray, nulls: np.ndarray | None
) -> pa.Array:
    """``buf[starts[i]:ends[i]]`` (null where ``nulls``) as a binary array, gathered in C.

    The segments are in buffer order, so one binary array whose offsets are
    ``0, s0, e0, s1, e1, ...`` covers the buffer; its odd elements are the segments."""
    n = len(starts)
    offsets = np.empty(2 * n + 1, np.int64)
    offsets[0] = 0
    offsets[1::2] = starts
    offsets[2::2] = ends
    if n and offsets[-1] >= 2**31:
        whole = pa.Array.from_buffers(pa.large_binary(), 2 * n, [None, pa.py_buffer(offsets), buf])
    else:
        whole = pa.Array.from_buffers(
            pa.binary(), 2 * n, [None, pa.py_buffer(offsets.astype(np.int32)), buf]
        )
    picks = int_array(np.arange(1, 2 * n, 2, dtype=np.int64), pa.int64(), nulls)
    return pc.take(whole, picks).cast(pa.binary())


def _empty(include_headers: bool) -> pa.RecordBatch:
    schema = ARROW_SCHEMA_HEADERS if include_headers else ARROW_SCHEMA
    return empty_batch(schema)


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of no rows (``RecordBatch.from_pylist([])`` would import pandas)."""
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def _sections(
    batches: KeptBatches, position: int, max_records: int | None
) -> tuple[list[_Kept], list[bytes | memoryview], bool, bool]:
    """The record sections of the kept batches (decompressed), whether any was compressed,
    and whether ``max_records`` rows were certain before the last data batch seen."""
    sections: list[bytes | memoryview] = []
    kept: list[_Kept] = []
    sure = 0  # records certainly at or after the position in the kept batches
    at = 0
    compressed = False
    full = False  # max_records rows are certain before the last data batch seen
    for batch in batches:
        if max_records is not None and sure >= max_records:
            full = True  # this batch has rows beyond the limit: stop after the last row
            break
        start = batch.pos + HEADER_SIZE
        compressed = compressed or bool(batch.compression)
        section = batches.records(batch)
        log_append = bool(batch.attributes & TIMESTAMP_TYPE_FLAG)
        kept.append(
            _Kept(
                batch.base_offset,
                batch.record_count,
                batch.max_timestamp if log_append else batch.base_timestamp,
                log_append,
                start,
                start + len(section),
                at,
            )
        )
        sections.append(section)
        at += len(section)
        if batch.base_offset >= position:
            sure += batch.record_count
    return kept, sections, compressed, full


@dataclass(slots=True)
class FetchedColumns:
    """The records of one fetched partition as numpy columns over the bytes they are in:
    what :func:`decode_fetched` makes Arrow of, and what the consumer makes ConsumerRecords of
    (no Arrow array it would not hand out). Bytes fields are (start, end, null) positions."""

    buf: bytes | memoryview
    nbuf: np.ndarray  # ``buf`` as uint8
    offsets: np.ndarray  # int64
    timestamps: np.ndarray  # int64, ms (the batch's max timestamp under LogAppendTime)
    log_append: np.ndarray  # bool: LogAppendTime
    keys: tuple[np.ndarray, np.ndarray, np.ndarray]
    values: tuple[np.ndarray, np.ndarray, np.ndarray]
    header_at: np.ndarray  # where each record's first header starts
    header_count: np.ndarray
    ends: np.ndarray  # where each record ends
    topic: str
    partition: int

    def __len__(self) -> int:
        return len(self.offsets)

    def binary(self, field: tuple[np.ndarray, np.ndarray, np.ndarray]) -> pa.Array:
        """``keys`` or ``values`` as an Arrow binary array (gathered in C)."""
        start, end, null = field
        return _segments(pa.py_buffer(self.buf), start, end, null if null.any() else None)

    def has_headers(self) -> bool:
        return bool(self.header_count.any())

    def headers(self) -> pa.Array:
        """The headers as list<struct<key, value>>, checked: every record must end with them."""
        p = self.header_at.copy()  # moved past the headers
        out = _decode_headers(
            pa.py_buffer(self.buf),
            self.nbuf,
            p,
            self.header_count,
            self.ends,
            self.topic,
            self.partition,
        )
        self.check_ends(p)
        return out

    def check_ends(self, after_headers: np.ndarray | None = None) -> None:
        """Every record ends after its headers (where they start if there are none)."""
        p = self.header_at if after_headers is None else after_headers
        if (p != self.ends).any():
            raise corrupt(f"{self.topic}-{self.partition}: record length does not match its fields")

    def after(self, position: int) -> FetchedColumns:
        """The rows at or after ``position`` (rows are in offset order)."""
        i = int(np.searchsorted(self.offsets, position))
        if i == 0:
            return self
        cut = slice(i, None)
        return FetchedColumns(
            self.buf,
            self.nbuf,
            self.offsets[cut],
            self.timestamps[cut],
            self.log_append[cut],
            (self.keys[0][cut], self.keys[1][cut], self.keys[2][cut]),
            (self.values[0][cut], self.values[1][cut], self.values[2][cut]),
            self.header_at[cut],
            self.header_count[cut],
            self.ends[cut],
            self.topic,
            self.partition,
        )


def decode_columns(
    data: bytes | bytearray | memoryview | None,
    topic: str,
    partition: int,
    position: int,
    *,
    isolation_level: int = READ_UNCOMMITTED,
    aborted: Iterable[Any] = (),
    check_crcs: bool = True,
    max_records: int | None = None,
) -> tuple[FetchedColumns | None, int]:
    """A Fetch response's records for one partition as numpy columns (None if no row), and
    the position after what was returned or skipped. Headers are located (count, start),
    not decoded.

    Batches are kept by :class:`~samsa.protocol.fetched.KeptBatches`: a partial batch at the
    end is ignored, records below ``position`` are dropped, control batches skipped, and with
    ``READ_COMMITTED`` the batches of the ``aborted`` transactions of the response
    ((producer id, first offset) pairs, or objects with ``producer_id`` and ``first_offset``)
    are skipped up to their abort marker. At most ``max_records`` rows; ``next_offset`` is
    the position after what was returned or skipped. A corrupt batch raises
    :class:`InvalidBatchError` (CORRUPT_MESSAGE).
    """
    if max_records is not None and max_records <= 0:
        raise ValueError("max_records must be positive")
    if not data:
        return None, position
    where = f"{topic}-{partition}"
    batches = KeptBatches(
        data,
        position,
        name=where,
        isolation_level=isolation_level,
        aborted=aborted,
        check_crcs=check_crcs,
    )
    kept, sections, compressed, full = _sections(batches, position, max_records)
    next_offset = batches.next_offset
    if not kept:
        return None, next_offset

    # uncompressed records are read where they are; else every section is copied together
    buf: bytes | memoryview = batches.data
    if compressed:
        buf = b"".join(sections)
        for k in kept:
            k.start, k.end = k.joined, k.joined + k.end - k.start
    nbuf = np.frombuffer(buf, np.uint8)
    rec, length, lsz = _record_starts(buf, nbuf, kept)
    counts = np.array([k.count for k in kept], np.int64)
    which = np.repeat(np.arange(len(kept)), counts)
    rec_end = np.empty_like(rec)
    rec_end[:-1] = rec[1:]
    rec_end[np.cumsum(counts) - 1] = [k.end for k in kept]
    p = rec + lsz
    # every record must end where the next starts: this checks the starts, however found
    if (p + length != rec_end).any() or (length < _MIN_RECORD - 1).any():
        raise corrupt(f"{where}: record lengths do not match their batch")
    p += 1  # attributes
    ts_delta, sz = _read_varints(nbuf, p)
    p += sz
    off_delta, sz = _read_varints(nbuf, p)
    p += sz
    offsets = np.array([k.base_offset for k in kept], np.int64)[which] + off_delta
    keep = offsets >= position
    if max_records is not None and (full or int(keep.sum()) > max_records):
        # as Java's consumer: the position follows the last row handed out
        keep &= np.cumsum(keep) <= max_records
        next_offset = int(offsets[np.flatnonzero(keep)[-1]]) + 1
    if not keep.all():
        p, rec_end, ts_delta, offsets, which = (
            p[keep],
            rec_end[keep],
            ts_delta[keep],
            offsets[keep],
            which[keep],
        )
    if len(p) == 0:
        return None, next_offset

    def field(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A nullable bytes field at ``pos``: (start, end, null mask)."""
        flen, fsz = _read_varints(nbuf, pos)
        if int(flen.min()) < -1:
            raise corrupt(f"{where}: negative record field length")
        fstart = pos + fsz
        fend = fstart + np.maximum(flen, 0)
        if (fend > rec_end).any():
            raise corrupt(f"{where}: record field overruns its record")
        return fstart, fend, flen < 0

    keys = field(p)
    values = field(keys[1])
    hcount, sz = _read_varints(nbuf, values[1])
    p = values[1] + sz
    # a header takes at least two bytes: this also bounds what the headers' arrays take
    if int(hcount.min()) < 0 or (p + 2 * hcount > rec_end).any():
        raise corrupt(f"{where}: bad header count")
    log_append = np.array([k.log_append for k in kept], np.bool_)[which]
    stamp = np.array([k.timestamp for k in kept], np.int64)[which]
    stamp = np.where(log_append, stamp, stamp + ts_delta)
    cols = FetchedColumns(
        buf, nbuf, offsets, stamp, log_append, keys, values, p, hcount, rec_end, topic, partition
    )
    return cols, next_offset


def decode_fetched(
    data: bytes | bytearray | memoryview | None,
    topic: str,
    partition: int,
    position: int,
    *,
    include_headers: bool = False,
    **options: Any,
) -> DecodedFetch:
    """A Fetch response's records for one partition as an Arrow batch in Spark's layout:
    :func:`decode_columns` (which ``options`` are for) made Arrow by :func:`to_arrow`."""
    cols, next_offset = decode_columns(data, topic, partition, position, **options)
    return DecodedFetch(to_arrow(cols, topic, partition, include_headers), next_offset)


def to_arrow(
    cols: FetchedColumns | None, topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    """Decoded columns as an Arrow batch in Spark's layout (headers decoded if asked)."""
    if cols is None:
        return _empty(include_headers)
    n = len(cols)
    arrays = [
        cols.binary(cols.keys),
        cols.binary(cols.values),
        _repeat_string(topic, n),
        int_array(np.full(n, partition, np.int32), pa.int32()),
        int_array(cols.offsets, pa.int64()),
        int_array(cols.timestamps * 1000, pa.timestamp("us", tz="UTC")),
        int_array(cols.log_append.astype(np.int32), pa.int32()),
    ]
    if include_headers:
        arrays.append(cols.headers())
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA_HEADERS)
    # headers not asked for are checked all the same (a record must end with them, as
    # Java's DefaultRecord.readFrom checks), decoded only if some record has one
    if cols.has_headers():
        cols.headers()
    else:
        cols.check_ends()
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _repeat_string(value: str, n: int) -> pa.Array:
    data = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data * n)]
    )


def _decode_headers(
    pbuf: pa.Buffer,
    nbuf: np.ndarray,
    p: np.ndarray,
    hcount: np.ndarray,
    rec_end: np.ndarray,
    topic: str,
    partition: int,
) -> pa.Array:
    """Headers of every record (in place: ``p`` moves past them) as list<struct<key, value>>."""
    total = int(hcount.sum())
    row_at = np.zeros(len(hcount) + 1, np.int64)
    np.cumsum(hcount, out=row_at[1:])
    hk_start = np.empty(total, np.int64)
    hk_end = np.empty(total, np.int64)
    hv_start = np.empty(total, np.int64)
    hv_end = np.empty(total, np.int64)
    hv_null = np.zeros(total, np.bool_)
    rows = np.flatnonzero(hcount)
    j = 0
    while rows.size:  # the j-th header of every record that has more than j
        at = row_at[rows] + j
        q = p[rows]
        for starts, ends, nulls in ((hk_start, hk_end, None), (hv_start, hv_end, hv_null)):
            flen, fsz = _read_varints(nbuf, q)
            if nulls is None and int(flen.min()) < 0:
                raise corrupt(f"{topic}-{partition}: null header key")
            if int(flen.min()) < -1:
                raise corrupt(f"{topic}-{partition}: negative header length")
            starts[at] = q + fsz
            q = q + fsz + np.maximum(flen, 0)
            ends[at] = q
            if nulls is not None:
                nulls[at] = flen < 0
            if (q > rec_end[rows]).any():
                raise corrupt(f"{topic}-{partition}: header overruns its record")
        p[rows] = q
        j += 1
        rows = rows[hcount[rows] > j]
    keys = _segments(pbuf, hk_start, hk_end, None)
    try:
        keys = keys.cast(pa.string())
    except pa.ArrowInvalid:
        raise corrupt(f"{topic}-{partition}: header key is not UTF-8") from None
    values = _segments(pbuf, hv_start, hv_end, hv_null if hv_null.any() else None)
    items = pa.StructArray.from_arrays([keys, values], fields=list(HEADERS_TYPE.value_type))
    return pa.ListArray.from_arrays(
        int_array(row_at.astype(np.int32), pa.int32()), items, type=HEADERS_TYPE
    )
