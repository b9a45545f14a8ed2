"""A client batch's records checked as Kafka's LogValidator reads them: streamed, bounded.

Theory of operation
-------------------
Kafka reads every record of a client batch before appending it (``DefaultRecord.readFrom``
for uncompressed records, ``readPartiallyFrom`` through a decompressing stream otherwise) and
refuses the batch if one is malformed, if there are fewer or more than ``recordCount``, or
(per record, reported by batch index) if a key is missing on a compacted topic or a timestamp
is outside the topic's window. Here the same reading is done without a Python object per
record and without the inflated records in memory:

- :func:`inflate` yields the records section in chunks of at most :data:`INFLATE_CHUNK`
  bytes (zlib, zstandard and lz4 frame decompress up to a cap per call; a gzip stream whose
  trailer says it fits a chunk is tried at once into a buffer of that size; a snappy block
  is bounded by the length it declares, checked before it is inflated). Past ``limit``
  inflated bytes it raises MESSAGE_TOO_LARGE, so a 32,000:1 bomb costs ``limit`` bytes of
  CPU, never memory. zstd frames may not ask for a window above :data:`ZSTD_MAX_WINDOW`.
  :func:`check_records` inflates into a buffer its caller reuses (:func:`new_scratch`, one
  per thread) where the codec can write there (gzip at once, zstd, snappy), in steps of up
  to its 1 MiB; the checker keeps nothing of a step but the bytes of a record it cuts.
- :class:`RecordChecker` takes those chunks and keeps only the unfinished tail of the last
  record. The complete records of a chunk are read one after the other by a small C
  extension, protocol/_records.c (a record starts where the one before it says it ends: a
  serial walk, which costs ~50x more as Python bytecode), with the GIL released over large
  chunks: lengths, varint sizes, offset deltas 0..n-1, key and value lengths within the
  record, header structure, the record ending where its fields do. It answers with the span
  of timestamp deltas and the count of null keys, which decide the topic's rules for the
  chunk unless a record may break one; only then is each record's key and timestamp asked for.
- Where the extension could not be built, the same checks are made with numpy: runs of
  records laid out alike are compared a byte column at a time; the others are found by
  guessing every record as long as the last one known (a short Python walk where sizes keep
  changing), then every field of all of them is read at once. Both paths give the same
  verdicts (tests/property/test_record_walker.py). Key and value bytes are only skipped. A
  record longer than two chunks is read field by field as it streams, never gathered.
- ``give_up`` (the event loop's try) bounds both the inflation and the reading: Unfinished
  once either passes it, not a verdict; the caller checks again in a worker thread.

All of it is C code (zlib, zstd, lz4, the walker or numpy) over buffers of a bounded size,
run by the broker in worker threads, so a heavy batch does not hold the event loop.
"""

from __future__ import annotations

import functools
import re
import struct
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import cramjam
import lz4.frame
import zstandard

from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    HEADER_SIZE,
    Compression,
    InvalidBatchError,
    RecordBatchView,
)

try:  # the C record walker: an install that could not build it reads records with numpy
    from samsa.protocol._records import RecordError as _RecordError
    from samsa.protocol._records import walk as _c_walk
except ImportError:  # pragma: no cover - the build makes it wherever a C compiler is
    _c_walk = None
    _RecordError = ValueError

if TYPE_CHECKING:
    import numpy as np
else:

    class _LazyNumpy:
        """numpy on first use: a uniform batch never needs it, and a broker starting (every
        test starts many) would pay ~0.2 s to import it."""

        def __getattr__(self, name: str) -> Any:
            import numpy

            globals()["np"] = numpy
            return getattr(numpy, name)

    np = _LazyNumpy()

INFLATE_CHUNK = 256 * 1024  # the most one decompression step produces
ZSTD_MAX_WINDOW = 1 << 24  # bytes of history a zstd frame may ask the decoder to keep
MAX_RECORD_ERRORS = 1000  # record errors kept for the response: a bound, not a limit on checks
_MIN_BODY = 6  # attributes, two deltas, key and value lengths, header count: a byte each
_MAX_WALK = 4096  # records walked in Python in one go when guessing fails
_BIG_RECORD = 2 * INFLATE_CHUNK  # longer records are read as they stream, never gathered
_RUN_COST = 512  # a uniform run's fixed cost (~10 us), in bytes of the general path's reading
# The C walker's bytes cost 1/32 of the numpy path's (at worst ~1.2 ns each, tiny records or
# headers, against ~30-40 ns): what ``give_up`` is charged for them.
_C_COST_SHIFT = 5
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _corrupt(message: str) -> InvalidBatchError:
    # Kafka's answer to records its codec cannot read (the stream's KafkaException is not
    # mapped to an error code); clients treat it as a failure, not a retry.
    return InvalidBatchError(ErrorCode.UNKNOWN_SERVER_ERROR, message)


def _invalid(message: str) -> InvalidBatchError:
    return InvalidBatchError(ErrorCode.INVALID_RECORD, message)


def _zigzag(raw: int, bits: int) -> int:
    """A varint's value as Java's ByteUtils reads it: the bits past ``bits`` (32 for an int,
    64 for a long) that a fifth (tenth) byte carries are dropped before the zigzag is undone,
    so an int of five bytes wraps as Kafka's does."""
    raw &= (1 << bits) - 1
    return (raw >> 1) ^ -(raw & 1)


# --- bounded inflation ---------------------------------------------------------------------


class Unfinished(Exception):
    """The records inflate past the ``give_up`` bytes a caller allowed: not a verdict on the
    batch, which is to be checked again where a long check may run."""


class _Budget:
    __slots__ = ("give_up", "left", "limit")

    def __init__(self, limit: int, give_up: int | None = None) -> None:
        self.limit = limit
        self.give_up = give_up if give_up is not None and give_up < limit else None
        self.left = limit if self.give_up is None else self.give_up

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            if self.give_up is not None:
                raise Unfinished(self.give_up)
            raise InvalidBatchError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"records inflate to more than {self.limit} bytes (message.max.inflated.bytes)",
            )


