"""The producer's accumulator: records in, per-partition encoded batches out.

Theory of operation
-------------------
Records arrive as *intake items*, plain tuples built by the caller with no per-record
object beyond the tuple (no future unless one was asked for: a *sink*, called once with
``(error, metadata)``). The loop thread hands a whole burst of items over at once, and the
unit of work from there on is the burst or the batch, not the record:

* :func:`assign_partitions` partitions a burst: keys hashed together (murmur2, vectorised
  by :mod:`samsa.protocol.columnar` for large bursts), unkeyed records to the sticky
  partition, explicit partitions checked.
* :func:`group_by_partition` splits the burst's columns per partition, keeping the order of
  each partition's records (the order the broker must see them in).
* :class:`Batch` holds a partition's records. The last batch of a partition is *open*: it
  keeps the columns (values, keys, timestamps, headers) and grows with each burst. When it
  reaches ``batch.size`` (estimated), :meth:`Batch.seal_full` encodes all its whole batches
  in one call and leaves the rest open; the sender seals what is left when linger expires
  or on flush. A sealed batch keeps only its encoded records section, never the values.
* The batch header (producer id, epoch, base sequence, transactional flag) is written when
  the batch is sent (:meth:`Batch.build`) and again after a renumbering, without
  re-encoding the records: the records section does not depend on the identity.

Columns (``produce_batch``). A call's columns are checked and converted to Arrow once, on
the caller's thread (:func:`make_columns`), and go through the same steps a column at a
time: :func:`assign_column_partitions` (keys hashed vectorised, unkeyed rows sticky per
``batch.size`` bytes, KIP-480/794), one stable sort to group rows per partition, and
:func:`encode_sealed`, which encodes every partition's rows straight into sealed batches
with one call of the vectorised encoder (a batch starts at each partition's first row): no
open batch, no per-row object. Those batches join the
partition's queue after its earlier records, with one :class:`Tally` for the whole call
instead of per-record sinks; the sender treats them as any other batch.

Sizes. Every item carries its size estimate (:func:`record_size`), computed once by the
caller; ``buffer.memory`` is accounted with it, and the sizes of a batch's records are what
its release gives back, so the accounting always returns to zero.

Ownership. :class:`RecordAccumulator` holds the records from intake to outcome: the
partitions (queued and pending batches), the records waiting for their topic's metadata,
the incomplete batches ``flush()`` waits for. :class:`BufferMemory` is ``buffer.memory``'s
only account: callers reserve before they hand records over (the sync facade from its
threads, lock-free on the owner's; ``AsyncProducer`` on the loop), the accumulator
releases. Neither knows the producer: they reach it through :class:`ProducerHost`, and the
transaction through :class:`TransactionGate`.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import logging
import operator
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import crc32c
import numpy as np

from samsa.client._errors import BufferExhaustedError, KafkaError
from samsa.client._idempotence import SEQ_MOD, Idempotence, PartitionSequences
from samsa.client._partitioner import StickyPartitioner
from samsa.client._types import ProducerState, RecordMetadata, TopicPartition
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    HEADER_SIZE,
    MAGIC_V2,
    TRANSACTIONAL_FLAG,
    RecordBatchView,
    compress,
    decode_records,
    encode_record,
)

if TYPE_CHECKING:
    from samsa.client._cluster import Cluster

log = logging.getLogger("samsa.client.producer")
T = TypeVar("T")

RECORD_OVERHEAD = 24  # bytes of framing per record, an upper bound for small records
# Below these many rows the per-record Python paths are cheaper than numpy/pyarrow's fixed
# cost per call (measured: columnar encode ~150 us a call, 0.3-0.4 us a row at 1000+ rows;
# the per-record encoder ~1.4 us a row; hashing ~60 us a call against ~1.2 us a key).
COLUMNAR_ENCODE_MIN = 128
COLUMNAR_HASH_MIN = 64
# Zigzag varints of [-_VARINT_MAX, _VARINT_MAX), as bytes, at v + _VARINT_MAX: the
# per-record encoder of plain records (no headers) looks its varints up (~0.3 us a record
# against ~0.95 us for encode_record; ~280 KB once per process).
_VARINT_MAX = 1 << 12

Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None
HeaderTuple = tuple[tuple[str, bytes | None], ...]
# A callable, or the handle (an int) of a RowSink (see register_sink)
Sink = Callable[[BaseException | None, RecordMetadata | None], None] | int
# (partition, timestamp, headers, sink): None for a record with none of them
Extras = tuple[int | None, int | None, HeaderTuple | None, Sink | None]
# (topic, value, key, size, extras)
Item = tuple[str, bytes | None, bytes | None, int, Extras | None]
TOPIC = operator.itemgetter(0)
VALUE = operator.itemgetter(1)
KEY = operator.itemgetter(2)
SIZE = operator.itemgetter(3)
EXTRAS = operator.itemgetter(4)

_NO_TIMESTAMPS = np.zeros(0, np.int64)
_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. record count
_BEFORE_CRC = struct.Struct(">qiibI")  # base offset, length, leader epoch, magic, crc


# --- intake --------------------------------------------------------------------------------


def _as_bytes(data: Any, what: str) -> bytes | None:
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, str or None, not {type(data).__name__}")


def normalize_headers(headers: Headers) -> HeaderTuple | None:
    """Headers as ((str, bytes | None), ...); None when there are none."""
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for pair in pairs:
        try:
            name, value = pair
        except (TypeError, ValueError):
            raise TypeError(f"a header must be a (name, value) pair, not {pair!r}") from None
        if isinstance(name, bytes):
            name = name.decode()
        if not isinstance(name, str):
            raise TypeError(f"a header name must be str, not {type(name).__name__}")
        out.append((name, _as_bytes(value, f"header {name!r}")))
    return tuple(out)


def record_size(value: bytes | None, key: bytes | None, headers: HeaderTuple | None) -> int:
    size = RECORD_OVERHEAD
    if value is not None:
        size += len(value)
    if key is not None:
        size += len(key)
    if headers:
        size += sum(len(h) + len(v or b"") + 2 for h, v in headers)
    return size


def make_item(
    topic: Any,
    value: Any,
    key: Any,
    partition: Any = None,
    timestamp: Any = None,
    headers: Headers = None,
    sink: Sink | None = None,
) -> Item:
    """Check one record on the caller's thread (a bad record must fail there, alone, not
    later in a batch) and make its intake tuple."""
    if type(topic) is not str or not topic:
        raise TypeError(f"topic must be a non-empty str, not {topic!r}")
    if partition is not None:
        try:
            partition = operator.index(partition)
        except TypeError:
            raise TypeError(f"partition must be an int or None, not {partition!r}") from None
        if partition == -1:
            partition = None  # confluent-kafka's "unassigned" (RD_KAFKA_PARTITION_UA)
        elif partition < 0:
            raise ValueError(f"partition must be >= 0 (or -1/None: any), not {partition}")
    value, key, hdrs, size = check_record(value, key, timestamp, headers)
    if partition is None and timestamp is None and hdrs is None and sink is None:
        return (topic, value, key, size, None)
    return (topic, value, key, size, (partition, timestamp, hdrs, sink))


def check_record(
    value: Any, key: Any, timestamp: Any, headers: Headers
) -> tuple[bytes | None, bytes | None, HeaderTuple | None, int]:
    """Validate one record: returns (value, key, headers, size)."""
    value = _as_bytes(value, "value")
    key = _as_bytes(key, "key")
    if timestamp is not None and (type(timestamp) is not int or timestamp < 0):
        # Kafka: "Invalid timestamp ... Timestamp should always be non-negative or null."
        raise ValueError(f"timestamp must be a non-negative int (ms) or None, not {timestamp!r}")
    hdrs = normalize_headers(headers)
    return value, key, hdrs, record_size(value, key, hdrs)


def _import_columnar() -> None:
    global _columnar_ready
    from samsa.protocol import columnar

    columnar.encode_batches([b""], [b""])  # warm up: compute kernels load on first use
    _columnar_ready = True


def columnar_ready(wait: bool = False) -> bool:
    """Whether the columnar codec is loaded (with ``wait``, once it is). The first call (a
    producer's start) starts loading it (pyarrow and numpy: ~0.5 s once per process) in a
    thread, overlapping the connection set-up. A large burst then waits for the rest of the
    load rather than take the per-record paths meanwhile: measured, those paths competing
    with the import for the GIL cost more than the wait (the caller goes on queueing). The
    thread is not a daemon: an import is never cut off at exit.
    """
    global _loader
    if _columnar_ready:
        return True
    with _loader_lock:
        if _loader is None:
            _loader = threading.Thread(target=_import_columnar, name="samsa-columnar-import")
            _loader.start()
    if wait:
        _loader.join()
    return _columnar_ready


_columnar_ready = False
_loader: threading.Thread | None = None
_loader_lock = threading.Lock()


# --- partitioning --------------------------------------------------------------------------


def hash_partitions(keys: Sequence[bytes], num_partitions: int) -> Sequence[int]:
    """Java's default partition of each (non-null) key (a numpy array for many keys)."""
    if len(keys) >= COLUMNAR_HASH_MIN and columnar_ready(wait=True):
        from samsa.protocol.columnar import partitions_for_keys  # pyarrow: imported lazily

        return partitions_for_keys(keys, num_partitions)  # type: ignore[no-any-return]
    from samsa.client._partitioner import partition_for_key

    return [partition_for_key(k, num_partitions) for k in keys]


def assign_partitions(
    keys: Sequence[bytes | None],
    explicit: Sequence[int | None] | None,
    num_partitions: int,
    sticky: Callable[[], int],
) -> int | Sequence[int]:
    """The partition of every record (``explicit`` None: none was given): one int when
    they all go to the same one, else a sequence; -1 marks an explicit partition the topic
    does not have."""
    n = len(keys)
    if explicit is None or explicit.count(None) == n:
        if num_partitions == 1:
            return 0
        nulls = keys.count(None)
        if nulls == n:
            return sticky()
        if nulls == 0:
            return hash_partitions(keys, num_partitions)  # type: ignore[arg-type]
        hashed = iter(hash_partitions([k for k in keys if k is not None], num_partitions))
        s = sticky()
        return [s if k is None else next(hashed) for k in keys]
    out: list[int] = []
    keyed = [k for k, p in zip(keys, explicit, strict=True) if p is None and k is not None]
    hashed = iter(hash_partitions(keyed, num_partitions)) if keyed else iter(())
    s = -1
    for k, p in zip(keys, explicit, strict=True):
        if p is not None:
            out.append(p if p < num_partitions else -1)
        elif k is not None:
            out.append(next(hashed))
        else:
            if s < 0:
                s = sticky()
            out.append(s)
    return out


def group_by_partition(parts: Sequence[int]) -> dict[int, list[int]]:
    """Row indexes per partition, each in input order."""
    if len(parts) < COLUMNAR_HASH_MIN:
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(parts):
            g = groups.get(p)
            if g is None:
                groups[p] = [i]
            else:
                g.append(i)
        return groups
    arr = np.asarray(parts)
    order = np.argsort(arr, kind="stable")  # stable: each partition's rows keep their order
    ordered = arr[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), len(arr)]
    rows = order.tolist()
    return {int(ordered[a]): rows[a:b] for a, b in zip(starts, ends, strict=True)}


