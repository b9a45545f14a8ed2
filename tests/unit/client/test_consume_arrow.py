"""consume_arrow() and poll() hand out the same records from buffered fetch responses.

The consumer's buffer is filled with crafted Fetch data (no broker; fetching is switched off),
so every case is exact: isolation levels, control and aborted batches, compression, a fetch
starting inside a batch, max_records slicing, mixing the two calls, headers, corrupt batches
(records before, then CorruptRecordError, until a seek past it) and the prefetch bound.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from typing import Any

import crc32c
import pytest
from test_fetch_parsing import batch, log_with_transactions, marker

from _fetch_reference import parse_fetched
from samsa.client import AsyncConsumer, CorruptRecordError, TopicPartition
from samsa.client._fetcher import CompletedFetch, end_offset
from samsa.log.log import with_log_append_time
from samsa.protocol.fetched import AbortedTxn
from samsa.protocol.records import (
    CRC_START,
    HEADER_SIZE,
    Compression,
    ControlType,
    NewRecord,
    RecordBatchView,
    build_batch,
)

TP = TopicPartition("t", 0)
Row = tuple[int, bytes | None, bytes | None, int, int]


def consumer(isolation: str = "read_uncommitted", **extra: Any) -> AsyncConsumer:
    c = AsyncConsumer({"bootstrap.servers": "127.0.0.1:9", "isolation.level": isolation, **extra})
    c._started = True
    c.fetcher.fetchable = lambda: []  # type: ignore[method-assign]  # only the buffered data
    c.assign([TP])
    return c


def fill(c: AsyncConsumer, *responses: tuple[bytes, int, list[AbortedTxn]]) -> None:
    """Buffer fetch responses (data, fetch offset, aborted); the position is the first's."""
    c.seek(TP, responses[0][1])
    q = c.fetcher.buffer.fetches.setdefault(TP, deque())
    for data, start, aborted in responses:
        q.append(CompletedFetch(data, start, end_offset(data, start), aborted))


def mixed_log() -> tuple[bytes, list[AbortedTxn]]:
    data, aborted = log_with_transactions()
    data += batch(11, [b"z1", b"z2", b"z3"], compression=Compression.GZIP)
    data += batch(14, [b"w1", b"w2"], pid=9, txn=True, compression=Compression.ZSTD)
    data += marker(16, 9, ControlType.ABORT)
    data += batch(17, [b"last"])
    return data, [*aborted, AbortedTxn(9, 14)]


def drain(c: AsyncConsumer, how: str, max_records: int) -> list[Row]:
    """Everything buffered, by poll(), consume_arrow() or the two in turn."""
    rows: list[Row] = []

    async def run() -> None:
        for i in range(1000):
            arrow = how == "arrow" or (how == "mixed" and i % 2)
            if arrow:
                b = await c.consume_arrow(max_records)
                assert b.num_rows <= max_records
                d = b.to_pydict()
                rows.extend(
                    zip(
                        d["offset"],
                        d["key"],
                        d["value"],
                        [round(t.timestamp() * 1000) for t in d["timestamp"]],
                        d["timestampType"],
                        strict=True,
                    )
                )
                n = b.num_rows
            else:
                recs = await c.poll(0, max_records)
                assert len(recs) <= max_records
                rows.extend((r.offset, r.key, r.value, r.timestamp, r.timestamp_type) for r in recs)
                n = len(recs)
            if not n and not c.fetcher.buffer.fetches:
                return
        raise AssertionError("did not drain")

    asyncio.run(run())
    return rows


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
@pytest.mark.parametrize("max_records", [1, 2, 4, 1000])
@pytest.mark.parametrize("start", [0, 3, 12])
def test_consume_arrow_equals_poll(isolation: str, max_records: int, start: int) -> None:
    data, aborted = mixed_log()
    results = {}
    positions = {}
    for how in ("poll", "arrow", "mixed"):
        c = consumer(isolation)
        fill(c, (data, start, aborted if isolation == "read_committed" else []))
        results[how] = drain(c, how, max_records)
        positions[how] = c.subscriptions.position(TP)
    assert results["arrow"] == results["poll"]
    assert results["mixed"] == results["poll"]
    values = [r[2] for r in results["poll"]]
    # a fetch may start inside a batch: nothing below the position is handed out
    assert all(r[0] >= start for r in results["poll"])
    aborted_values = {b"x1", b"x2", b"w1", b"w2"}
    if isolation == "read_committed":
        assert not aborted_values & set(values)
        assert (b"y" in values) == (start < 10)  # pid 7's committed transaction after its abort
    else:
        assert b"w2" in values and (b"x2" in values) == (start < 4)
    assert values[-1] == b"last"
    assert [r[0] for r in results["poll"]] == sorted(r[0] for r in results["poll"])
    # past the last batch, as poll() leaves it, whichever call handed the records out
    assert positions["poll"] == positions["arrow"] == positions["mixed"] == 18