# A caller's reusable buffer to inflate into (check_records' ``scratch``): a fresh one per
# chunk cost an allocation, its page faults and a copy into bytes (~10-20% of a 1000-record
# snappy or gzip batch's check). A stream is inflated into it in steps of its size (a gzip
# stream whose trailer says it fits: at once), so the records of a batch up to 1 MiB, as
# librdkafka's default batch.size makes, are one chunk. One byte more: gzip's spare byte.
SCRATCH_BYTES = 1 << 20


def new_scratch() -> memoryview:
    """A buffer for :func:`check_records`: one per thread, reused batch after batch."""
    return memoryview(bytearray(SCRATCH_BYTES + 1))


def inflate(
    codec: int, data: bytes | memoryview, limit: int, give_up: int | None = None
) -> Iterator[bytes]:
    """The records section of ``codec`` ``data``, in chunks of at most :data:`INFLATE_CHUNK`
    bytes (a snappy block: at most what it declares). InvalidBatchError: UNKNOWN_SERVER_ERROR for
    bytes the codec cannot read, MESSAGE_TOO_LARGE past ``limit`` inflated bytes; Unfinished
    past ``give_up`` bytes if that is fewer (at most a chunk more is inflated)."""
    for chunk in _inflate(codec, data, _Budget(limit, give_up), None):
        yield chunk if type(chunk) is bytes else bytes(chunk)


def _inflate(
    codec: int, data: bytes | memoryview, budget: _Budget, out: memoryview | None
) -> Iterator[bytes | memoryview]:
    """:func:`inflate`'s chunks; with ``out`` (a caller's :func:`new_scratch`), views of it
    where the codec can write there, in steps of up to its size (each overwritten by the
    next: the caller keeps none of them)."""
    try:
        if codec == Compression.NONE:
            budget.take(len(data))
            yield bytes(data)
            return
        if codec == Compression.GZIP:
            chunks: Iterator[bytes | memoryview] = _gzip(data, budget, out)
        elif codec == Compression.ZSTD:
            chunks = _zstd(data, budget, out)
        elif codec == Compression.LZ4:
            chunks = _lz4(data)
        elif codec == Compression.SNAPPY:
            chunks = _snappy(data, budget, out)
        else:
            raise _invalid(f"unknown compression codec {codec}")
        for chunk in chunks:
            budget.take(len(chunk))
            yield chunk
    except (InvalidBatchError, Unfinished):
        raise
    except Exception as exc:  # each library's own error for bytes it cannot read
        raise _corrupt(f"records cannot be decompressed: {exc}") from None


def _gzip(data: bytes | memoryview, budget: _Budget, out: memoryview | None) -> Iterator[Any]:
    if budget.give_up is not None and len(data) >= 18:
        claimed = int.from_bytes(data[-4:], "little")
        if claimed > budget.left:  # the trailer's claim: enough to leave it to a worker
            raise Unfinished(budget.give_up)
    whole = _gzip_whole(data, out)
    if whole is not None:
        yield whole
        return
    rest = bytes(data)
    while True:  # one gzip member after another, as Java's GZIPInputStream reads them
        d = zlib.decompressobj(31)
        pending = rest
        while not d.eof:
            chunk = d.decompress(pending, INFLATE_CHUNK)
            pending = d.unconsumed_tail
            if chunk:
                yield chunk
            elif not pending:
                raise _corrupt("records cannot be decompressed: truncated gzip stream")
        rest = d.unused_data
        if not rest:
            return


def _gzip_whole(data: bytes | memoryview, out: memoryview | None = None) -> Any:
    """The records of a gzip stream that says (its trailer's ISIZE) it inflates to less than
    ``out`` holds (without it: a chunk), inflated at once by cramjam (~1.7x zlib's speed
    here) into ``out`` (a view of it is returned) or a buffer of that size (bytes); None if
    that fails for any reason, a stream longer than it says included: zlib's streamed reading
    then gives the verdict, so the fast path never decides a refusal."""
    if len(data) < 18:
        return None
    size = int.from_bytes(data[-4:], "little")
    if size >= (INFLATE_CHUNK if out is None else len(out) - 1):
        return None
    # a byte to spare: it fits only if the stream holds what it says
    buf = bytearray(size + 1) if out is None else out[: size + 1]
    try:
        n = cramjam.gzip.decompress_into(data, buf)
    except Exception:  # cramjam's DecompressionError, or a short buffer
        return None
    return bytes(buf[:n]) if out is None else buf[:n]


# Idle zstd decompression contexts: making one costs about as much as inflating 50 KB. A
# stream takes one (list.pop and append are atomic: worker threads share the list) and gives
# it back when done; each stream_reader resets it.
_ZSTD_CONTEXTS: list[zstandard.ZstdDecompressor] = []
_MAX_ZSTD_CONTEXTS = 4


def _zstd(data: bytes | memoryview, budget: _Budget, out: memoryview | None) -> Iterator[Any]:
    window = zstandard.get_frame_parameters(data).window_size
    if window > ZSTD_MAX_WINDOW:  # the decoder would hold that much history
        raise InvalidBatchError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"zstd frame asks for a {window}-byte window; {ZSTD_MAX_WINDOW} at most",
        )
    try:
        dctx = _ZSTD_CONTEXTS.pop()
    except IndexError:
        dctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
    try:
        with dctx.stream_reader(data, read_across_frames=True) as reader:
            while True:
                # a byte past the budget is enough to stop (the event loop's try)
                step = min(INFLATE_CHUNK if out is None else SCRATCH_BYTES, budget.left + 1)
                if out is None:
                    chunk = reader.read(step)
                    if not chunk:
                        return
                    yield chunk
                else:
                    n = reader.readinto(out[:step])
                    if not n:
                        return
                    yield out[:n]
    finally:  # also when the stream is abandoned: the generator is closed
        if len(_ZSTD_CONTEXTS) < _MAX_ZSTD_CONTEXTS:
            _ZSTD_CONTEXTS.append(dctx)


def _lz4(data: bytes | memoryview) -> Iterator[bytes]:
    d = lz4.frame.LZ4FrameDecompressor()
    pending = bytes(data)
    while not d.eof:
        chunk = d.decompress(pending, INFLATE_CHUNK)
        pending = b""
        if chunk:
            yield chunk
        elif not d.needs_input:
            continue
        else:
            raise _corrupt("records cannot be decompressed: truncated lz4 frame")
    if d.unused_data:
        raise _corrupt("records cannot be decompressed: bytes after the lz4 frame")