def take(column: Sequence[Any], rows: list[int]) -> tuple[Any, ...]:
    """The given rows of a column, as a tuple (one C call)."""
    if len(rows) == 1:
        return (column[rows[0]],)
    return operator.itemgetter(*rows)(column)  # type: ignore[no-any-return]


# --- encoding ------------------------------------------------------------------------------


class Encoded:
    """The records section of one batch, for the rows ``[first, first + count)``; ``whole``
    (if not None) is the batch with room for its header, ``section`` a view of it."""

    __slots__ = ("count", "first", "first_ts", "max_ts", "section", "whole")

    def __init__(
        self,
        whole: bytearray | None,
        section: bytes | memoryview,
        first: int,
        count: int,
        first_ts: int,
        max_ts: int,
    ) -> None:
        self.whole = whole
        self.section = section
        self.first = first
        self.count = count
        self.first_ts = first_ts
        self.max_ts = max_ts


def _framed(section: memoryview) -> tuple[bytearray, memoryview]:
    """A section copied behind room for its batch header. The copy is the only one the
    records get (build() writes the header in place), and it lets the vectorised encoder's
    buffer, which holds every partition's sections of a burst, go at once."""
    whole = bytearray(HEADER_SIZE)
    whole += section  # one pass: bytearray(n) would zero the n bytes before the copy
    return whole, memoryview(whole)[HEADER_SIZE:]


def _split(sizes: Sequence[int], limit: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, s in enumerate(sizes):
        if total + s > limit and i > start:
            runs.append((start, i))
            start, total = i, 0
        total += s
    runs.append((start, len(sizes)))
    return runs


def encode_columns(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None],
    timestamps: np.ndarray,
    headers: Sequence[HeaderTuple | None] | None,
    sizes: Sequence[int],
    *,
    codec: int,
    max_batch_bytes: int,
) -> list[Encoded]:
    """Encode columns as the records sections of batches of at most ``max_batch_bytes``
    (one record alone may exceed it), compressed with ``codec``; one call for all rows."""
    n = len(values)
    if n >= COLUMNAR_ENCODE_MIN and columnar_ready(wait=True):
        from samsa.protocol.columnar import encode_sections  # pyarrow: imported lazily

        return [
            Encoded(*_framed(es.section), es.first, es.count, es.first_timestamp, es.max_timestamp)
            for es in encode_sections(
                values,
                keys,
                headers=headers,
                timestamps=timestamps,
                compression=codec,
                max_batch_bytes=max_batch_bytes,
            )
        ]
    out = []
    stamps: list[int] = timestamps.tolist()
    for a, b in _split(sizes, max_batch_bytes - HEADER_SIZE):
        base_ts = stamps[a]
        if headers is None or headers[a:b].count(None) == b - a:
            body = _encode_plain(values, keys, stamps, a, b)
        else:
            body = b"".join(
                encode_record(i - a, stamps[i] - base_ts, keys[i], values[i], headers[i] or ())
                for i in range(a, b)
            )
        out.append(Encoded(None, compress(codec, body), a, b - a, base_ts, max(stamps[a:b])))
    return out


def _make_varints() -> list[bytes]:
    out = []
    for v in range(-_VARINT_MAX, _VARINT_MAX):
        z = (v << 1) ^ (v >> 63)
        b = bytearray()
        while z >= 0x80:
            b.append((z & 0x7F) | 0x80)
            z >>= 7
        b.append(z)
        out.append(bytes(b))
    return out


_VARINTS = _make_varints()