def test_two_buffered_responses_in_a_row() -> None:
    """A response fetched ahead starts where the previous one's whole batches end."""
    first, aborted = log_with_transactions()  # ends with a commit marker at offset 10
    second = batch(11, [b"n1", b"n2"]) + batch(13, [b"n3"])
    for how in ("poll", "arrow"):
        c = consumer("read_committed")
        fill(c, (first, 0, aborted), (second, 11, []))
        rows = drain(c, how, 3)
        assert [r[2] for r in rows] == [b"a", b"b", b"c1", b"c2", b"d", b"y", b"n1", b"n2", b"n3"]
        assert c.subscriptions.position(TP) == 14


def test_headers_column() -> None:
    recs = [
        NewRecord(value=b"v0", key=None, timestamp=5, headers=[("h", b"1"), ("g", None)]),
        NewRecord(value=None, key=b"k1", timestamp=6, headers=[]),
    ]
    data = build_batch(recs, base_offset=0)
    c = consumer()
    fill(c, (data, 0, []))
    got = asyncio.run(c.consume_arrow(10, include_headers=True)).to_pydict()
    assert got["headers"] == [[{"key": "h", "value": b"1"}, {"key": "g", "value": None}], []]
    assert got["key"] == [None, b"k1"] and got["value"] == [b"v0", None]
    c = consumer()
    fill(c, (data, 0, []))
    polled = asyncio.run(c.poll(0, 10))
    assert [list(r.headers) for r in polled] == [[("h", b"1"), ("g", None)], []]
    # asked for without headers after decoding with them: the column is dropped
    c = consumer()
    fill(c, (data, 0, []))
    first = asyncio.run(c.consume_arrow(1, include_headers=True))
    rest = asyncio.run(c.consume_arrow(10))
    assert first.num_columns == 8 and rest.num_columns == 7 and rest.num_rows == 1