def _snappy_declared(block: bytes | memoryview, budget: _Budget, held: int) -> int:
    """A raw snappy block's inflated length (its preamble), refused before anything is
    inflated if it and the ``held`` bytes pass the budget."""
    declared, shift, i = 0, 0, 0
    while True:  # the block's preamble: its inflated length, a varint
        if i >= len(block) or i > 4:
            raise _corrupt("records cannot be decompressed: bad snappy preamble")
        b = block[i]
        declared |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            break
        shift += 7
    if declared + held > budget.left:
        budget.take(declared + held)  # raises: refused before anything is inflated
    return declared


def _snappy_block(block: bytes | memoryview, budget: _Budget, held: int = 0) -> bytes:
    _snappy_declared(block, budget, held)
    return bytes(cramjam.snappy.decompress_raw(block))


def _snappy(data: bytes | memoryview, budget: _Budget, out: memoryview | None) -> Iterator[Any]:
    raw = memoryview(data)
    step = None if out is None else out[:SCRATCH_BYTES]
    if raw[:8] != _XERIAL_MAGIC:
        if step is not None and _snappy_declared(raw, budget, 0) <= len(step):
            yield step[: cramjam.snappy.decompress_raw_into(raw, step)]
        else:
            yield _snappy_block(raw, budget)
        return
    if step is not None:
        yield from _xerial_into(raw, budget, step)
        return
    # Java's 32 KB blocks are handed on a few at a time (up to half a chunk): each hand-off
    # costs the checker a pass; the ones held count against the budget all the same.
    held: list[bytes] = []
    size = 0
    for raw_block in _xerial_blocks(raw):
        block = _snappy_block(raw_block, budget, size)
        held.append(block)
        size += len(block)
        if size >= INFLATE_CHUNK // 2:
            yield b"".join(held) if len(held) > 1 else block
            held, size = [], 0
    if held:
        yield b"".join(held)


def _xerial_blocks(raw: memoryview) -> Iterator[memoryview]:
    pos = 16  # magic, version, compatible version
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise _corrupt("records cannot be decompressed: torn xerial snappy block")
        (n,) = struct.unpack_from(">i", raw, pos)
        if n < 0 or pos + 4 + n > len(raw):
            raise _corrupt("records cannot be decompressed: bad xerial snappy block length")
        yield raw[pos + 4 : pos + 4 + n]
        pos += 4 + n


def _xerial_into(raw: memoryview, budget: _Budget, step: memoryview) -> Iterator[Any]:
    """Java's 32 KB blocks inflated one after the other into ``step``, handed on when the
    next would not fit (a hand-off costs the checker a pass); the ones held count against
    the budget. A block larger than ``step`` (no Java producer makes one) is its own chunk."""
    at = 0
    for block in _xerial_blocks(raw):
        declared = _snappy_declared(block, budget, at)
        if at + declared > len(step) and at:
            yield step[:at]
            at = 0
        if declared > len(step):
            yield bytes(cramjam.snappy.decompress_raw(block))
        else:
            at += cramjam.snappy.decompress_raw_into(block, step[at:])
    if at:
        yield step[:at]


# --- records -------------------------------------------------------------------------------

# protocol/_records.c's walk: (count, bytes used up to, least and greatest timestamp delta,
# null keys) of the complete records of buf[pos:end]
_Walk = Callable[..., tuple[int, int, int, int, int]]


class RecordRules(NamedTuple):
    """What a topic asks of each record beyond its structure (Kafka's validateRecord). A
    tuple: one is made per batch, at a fraction of a frozen dataclass's cost."""

    need_key: bool = False  # compacted topic
    partition: str = ""  # "topic-index", for the messages, as Kafka's
    min_timestamp: int | None = None  # CreateTime window; None: unchecked
    max_timestamp: int | None = None


@dataclass(slots=True)
class RecordsSummary:
    count: int = 0
    inflated_bytes: int = 0
    # (batch index, message) per refused record, as Kafka's RecordError; the first
    # MAX_RECORD_ERRORS of them, with ``error`` the batch's code (INVALID_TIMESTAMP if any
    # timestamp is out of the window, else INVALID_RECORD), as Kafka's processRecordErrors.
    record_errors: list[tuple[int, str]] = field(default_factory=list)
    error_count: int = 0  # all of them, kept or not
    error: ErrorCode = ErrorCode.NONE