def _encode_plain(
    values: Sequence[bytes | None], keys: Sequence[bytes | None], stamps: list[int], a: int, b: int
) -> bytes:
    """The records section of rows [a, b) without headers, as encode_record writes it:
    length, attributes (0), timestamp and offset deltas, key, value, header count (0). The
    varints come from a table; a record with a field beyond it takes encode_record."""
    V, M = _VARINTS, _VARINT_MAX
    parts: list[bytes] = []
    put = parts.extend
    base_ts = stamps[a]
    for i in range(a, b):
        key, value = keys[i], values[i]
        td, od = stamps[i] - base_ts, i - a
        kl = -1 if key is None else len(key)
        vl = -1 if value is None else len(value)
        n = 2 + kl + vl  # attributes, header count, the key and value bytes (-1: none)
        if -M <= td < M and od < M and n < M - 16:
            tdb, odb, klb, vlb = V[td + M], V[od + M], V[kl + M], V[vl + M]
            n += len(tdb) + len(odb) + len(klb) + len(vlb) + (kl < 0) + (vl < 0)
            put((V[n + M], b"\0", tdb, odb, klb, key or b"", vlb, value or b"", b"\0"))
        else:
            parts.append(encode_record(od, td, key, value))
    return b"".join(parts)


# --- batches -------------------------------------------------------------------------------