def damaged(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


@pytest.mark.parametrize("how", ["poll", "arrow"])
@pytest.mark.parametrize("max_records", [1, 100])
def test_corrupt_batch_records_before_then_error_until_seek(how: str, max_records: int) -> None:
    good = batch(0, [b"a", b"b"]) + batch(2, [b"c"])
    bad = batch(3, [b"bad1", b"bad2"])
    after = batch(5, [b"e"])
    data = good + damaged(bad, len(bad) - 2) + after  # a record byte: the CRC fails
    c = consumer()
    fill(c, (data, 0, []), (batch(6, [b"f"]), 6, []))

    async def take() -> list[bytes | None]:
        if how == "poll":
            return [r.value for r in await c.poll(0, max_records)]
        return (await c.consume_arrow(max_records)).column("value").to_pylist()

    async def run() -> None:
        got: list[bytes | None] = []
        for _ in range(10):
            try:
                got += await take()
            except CorruptRecordError as exc:
                assert (exc.topic, exc.partition, exc.offset) == ("t", 0, 3)
                assert "offset 3" in str(exc) and "seek past offset 4" in str(exc)
                break
        else:
            raise AssertionError("no CorruptRecordError")
        assert got == [b"a", b"b", b"c"]
        assert c.subscriptions.position(TP) == 3
        with pytest.raises(CorruptRecordError):  # again, while the position is at it
            await take()
        c.seek(TP, 5)
        c.fetcher.buffer.fetches[TP] = deque([CompletedFetch(after, 5, 6, [])])
        assert await take() == [b"e"]

    asyncio.run(run())


@pytest.mark.parametrize("how", ["poll", "arrow"])
def test_bad_batch_length_is_corrupt_after_the_good_records(how: str) -> None:
    data = batch(0, [b"a"]) + b"\x7f" * 8 + b"\xff\xff\xff\xf0" + b"\x00" * 60
    c = consumer()
    fill(c, (data, 0, []))

    async def run() -> None:
        if how == "poll":
            assert [r.value for r in await c.poll(0, 10)] == [b"a"]
            with pytest.raises(CorruptRecordError) as info:
                await c.poll(0, 10)
        else:
            assert (await c.consume_arrow(10)).column("value").to_pylist() == [b"a"]
            with pytest.raises(CorruptRecordError) as info:
                await c.consume_arrow(10)
        assert info.value.offset == 1

    asyncio.run(run())


@pytest.mark.parametrize("how", ["poll", "arrow"])
def test_record_longer_than_its_fields_is_corrupt_after_the_good_records(how: str) -> None:
    """A byte after a record's header count, inside its length, under a valid CRC: corrupt,
    raised at its batch's offset once the records before it are out (poll() checks it
    without decoding the headers, as no record has one)."""
    bad = bytearray(batch(2, [b"x"]))
    bad[HEADER_SIZE] += 2  # the record claims one byte more (zigzag varint)...
    bad += b"\x00"  # ...which follows its header count
    struct.pack_into(">i", bad, 8, len(bad) - 12)
    struct.pack_into(">I", bad, 17, crc32c.crc32c(bytes(bad[CRC_START:])))
    data = batch(0, [b"a", b"b"]) + bytes(bad) + batch(3, [b"c"])
    c = consumer()
    fill(c, (data, 0, []))

    async def run() -> None:
        if how == "poll":
            assert [r.value for r in await c.poll(0, 10)] == [b"a", b"b"]
            with pytest.raises(CorruptRecordError) as info:
                await c.poll(0, 10)
        else:
            assert (await c.consume_arrow(10)).column("value").to_pylist() == [b"a", b"b"]
            with pytest.raises(CorruptRecordError) as info:
                await c.consume_arrow(10)
        assert info.value.offset == 2 and "match its fields" in str(info.value)

    asyncio.run(run())


def test_prefetch_is_bounded() -> None:
    c = AsyncConsumer(
        {"bootstrap.servers": "127.0.0.1:9", "fetch.max.bytes": "1000", "check.crcs": "true"}
    )
    tp2 = TopicPartition("t", 1)
    c.assign([TP, tp2])
    c.seek(TP, 0)
    c.seek(tp2, 0)
    assert c.fetcher.fetchable() == [TP, tp2]
    small = batch(0, [b"x"])
    c.fetcher.buffer.fetches[TP] = deque([CompletedFetch(small, 0, 1, [])])
    # one response being handed out: the next is fetched ahead, from where it ends
    assert c.fetcher.fetchable() == [TP, tp2] and c.fetcher.fetch_offset(TP) == 1
    c.fetcher.buffer.fetches[TP].append(CompletedFetch(batch(1, [b"y"]), 1, 2, []))
    assert c.fetcher.fetchable() == [tp2]  # two responses held: no more for it
    c.fetcher.buffer.fetches[tp2] = deque([CompletedFetch(batch(0, [b"z" * 1000]), 0, 1, [])])
    assert c.fetcher.fetchable() == []  # fetch.max.bytes buffered in all: nothing more


@pytest.mark.parametrize("how", ["poll", "arrow"])
def test_position_moves_past_trailing_control_batches(how: str) -> None:
    """Once a response is handed out, the position is past its trailing commit marker (as
    Java's consumer), so the next fetch does not read the marker again."""
    data, aborted = log_with_transactions()  # the last record is at 9, a marker at 10
    c = consumer("read_committed")
    fill(c, (data, 0, aborted))
    rows = drain(c, how, 100)
    assert rows[-1][0] == 9 and c.subscriptions.position(TP) == 11
    assert c.fetcher.fetch_offset(TP) == 11


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_poll_records_equal_the_per_record_parser(isolation: str) -> None:
    """poll() builds its ConsumerRecords from the columnar decoding: every field (producer
    id and leader epoch per batch, headers, timestamp type) as parse_fetched gives them."""
    data, aborted = mixed_log()
    data += build_batch(
        [NewRecord(value=b"h", key=None, timestamp=7, headers=[("a", b"1"), ("b", None)])],
        base_offset=18,
        producer_id=44,
        producer_epoch=0,
        base_sequence=0,
        partition_leader_epoch=3,
    )
    data += build_batch([NewRecord(value=b"end", timestamp=1)], base_offset=19)
    # a LogAppendTime batch between CreateTime ones: the timestamp type is per batch too
    appended = build_batch(
        [NewRecord(value=b"la", timestamp=5), NewRecord(value=b"lb", timestamp=6)],
        base_offset=20,
        partition_leader_epoch=4,
    )
    data += with_log_append_time(RecordBatchView(appended), 99).buf
    data += build_batch([NewRecord(value=b"last", timestamp=2)], base_offset=22)
    level = 1 if isolation == "read_committed" else 0
    for start in (0, 5, 18):
        want, nxt = parse_fetched(TP, data, start, isolation_level=level, aborted=aborted)
        c = consumer(isolation)
        fill(c, (data, start, aborted))
        got = asyncio.run(c.poll(0, 1000))
        assert got == want
        assert c.subscriptions.position(TP) == nxt == 23
        assert len({r.producer_id for r in got}) > 1
    assert {r.producer_id for r in got} == {44, -1} and got[0].leader_epoch == 3
    # plain ints, as the per-record parser gives (not numpy scalars, nor bools)
    fields = [(r.offset, r.timestamp, r.timestamp_type, r.producer_id, r.leader_epoch) for r in got]
    assert {type(v) for row in fields for v in row} == {int}
    assert [(r.timestamp, r.timestamp_type, r.leader_epoch) for r in got[2:]] == [
        (99, 1, 4),
        (99, 1, 4),
        (2, 0, 0),
    ]
    assert got[0].headers == (("a", b"1"), ("b", None))