def _varints(
    buf: np.ndarray, pos: np.ndarray, max_size: int, *, strict: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints at every ``pos`` (all within ``buf``, padded by 10 bytes): (values,
    sizes). A varint longer than ``max_size`` bytes (5 for int32, 10 for int64) is invalid;
    ``strict=False`` (guessed positions) reads it as -1 instead."""
    b = buf[pos]
    cont = b >= 0x80
    if not cont.any():  # the usual case: every one a single byte
        raw = b.astype(np.int64)
        return (raw >> 1) ^ -(raw & 1), np.ones(len(pos), np.int64)
    raw = (b & 0x7F).astype(np.int64)
    sizes = 1 + cont.astype(np.int64)
    active = cont
    for k in range(1, max_size):  # dense passes: cheaper than gathering the few still going
        nxt = buf[pos + k]
        raw |= np.where(active, (nxt & 0x7F).astype(np.int64) << (7 * k), 0)
        active = active & (nxt >= 0x80)
        if not active.any():
            break
        sizes += active
    if max_size == 5:
        raw &= 0xFFFFFFFF  # a fifth byte's high bits fall off, as in Java's int
    values = ((raw >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(raw & 1)
    if active.any():
        if strict:
            raise _invalid("Found invalid record structure: varint too long")
        values[active] = -1
    return values, sizes


_MIN_RUN = 8  # a shorter run that a different record ends: the general path goes on
_HIGH_BYTES = bytes(range(0x80, 0x100))
_HIGH_BIT = re.compile(rb"[^\x80-\xff]")  # the first byte without it ends a run
_NO_HIGH_BIT = re.compile(rb"[\x80-\xff]")


def _same_run(column: bytes, byte: bytes) -> int:
    """How many bytes of ``column`` repeat ``byte`` before another (a memcmp when all do)."""
    if column == byte * len(column):
        return len(column)
    return len(column) - len(column.lstrip(byte))


def _low_run(column: bytes) -> int:
    """How many bytes of ``column`` come before the first with the high bit set."""
    if column.isascii():
        return len(column)
    found = _NO_HIGH_BIT.search(column)
    return len(column) if found is None else found.start()


def _high_run(column: bytes) -> int:
    """How many bytes of ``column`` come before the first without the high bit."""
    if not column.translate(None, _HIGH_BYTES):
        return len(column)
    found = _HIGH_BIT.search(column)
    return len(column) if found is None else found.start()


@functools.lru_cache(maxsize=64)
def _offset_delta_column(first: int, n: int, size: int, k: int) -> bytes:
    """Byte ``k`` of the ``size``-byte varints of offset deltas first..first+n-1."""
    more = 0x80 if k < size - 1 else 0
    return bytes(((2 * i >> (7 * k)) & 0x7F) | more for i in range(first, first + n))


def _py_varint(buf: bytes, pos: int, end: int, max_size: int) -> tuple[int, int] | None:
    """(zigzag value, size) of the varint at ``pos``, None if cut by ``end`` or too long."""
    if pos < end and buf[pos] < 0x80:  # one byte: most of a record's varints
        b = buf[pos]
        return (b >> 1) ^ -(b & 1), 1
    n, shift = 0, 0
    for i in range(max_size):
        if pos + i >= end:
            return None
        b = buf[pos + i]
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return _zigzag(n, 32 if max_size == 5 else 64), i + 1
        shift += 7
    return None


# size, timestamp delta at, its varint size, offset delta at, its size, key is null, and the
# (column, byte) pairs that each record of the run must repeat
_Layout = tuple[int, int, int, int, int, bool, tuple[tuple[int, bytes], ...]]
# recent layouts by (the first two bytes of a run, its offset delta bound): a guess to try
_LAYOUTS: dict[tuple[bytes, int], _Layout] = {}
_MAX_LAYOUTS = 256


def _layout(buf: bytes, pos: int, end: int) -> _Layout | None:
    """The layout of the record at ``pos`` if it is whole, well formed and has no headers:
    (size, timestamp delta at, its varint size, offset delta at, its size, key is null,
    (column, byte) of each byte its like must repeat: the length, key length, value length
    and header count)."""
    got = _py_varint(buf, pos, end, 5)
    if got is None:
        return None
    length, lsz = got
    rec_end = pos + lsz + length
    if length < _MIN_BODY or rec_end > end:
        return None
    at = pos + lsz + 1  # attributes: not looked at, as in Kafka
    fields = []
    for max_size in (10, 5, 5):  # timestamp delta, offset delta, key length
        got = _py_varint(buf, at, rec_end, max_size)
        if got is None:
            return None
        fields.append((at - pos, got[1], got[0]))
        at += got[1]
    klen = fields[2][2]
    at += max(klen, 0)
    got = _py_varint(buf, at, rec_end, 5)
    if got is None:
        return None
    vlen_at, vlen_size, vlen = at - pos, got[1], got[0]
    at += vlen_size + max(vlen, 0)
    if at >= rec_end or buf[at] != 0 or at + 1 != rec_end:  # header count 0, then the end
        return None
    size = rec_end - pos
    key_at, key_size = fields[2][0], fields[2][1]
    cols = [*range(lsz), *range(key_at, key_at + key_size)]
    cols += [*range(vlen_at, vlen_at + vlen_size), size - 1]
    fixed = tuple((c, buf[pos + c : pos + c + 1]) for c in cols)
    (ts_at, ts_len, _), (od_at, od_len, _) = fields[0], fields[1]
    return size, ts_at, ts_len, od_at, od_len, klen < 0, fixed


class _Cursor:
    """Bytes of a record too long to gather, consumed as chunks arrive."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def more(self, n: int) -> Generator[None, bytes | None, None]:
        while len(self.buf) - self.pos < n:
            chunk = yield
            if chunk is None:
                raise _invalid("Found invalid record structure: the records end inside a record")
            self.buf = self.buf[self.pos :] + chunk
            self.pos = 0

    def varint(self, max_size: int) -> Generator[None, bytes | None, int]:
        n, shift = 0, 0
        for _ in range(max_size):
            yield from self.more(1)
            b = self.buf[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return _zigzag(n, 32 if max_size == 5 else 64)
            shift += 7
        raise _invalid("Found invalid record structure: varint too long")

    def skip(self, n: int) -> Generator[None, bytes | None, None]:
        while n > 0:
            avail = len(self.buf) - self.pos
            if not avail:
                chunk = yield
                if chunk is None:
                    raise _invalid("Reached end of input stream before skipping all bytes")
                self.buf, self.pos = chunk, 0
                continue
            step = min(avail, n)
            self.pos += step
            n -= step


_BigResult = tuple[bool, int, int, bytes]  # key is null, timestamp delta, offset delta, rest


def _big_record(cur: _Cursor) -> Generator[None, bytes | None, _BigResult]:
    """One record read field by field as Kafka's readPartiallyFrom does, key, value and
    header bytes skipped, never gathered."""
    yield from cur.varint(5)  # its length: the caller checks what was read against it
    yield from cur.more(1)
    cur.pos += 1  # attributes
    ts_delta = yield from cur.varint(10)
    off_delta = yield from cur.varint(5)
    fields: list[int] = []
    for _ in ("key", "value"):
        n = yield from cur.varint(5)
        fields.append(n)  # negative: null, whatever the value, as in Kafka
        yield from cur.skip(n)
    hcount = yield from cur.varint(5)
    if hcount < 0:
        raise _invalid(f"Found invalid number of record headers {hcount}")
    for _ in range(hcount):
        hk = yield from cur.varint(5)
        if hk < 0:
            raise _invalid(f"Invalid negative header key size {hk}")
        yield from cur.skip(hk)
        hv = yield from cur.varint(5)
        yield from cur.skip(hv)
    return fields[0] < 0, ts_delta, off_delta, cur.buf[cur.pos :]


class RecordChecker:
    """Feed the records section in chunks (:meth:`feed`), then :meth:`finish`."""

    every_timestamp = False  # hand every record's timestamp to _rules, needed or not
    # What reads the records: protocol/_records.c's walk if it was built, else (None) numpy.
    # Both give the same verdicts; the tests read every batch both ways.
    walk: ClassVar[_Walk | None] = _c_walk

    def __init__(
        self, view: RecordBatchView, rules: RecordRules, give_up: int | None = None
    ) -> None:
        self.declared = view.record_count
        self.base_timestamp = view.base_timestamp
        self.rules = rules
        self.summary = RecordsSummary()
        # bytes' worth of reading left before Unfinished (None: no bound): the numpy path's
        # general reading spends a byte a byte (~30 ns), a uniform run _RUN_COST and 1/256 of
        # its bytes, the C walker 1/32 of its bytes
        self._give_up = give_up
        self._reads_left = give_up
        self._tail = b""
        self._big: Generator[None, bytes | None, _BigResult] | None = None
        self._big_fed = 0  # bytes handed to the record being read field by field
        self._big_size = 0
        self._timestamp_error = False

    def feed(self, chunk: bytes | memoryview) -> None:
        """Check the records ``chunk`` completes; a view may be of a buffer its owner then
        reuses: only bytes copied from it are kept."""
        self.summary.inflated_bytes += len(chunk)
        if self._big is not None:
            if not self._feed_big(chunk):
                return
            chunk, self._tail = self._tail, b""
        if self._tail:
            need = self._needs(chunk)
            if need is None:  # the old way: a long record, a bad length, a short chunk
                chunk, self._tail = self._tail + chunk, b""
            else:  # the record the last chunk cut, then the rest where it lies (no copy)
                self._read(self._tail + bytes(chunk[:need]))
                chunk = chunk[need:]
        self._read(chunk)

    def _needs(self, chunk: bytes | memoryview) -> int | None:
        """The bytes of ``chunk`` that complete the record the tail begins, if it completes
        it and the record is not one to read as it streams; else None."""
        size = self._pending_size(self._tail + bytes(chunk[:5]))
        if (
            size is None
            or size > _BIG_RECORD
            or not len(self._tail) < size <= len(self._tail) + len(chunk)
        ):
            return None
        return size - len(self._tail)

    def _read(self, buf: bytes | memoryview) -> None:
        while True:
            used = self._check_complete(buf)
            rest = buf[used:]
            size = self._pending_size(rest)
            if size is None or size <= _BIG_RECORD:
                self._tail = bytes(rest)  # the same object if bytes already
                return
            # a record longer than this: read it as it streams in, without gathering it
            self._big_size = size
            self._big_fed = 0
            self._big = _big_record(_Cursor(b""))
            next(self._big)
            if not self._feed_big(rest):
                self._tail = b""
                return
            buf, self._tail = self._tail, b""

    def _feed_big(self, chunk: bytes | memoryview | None) -> bool:
        """Hand bytes to the long record; True once it is done (the rest is in _tail)."""
        assert self._big is not None
        if chunk is not None and type(chunk) is not bytes:
            chunk = bytes(chunk)  # the cursor keeps it across chunks (a rare record: copied)
        self._spend(len(chunk or b""))
        try:
            self._big.send(chunk)
        except StopIteration as done:
            key_null, ts_delta, off_delta, rest = done.value
            self._big = None
            fed = self._big_fed + len(chunk or b"") - len(rest)
            if fed != self._big_size:
                raise _invalid(
                    f"Invalid record size: expected {self._big_size} bytes in record payload, "
                    f"but instead read {fed}"
                ) from None
            first = self.summary.count
            if first >= self.declared:
                raise _invalid(
                    "Incorrect declared batch size, records still remaining in file"
                ) from None
            self._check_offsets(first, np.array([off_delta], np.int64))
            self._rules(first, np.array([key_null]), np.array([ts_delta], np.int64))
            self.summary.count += 1
            self._tail = rest
            return True
        self._big_fed += len(chunk or b"")
        return False

    @staticmethod
    def _cut(head: bytes, left: int) -> bool:
        """Whether the record ``head`` starts is well begun but longer than ``left`` bytes
        (a bad length is the general path's to report)."""
        n, shift = 0, 0
        for i, b in enumerate(head):
            n |= (b & 0x7F) << shift
            if b < 0x80:
                n = _zigzag(n, 32)
                return n >= _MIN_BODY and i + 1 + n > left
            shift += 7
        return len(head) < 5

    @staticmethod
    def _pending_size(rest: bytes) -> int | None:
        """Bytes of the record ``rest`` starts (length varint included), if its length is in."""
        n, shift = 0, 0
        for i, b in enumerate(rest[:5]):
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return i + 1 + _zigzag(n, 32)
            shift += 7
        return None

    def read_in_place(self, buf: bytes | memoryview, start: int, end: int) -> None:
        """Instead of :meth:`feed`: all the records, uncompressed in ``buf[start:end]``, read
        by the C walker where they lie (nothing copied, whatever their sizes)."""
        walk = type(self).walk
        assert walk is not None
        self.summary.inflated_bytes += end - start
        if self._reads_left is not None and (end - start) >> _C_COST_SHIFT > self._reads_left:
            raise Unfinished(self._give_up)
        if self._walk_in_c(walk, buf, start, end) < end:  # fewer records than declared
            raise _invalid("Found invalid record structure: the records end inside a record")

    def finish(self) -> RecordsSummary:
        if self._big is not None:
            self._feed_big(None)  # raises: the stream ended inside the long record
        if self._tail:
            if self.summary.count >= self.declared:
                raise _invalid("Incorrect declared batch size, records still remaining in file")
            raise _invalid("Found invalid record structure: the records end inside a record")
        if self.summary.count != self.declared:
            raise _invalid(
                f"Incorrect declared batch size: {self.declared} records declared, "
                f"{self.summary.count} found"
            )
        s = self.summary
        if s.error_count:
            timestamps = self._timestamp_error
            s.error = ErrorCode.INVALID_TIMESTAMP if timestamps else ErrorCode.INVALID_RECORD
        return s

    # -- finding records ------------------------------------------------------------------

    def _check_complete(self, buf: bytes | memoryview) -> int:
        """Check every complete record at the start of ``buf``; bytes used."""
        end = len(buf)
        pos = 0
        walk = type(self).walk  # a plain function set by a test stays unbound
        if walk is not None:  # one pass reads every record, laid out alike or not
            if self._reads_left is not None and end >> _C_COST_SHIFT > self._reads_left:
                raise Unfinished(self._give_up)
            return self._walk_in_c(walk, buf, pos, end)
        if type(buf) is not bytes:
            buf = bytes(buf)  # the numpy path slices and searches bytes
        while pos < end:  # runs of records laid out alike first: a few C passes each
            used = self._uniform_run(buf, pos, end)
            if not used:
                break
            self._spend(_RUN_COST + (used >> 8))
            pos += used
        if pos >= end or self._cut(buf[pos : pos + 5], end - pos):
            return pos  # the chunk ends inside this record: nothing for the general path
        if self._reads_left is not None and end - pos > self._reads_left:
            raise Unfinished(self._give_up)  # the general path would read past it: not here
        return self._read_records(buf, pos, end)

    def _read_records(self, buf: bytes, pos: int, end: int) -> int:
        """The numpy path: check the complete records of ``buf[pos:end]``; bytes used."""
        nbuf = np.frombuffer(buf + bytes(10), np.uint8)  # padded: varint reads stay inside
        starts = self._starts(buf, nbuf, end, pos)
        if not starts.size:
            return pos
        if self.summary.count + len(starts) > self.declared:
            raise _invalid("Incorrect declared batch size, records still remaining in file")
        length, lsz = _varints(nbuf, starts[-1:], 5)
        used = int(starts[-1] + lsz[0] + length[0])
        self._spend(used - pos)
        self._check_fields(nbuf, starts)
        self.summary.count += len(starts)
        return used

    def _walk_in_c(self, walk: _Walk, buf: bytes | memoryview, pos: int, end: int) -> int:
        first = self.summary.count
        room = max(self.declared - first, 0)  # a negative count declared: no record fits
        try:
            n, used, ts_min, ts_max, null_keys = walk(buf, pos, end, first, room)
        except _RecordError as exc:
            raise _invalid(str(exc)) from None
        if n == room and used < end:  # all declared records read, and more bytes follow
            raise _invalid("Incorrect declared batch size, records still remaining in file")
        self._spend((used - pos) >> _C_COST_SHIFT)
        if n and not self._rules_pass(ts_min, ts_max, null_keys):
            # some record breaks a rule: read again for each record's key and timestamp
            ts_delta = np.empty(n, np.int64)
            key_null = np.empty(n, np.bool_)
            walk(buf, pos, used, first, n, ts_delta, key_null)
            self._rules(first, key_null, ts_delta)
        self.summary.count += n
        return used

    def _rules_pass(self, ts_min: int, ts_max: int, null_keys: int) -> bool:
        """Whether records whose timestamp deltas span ``ts_min..ts_max`` pass the topic's
        rules whatever each one's is (sums that would wrap a Java long are left to
        :meth:`_rules`, which wraps them)."""
        rules = self.rules
        if self.every_timestamp or (rules.need_key and null_keys):
            return False
        if rules.min_timestamp is None and rules.max_timestamp is None:
            return True
        low, high = self.base_timestamp + ts_min, self.base_timestamp + ts_max
        return (
            -(2**63) <= low
            and high < 2**63
            and (rules.min_timestamp is None or low >= rules.min_timestamp)
            and (rules.max_timestamp is None or high <= rules.max_timestamp)
        )

    def _spend(self, n: int) -> None:
        if self._reads_left is not None:
            self._reads_left -= n
            if self._reads_left < 0:
                raise Unfinished(self._give_up)

    def _uniform_run(self, buf: bytes, pos: int, end: int) -> int:
        """Records from ``pos`` laid out exactly as the first (same length, key and value
        lengths, no headers, timestamp and offset deltas of the same varint sizes). The first
        is read in Python, unless the layout of an earlier run fits it; in every record, that
        first included, each byte that fixes the layout is compared with its, a column at a
        time (a strided slice of the bytes, searched by ``re``: C code), and the offset deltas
        with 0, 1, ... Bytes used: the longest such run, 0 if none (the general path then
        reads the records)."""
        first = self.summary.count
        room = self.declared - first
        if room <= 0:
            return 0
        boundary = 64  # the offset delta's varint grows at 64, 8192, ...: one size a run
        while boundary <= first:
            boundary <<= 7
        # A producer sends batches laid out alike: the layout of the last run that began with
        # these bytes is tried first. Only a guess: its column checks include the first
        # record, so a wrong one fails there and the record is read after all.
        hint = (buf[pos : pos + 2], boundary)
        layout = _LAYOUTS.get(hint)
        n = self._run_length(buf, pos, end, first, room, boundary, layout) if layout else 0
        if not n:
            layout = _layout(buf, pos, end)
            if layout is None:
                return 0
            n = self._run_length(buf, pos, end, first, room, boundary, layout)
            if not n:
                return 0
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                _LAYOUTS.clear()
            _LAYOUTS[hint] = layout
        size, ts_at, ts_len, _od_at, _od_len, key_null, _fixed = layout
        stop = pos + n * size
        bound = 1 << (7 * ts_len - 1)  # |timestamp delta| below this, whatever its bytes
        rules = self.rules
        base = self.base_timestamp
        if (
            self.every_timestamp
            or (rules.need_key and key_null)
            or not (
                (rules.min_timestamp is None or base - bound >= rules.min_timestamp)
                and (rules.max_timestamp is None or base + bound <= rules.max_timestamp)
            )
        ):
            cols = [
                np.frombuffer(buf[pos + ts_at + k : stop : size], np.uint8).astype(np.int64)
                for k in range(ts_len)
            ]
            zz = np.bitwise_or.reduce([(c & 0x7F) << (7 * k) for k, c in enumerate(cols)])
            ts_delta = ((zz >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(zz & 1)
            self._rules(first, np.full(n, key_null), ts_delta)
        self.summary.count += n
        return n * size

    @staticmethod
    def _run_length(
        buf: bytes, pos: int, end: int, first: int, room: int, boundary: int, layout: _Layout
    ) -> int:
        """How many records from ``pos`` (the first included) have ``layout``'s bytes where
        it fixes them; 0 if too few for a run."""
        size, ts_at, ts_len, od_at, od_len, _key_null, fixed = layout
        most = n = min(room, (end - pos) // size, boundary - first)
        stop = pos + n * size
        for col, byte in fixed:  # inline while every record repeats it: a call costs here
            column = buf[pos + col : stop : size]
            if column != byte * n:
                n = _same_run(column, byte)
                stop = pos + n * size
        for k in range(ts_len):  # the timestamp delta's varint keeps its size
            column = buf[pos + ts_at + k : stop : size]
            if k < ts_len - 1:
                n = _high_run(column)
            elif not column.isascii():
                n = _low_run(column)
            stop = pos + n * size
        if not n or (n < most and n < _MIN_RUN):
            return 0  # sizes keep changing: the general path reads the rest at once
        for k in range(od_len):
            if buf[pos + od_at + k : stop : size] != _offset_delta_column(first, n, od_len, k):
                return 0  # the general path says which record is wrong
        return n

    def _starts(self, buf: bytes, nbuf: np.ndarray, end: int, pos: int = 0) -> np.ndarray:
        """Starts of the complete records from ``pos`` in ``buf`` (at most one more than
        declared, which shows a surplus)."""
        found: list[np.ndarray] = []
        room = self.declared - self.summary.count + 1
        while pos < end and room > 0:
            length, lsz = _varints(nbuf, np.array([pos]), 5, strict=False)
            if pos + int(lsz[0]) > end:
                break  # the length varint itself is cut by the chunk's end
            if length[0] < _MIN_BODY:
                raise _invalid(f"Invalid record size: {int(length[0])}")
            size = int(lsz[0] + length[0])
            if pos + size > end:
                break
            # guess: the records that follow are of this size; check every guessed start
            n = min(room, (end - pos) // size)
            guess = pos + size * np.arange(n, dtype=np.int64)
            glen, gsz = _varints(nbuf, guess, 5, strict=False)
            ok = (glen + gsz) == size
            bad = n if ok.all() else int(np.argmin(ok))
            if bad >= 16 or bad == n:
                found.append(guess[:bad])
                pos += size * bad
                room -= bad
                continue
            walked = self._walk(buf, pos, min(room, _MAX_WALK), end)
            if not walked:
                break
            found.append(np.array(walked, np.int64))
            room -= len(walked)
            ln, ls = _varints(nbuf, np.array([walked[-1]]), 5)
            pos = int(walked[-1] + ls[0] + ln[0])
        if not found:
            return np.zeros(0, np.int64)
        return np.concatenate(found)

    @staticmethod
    def _walk(buf: bytes, pos: int, count: int, end: int) -> list[int]:
        """Starts of up to ``count`` complete records from ``pos``, reading only lengths."""
        out: list[int] = []
        append = out.append
        while count and pos < end:
            b = buf[pos]
            # Lengths of one or two bytes (records up to 8 KB) inline: this loop is the check's
            # cost for records of changing sizes.
            if b < 0x80:
                q = pos + 1
                n = (b >> 1) ^ -(b & 1)
            elif pos + 1 < end and buf[pos + 1] < 0x80:
                q = pos + 2
                n = (b & 0x7F) | (buf[pos + 1] << 7)
                n = (n >> 1) ^ -(n & 1)
            else:
                got = RecordChecker._long_length(buf, pos, end)
                if got is None:
                    return out
                n, q = got
            if n < _MIN_BODY:
                raise _invalid(f"Invalid record size: {n}")
            if q + n > end:
                return out
            append(pos)
            pos = q + n
            count -= 1
        return out

    @staticmethod
    def _long_length(buf: bytes, pos: int, end: int) -> tuple[int, int] | None:
        """(length, where the record's body starts) of the record at ``pos``; None if cut."""
        n, shift, q = 0, 0, pos
        while True:
            if q >= end:
                return None
            b = buf[q]
            q += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return _zigzag(n, 32), q
            shift += 7
            if shift > 28:
                raise _invalid("Found invalid record structure: varint too long")

    # -- checking them --------------------------------------------------------------------

    def _check_fields(self, nbuf: np.ndarray, starts: np.ndarray) -> None:
        first = self.summary.count
        length, lsz = _varints(nbuf, starts, 5)
        rec_end = starts + lsz + length
        p = starts + lsz + 1  # after the attributes, which Kafka does not look at
        ts_delta, sz = _varints(nbuf, p, 10)
        p += sz
        off_delta, sz = _varints(nbuf, p, 5)
        p += sz
        self._check_offsets(first, off_delta)
        klen, sz = _varints(nbuf, p, 5)
        p += sz
        self._no_overrun(klen, p, rec_end, "key")
        key_null = klen < 0
        p += np.maximum(klen, 0)
        vlen, sz = _varints(nbuf, p, 5)
        p += sz
        self._no_overrun(vlen, p, rec_end, "value")
        p += np.maximum(vlen, 0)
        hcount, sz = _varints(nbuf, p, 5)
        p += sz
        if (hcount < 0).any():
            raise _invalid(f"Found invalid number of record headers {int(hcount.min())}")
        if (p + 2 * hcount > rec_end).any():  # a header takes two bytes at least
            raise _invalid("Found invalid number of record headers: more than the record holds")
        idx = np.flatnonzero(hcount)
        k = 0
        while idx.size:
            q = p[idx]
            hk, sz = _varints(nbuf, q, 5)
            if (hk < 0).any():
                raise _invalid(f"Invalid negative header key size {int(hk.min())}")
            q = q + sz
            self._no_overrun(hk, q, rec_end[idx], "header key")
            q += hk
            hv, sz = _varints(nbuf, q, 5)
            q += sz
            self._no_overrun(hv, q, rec_end[idx], "header value")
            p[idx] = q + np.maximum(hv, 0)
            k += 1
            idx = idx[hcount[idx] > k]
        if (p != rec_end).any():
            i = int(np.argmax(p != rec_end))
            raise _invalid(
                f"Invalid record size: expected to read {int(length[i])} bytes in record "
                f"payload, but instead read {int(p[i] - starts[i] - lsz[i])}"
            )
        self._rules(first, key_null, ts_delta)

    @staticmethod
    def _check_offsets(first: int, off_delta: np.ndarray) -> None:
        expected = np.arange(first, first + len(off_delta), dtype=np.int64)
        if (off_delta != expected).any():
            i = int(np.argmax(off_delta != expected))
            raise _invalid(
                f"record {first + i} has offset delta {int(off_delta[i])}: "
                "a batch's offset deltas must be 0, 1, ..."
            )

    @staticmethod
    def _no_overrun(n: np.ndarray, at: np.ndarray, end: np.ndarray, what: str) -> None:
        # any negative length is a null, as Kafka's Utils.readBytes and skipBytes read it
        if (at + np.maximum(n, 0) > end).any():
            raise _invalid(f"Found invalid record structure: {what} length beyond its record")

    def _rules(self, first: int, key_null: np.ndarray, ts_delta: np.ndarray) -> None:
        """Kafka's validateRecord: the key (compacted topics), else the timestamp; a record's
        errors in batch order, as Kafka lists them."""
        rules = self.rules
        bad_key = key_null if rules.need_key else np.zeros(len(key_null), np.bool_)
        bad_ts = np.zeros(len(key_null), np.bool_)
        low = rules.min_timestamp if rules.min_timestamp is not None else -(2**63)
        high = rules.max_timestamp if rules.max_timestamp is not None else 2**63 - 1
        ts = self.base_timestamp + ts_delta
        if rules.min_timestamp is not None or rules.max_timestamp is not None:
            bad_ts = (ts != -1) & ((ts < low) | (ts > high)) & ~bad_key
        bad = bad_key | bad_ts
        if not bad.any():
            return
        if bad_ts.any():
            self._timestamp_error = True
        no_key = "Compacted topic cannot accept message without key in topic partition "
        no_key += rules.partition

        def message(i: int) -> str:
            if bad_key[i]:
                return no_key
            return (
                f"Timestamp {int(ts[i])} of message with offset {first + i} is out of "
                f"range. The timestamp should be within [{low}, {high}]"
            )

        self._report(first, bad, message)

    def _report(self, first: int, bad: np.ndarray, message: Callable[[int], str]) -> None:
        s = self.summary
        where = np.flatnonzero(bad)
        s.error_count += len(where)
        for i in where[: max(0, MAX_RECORD_ERRORS - len(s.record_errors))].tolist():
            s.record_errors.append((first + i, message(i)))


def check_records(
    view: RecordBatchView,
    rules: RecordRules,
    limit: int,
    sink: Callable[[bytes], None] | None = None,
    give_up: int | None = None,
    scratch: memoryview | None = None,
) -> RecordsSummary:
    """Read every record of ``view`` (streamed, at most ``limit`` bytes inflated), handing
    each inflated chunk to ``sink`` too if given. InvalidBatchError for a batch Kafka refuses
    whole; per-record refusals are in the summary's ``record_errors`` and ``error``.
    Unfinished if the records inflate past ``give_up`` bytes (fewer than ``limit``).
    ``scratch`` (:func:`new_scratch`, not shared with another thread) is inflated into
    where the codec allows, unless there is a sink (which keeps the chunks)."""
    checker = RecordChecker(view, rules, give_up)
    start, end = view.pos + HEADER_SIZE, view.pos + view.size
    uncompressed = view.compression == Compression.NONE and end - start <= limit
    if uncompressed and sink is None and checker.walk is not None:
        checker.read_in_place(view.buf, start, end)
        return checker.finish()
    body = view.buf[start:end]  # one copy for bytes
    if uncompressed:
        # Nothing to inflate: ``give_up`` bounds the reading alone (RecordChecker._spend).
        plain = body if type(body) is bytes else bytes(body)
        chunks: Iterator[bytes | memoryview] | tuple[bytes] = (plain,)  # inflate's, sooner
    else:
        # into this thread's buffer, unless a sink is to keep the chunks
        out = scratch if sink is None else None
        chunks = _inflate(view.compression, memoryview(body), _Budget(limit, give_up), out)
    for chunk in chunks:
        checker.feed(chunk)
        if sink is not None:
            sink(chunk)  # type: ignore[arg-type]  # bytes: no scratch with a sink
    return checker.finish()


class _Found(Exception):  # control flow: the search stops at its first hit
    pass


class _TimestampSearch(RecordChecker):
    """Reads records as the checker does, stopping at the first at or after a timestamp."""

    every_timestamp = True

    def __init__(self, view: RecordBatchView, timestamp: int, min_delta: int) -> None:
        super().__init__(view, RecordRules())
        self.timestamp = timestamp
        self.min_delta = min_delta
        self.found: tuple[int, int] | None = None

    def _rules(self, first: int, key_null: np.ndarray, ts_delta: np.ndarray) -> None:
        ts = self.base_timestamp + ts_delta
        hit = (ts >= self.timestamp) & (np.arange(first, first + len(ts)) >= self.min_delta)
        if hit.any():
            i = int(np.argmax(hit))
            self.found = (first + i, int(ts[i]))
            raise _Found


def find_timestamp(
    view: RecordBatchView, timestamp: int, min_delta: int, limit: int
) -> tuple[int, int] | None:
    """(offset delta, timestamp) of the batch's first record at offset delta ``min_delta`` or
    later whose timestamp is ``timestamp`` or later (ListOffsets), streamed as
    :func:`check_records` reads; None if there is none. InvalidBatchError if the records
    cannot be read within ``limit`` inflated bytes."""
    search = _TimestampSearch(view, timestamp, min_delta)
    body = memoryview(view.buf)[view.pos + HEADER_SIZE : view.pos + view.size]
    try:
        for chunk in inflate(view.compression, body, limit):
            search.feed(chunk)
    except _Found:
        return search.found
    return None
