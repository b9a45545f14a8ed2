"""The fetcher: Fetch rounds, the buffer of completed fetches and handing records out.

One Fetch per leader broker makes a *round*, waiting up to ``fetch.max.wait.ms`` on the
broker side; rounds are sequential (one ``fetching`` task), as a KIP-227 fetch session
allows one request in flight per broker. A fetched partition is buffered as received (a
:class:`CompletedFetch`, its batch headers read column-wise on arrival:
:func:`samsa.protocol.columnar.batch_headers`) and decoded when first handed out: for
``poll()`` into ConsumerRecords in one call to protocol/_records.c (``batch_records``; where
it was not built, from the numpy columns of :func:`samsa.protocol.columnar.decode_columns`),
for ``consume_arrow()`` column-wise into an Arrow batch. The batches kept are those
:class:`samsa.protocol.fetched.KeptBatches` selects: whole batches (a partial batch at the
end of a response is normal), CRC-32C checked when ``check.crcs``, records below the
position dropped (a fetch may start inside a batch), control batches and, with
``read_committed``, aborted transactions skipped.

A poll that hands out records sends the next round before returning (fetch ahead, from
where the buffered data ends), so the broker works while the application handles the
records; a partition holds at most two responses (the one being handed out and the next)
and no round is sent while ``fetch.max.bytes`` are buffered in all. A corrupt batch is
raised by poll once the position reaches it, after the records before it (Java's Fetcher),
until a seek moves past it.

Before fetching, positions are checked against the leaders (KIP-320, Java's
``OffsetsForLeaderEpochUtils``): a partition whose metadata names a leader or epoch its
position was not checked against, and whose position carries the epoch it was read in, awaits
validation (client/_subscription.py). Its buffered data is dropped (it came from the old
leader, and the position may have to move back) and it is not fetched until the leader
answers OffsetForLeaderEpoch: where the position's epoch ends in the leader's log. A
position beyond that end lies in a truncated part of the log: it moves back to the end with
a reset policy, else poll raises :class:`LogTruncationError`. Stale-leader answers
(FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER) refresh the metadata and
are asked again.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import gc
import itertools
import logging
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from samsa.client._cluster import Cluster
from samsa.client._config import Config
from samsa.client._errors import CorruptRecordError, KafkaError, LogTruncationError
from samsa.client._fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchPlan,
    FetchSessionHandler,
    fetch_request,
)
from samsa.client._subscription import OffsetAndEpoch, SubscriptionState, Truncation
from samsa.client._types import ConsumerRecord, TopicPartition
from samsa.protocol.errors import ErrorCode
from samsa.protocol.fetched import AbortedTxn, KeptBatches, corrupt
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import (
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    TIMESTAMP_TYPE_FLAG,
    InvalidBatchError,
    RecordBatchView,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from samsa.protocol.columnar import BatchHeaders, FetchedColumns

log = logging.getLogger("samsa.client.consumer")
_T = TypeVar("_T")

try:  # poll()'s ConsumerRecords made in C; an install that could not build it makes them here
    from samsa.protocol._records import RecordError as _RecordError
    from samsa.protocol._records import batch_records as _c_records
except ImportError:  # pragma: no cover - the build makes it wherever a C compiler is
    _c_records = None
    _RecordError = ValueError

_offset_of = attrgetter("offset")

_REFRESH_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_ID,
    }
)


_BASE_AND_DELTA = struct.Struct(">q15xi")  # baseOffset ... lastOffsetDelta (at byte 23)


def split_at_corrupt(
    tp: TopicPartition,
    data: bytes | memoryview,
    position: int,
    decodes: Callable[[memoryview], object],
    cause: Exception,
) -> tuple[memoryview, CorruptRecordError]:
    """The whole batches before the first one that ``decodes`` fails on, and the error for it.

    ``decodes`` raised ``cause`` on all of ``data``; the bad batch is the first whose prefix
    of ``data`` fails (found by bisection, so the decoder's state, e.g. aborted transactions,
    is the same as in the full decode). A header that cannot be walked is the bad batch when
    every whole batch before it decodes."""
    mv = memoryview(data).cast("B")
    ends = [0]  # byte ends of the first k whole batches
    after = [position]  # the offset after them
    while len(mv) - ends[-1] >= HEADER_SIZE:
        view = RecordBatchView(mv, ends[-1])
        if view.batch_length < MIN_BATCH_LENGTH or ends[-1] + view.size > len(mv):
            break
        ends.append(ends[-1] + view.size)
        after.append(max(after[-1], view.next_offset))

    def ok(k: int) -> bool:
        try:
            decodes(mv[: ends[k]])
        except (InvalidBatchError, KafkaError, ValueError):
            return False
        return True

    lo, hi = 0, len(ends) - 1  # the first lo batches decode; find the largest such lo
    if ok(hi):
        lo = hi
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
    at = ends[lo]
    # a header too damaged to walk has no offsets to trust: the error is where it starts
    walked = lo < len(ends) - 1
    base, delta = _BASE_AND_DELTA.unpack_from(mv, at) if walked else (after[lo], 0)
    err = CorruptRecordError(
        f"{tp.topic}-{tp.partition}: record batch at offset {base} is corrupt ({cause}); "
        f"seek past offset {base + delta} to skip it",
        tp.topic,
        tp.partition,
        max(after[lo], base),
    )
    return mv[:at], err


@dataclass(slots=True)
class CompletedFetch:
    """One partition's records from one Fetch response, decoded when first handed out: into
    ConsumerRecords by poll(), into Arrow by consume_arrow() (a switch between the two decodes
    again from ``start``, which keeps the aborted-transaction state right)."""

    data: bytes | memoryview
    start: int  # the fetch offset
    end: int  # the offset after its last whole batch: where a fetch ahead starts
    aborted: list[AbortedTxn]
    records: list[ConsumerRecord] | None = None  # the rest to hand out, once decoded
    arrow: pa.RecordBatch | None = None
    next_offset: int = -1  # the position after all of it (skipped batches included)
    taken: int = 0  # rows of ``records`` already handed out
    heads: BatchHeaders | None = None  # its batch headers, read once (``headers()``)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.data)

    def headers(self) -> BatchHeaders:
        if self.heads is None:
            self.heads = _batch_headers(self.data)
        return self.heads

    def epoch_at(self, offset: int) -> int:
        """The leader epoch of the batch holding ``offset`` (what a position after it
        carries)."""
        heads = self.headers()
        i = int(heads.owner(offset))
        return int(heads.leader_epoch[i]) if i >= 0 else -1


def _batch_headers(data: bytes | memoryview | None) -> BatchHeaders:
    from samsa.protocol.columnar import batch_headers  # pyarrow: imported when first used

    return batch_headers(data)


def end_offset(data: bytes | memoryview | None, start: int) -> int:
    """The offset after the last whole batch in fetched data (``start`` if none)."""
    return _batch_headers(data).end_offset(start)


def _shared_ints(values: Any) -> Iterable[int]:
    """A numpy column as Python ints, a run of equal values sharing one int object: a
    batch's producer id, epoch and timestamp type, and often timestamps (a producer stamps
    many records in one millisecond). Fewer ints to make, and to free once read."""
    import numpy as np

    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    if 4 * len(change) > len(values):  # mostly distinct: runs would cost more than they save
        out: list[int] = values.tolist()
        return out
    starts = np.concatenate(([0], change))
    runs = np.diff(starts, append=len(values)).tolist()
    return itertools.chain.from_iterable(map(itertools.repeat, values[starts].tolist(), runs))


class FetchBuffer:
    """Fetched data per partition, in offset order (the response being handed out and at
    most one fetched ahead of it), and the corrupt batch met per partition: raised by poll
    while the position is at it (after the records before it), until a seek moves past it."""

    def __init__(self) -> None:
        self.fetches: dict[TopicPartition, deque[CompletedFetch]] = {}
        self.corrupt: dict[TopicPartition, CorruptRecordError] = {}

    def size(self) -> int:
        return sum(e.size for q in self.fetches.values() for e in q)

    def retain(self, tps: Iterable[TopicPartition], *, fetched: bool = True) -> None:
        """Forget what is not of ``tps`` (and every fetch unless ``fetched``)."""
        keep = set(tps)
        self.fetches = {tp: q for tp, q in self.fetches.items() if fetched and tp in keep}
        self.corrupt = {tp: e for tp, e in self.corrupt.items() if tp in keep}

    def drop(self, tp: TopicPartition) -> None:
        """A seek: what was fetched from the old position is not handed out."""
        self.fetches.pop(tp, None)
        self.corrupt.pop(tp, None)


class Fetcher:
    def __init__(
        self,
        cluster: Cluster,
        config: Config,
        subscriptions: SubscriptionState,
        isolation_level: int,
        init_positions: Callable[[list[TopicPartition], float | None], Awaitable[None]],
        *,
        can_reset: bool = True,
    ) -> None:
        c = self.config = config
        self.cluster = cluster
        self.subscriptions = subscriptions
        self.isolation_level = isolation_level
        # positions unknown (None) are looked up by the consumer: committed, else reset
        self._init_positions = init_positions
        self.can_reset = can_reset  # auto.offset.reset is not "none"
        self.check_crcs = c.bool("check.crcs")
        self.request_timeout = c.seconds("request.timeout.ms")
        self.retry_backoff = c.seconds("retry.backoff.ms")
        self.api_timeout = c.seconds("default.api.timeout.ms")
        self.fetch_max_bytes = c.int("fetch.max.bytes")
        self.buffer = FetchBuffer()
        # The Fetch round in flight: sent when a poll hands out the last buffered records of
        # a partition, so the broker works while the application handles them.
        self.fetching: asyncio.Task[None] | None = None
        # KIP-227 fetch sessions, one per broker (client/_fetch_session.py).
        self.sessions: dict[int, FetchSessionHandler] = {}
        self.closed = False

    async def wait(self, deadline: float) -> None:
        """Wait for the Fetch round in flight (sending one if none) until ``deadline``; a
        round this poll sends is waited for whole (its broker-side wait fits the poll's)."""
        loop = asyncio.get_running_loop()
        remaining = max(0.0, deadline - loop.time())
        task = self.fetching
        if task is None:
            max_wait = min(remaining, self.config.seconds("fetch.max.wait.ms"))
            task = self.fetching = loop.create_task(self._fetch_once(max_wait, remaining))
            await asyncio.wait({task})
        else:
            await asyncio.wait({task}, timeout=remaining)
        if task.done():
            if self.fetching is task:
                self.fetching = None
            task.result()  # its error, if any, is this poll's

    def prefetch(self) -> None:
        """Send the next Fetch round now, if a partition wants one, so its answer is on the
        way while the application handles what this poll returns."""
        done = self.fetching
        if done is not None and done.done() and not done.cancelled() and not done.exception():
            self.fetching = None  # (a failed one stays, for the next wait to raise)
        if self.fetching is None and not self.closed and self.fetchable():
            self.fetching = asyncio.get_running_loop().create_task(
                self._fetch_once(self.config.seconds("fetch.max.wait.ms"), self.api_timeout)
            )

    def fetchable(self) -> list[TopicPartition]:
        """Partitions to fetch. Prefetching is bounded: a partition is fetched while it holds
        at most one response (the one being handed out; the next fetch starts after it), and
        none while the buffered responses reach ``fetch.max.bytes`` in all."""
        if self.buffer.size() >= self.fetch_max_bytes:
            return []
        out = []
        for tp in self.subscriptions.partitions():
            q = self.buffer.fetches.get(tp)
            if tp in self.buffer.corrupt or (q and (len(q) > 1 or q[-1].end <= q[-1].start)):
                continue
            out.append(tp)
        return out

    def fetch_offset(self, tp: TopicPartition) -> int | None:
        q = self.buffer.fetches.get(tp)
        return q[-1].end if q else self.subscriptions.positions.get(tp)

    def _take(
        self,
        limit: int,
        hand_out: Callable[[TopicPartition, CompletedFetch, int], tuple[Any, int, int]],
    ) -> list[tuple[TopicPartition, Any]]:
        """Rows for up to ``limit`` records, partition after partition: ``hand_out`` gives
        (rows, count, offset after the last) from the head response of a partition."""
        out: list[tuple[TopicPartition, Any]] = []
        subs = self.subscriptions
        for tp in list(self.buffer.fetches):
            q = self.buffer.fetches[tp]
            if not subs.fetching(tp):
                continue  # awaiting validation: nothing buffered (it was dropped)
            while q and limit > 0:
                e = q[0]
                rows, n, after = hand_out(tp, e, limit)
                if n:
                    out.append((tp, rows))
                    # the position carries the epoch of the last record handed out (KIP-320)
                    subs.advance(tp, after, e.epoch_at(after - 1))
                    limit -= n
                if self._remaining(e) == 0:
                    q.popleft()
                    # past the skipped batches (control, aborted) after its last record
                    pos = subs.position(tp)
                    if pos is not None and e.next_offset > pos:
                        subs.advance(tp, e.next_offset)
            if not q:
                del self.buffer.fetches[tp]
            if limit <= 0:
                break
        return out

    @staticmethod
    def _remaining(e: CompletedFetch) -> int:
        if e.records is not None:
            return len(e.records) - e.taken
        return e.arrow.num_rows if e.arrow is not None else -1

    def take_records(self, limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        def hand_out(tp: TopicPartition, e: CompletedFetch, n: int) -> tuple[Any, int, int]:
            recs = self._records_of(tp, e)
            rows = recs[e.taken : e.taken + n]
            e.taken += len(rows)
            return rows, len(rows), rows[-1].offset + 1 if rows else 0

        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp, rows in self._take(limit, hand_out):
            out.setdefault(tp, []).extend(rows)
        return out

    def take_arrow(self, limit: int, include_headers: bool) -> list[pa.RecordBatch]:
        def hand_out(tp: TopicPartition, e: CompletedFetch, n: int) -> tuple[Any, int, int]:
            batch = self._arrow_of(tp, e, include_headers)
            rows = batch.slice(0, n)
            e.arrow = batch.slice(rows.num_rows)
            if not rows.num_rows:
                return rows, 0, 0
            return rows, rows.num_rows, rows.column(4)[-1].as_py() + 1

        return [rows for _, rows in self._take(limit, hand_out)]

    def _records_of(self, tp: TopicPartition, e: CompletedFetch) -> list[ConsumerRecord]:
        """The response's records not yet handed out, as ConsumerRecords (built once).

        Read and made in C (protocol/_records.c's ``batch_records``: no bytecode per
        record); where that was not built, decoded column-wise, then one object per record
        made from the columns in Python (``_build``), still about twice as fast as decoding
        record by record in Python."""
        if e.records is not None:
            return e.records
        if e.arrow is not None:  # consume_arrow() handed out the first rows
            from samsa.protocol.columnar import to_numpy

            batch = self._arrow_of(tp, e, True)
            cols = batch.columns
            offsets = to_numpy(cols[4])
            stamps = to_numpy(cols[5]) // 1000
            types = to_numpy(cols[6])
            keys, values, hcol = cols[0], cols[1], cols[7]
            if hcol.offsets[-1].as_py() == hcol.offsets[0].as_py():  # no headers at all
                hcol = None
            records = self._build(tp, e, offsets, stamps, types, keys, values, hcol)
        elif _c_records is not None:
            records = self._records_in_c(tp, e)
        else:
            fetched, hcol = self._columns_of(tp, e)
            if fetched is None:
                records = []
            else:
                offsets, stamps, types = fetched.offsets, fetched.timestamps, fetched.log_append
                keys, values = fetched.binary(fetched.keys), fetched.binary(fetched.values)
                records = self._build(tp, e, offsets, stamps, types, keys, values, hcol)
        e.records, e.taken, e.arrow = records, 0, None
        return records

    def _records_in_c(self, tp: TopicPartition, e: CompletedFetch) -> list[ConsumerRecord]:
        """The response's records at or after the position, read and made in C, batch after
        batch, from the batches KeptBatches keeps (decompressed); ``e.next_offset`` set."""
        assert _c_records is not None
        make = _c_records
        name = f"{tp.topic}-{tp.partition}"

        def made(
            data: bytes | memoryview, topic: str, partition: int, position: int, **kw: Any
        ) -> tuple[list[ConsumerRecord], int]:
            batches = KeptBatches(data, position, name=name, **kw)
            kept = []
            for b in batches:
                section = batches.records(b)
                log_append = bool(b.attributes & TIMESTAMP_TYPE_FLAG)
                stamp = b.max_timestamp if log_append else b.base_timestamp
                kept.append((section, b.base_offset, stamp, log_append, b.record_count,
                             b.producer_id, b.partition_leader_epoch))  # fmt: skip
            try:
                records: list[ConsumerRecord] = make(
                    ConsumerRecord, topic, partition, position, kept
                )
            except _RecordError as exc:
                raise corrupt(str(exc)) from None
            return records, batches.next_offset

        records, e.next_offset = self._decode(tp, e, made)
        pos = self.subscriptions.position(tp)
        if records and pos is not None and pos > e.start:  # some handed out already
            records = records[bisect.bisect_left(records, pos, key=_offset_of) :]
        return records

    def _columns_of(
        self, tp: TopicPartition, e: CompletedFetch
    ) -> tuple[FetchedColumns | None, pa.Array | None]:
        """The response's rows at or after the position as numpy columns, and their
        headers (None if no record has any), all checked; ``e.next_offset`` set."""
        from samsa.protocol.columnar import decode_columns

        def checked(*args: Any, **kw: Any) -> tuple[FetchedColumns | None, int, Any]:
            cols, after = decode_columns(*args, **kw)
            headers = None
            if cols is not None:
                if cols.has_headers():
                    headers = cols.headers()
                else:
                    cols.check_ends()
            return cols, after, headers

        cols, e.next_offset, headers = self._decode(tp, e, checked)
        pos = self.subscriptions.position(tp)
        if cols is not None and pos is not None and pos > e.start:  # some handed out already
            rest = cols.after(pos)
            if headers is not None:
                headers = headers.slice(len(cols) - len(rest))
            cols = rest if len(rest) else None
        return cols, headers

    @staticmethod
    def _build(
        tp: TopicPartition,
        e: CompletedFetch,
        offsets: Any,
        stamps: Any,
        types: Any,
        keys: pa.Array,
        values: pa.Array,
        headers: pa.Array | None,
    ) -> list[ConsumerRecord]:
        """ConsumerRecords from columns: offsets, timestamps (ms) and timestamp types as
        numpy, keys, values and headers (None: no record has any) as Arrow."""
        import numpy as np

        n = len(offsets)
        if not n:
            return []
        # producer id, leader epoch and timestamp type are per batch: found by offset
        heads = e.headers()
        at = heads.owner(offsets)
        if headers is None:
            hs: Iterable[Any] = itertools.repeat((), n)
        else:
            hs = [tuple((h["key"], h["value"]) for h in row) for row in headers.to_pylist()]
        fields = zip(
            itertools.repeat(tp.topic, n),
            itertools.repeat(tp.partition, n),
            offsets.tolist(),
            _shared_ints(stamps),
            keys.to_pylist(),
            values.to_pylist(),
            hs,
            _shared_ints(types.astype(np.int64)),  # (a bool column: ints, as parsed)
            _shared_ints(heads.producer_id[at]),
            _shared_ints(heads.leader_epoch[at]),
            strict=True,
        )
        # tuple.__new__ skips the named tuple's own __new__ (its argument parsing)
        # Without the collector: a young collection every 700 new records walks them (a
        # named tuple is never untracked, as a plain tuple of atoms is), ~20% of the
        # consumer's CPU for 100 B records (benchmarks/client.py, gc callbacks timed). One
        # young collection still walks them, at the first allocation after: a profile charges
        # it to whatever code that is (epoch_at's lookup, ~8% of the loop thread's samples).
        enabled = gc.isenabled()
        gc.disable()
        try:
            return list(map(tuple.__new__, itertools.repeat(ConsumerRecord, n), fields))
        finally:
            if enabled:  # an application that turned it off keeps it off
                gc.enable()

    def _arrow_of(
        self, tp: TopicPartition, e: CompletedFetch, include_headers: bool
    ) -> pa.RecordBatch:
        """The response's records not yet handed out, decoded once (column-wise)."""
        import numpy as np
        import pyarrow as pa

        from samsa.protocol.columnar import ARROW_SCHEMA, decode_fetched, to_numpy

        batch = e.arrow
        if batch is not None:
            has = batch.num_columns > len(ARROW_SCHEMA)
            if has and not include_headers:
                return pa.RecordBatch.from_arrays(batch.columns[:-1], schema=ARROW_SCHEMA)
            if has or not include_headers:
                return batch

        d = self._decode(tp, e, functools.partial(decode_fetched, include_headers=include_headers))
        batch, e.next_offset = d.batch, d.next_offset
        pos = self.subscriptions.position(tp)
        if pos is not None and pos > e.start and batch.num_rows:  # some handed out already
            offsets = to_numpy(batch.column(4))
            batch = batch.slice(int(np.searchsorted(offsets, pos)))
        e.arrow, e.records = batch, None
        return batch

    def _decode(self, tp: TopicPartition, e: CompletedFetch, decoder: Callable[..., _T]) -> _T:
        """``decoder`` (called as :func:`samsa.protocol.columnar.decode_columns`) on the
        fetched data, or on what precedes its first corrupt batch (see ``_split_corrupt``)."""

        def decode(data: bytes | memoryview) -> _T:
            return decoder(
                data,
                tp.topic,
                tp.partition,
                e.start,
                isolation_level=self.isolation_level,
                aborted=e.aborted,
                check_crcs=self.check_crcs,
            )

        try:
            return decode(e.data)
        except (InvalidBatchError, KafkaError, ValueError) as exc:
            self._split_corrupt(tp, e, decode, exc)
            return decode(e.data)

    def _split_corrupt(
        self, tp: TopicPartition, e: CompletedFetch, decode: Callable[[Any], Any], exc: Exception
    ) -> None:
        """Keep what precedes the batch ``decode`` failed on; poll raises at its offset after
        handing that out (Java's Fetcher). Not retriable: the same bytes come back."""
        e.data, err = split_at_corrupt(tp, e.data, e.start, decode, exc)
        log.error("%s", err)
        self.buffer.corrupt[tp] = err
        e.end = err.offset
        q = self.buffer.fetches.get(tp)
        while q and q[-1] is not e:  # fetched after the corrupt batch
            q.pop()

    def raise_corrupt(self) -> None:
        """Raise the CRC failure of a partition whose position reached the corrupt batch."""
        for tp, err in self.buffer.corrupt.items():
            if tp not in self.buffer.fetches:
                # only skipped batches (control, aborted) lie between
                self.subscriptions.advance(tp, err.offset)
                raise err

    async def _fetch_once(self, max_wait: float, time_left: float) -> None:
        wanted = self.fetchable()
        if not wanted:
            await asyncio.sleep(max_wait)
            return
        subs = self.subscriptions
        unknown = [tp for tp in wanted if subs.position(tp) is None]
        if unknown:
            await self._init_positions(unknown, time_left)
        self.check_leaders()
        if subs.awaiting_validation():
            await self.validate(time_left)
        # a rebalance meanwhile: what is no longer assigned is not fetched; what awaits
        # validation (its answer lost or refused) is asked again in the next round
        wanted = [tp for tp in wanted if subs.fetching(tp)]
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in wanted:
            leader = self.cluster.leader(*tp)
            if leader is None:
                await self.cluster.refresh([tp.topic])
                leader = self.cluster.leader(*tp)
            if leader is not None:
                by_node.setdefault(leader, []).append(tp)
        if not by_node:
            await asyncio.sleep(min(max_wait, self.retry_backoff))
            return
        results = await asyncio.gather(
            *(self._fetch_node(node, tps, max_wait) for node, tps in by_node.items()),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _fetch_node(self, node: int, tps: list[TopicPartition], max_wait: float) -> None:
        conn = await self.cluster.connection(node)
        v = conn.version(ApiKey.FETCH, 4, 12)
        c = self.config
        positions: dict[TopicPartition, int | None] = {tp: self.fetch_offset(tp) for tp in tps}
        if any(p is None for p in positions.values()):
            return  # seeked to "unknown" meanwhile; the next pass initialises it
        part_max = c.int("max.partition.fetch.bytes")
        epoch = self.cluster.leader_epoch
        wanted = {
            (tp.topic, tp.partition): (off, part_max, epoch(*tp)) for tp, off in positions.items()
        }
        # KIP-227 from Fetch v7 (as Java's consumer, always): a full request opens a session,
        # later ones name only what changed. Rounds are sequential (one _fetching task, one
        # request per node each), as a session allows one request in flight.
        handler = self.sessions.setdefault(node, FetchSessionHandler()) if v >= 7 else None
        if handler is not None:
            plan = handler.build(wanted)
        else:
            plan = FetchPlan(INVALID_SESSION_ID, FINAL_EPOCH, wanted)
        req = fetch_request(
            v,
            plan,
            max_wait_ms=int(max_wait * 1000),
            min_bytes=c.int("fetch.min.bytes"),
            max_bytes=c.int("fetch.max.bytes"),
            isolation_level=self.isolation_level,
        )
        try:
            fut = conn.send_nowait(ApiKey.FETCH, req, version=v)
            try:
                await conn.drain()
                resp = await conn.wait_response(fut, ApiKey.FETCH, self.request_timeout + max_wait)
            except asyncio.CancelledError:
                # a fetch ahead cancelled (close, unsubscribe): its answer (or the connection's
                # error) has nobody left to read it
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())
                raise
        except BaseException:
            if handler is not None:
                handler.handle_error()  # what the broker made of it is unknown: start over
            raise
        if handler is not None and not handler.handle_response(
            int(resp.error_code), int(resp.session_id)
        ):
            # A session error: nothing was read; the next round fetches the same offsets in
            # a full request (retried at once, as Java's consumer).
            log.debug("fetch session with node %d: error %d; next fetch full", node,
                      int(resp.error_code))  # fmt: skip
            return
        if resp.error_code:
            raise KafkaError(int(resp.error_code), "Fetch")
        for t in resp.responses:
            for p in t.partitions:
                self._on_partition(TopicPartition(t.topic, int(p.partition_index)), p, positions)

    def _on_partition(
        self, tp: TopicPartition, p: Any, positions: dict[TopicPartition, int | None]
    ) -> None:
        """Buffer one partition's answer to a Fetch sent from ``positions``, or act on its
        error."""
        if not self.subscriptions.fetching(tp) or self.fetch_offset(tp) != positions.get(tp):
            return  # seeked, unassigned or awaiting validation while fetching
        code = int(p.error_code)
        if code in _REFRESH_ERRORS:
            self._spawn_refresh(tp.topic)
            return
        if code and tp in self.buffer.fetches:
            return  # a fetch ahead: asked again once the buffered data is out
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            # as Java's consumer: reset by auto.offset.reset (not to the committed offset,
            # which may be the very one out of range), or raised with "none"
            if not self.can_reset:
                raise KafkaError(code, f"Fetch {tp.topic}-{tp.partition} at {positions[tp]}")
            log.info("%s: offset %s out of range; resetting", tp, positions[tp])
            self.subscriptions.request_reset(tp)
            return
        if code == ErrorCode.CORRUPT_MESSAGE:
            # The broker met damaged data reading at this offset. Asking again reads the same
            # bytes: not retried, as Java's consumer (a KafkaException).
            pos = positions[tp]
            assert pos is not None
            self.buffer.corrupt[tp] = err = CorruptRecordError(
                f"{tp.topic}-{tp.partition}: the broker found corrupt data fetching "
                f"offset {pos}; seek past it to go on",
                tp.topic,
                tp.partition,
                pos,
            )
            log.error("%s", err)
            return
        if code:
            raise KafkaError(code, f"Fetch {tp.topic}-{tp.partition}")
        if not p.records:
            return
        start = positions[tp]
        assert start is not None
        heads = _batch_headers(p.records)
        self.buffer.fetches.setdefault(tp, deque()).append(
            CompletedFetch(
                p.records,
                start,
                heads.end_offset(start),
                [
                    AbortedTxn(int(a.producer_id), int(a.first_offset))
                    for a in (p.aborted_transactions or ())
                ],
                heads=heads,
            )
        )

    def check_leaders(self) -> None:
        """Compare each position with its partition's leader and epoch in the metadata
        (Java's ``validatePositionsIfNeeded``, at every poll): one not checked against them
        awaits validation, and what was fetched for it is not handed out."""
        # once per poll over every partition: the metadata read directly, and a position
        # already checked against its leader passed over at the cost of one comparison
        topics, brokers = self.cluster.topics, self.cluster.brokers
        for tp, s in self.subscriptions.assignment.states.items():
            info = topics.get(tp.topic)
            p = info.partitions.get(tp.partition) if info is not None else None
            if p is None or p.leader not in brokers or s.leader == (p.leader, p.leader_epoch):
                continue
            if self.subscriptions.maybe_validate(tp, (p.leader, p.leader_epoch)):
                self.buffer.fetches.pop(tp, None)

    async def validate(self, timeout: float | None = None) -> None:
        """OffsetForLeaderEpoch for the positions awaiting validation, at their leaders
        (stale leaders refreshed and asked again until ``timeout``). A truncation without a
        reset policy raises :class:`LogTruncationError`."""
        subs = self.subscriptions
        asked = subs.awaiting_validation()
        k = ApiKey.OFFSET_FOR_LEADER_EPOCH

        def fields(v: int, topics: dict[str, list[int]]) -> dict[str, Any]:
            def part(t: str, p: int) -> Any:
                return make_request(
                    k, v, "OffsetForLeaderPartition", partition=p,
                    # the epoch the metadata says now: a leader behind or ahead of it
                    # answers UNKNOWN_ / FENCED_LEADER_EPOCH, and the metadata is refreshed
                    current_leader_epoch=self.cluster.leader_epoch(t, p),
                    leader_epoch=asked[TopicPartition(t, p)].leader_epoch,
                )  # fmt: skip

            return {
                "replica_id": -1,  # a consumer
                "topics": tuple(
                    make_request(
                        k,
                        v,
                        "OffsetForLeaderTopic",
                        topic=t,
                        partitions=tuple(part(t, p) for p in ps),
                    )
                    for t, ps in topics.items()
                ),
            }

        def results(resp: Any) -> Iterable[tuple[TopicPartition, int, Any]]:
            for t in resp.topics:
                for p in t.partitions:
                    end = OffsetAndEpoch(int(p.end_offset), int(p.leader_epoch))
                    yield TopicPartition(t.topic, int(p.partition)), int(p.error_code), end

        try:
            # v3 is the first a consumer may use (KIP-320: it carries replica_id)
            found = await self.cluster.leader_call(
                list(asked), k, (3, 4), "OffsetForLeaderEpochRequest", fields, results,
                errors_in_result=True, timeout=timeout,
            )  # fmt: skip
        except KafkaError as exc:
            if exc.code != ErrorCode.UNSUPPORTED_VERSION:
                raise
            # a broker without it (before Kafka 2.3): fetched unvalidated, as Java's consumer
            for tp in asked:
                subs.skip_validation(tp)
            return
        truncated: list[Truncation] = []
        for tp, end in found.items():
            if isinstance(end, KafkaError):
                if end.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                    raise end
                log.warning("%s: validating position %s: %s; retrying", tp, asked[tp], end)
                continue
            before = subs.position(tp)
            t = subs.complete_validation(tp, asked[tp], end, can_reset=self.can_reset)
            if t is not None:
                truncated.append(t)
            elif subs.position(tp) != before:
                log.warning("%s: log truncated below position %s (leader epoch %d ends at "
                            "%d); position now %s", tp, before, asked[tp].leader_epoch,
                            end.offset, subs.position(tp) or "reset")  # fmt: skip
                self.buffer.drop(tp)
        if truncated:
            raise LogTruncationError(truncated)

    async def stop(self) -> None:
        """Cancel the Fetch round in flight (a fetch ahead): its answer is not wanted."""
        if self.fetching is not None:
            self.fetching.cancel()
            with contextlib.suppress(BaseException):
                await self.fetching
            self.fetching = None

    async def close_sessions(self) -> None:
        """Close the fetch sessions (epoch -1), freeing their slots on the brokers at once
        rather than when evicted; best effort, briefly, as Java's consumer on close."""
        sessions, self.sessions = self.sessions, {}
        for node, handler in sessions.items():
            plan = handler.close()
            if plan is None:
                continue
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                conn = await asyncio.wait_for(self.cluster.connection(node), 1.0)
                v = conn.version(ApiKey.FETCH, 7, 12)
                req = fetch_request(
                    v, plan, max_wait_ms=0, min_bytes=0, max_bytes=0,
                    isolation_level=self.isolation_level,
                )  # fmt: skip
                fut = conn.send_nowait(ApiKey.FETCH, req, version=v)
                await conn.drain()
                await conn.wait_response(fut, ApiKey.FETCH, 1.0)

    def _spawn_refresh(self, topic: str) -> None:
        async def refresh() -> None:
            with contextlib.suppress(KafkaError):
                await self.cluster.refresh([topic])

        asyncio.get_running_loop().create_task(refresh())