class Batch:
    """Records of one partition, open (columns) or sealed (an encoded records section).

    The sender's fields (sequence, identity, attempts, in flight) belong to the producer;
    ``payload`` caches the full batch for the current identity (None: build it again).
    """

    __slots__ = (
        "attempts",
        "base_sequence",
        "codec",
        "count",
        "created",
        "done",
        "epoch",
        "first_ts",
        "full",
        "handle",
        "headers",
        "in_flight",
        "keys",
        "max_ts",
        "payload",
        "producer_id",
        "retry_at",
        "section",
        "sink_rows",
        "sinks",
        "size",
        "sizes",
        "timestamps",
        "tp",
        "values",
        "whole",
    )

    def __init__(self, tp: TopicPartition, created: float) -> None:
        self.tp = tp
        self.created = created
        self.count = 0
        self.size = 0
        self.full = False  # sealed, or no record may be added any more
        self.done = False
        # the rows that have a sink, ascending, and their sinks: two lists, not a tuple per
        # row (a tuple holding a sink is one more object for the GC to walk, per record)
        self.sink_rows: list[int] = []
        self.sinks: list[Sink] = []
        self.handle: Tally | None = None  # a produce_batch() call owning every record
        # open: the columns
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        # int64 ms (one Arrow conversion fewer than a list); sealed: only with sinks
        self.timestamps: np.ndarray | None = _NO_TIMESTAMPS
        self.headers: list[HeaderTuple | None] | None = None
        self.sizes: list[int] = []
        # sealed
        self.section: bytes | memoryview | None = None
        self.whole: bytearray | None = None  # the batch ``section`` is a view of (_framed)
        self.codec = 0
        self.first_ts = -1
        self.max_ts = -1
        # sender
        self.base_sequence = -1
        self.producer_id = -1
        self.epoch = -1
        self.payload: bytes | memoryview | None = None
        self.in_flight = False
        self.attempts = 0
        self.retry_at = 0.0

    @property
    def last_sequence(self) -> int:
        return (self.base_sequence + self.count - 1) % SEQ_MOD

    @property
    def sealed(self) -> bool:
        return self.section is not None

    def __repr__(self) -> str:
        return f"Batch({self.tp}, seq={self.base_sequence}, n={self.count})"

    # --- open ------------------------------------------------------------------------------

    def extend(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None],
        timestamps: int | Sequence[int],
        headers: Sequence[HeaderTuple | None] | None,
        sinks: Sequence[Sink | None] | None,
        sizes: Sequence[int],
    ) -> None:
        """Append rows to this open batch (``timestamps``: one for all, or one per row)."""
        assert self.section is None and self.timestamps is not None
        base = self.count
        self.values.extend(values)
        self.keys.extend(keys)
        if isinstance(timestamps, int):
            ts = np.full(len(values), timestamps, np.int64)
        else:
            ts = np.asarray(timestamps, np.int64)
        self.timestamps = np.concatenate((self.timestamps, ts)) if base else ts
        if headers is not None:
            if self.headers is None:
                self.headers = [None] * base
            self.headers.extend(headers)
        elif self.headers is not None:
            self.headers.extend(itertools.repeat(None, len(values)))
        if sinks is not None:
            if None in sinks:
                rows = [i for i, s in enumerate(sinks) if s is not None]
                self.sink_rows.extend([base + i for i in rows])
                self.sinks.extend([sinks[i] for i in rows])  # type: ignore[misc]
            else:
                self.sink_rows.extend(range(base, base + len(sinks)))
                self.sinks.extend(sinks)  # type: ignore[arg-type]
        self.sizes.extend(sizes)
        self.count += len(values)
        self.size += sum(sizes)

    def seal_full(self, batch_size: int, codec: int, now: float) -> list[Batch]:
        """Encode the whole batches this open batch holds (by estimated size), in one call,
        as sealed batches; this batch keeps the rest, open."""
        budget = batch_size - HEADER_SIZE
        cum = list(itertools.accumulate(self.sizes))
        # at least the first record: alone, it may exceed batch.size
        cut = max(1, bisect.bisect_right(cum, (cum[-1] // budget) * budget))
        hdrs = self.headers[:cut] if self.headers is not None else None
        assert self.timestamps is not None
        encoded = encode_columns(
            self.values[:cut],
            self.keys[:cut],
            self.timestamps[:cut],
            hdrs,
            self.sizes[:cut],
            codec=codec,
            max_batch_bytes=batch_size,
        )
        out = []
        for e in encoded:
            b = Batch(self.tp, self.created)
            self._give(b, e, codec)
            out.append(b)
        rest = self.count - cut
        del self.values[:cut], self.keys[:cut], self.sizes[:cut]
        self.timestamps = self.timestamps[cut:].copy()
        if self.headers is not None:
            del self.headers[:cut]
        k = bisect.bisect_left(self.sink_rows, cut)
        self.sink_rows = [i - cut for i in self.sink_rows[k:]]
        del self.sinks[:k]
        self.count = rest
        self.size = sum(self.sizes)
        self.created = now  # the rest waits linger.ms from now, as a new batch would
        return out

    def _give(self, b: Batch, e: Encoded, codec: int) -> None:
        """Make ``b`` the sealed batch of rows ``e`` of this one."""
        end = e.first + e.count
        b.section, b.whole = e.section, e.whole
        b.codec = codec
        b.count = e.count
        b.first_ts, b.max_ts = e.first_ts, e.max_ts
        b.size = sum(self.sizes[e.first : end])
        b.full = True
        lo = bisect.bisect_left(self.sink_rows, e.first)
        hi = bisect.bisect_left(self.sink_rows, end)
        b.sink_rows = [i - e.first for i in self.sink_rows[lo:hi]]
        b.sinks = self.sinks[lo:hi]
        assert self.timestamps is not None
        b.timestamps = self.timestamps[e.first : end].copy() if b.sinks else None
        b.values, b.keys, b.sizes, b.headers = [], [], [], None

    def seal(self, codec: int) -> None:
        """Encode what this open batch holds as one batch (the sender takes it)."""
        if self.section is not None:
            return
        assert self.timestamps is not None
        (e,) = encode_columns(
            self.values,
            self.keys,
            self.timestamps,
            self.headers,
            self.sizes,
            codec=codec,
            max_batch_bytes=1 << 62,
        )
        self._give(self, e, codec)

    # --- sending ---------------------------------------------------------------------------

    def build(
        self, producer_id: int, epoch: int, base_sequence: int, transactional: bool, codec: int
    ) -> bytes | memoryview:
        """The full v2 batch for this identity; the records section is encoded once. A
        framed section (``whole``) gets its header written in place, so the result is valid
        until the next build (the request encoder copies it before that can happen)."""
        self.seal(codec)
        assert self.section is not None
        fields = (
            self.codec | (TRANSACTIONAL_FLAG if transactional else 0),
            self.count - 1,
            self.first_ts,
            self.max_ts,
            producer_id,
            epoch,
            base_sequence,
            self.count,
        )
        whole = self.whole
        if whole is not None:
            _AFTER_CRC.pack_into(whole, _BEFORE_CRC.size, *fields)
            crc = crc32c.crc32c(memoryview(whole)[_BEFORE_CRC.size :])
            _BEFORE_CRC.pack_into(whole, 0, 0, len(whole) - 12, 0, MAGIC_V2, crc)
            return memoryview(whole)
        tail = _AFTER_CRC.pack(*fields)
        crc = crc32c.crc32c(self.section, crc32c.crc32c(tail))
        head = _BEFORE_CRC.pack(0, len(tail) + len(self.section) + 9, 0, MAGIC_V2, crc)
        return b"".join((head, tail, self.section))

    def drop_first(self, k: int) -> None:
        """The first ``k`` records were written already (a resumed identity): resolve them
        as duplicates and keep the rest (re-encoded when sealed)."""
        if self.section is not None:
            self._unseal()
        assert self.timestamps is not None
        if self.handle is not None:
            self.handle.landed(self.tp.partition, -1, k, -1, True)
        kept = bisect.bisect_left(self.sink_rows, k)
        for i, sink in zip(self.sink_rows[:kept], self.sinks[:kept], strict=True):
            _deliver(
                sink,
                None,
                RecordMetadata(*self.tp, -1, int(self.timestamps[i]), duplicate=True),
            )
        self.sink_rows = [i - k for i in self.sink_rows[kept:]]
        del self.sinks[:kept]
        dropped = sum(self.sizes[:k])
        del self.values[:k], self.keys[:k], self.sizes[:k]
        self.timestamps = self.timestamps[k:]
        if self.sizes:  # the batch's release gives back the dropped records' bytes too
            self.sizes[0] += dropped
        if self.headers is not None:
            del self.headers[:k]
        self.count -= k
        self.payload = None

    def _unseal(self) -> None:
        """Back to columns (rare: only a resumed producer's first batches need it)."""
        full = self.build(-1, -1, -1, False, self.codec)
        records = decode_records(RecordBatchView(full))
        size = self.size
        self.section = self.whole = None
        self.full = False
        self.values = [r.value for r in records]
        self.keys = [r.key for r in records]
        self.timestamps = np.array([r.timestamp for r in records], np.int64)
        self.headers = [r.headers or None for r in records]
        self.sizes = [record_size(r.value, r.key, r.headers) for r in records]
        # the release must give back what the intake took, not a new estimate
        self.sizes[-1] += size - sum(self.sizes)

    # --- outcome ---------------------------------------------------------------------------

    def succeed(self, base_offset: int, append_time: int, duplicate: bool) -> None:
        """Every record's sink gets its metadata (offset -1 when the broker gave none)."""
        if self.done:
            return
        self.done = True
        if self.handle is not None:
            self.handle.landed(self.tp.partition, base_offset, self.count, append_time, duplicate)
        if not self.sinks:
            return
        topic, partition = self.tp
        assert self.timestamps is not None
        ts = self.timestamps.tolist()
        first = self.sinks[0]
        # (count compares by ==: identity for the callables made here, value for handles)
        if type(first) is int and self.sinks.count(first) == len(self.sinks):
            # one call for the batch: no RecordMetadata held per record until delivered
            try:
                _row_sinks[first].landed_rows(
                    topic,
                    partition,
                    base_offset,
                    self.sink_rows,
                    ts if append_time < 0 else None,
                    append_time,
                    duplicate,
                )
            except Exception:  # as _deliver: never the producer's problem
                log.exception("delivery callback failed")
            return
        new, md_type = tuple.__new__, RecordMetadata  # skips the named tuple's __new__
        for i, sink in zip(self.sink_rows, self.sinks, strict=True):
            md = new(
                md_type,
                (
                    topic,
                    partition,
                    base_offset + i if base_offset >= 0 else -1,
                    append_time if append_time >= 0 else ts[i],
                    duplicate,
                ),
            )
            _deliver(sink, None, md)

    def fail(self, err: BaseException) -> None:
        if self.done:
            return
        self.done = True
        if self.handle is not None:
            self.handle.failed(err, self.count)
        for sink in self.sinks:
            _deliver(sink, err, None)


class RowSink:
    """A sink that also takes a whole batch's records at once: when every record of a
    batch has this sink's handle (:func:`register_sink`) as its sink, :meth:`Batch.succeed`
    calls :meth:`landed_rows` instead of the sink once per record (the sync producer's
    delivery callbacks: one queue entry per batch, and the RecordMetadata made only when
    the callback is served)."""

    __slots__ = ()

    def __call__(self, err: BaseException | None, md: RecordMetadata | None) -> None:
        raise NotImplementedError

    def landed_rows(
        self,
        topic: str,
        partition: int,
        base_offset: int,
        rows: Sequence[int],
        timestamps: list[int] | None,
        append_time: int,
        duplicate: bool,
    ) -> None:
        """Rows ``rows`` of a batch written at ``base_offset`` (-1: no offset), each with its
        timestamp in ``timestamps`` (indexed by row), or all ``append_time`` (log append
        time) when ``timestamps`` is None."""
        raise NotImplementedError


# RowSinks by handle. A record carries the handle, an int, rather than the sink: a tuple
# of ints, bytes and None is left alone by the garbage collector, one holding an object
# is walked at every collection while it lives (profiled: the collector took over half of
# a producer's time when 100k+ records with a delivery callback were queued).
_row_sinks: dict[int, RowSink] = {}
_sink_handles = itertools.count(1)


def register_sink(sink: RowSink) -> int:
    """A handle for ``sink``, to pass as a record's sink; valid until unregistered."""
    handle = next(_sink_handles)
    _row_sinks[handle] = sink
    return handle


def unregister_sink(handle: int) -> None:
    _row_sinks.pop(handle, None)


def row_sink(handle: int) -> RowSink | None:
    return _row_sinks.get(handle)


def _deliver(sink: Sink, err: BaseException | None, md: RecordMetadata | None) -> None:
    """Call a sink; a sink that raises (a user's callback) must not stop the others."""
    try:
        if type(sink) is int:
            sink = _row_sinks[sink]
        sink(err, md)
    except Exception:  # the user's problem, reported, never the producer's
        log.exception("delivery callback failed")


def fail_items(items: Sequence[Item], err: BaseException) -> None:
    for item in items:
        extras = item[4]
        if extras is not None and extras[3] is not None:
            _deliver(extras[3], err, None)


# --- columnar intake (produce_batch) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """Where the records of one ``produce_batch()`` call landed.

    ``offsets`` maps each partition to its runs of records as (first offset, count), in the
    order of the call's rows for that partition; consecutive batches that landed next to each
    other are merged into one run. Records acknowledged without an offset (``acks=0``, or a
    retry the broker recognised as a duplicate of a write it had made: DUPLICATE_SEQUENCE_NUMBER
    or a resumed producer's records written by its previous incarnation) are counted in
    ``without_offset`` instead.
    """

    topic: str
    count: int
    offsets: dict[int, list[tuple[int, int]]]
    without_offset: int = 0


class Tally:
    """Counts the records of one ``produce_batch()`` call as their batches resolve; calls
    ``done(error, metadata)`` once, when the last one did (error: the first failure; the
    metadata then still says where the records that were written landed)."""

    __slots__ = ("_done", "count", "error", "offsets", "remaining", "topic", "without_offset")

    def __init__(
        self,
        topic: str,
        count: int,
        done: Callable[[BaseException | None, BatchMetadata], None],
    ) -> None:
        self.topic = topic
        self.count = count
        self.remaining = count
        self.offsets: dict[int, list[tuple[int, int]]] = {}
        self.without_offset = 0
        self.error: BaseException | None = None
        self._done = done
        if count == 0:
            self._finish()

    def landed(
        self,
        partition: int,
        base_offset: int,
        count: int,
        append_time: int = -1,
        duplicate: bool = False,
    ) -> None:
        """``count`` records written at ``base_offset`` (-1: none given) with the batch's
        log append time (-1: CreateTime) and duplicate flag (for subclasses)."""
        if base_offset < 0:
            self.without_offset += count
        else:
            runs = self.offsets.setdefault(partition, [])
            if runs and runs[-1][0] + runs[-1][1] == base_offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + count)
            else:
                runs.append((base_offset, count))
        self._resolved(count)

    def failed(self, err: BaseException, count: int) -> None:
        if self.error is None:
            self.error = err
        self._resolved(count)

    def _resolved(self, count: int) -> None:
        self.remaining -= count
        if self.remaining == 0:
            self._finish()

    def _finish(self) -> None:
        md = BatchMetadata(self.topic, self.count, self.offsets, self.without_offset)
        try:
            self._done(self.error, md)
        except Exception:  # a user's callback: reported, never the producer's problem
            log.exception("produce_batch completion callback failed")


@dataclass(slots=True)
class Columns:
    """Validated columns of a ``produce_batch()`` call (see :func:`make_columns`)."""

    values: Any  # pa.LargeBinaryArray, nulls kept
    keys: Any | None  # pa.LargeBinaryArray or None: no keys at all
    timestamps: np.ndarray  # int64 ms
    headers: Any | None  # pa.ListArray of (key, value) structs, or None
    partitions: np.ndarray | None  # int64, -1 = any; None: any for every row
    sizes: np.ndarray  # int64 estimate per row (buffer.memory is accounted with it)

    def __len__(self) -> int:
        return len(self.sizes)

    def slice(self, a: int, b: int) -> Columns:
        return Columns(
            self.values.slice(a, b - a),
            self.keys.slice(a, b - a) if self.keys is not None else None,
            self.timestamps[a:b],
            self.headers.slice(a, b - a) if self.headers is not None else None,
            self.partitions[a:b] if self.partitions is not None else None,
            self.sizes[a:b],
        )

    def take(self, rows: np.ndarray) -> Columns:
        import pyarrow as pa

        from samsa.protocol.columnar import int_array

        idx = int_array(rows.astype(np.int64), pa.int64())
        return Columns(
            self.values.take(idx),
            self.keys.take(idx) if self.keys is not None else None,
            self.timestamps[rows],
            self.headers.take(idx) if self.headers is not None else None,
            self.partitions[rows] if self.partitions is not None else None,
            self.sizes[rows],
        )


def plain_columns(items: Sequence[Item], now_ms: int) -> Columns | None:
    """A burst of one topic's plain records (intake items with no partition, timestamp or
    headers, and all the same extras: none, or one shared sink's) as the columns of the
    columnar intake, or None if the burst is not that. The sizes are the items' own, so
    buffer.memory's accounting gives back exactly what the caller counted."""
    n = len(items)
    if not n:
        return None
    extras = items[0][4]
    if extras is not None and extras[:3] != (None, None, None):
        return None
    if list(map(EXTRAS, items)).count(extras) != n:  # identity first: a shared tuple
        return None
    if len(set(map(TOPIC, items))) != 1:
        return None
    from samsa.protocol.columnar import binary_array

    keys = list(map(KEY, items))
    return Columns(
        binary_array(list(map(VALUE, items)), "values"),
        None if keys.count(None) == n else binary_array(keys, "keys"),
        np.full(n, now_ms, np.int64),
        None,
        None,
        np.fromiter(map(SIZE, items), np.int64, n),
    )


def run_columns(values: list[bytes], keys: list[bytes | None], now_ms: int) -> Columns:
    """The sync producer's run of plain records (bytes values, keys bytes or None, one
    topic and one sink: nothing to check) as the columnar intake's columns, stamped
    ``now_ms``. Sizes are record_size()'s, what the caller reserved in buffer.memory."""
    from samsa.protocol.columnar import binary_array

    n = len(values)
    vals, sizes = _bytes_rows(values)
    sizes += RECORD_OVERHEAD
    key_arr = None
    try:  # keys are distinct objects, each read once per pass: no pass to look for None
        key_arr, klen = _bytes_rows(keys)  # type: ignore[arg-type]
    except TypeError:  # a null key
        if keys.count(None) != n:
            key_arr = binary_array(keys, "keys")  # a null key's length counts 0
            klen = np.diff(np.frombuffer(key_arr.buffers()[1], np.int64, n + 1))
    if key_arr is not None:
        sizes += klen
    return Columns(vals, key_arr, np.full(n, now_ms, np.int64), None, None, sizes)


def _bytes_rows(rows: list[bytes]) -> tuple[Any, np.ndarray]:
    """Rows of bytes (TypeError for anything else) as large_binary, and their lengths."""
    import pyarrow as pa

    n = len(rows)
    lengths = np.fromiter(map(len, rows), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(rows)
    arr = pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return arr, lengths


def make_columns(values: Any, keys: Any, partition: Any, headers: Any, timestamps: Any) -> Columns:
    """Check a ``produce_batch()`` call on the caller's thread (bad input raises here and
    nothing is queued) and convert its columns to Arrow once."""
    from samsa.protocol import columnar as col

    vals, vlen = _binary_column(values, "values")
    n = len(vlen)
    size = RECORD_OVERHEAD + np.maximum(vlen, 0)
    key_arr = None
    if keys is not None:
        key_arr, klen = _binary_column(keys, "keys")
        if len(klen) != n:
            raise ValueError(f"keys: {len(klen)} given for {n} values")
        if key_arr.null_count == n:
            key_arr = None  # all null: every row is unkeyed
        else:
            size += np.maximum(klen, 0)
    ts = col._timestamps(timestamps, n, None)
    hlist = col._headers_list(headers, n)
    if hlist is not None:
        sections = col._header_sections(hlist)  # validates: a header needs a key
        if sections is None:
            hlist = None
        else:
            size += sections.lengths
    parts = _partition_column(partition, n)
    return Columns(vals, key_arr, ts, hlist, parts, size)


def _binary_column(data: Any, what: str) -> tuple[Any, np.ndarray]:
    """bytes, str or None per row (or a binary/string Arrow array), as large_binary with
    its lengths (-1: null)."""
    import pyarrow as pa

    from samsa.protocol import columnar as col

    if isinstance(data, (bytes, str)):
        raise TypeError(f"{what}: expected a column (a sequence or an Arrow array), not {data!r}")
    arr = col._to_arrow(data, what, pa.large_binary())
    lengths = np.diff(col._offsets(arr))
    nulls = col.null_mask(arr)
    if nulls is not None:
        lengths[nulls] = -1
    return arr, lengths


def _partition_column(partition: Any, n: int) -> np.ndarray | None:
    """An explicit partition for all rows (int) or per row (a column, None/-1 = any)."""
    if partition is None:
        return None
    if isinstance(partition, (int, np.integer)) and not isinstance(partition, bool):
        p = int(partition)
        if p < -1:
            raise ValueError(f"partition must be >= 0 (or -1/None: any), not {p}")
        return None if p == -1 else np.full(n, p, np.int64)
    import pyarrow as pa

    from samsa.protocol import columnar as col

    arr = col._to_arrow(partition, "partition", pa.int64())
    if len(arr) != n:
        raise ValueError(f"partition: {len(arr)} given for {n} values")
    parts = col.to_numpy(arr, fill=-1)
    if n and int(parts.min()) < -1:
        raise ValueError(f"partition must be >= 0 (or -1/None: any), not {int(parts.min())}")
    return None if (parts == -1).all() else parts


def assign_column_partitions(
    cols: Columns,
    num_partitions: int,
    batch_size: int,
    sticky: Callable[[], int],
    move_on: Callable[[int], None],
) -> np.ndarray:
    """The partition of every row (-2: an explicit partition the topic does not have).
    Keys hash as Java's default partitioner does; unkeyed rows follow the sticky
    partitioner, which moves on every ``batch.size`` bytes (KIP-480/794: one partition per
    batch), so that a large burst of unkeyed records spreads over the partitions."""
    from samsa.protocol.columnar import partitions_for_keys

    n = len(cols)
    out = np.full(n, -1, np.int64)
    if cols.partitions is not None:
        explicit = cols.partitions
        out[explicit >= num_partitions] = -2
        ok = (explicit >= 0) & (explicit < num_partitions)
        out[ok] = explicit[ok]
    if cols.keys is not None:
        free = out == -1
        if free.any():
            hashed = partitions_for_keys(cols.keys, num_partitions)
            out[free] = hashed[free]
    free_rows = np.flatnonzero(out == -1)
    if free_rows.size:
        # chunks of batch.size bytes, each on the current sticky partition, then the next
        budget = max(1, batch_size - HEADER_SIZE)
        cum = np.cumsum(cols.sizes[free_rows])
        chunk = (cum - 1) // budget
        cuts = np.flatnonzero(chunk[1:] != chunk[:-1]) + 1
        bounds = [0, *cuts.tolist(), len(free_rows)]
        for a, b in itertools.pairwise(bounds):
            p = sticky()
            out[free_rows[a:b]] = p
            if b - a and cum[b - 1] - (cum[a - 1] if a else 0) >= budget // 2:
                move_on(p)  # this chunk fills (most of) a batch: the next goes elsewhere
    return out


def encode_sealed(
    spans: Sequence[tuple[TopicPartition, int, int]],
    cols: Columns,
    codec: int,
    batch_size: int,
    created: float,
    tally: Tally,
) -> list[list[Batch]]:
    """Each partition's rows ``[a, b)`` of ``cols`` (the spans in row order, covering every
    row) as sealed batches of at most ``batch.size`` (one record alone may exceed it), owned
    by ``tally``; their sizes sum to the rows' estimate. One encode for every partition:
    per call, the vectorised encoder's fixed cost was a partition's (4 calls per burst)."""
    from samsa.protocol.columnar import encode_sections

    out: list[list[Batch]] = [[] for _ in spans]
    cum = np.zeros(len(cols) + 1, np.int64)
    np.cumsum(cols.sizes, out=cum[1:])
    k = 0
    for es in encode_sections(
        cols.values,
        cols.keys,
        headers=cols.headers,
        timestamps=cols.timestamps,
        compression=codec,
        max_batch_bytes=batch_size,
        cuts=[a for _, a, _ in spans[1:]],
    ):
        while es.first >= spans[k][2]:
            k += 1
        b = Batch(spans[k][0], created)
        b.whole, b.section = _framed(es.section)
        b.first_ts, b.max_ts = es.first_timestamp, es.max_timestamp
        b.codec = codec
        b.count = es.count
        b.size = int(cum[es.first + es.count] - cum[es.first])
        b.full = True
        b.timestamps = None
        b.handle = tally
        out[k].append(b)
    return out


# --- buffer.memory ---------------------------------------------------------------------------


class BufferMemory:
    """``buffer.memory``'s one account: bytes reserved by whoever queues records (the sync
    facade's threads, or the loop thread for :class:`AsyncProducer`'s own calls) against
    bytes the accumulator released (loop thread).

    Every count only grows and what is held is their difference, so each count has one
    writer and nobody waits for a lock on the hot path: ``reserved`` is the owner thread's
    (the thread that made the producer; a lock per record was 40% of ``produce()``'s cost),
    ``reserved_other`` is written under a lock by the other threads, ``released`` by the
    loop thread. A thread reading the three may miss another thread's record in flight, so
    the bound can be passed by one record per producing thread.
    """

    __slots__ = (
        "_lock",
        "_space",
        "_thread_space",
        "_wake_below",
        "_want_space",
        "limit",
        "max_block",
        "owner",
        "released",
        "reserved",
        "reserved_other",
    )

    def __init__(self, limit: int, max_block: float) -> None:
        self.limit = limit
        self.max_block = max_block
        self.owner = threading.get_ident()
        self.reserved = 0
        self.reserved_other = 0
        self.released = 0
        self._lock = threading.Lock()
        self._space = asyncio.Event()  # the loop thread's callers (send, produce_batch)
        self._space.set()
        self._thread_space = threading.Event()  # a thread blocked in reserve()
        self._want_space = False
        self._wake_below = 0  # what that thread waits for (see wait)

    def held(self) -> int:
        """Bytes reserved and not released yet."""
        return self.reserved + self.reserved_other - self.released

    def set_owner(self, ident: int) -> None:
        """The thread whose reservations take no lock (before its first one)."""
        self.owner = ident

    def try_reserve(self, size: int) -> bool:
        """Count ``size`` bytes in if they fit; never blocks (the owner thread only)."""
        reserved = self.reserved + size
        if reserved + self.reserved_other - self.released <= self.limit:
            self.reserved = reserved
            return True
        return False

    def give_back(self, size: int) -> None:
        """Un-count bytes the owner thread reserved and did not use (owner thread)."""
        self.reserved -= size

    def reserve(self, size: int, need: int | None = None) -> None:
        """Count ``size`` bytes in (any thread), first blocking while ``need`` (default
        ``size``) more bytes do not fit (see :meth:`wait`)."""
        if self.held() + size > self.limit:
            self.wait(size if need is None else need)
        self.add(size)

    def add(self, size: int) -> None:
        """Count ``size`` bytes in, whether they fit or not."""
        if threading.get_ident() == self.owner:
            self.reserved += size
        else:
            with self._lock:
                self.reserved_other += size

    def wait(self, size: int) -> None:
        """Block until less than buffer.memory is held, up to max.block.ms.

        Once blocked, the caller waits for a quarter of buffer.memory to be free (or for
        what the record needs, if more), not just for this record's bytes: it then queues a
        burst the loop thread takes in a few calls, rather than the few hundred records a
        batch's release makes room for, each burst paying the intake's fixed costs. At
        max.block.ms a record that fits is still taken."""
        memory = self.limit
        if size > memory:
            raise KafkaError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"the record is {size} bytes when serialized, more than buffer.memory ({memory})",
            )
        wake_below = memory - max(size, memory // 4)
        deadline = time.monotonic() + self.max_block
        while True:
            self._thread_space.clear()
            self._wake_below = wake_below
            self._want_space = True
            if self.held() <= wake_below:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if self.held() + size <= memory:
                    return
                raise BufferExhaustedError(memory, self.max_block)
            # release() sets it; the timeout only bounds a lost wakeup
            self._thread_space.wait(min(remaining, 0.05))

    # --- the loop thread ---------------------------------------------------------------------

    def add_from_loop(self, size: int) -> None:
        """Count in the bytes of an AsyncProducer call; when full, the next calls wait."""
        self.add(size)
        if self.held() >= self.limit:
            self._space.clear()

    async def wait_async(self) -> None:
        """Until the last loop-thread reservation's overflow is released (max.block.ms)."""
        if self._space.is_set():
            return
        try:
            await asyncio.wait_for(self._space.wait(), self.max_block)
        except TimeoutError:
            raise BufferExhaustedError(self.limit, self.max_block) from None

    async def wait_async_for(self, size: int) -> None:
        """Until ``size`` more bytes fit, or nothing is held (max.block.ms)."""
        held = self.held()
        if held + size > self.limit and held:
            self._space.clear()
            await self.wait_async()

    def release(self, size: int) -> None:
        """Give bytes back (loop thread) and wake whoever waits for them."""
        self.released += size
        held = self.held()
        if held < self.limit:
            self._space.set()
        if self._want_space and held <= self._wake_below:
            self._want_space = False
            self._thread_space.set()


# --- the accumulator -------------------------------------------------------------------------


class ProducerHost(Protocol):
    """What the producer's parts (accumulator, sender, transaction manager) ask of the
    producer that owns them."""

    @property
    def fatal_error(self) -> KafkaError | None: ...

    def wake(self) -> None:
        """The sender has work (a new batch, a partition added, a request answered)."""

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` as a task the producer cancels on close."""
        ...

    def fail_fatal(self, err: KafkaError) -> None:
        """The producer is finished: every record fails, every call raises ``err``."""


class TransactionGate(Protocol):
    """What the accumulator asks of the open transaction (``TransactionManager``)."""

    def admission_error(self) -> BaseException | None:
        """None while records may join the transaction, else why not."""

    def enlist(self, tp: TopicPartition) -> None:
        """A partition gets a record: add it to the transaction if it is not in it."""

    def fail(self, err: BaseException, *, bump: bool) -> None:
        """A record of the transaction was lost: it can only abort."""


class ProducerPartition(PartitionSequences):
    """A partition's sequences (see ``_idempotence``) and its batches not yet drained."""

    __slots__ = ("queue", "tp")

    def __init__(self, tp: TopicPartition, producer_id: int, epoch: int, next_seq: int) -> None:
        super().__init__(producer_id, epoch, next_seq)
        self.tp = tp
        self.queue: collections.deque[Batch] = collections.deque()  # no sequence yet


def _now_ms() -> int:
    return int(time.time() * 1000)


class RecordAccumulator:
    """The producer's records from intake until their outcome: per partition the batches
    not drained yet (``queue``) and those sequenced and unacknowledged (``pending``, see
    ``_idempotence``), the records waiting for their topic's metadata, how many batches
    are incomplete (what ``flush()`` waits for) and ``buffer.memory``'s account, the only
    one: every byte a caller reserved is released here once, when its record fails or its
    batch completes. The sender drains the partitions and resolves their batches through
    :meth:`release`; the caller reserves before it appends (``append_*`` never wait).
    Loop thread only, but for :attr:`buffer`'s reservations.
    """

    def __init__(
        self,
        host: ProducerHost,
        cluster: Cluster,
        idem: Idempotence,
        buffer: BufferMemory,
        *,
        batch_size: int,
        codec: int,
        retry_backoff: float,
        txn: TransactionGate | None,
        resume: ProducerState | None,
        column_limit: Callable[[str], int],
    ) -> None:
        self.host = host
        self.cluster = cluster
        self.idem = idem
        self.buffer = buffer
        self.batch_size = batch_size
        self.codec = codec
        self.retry_backoff = retry_backoff
        self.txn = txn  # None without transactional.id
        self.resume = resume
        self.column_limit = column_limit  # a produce_batch() batch's largest size
        self.partitioner = StickyPartitioner()
        self.partitions: dict[TopicPartition, ProducerPartition] = {}
        self.awaiting_metadata: dict[str, list[Item]] = {}
        self.outstanding = 0  # batches not yet completed
        self.idle = asyncio.Event()
        self.idle.set()
        self.flushing = 0  # flush() calls waiting: send without waiting for linger.ms
        self.closed = False

    # --- intake ------------------------------------------------------------------------------

    def metadata_ready(self, topic: str) -> bool:
        """The topic's partitions are known and none of its records waits for them."""
        return (
            topic not in self.awaiting_metadata and self.cluster.partition_count(topic) is not None
        )

    def append_many(self, items: list[Item]) -> None:
        """Add records (intake tuples, see :func:`make_item`; their bytes reserved) to
        their partitions' batches, in order (never blocks)."""
        topic = items[0][0]
        if len(items) == 1 or len(set(map(TOPIC, items))) == 1:
            self._append_topic(topic, items)
            return
        by_topic: dict[str, list[Item]] = {}
        for item in items:
            by_topic.setdefault(item[0], []).append(item)
        for topic, group in by_topic.items():
            self._append_topic(topic, group)

    def drop_items(self, items: Sequence[Item], err: BaseException) -> None:
        """Records that never reach a batch: fail them and give their bytes back."""
        fail_items(items, err)
        self.release_bytes(sum(map(SIZE, items)))

    def drop_columns(self, cols: Columns, tally: Tally, err: BaseException) -> None:
        """A produce_batch() chunk that never reaches a batch."""
        tally.failed(err, len(cols))
        self.release_bytes(int(cols.sizes.sum()))

    def _append_topic(self, topic: str, items: list[Item]) -> None:
        if topic in self.awaiting_metadata or self.cluster.partition_count(topic) is None:
            waiting = self.awaiting_metadata.setdefault(topic, [])
            if not waiting:
                self.outstanding += 1  # flush() waits for the metadata too
                self.idle.clear()
                self.host.spawn(self._await_metadata(topic))
            waiting.extend(items)
            return
        self._append_records(topic, items)

    def _lost(self, items: Sequence[Item], err: KafkaError) -> None:
        """Records of the topic that cannot be sent (no such partition, no metadata)."""
        self.drop_items(items, err)
        if self.txn is not None:
            # As Java's doSend: a record lost in a transaction makes it abortable.
            self.txn.fail(err, bump=False)

    def _append_records(self, topic: str, items: list[Item]) -> None:
        """Partition a burst of one topic's records and add them to their batches."""
        if self.txn is not None:
            refused = self.txn.admission_error()
            if refused is not None:
                self.drop_items(items, refused)
                return
        n = self.cluster.partition_count(topic)
        assert n is not None
        # Columns by itemgetter: no object per row (zip(*items) makes one, and the GC runs)
        values = list(map(VALUE, items))
        keys = list(map(KEY, items))
        sizes = list(map(SIZE, items))
        extras = list(map(EXTRAS, items))
        now = _now_ms()
        explicit = ts = hdrs = sinks = None
        if extras.count(None) != len(extras):
            none = (None, None, None, None)
            filled = [e or none for e in extras]  # four columns, no object per row (as above)
            explicit, stamps, hdrs, sinks = ([e[k] for e in filled] for k in range(4))
            if stamps.count(None) != len(stamps):
                ts = [now if t is None else t for t in stamps]
            if hdrs.count(None) == len(hdrs):
                hdrs = None
            if sinks.count(None) == len(sinks):
                sinks = None
        parts = assign_partitions(keys, explicit, n, lambda: self.partitioner.partition(topic, n))
        if isinstance(parts, int):
            self._accumulate(
                TopicPartition(topic, parts),
                values,
                keys,
                ts if ts is not None else now,
                hdrs,
                sinks,
                sizes,
            )
            return
        for p, rows in group_by_partition(parts).items():
            if p < 0:  # an explicit partition the topic does not have
                assert explicit is not None
                err = KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{topic} has no partition {take(explicit, rows)[0]}",
                )
                self._lost(take(items, rows), err)
                continue
            self._accumulate(
                TopicPartition(topic, p),
                take(values, rows),
                take(keys, rows),
                take(ts, rows) if ts is not None else now,
                take(hdrs, rows) if hdrs is not None else None,
                take(sinks, rows) if sinks is not None else None,
                take(sizes, rows),
            )

    def _accumulate(
        self,
        tp: TopicPartition,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None],
        timestamps: int | Sequence[int],
        headers: Sequence[Any] | None,
        sinks: Sequence[Sink | None] | None,
        sizes: Sequence[int],
    ) -> None:
        """Append one partition's records to its open batch; seal the whole batches."""
        ps = self.partition(tp)
        batch = ps.queue[-1] if ps.queue else None
        if batch is None or batch.full:
            batch = Batch(tp, asyncio.get_running_loop().time())
            ps.queue.append(batch)
            self.outstanding += 1
            self.idle.clear()
            self.host.wake()  # as Java's sender is woken for a new batch (its linger starts)
        batch.extend(values, keys, timestamps, headers, sinks, sizes)
        if batch.size >= self.batch_size - HEADER_SIZE:
            sealed = batch.seal_full(self.batch_size, self.codec, asyncio.get_running_loop().time())
            if sealed:
                if batch.count:
                    ps.queue.pop()
                    ps.queue.extend(sealed)
                    ps.queue.append(batch)
                    self.outstanding += len(sealed)
                else:  # all of it sealed: the open batch object is not needed any more
                    ps.queue.pop()
                    ps.queue.extend(sealed)
                    self.outstanding += len(sealed) - 1
                self.host.wake()

    def partition(self, tp: TopicPartition) -> ProducerPartition:
        """The partition's state (made on its first record), added to the transaction."""
        ps = self.partitions.get(tp)
        if ps is None:
            idem, resume = self.idem, self.resume
            resumed = (
                resume is not None
                and tp in resume.sequences
                and (resume.producer_id, resume.epoch) == (idem.producer_id, idem.epoch)
            )
            seq = resume.sequences[tp] if resumed and resume else 0
            ps = self.partitions[tp] = ProducerPartition(tp, idem.producer_id, idem.epoch, seq)
            ps.skip_known = not resumed
        if self.txn is not None:
            self.txn.enlist(tp)
        return ps

    def append_columns(self, topic: str, cols: Columns, tally: Tally) -> None:
        """Partition a chunk of a produce_batch() call (its bytes reserved), encode it per
        partition as sealed batches and queue them after the partition's earlier records."""
        n_rows = len(cols)
        n = self.cluster.partition_count(topic)
        if n is None:
            err = KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic} unknown")
            self.drop_columns(cols, tally, err)
            return
        waiting = self.awaiting_metadata.pop(topic, None)
        if waiting:  # send()'s records that waited for this metadata come first
            self._append_records(topic, waiting)
        parts = assign_column_partitions(
            cols,
            n,
            self.batch_size,
            lambda: self.partitioner.partition(topic, n),
            lambda p: self.partitioner.batch_closed(topic, p, n),
        )
        first, last = int(parts.min()), int(parts.max())
        if first == last:
            spans = [(first, 0, n_rows)]
        else:  # each partition's rows together, in call order: one take, one encode
            order = np.argsort(parts, kind="stable")
            ordered = parts[order]
            cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
            bounds = [0, *cuts.tolist(), n_rows]
            spans = [(int(ordered[a]), a, b) for a, b in itertools.pairwise(bounds)]
            cols = cols.take(order)
        if spans[0][0] < 0:  # explicit partitions the topic does not have (sorted first)
            _, a, b = spans.pop(0)
            bad_cols, cols = cols.slice(a, b), cols.slice(b, n_rows)
            spans = [(p, a - b, c - b) for p, a, c in spans]
            assert bad_cols.partitions is not None
            bad = KafkaError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"{topic} has no partition {int(bad_cols.partitions[0])}",
            )
            self.drop_columns(bad_cols, tally, bad)
            if self.txn is not None:
                self.txn.fail(bad, bump=False)
        if spans:
            now = asyncio.get_running_loop().time()
            tps = [(TopicPartition(topic, p), a, b) for p, a, b in spans]
            sealed = encode_sealed(tps, cols, self.codec, self.column_limit(topic), now, tally)
            for (tp, _, _), batches in zip(tps, sealed, strict=True):
                ps = self.partition(tp)
                # after the partition's open batch, if any: its records stay ahead, and the
                # next send() starts a new batch (the last one is sealed, full)
                ps.queue.extend(batches)
                self.outstanding += len(batches)
        self.idle.clear()
        self.host.wake()

    async def wait_metadata(self, topic: str, max_block: float) -> None:
        """Until the topic's partition count is known (``max_block`` s, then an error)."""
        if self.cluster.partition_count(topic) is not None:
            return
        deadline = asyncio.get_running_loop().time() + max_block
        while self.cluster.partition_count(topic) is None:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic} not in metadata after max.block.ms",
                )
            try:
                await self.cluster.refresh([topic], timeout=left)
            except KafkaError as exc:
                log.debug("metadata for %s: %s", topic, exc)
            if self.cluster.partition_count(topic) is None:
                await asyncio.sleep(self.retry_backoff)

    async def _await_metadata(self, topic: str) -> None:
        """The records of a topic without metadata wait here, then go (or fail) together."""
        error: KafkaError | None = None
        try:
            await self.wait_metadata(topic, self.buffer.max_block)
        except KafkaError as exc:
            error = exc
        waiting = self.awaiting_metadata.pop(topic, [])
        if waiting:
            fatal = self.host.fatal_error
            if error is not None:
                self._lost(waiting, error)
            elif fatal is not None:
                self.drop_items(waiting, fatal)
            else:
                self._append_records(topic, waiting)
        self._batch_done()

    def queued_records(self) -> int:
        """Records given to the producer and not yet acknowledged or failed."""
        n = sum(len(w) for w in self.awaiting_metadata.values())
        for ps in self.partitions.values():
            n += sum(b.count for b in ps.pending) + sum(b.count for b in ps.queue)
        return n

    # --- completion --------------------------------------------------------------------------

    def release(self, b: Batch) -> None:
        """``b`` is complete (acknowledged or failed): its bytes go back."""
        self.release_bytes(b.size)
        self._batch_done()

    def release_bytes(self, size: int) -> None:
        self.buffer.release(size)

    def _batch_done(self) -> None:
        self.outstanding -= 1
        if self.outstanding <= 0:
            self.outstanding = 0
            self.idle.set()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every record appended so far is complete; the sender drains
        everything meanwhile, linger.ms or not."""
        self.flushing += 1
        self.host.wake()
        try:
            await asyncio.wait_for(self.idle.wait(), timeout)
        finally:
            self.flushing -= 1

    def close(self, err: BaseException) -> None:
        """Fail every record not complete; the sender stops."""
        self.closed = True
        self.fail_all(err)

    def fail_all(self, err: BaseException) -> None:
        """Fail every record not complete, sent or not (Kafka's abortIncompleteBatches)."""
        for ps in self.partitions.values():
            for b in list(ps.pending) + list(ps.queue):
                b.fail(err)
                self.release(b)
            ps.pending.clear()
            ps.queue.clear()
        self._drop_waiting(err)
        self.host.wake()

    def drop_unsent(self, err: BaseException) -> None:
        """Fail every record not yet sent (Kafka's abortUndrainedBatches)."""
        for ps in self.partitions.values():
            while ps.queue:
                b = ps.queue.popleft()
                b.fail(err)
                self.release(b)
        self._drop_waiting(err)
        self.host.wake()

    def _drop_waiting(self, err: BaseException) -> None:
        """Fail the records waiting for their topic's metadata."""
        for waiting in self.awaiting_metadata.values():
            self.drop_items(waiting, err)
            waiting.clear()
