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

Sizes. Every item carries its size estimate (:func:`record_size`), computed once by the
caller; ``buffer.memory`` is accounted with it, and the sizes of a batch's records are what
its release gives back, so the accounting always returns to zero.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import crc32c
import numpy as np

from samsa.client._types import RecordMetadata, TopicPartition
from samsa.protocol.records import (
    HEADER_SIZE,
    MAGIC_V2,
    TRANSACTIONAL_FLAG,
    RecordBatchView,
    compress,
    decode_records,
    encode_record,
)

log = logging.getLogger("samsa.client.producer")

SEQ_MOD = 1 << 31
RECORD_OVERHEAD = 24  # bytes of framing per record, an upper bound for small records
# Below these many rows the per-record Python paths are cheaper than numpy/pyarrow's fixed
# cost per call (measured: columnar encode ~150 us a call, 0.3-0.4 us a row at 1000+ rows;
# the per-record encoder ~1.4 us a row; hashing ~60 us a call against ~1.2 us a key).
COLUMNAR_ENCODE_MIN = 128
COLUMNAR_HASH_MIN = 64

Headers = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None
HeaderTuple = tuple[tuple[str, bytes | None], ...]
Sink = Callable[[BaseException | None, RecordMetadata | None], None]
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
_FIRST_MAX_TS = struct.Struct(">qq")
_TS_AT = 27  # firstTimestamp's position in a batch


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

    columnar.encode_batches([b""], [b""])  # pyarrow's first conversion imports pandas too
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
    """The records section of one batch, for the rows ``[first, first + count)``."""

    __slots__ = ("count", "first", "first_ts", "max_ts", "section")

    def __init__(
        self, section: bytes | memoryview, first: int, count: int, first_ts: int, max_ts: int
    ) -> None:
        self.section = section
        self.first = first
        self.count = count
        self.first_ts = first_ts
        self.max_ts = max_ts


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
        from samsa.protocol.columnar import encode_batches  # pyarrow: imported lazily

        out = []
        for eb in encode_batches(
            values,
            keys,
            headers=headers,
            timestamps=timestamps,
            compression=codec,
            max_batch_bytes=max_batch_bytes,
        ):
            first_ts, max_ts = _FIRST_MAX_TS.unpack_from(eb.data, _TS_AT)
            section = memoryview(eb.data)[HEADER_SIZE:]
            out.append(Encoded(section, eb.first, eb.count, first_ts, max_ts))
        return out
    out = []
    stamps: list[int] = timestamps.tolist()
    for a, b in _split(sizes, max_batch_bytes - HEADER_SIZE):
        base_ts = stamps[a]
        body = b"".join(
            encode_record(
                i - a,
                stamps[i] - base_ts,
                keys[i],
                values[i],
                (headers[i] or ()) if headers is not None else (),
            )
            for i in range(a, b)
        )
        out.append(Encoded(compress(codec, body), a, b - a, base_ts, max(stamps[a:b])))
    return out


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
        "headers",
        "in_flight",
        "keys",
        "max_ts",
        "payload",
        "producer_id",
        "retry_at",
        "section",
        "sinks",
        "size",
        "sizes",
        "timestamps",
        "tp",
        "values",
    )

    def __init__(self, tp: TopicPartition, created: float) -> None:
        self.tp = tp
        self.created = created
        self.count = 0
        self.size = 0
        self.full = False  # sealed, or no record may be added any more
        self.done = False
        self.sinks: list[tuple[int, Sink]] = []  # (row, sink), rows ascending
        # open: the columns
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] = []
        # int64 ms (one Arrow conversion fewer than a list); sealed: only with sinks
        self.timestamps: np.ndarray | None = _NO_TIMESTAMPS
        self.headers: list[HeaderTuple | None] | None = None
        self.sizes: list[int] = []
        # sealed
        self.section: bytes | memoryview | None = None
        self.codec = 0
        self.first_ts = -1
        self.max_ts = -1
        # sender
        self.base_sequence = -1
        self.producer_id = -1
        self.epoch = -1
        self.payload: bytes | None = None
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
            self.sinks.extend((base + i, s) for i, s in enumerate(sinks) if s is not None)
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
        k = bisect.bisect_left(self.sinks, cut, key=operator.itemgetter(0))
        self.sinks = [(i - cut, s) for i, s in self.sinks[k:]]
        self.count = rest
        self.size = sum(self.sizes)
        self.created = now  # the rest waits linger.ms from now, as a new batch would
        return out

    def _give(self, b: Batch, e: Encoded, codec: int) -> None:
        """Make ``b`` the sealed batch of rows ``e`` of this one."""
        end = e.first + e.count
        b.section = e.section
        b.codec = codec
        b.count = e.count
        b.first_ts, b.max_ts = e.first_ts, e.max_ts
        b.size = sum(self.sizes[e.first : end])
        b.full = True
        lo = bisect.bisect_left(self.sinks, e.first, key=operator.itemgetter(0))
        hi = bisect.bisect_left(self.sinks, end, key=operator.itemgetter(0))
        b.sinks = [(i - e.first, s) for i, s in self.sinks[lo:hi]]
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
    ) -> bytes:
        """The full v2 batch for this identity; the records section is encoded once."""
        self.seal(codec)
        assert self.section is not None
        attributes = self.codec | (TRANSACTIONAL_FLAG if transactional else 0)
        tail = _AFTER_CRC.pack(
            attributes,
            self.count - 1,
            self.first_ts,
            self.max_ts,
            producer_id,
            epoch,
            base_sequence,
            self.count,
        )
        crc = crc32c.crc32c(self.section, crc32c.crc32c(tail))
        head = _BEFORE_CRC.pack(0, len(tail) + len(self.section) + 9, 0, MAGIC_V2, crc)
        return b"".join((head, tail, self.section))

    def drop_first(self, k: int) -> None:
        """The first ``k`` records were written already (a resumed identity): resolve them
        as duplicates and keep the rest (re-encoded when sealed)."""
        if self.section is not None:
            self._unseal()
        assert self.timestamps is not None
        for i, sink in self.sinks:
            if i < k:
                _deliver(
                    sink,
                    None,
                    RecordMetadata(*self.tp, -1, int(self.timestamps[i]), duplicate=True),
                )
        self.sinks = [(i - k, s) for i, s in self.sinks if i >= k]
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
        self.section = None
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
        if not self.sinks:
            return
        topic, partition = self.tp
        assert self.timestamps is not None
        ts = self.timestamps.tolist()
        for i, sink in self.sinks:
            md = RecordMetadata(
                topic,
                partition,
                base_offset + i if base_offset >= 0 else -1,
                append_time if append_time >= 0 else ts[i],
                duplicate=duplicate,
            )
            _deliver(sink, None, md)

    def fail(self, err: BaseException) -> None:
        if self.done:
            return
        self.done = True
        for _i, sink in self.sinks:
            _deliver(sink, err, None)


def _deliver(sink: Sink, err: BaseException | None, md: RecordMetadata | None) -> None:
    """Call a sink; a sink that raises (a user's callback) must not stop the others."""
    try:
        sink(err, md)
    except Exception:  # the user's problem, reported, never the producer's
        log.exception("delivery callback failed")


def fail_items(items: Sequence[Item], err: BaseException) -> None:
    for item in items:
        extras = item[4]
        if extras is not None and extras[3] is not None:
            _deliver(extras[3], err, None)
