"""poll()'s ConsumerRecords read and made in C (protocol/_records.c's ``batch_records``)
against the Python fallback the consumer uses where the extension was not built: the same
records, field by field, and the same verdicts on damaged bytes, on crafted fetch data;
malformed records are a clear error, never a crash or a read outside the batch.
"""

from __future__ import annotations

import asyncio
import gc
import random
import struct
from typing import Any

import crc32c
import pytest
from test_consume_arrow import TP, consumer, fill, mixed_log

from _fetch_reference import parse_fetched
from samsa.client import ConsumerRecord, CorruptRecordError, _fetcher
from samsa.log.log import with_log_append_time
from samsa.protocol.records import (
    CRC_START,
    HEADER_SIZE,
    Compression,
    NewRecord,
    RecordBatchView,
    build_batch,
)

records_in_c = pytest.importorskip("samsa.protocol._records").batch_records


@pytest.fixture(params=["c", "python"])
def maker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once with the C records and once with the Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(_fetcher, "_c_records", None)
    return str(request.param)


def crc(batch: bytes | bytearray) -> bytes:
    b = bytearray(batch)
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[CRC_START:])))
    return bytes(b)


def varied_log() -> tuple[bytes, list[Any]]:
    """Plain, transactional (committed and aborted), control, compressed and LogAppendTime
    batches, then batches of other producers and leader epochs with headers (null values,
    empty and non-ASCII keys), null and empty keys and values, far-apart timestamps."""
    data, aborted = mixed_log()  # offsets 0-17

    def add(base: int, rows: list[NewRecord], **kw: Any) -> bytes:
        return build_batch(rows, base_offset=base, **kw)

    data += add(
        18,
        [
            NewRecord(value=b"h", key=None, timestamp=7, headers=[("a", b"1"), ("b", None)]),
            NewRecord(value=None, key=b"", timestamp=2**41, headers=[("", b""), ("é✓", b"\0")]),
            NewRecord(value=b"", key=b"k" * 300, timestamp=-1),
        ],
        producer_id=44,
        producer_epoch=2,
        base_sequence=0,
        partition_leader_epoch=3,
    )
    appended = add(
        21,
        [NewRecord(value=b"la", timestamp=5, headers=[("x", b"y" * 200)]), NewRecord(value=b"lb")],
        producer_id=45,
        producer_epoch=0,
        base_sequence=0,
        partition_leader_epoch=4,
    )
    data += with_log_append_time(RecordBatchView(appended), 99).buf
    data += add(
        23,
        [NewRecord(value=bytes([i]) * i, key=str(i).encode(), timestamp=i) for i in range(70)],
        compression=Compression.LZ4,
        partition_leader_epoch=5,
    )
    return data, aborted


def drain_records(isolation: str, data: bytes, start: int, aborted: list[Any], max_records: int
                  ) -> tuple[list[ConsumerRecord], int | None]:  # fmt: skip
    c = consumer(isolation)
    fill(c, (data, start, aborted))

    async def run() -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        while c.fetcher.buffer.fetches:
            out += await c.poll(0, max_records)
        return out

    got = asyncio.run(run())
    return got, c.subscriptions.position(TP)


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_c_records_equal_the_python_fallback(
    isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, aborted = varied_log()
    level = 1 if isolation == "read_committed" else 0
    for start in (0, 5, 19, 60):
        for max_records in (1, 7, 1000):
            got = {}
            for how in ("c", "python"):
                with monkeypatch.context() as mp:
                    if how == "python":
                        mp.setattr(_fetcher, "_c_records", None)
                    got[how] = drain_records(isolation, data, start, aborted, max_records)
            c_recs, python_recs = got["c"][0], got["python"][0]
            assert got["c"][1] == got["python"][1] == 93  # the same position after
            assert len(c_recs) == len(python_recs) > 0
            for a, b in zip(c_recs, python_recs, strict=True):
                assert type(a) is ConsumerRecord
                assert a == b
                assert [type(v) for v in a] == [type(v) for v in b]
                assert [type(v) for h in a.headers for v in h] == [
                    type(v) for h in b.headers for v in h
                ]
            want, _ = parse_fetched(TP, data, start, isolation_level=level, aborted=aborted)
            assert c_recs == want
            if start == 0:  # every kind of batch and field was compared
                assert {r.producer_id for r in c_recs} >= {44, 45, -1}
                assert {r.leader_epoch for r in c_recs} >= {3, 4, 5}
                assert {r.timestamp_type for r in c_recs} == {0, 1}
                assert any(r.key is None for r in c_recs)
                assert any(r.value is None for r in c_recs)
                assert any(len(r.headers) == 2 for r in c_recs)


def test_c_records_are_not_tracked_by_the_collector() -> None:
    """They hold no container but tuples of atoms: no cycle can go through them, and the
    young collections that walked every new record cost the consumer ~20% of its time."""
    data, aborted = varied_log()
    got, _ = drain_records("read_uncommitted", data, 0, aborted, 1000)
    assert got and not any(gc.is_tracked(r) or gc.is_tracked(r.headers) for r in got)


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("null key", "null header key"),
        ("key not UTF-8", "header key is not UTF-8"),
        ("header past the end", "header overruns its record"),
        ("byte after the headers", "record length does not match its fields"),
    ],
)
def test_malformed_header_is_corrupt_after_the_records_before(
    maker: str, fault: str, said: str
) -> None:
    """A header the CRC vouches for but Kafka cannot read: CorruptRecordError with the
    topic, partition and offset of its batch, once the records before it are out."""
    bad = bytearray(build_batch([NewRecord(value=b"x", headers=[("ab", b"v")])], base_offset=2))
    at = bad.index(b"ab") - 1  # the header key's length varint: zigzag 2
    if fault == "null key":
        bad[at] = 0x01  # -1
    elif fault == "key not UTF-8":
        bad[at + 1] = 0xFF
    elif fault == "header past the end":
        bad[at + 3] = 0x7E  # the value's length: 63 bytes, past the record
    else:
        bad[at - 1] = 0x00  # no header: the record's header bytes are left over
    data = (
        build_batch([NewRecord(value=b"a")])
        + crc(bad)
        + build_batch([NewRecord(value=b"c")], base_offset=3)
    )
    c = consumer()
    fill(c, (data, 0, []))

    async def run() -> None:
        assert [r.value for r in await c.poll(0, 10)] == [b"a"]
        for _ in range(2):  # again, while the position is at it
            with pytest.raises(CorruptRecordError) as info:
                await c.poll(0, 10)
            assert (info.value.topic, info.value.partition, info.value.offset) == ("t", 0, 2)
            assert said in str(info.value)

    asyncio.run(run())


def zz(n: int) -> bytes:
    """A zigzag varint, as a record's fields are written."""
    v, out = (n << 1) ^ (n >> 63), bytearray()
    v &= (1 << 64) - 1
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    return bytes([*out, v])


def record(*fields: bytes, length: int | None = None) -> bytes:
    body = b"\0" + b"".join(fields)  # attributes, then the fields
    return zz(len(body) if length is None else length) + body


def plain(delta: int, value: bytes = b"v", headers: bytes = zz(0)) -> bytes:
    return record(zz(0), zz(delta), zz(-1), zz(len(value)) + value, headers)


def batch_records(section: bytes, count: int, position: int = 0) -> list[ConsumerRecord]:
    return records_in_c(ConsumerRecord, "t", 0, position, [(section, 10, 1000, False, count, 7, 1)])


def test_batch_records_reads_what_the_batch_says() -> None:
    got = batch_records(plain(0, b"a") + plain(1, b"b", zz(1) + zz(1) + b"h" + zz(-1)), 2)
    assert got == [
        ConsumerRecord("t", 0, 10, 1000, None, b"a", (), 0, 7, 1),
        ConsumerRecord("t", 0, 11, 1000, None, b"b", (("h", None),), 0, 7, 1),
    ]
    # a fetch starting inside a batch: the records before the position are walked past
    assert [r.offset for r in batch_records(plain(0) + plain(1), 2, position=11)] == [11]


@pytest.mark.parametrize(
    ("section", "count", "said"),
    [
        (plain(0), 2, "record count does not fit the batch"),
        (plain(0), 0, "record count does not fit the batch"),
        (plain(0) + zz(40) + b"\0" * 8, 2, "record lengths run past the batch"),
        (plain(0) + b"\xff" * 11, 2, "record varint longer than 10 bytes"),
        (record(zz(0), length=3) + b"\0" * 8, 1, "record length too small"),
        (plain(0) + b"\0", 1, "record lengths do not match their batch"),
        (record(zz(0), b"\xff" * 11, zz(-1), zz(-1), zz(0)), 1, "longer than 10 bytes"),
        (record(zz(0), zz(0), zz(-2), zz(-1), zz(0)), 1, "negative record field length"),
        (record(zz(0), zz(0), zz(9), b"k", zz(-1), zz(0)), 1, "field overruns its record"),
        (record(zz(0), zz(0), zz(-1), zz(-1), zz(-1)), 1, "bad header count"),
        (record(zz(0), zz(0), zz(-1), zz(-1), zz(3), zz(0)), 1, "bad header count"),
        (record(zz(0), zz(0), zz(-1), zz(-1), zz(0), b"x"), 1, "does not match its fields"),
        (plain(0, headers=zz(1) + zz(-1) + zz(-1)), 1, "null header key"),
        (plain(0, headers=zz(1) + zz(1) + b"\xff" + zz(-1)), 1, "header key is not UTF-8"),
        (plain(0, headers=zz(1) + zz(1) + b"h" + zz(-2)), 1, "negative header length"),
        (plain(0, headers=zz(1) + zz(1) + b"h" + zz(5) + b"v"), 1, "header overruns its record"),
        (plain(0, headers=zz(1) + zz(0) + zz(0) + b"x"), 1, "does not match its fields"),
    ],
)
def test_batch_records_refuses_malformed_records(section: bytes, count: int, said: str) -> None:
    """Every length is checked against its record and every record against its batch: a
    RecordError naming the topic, partition and record, never a read outside the section."""
    from samsa.protocol._records import RecordError

    with pytest.raises(RecordError, match=f"^t-0: .*{said}.*at offset 1[01]"):
        batch_records(section, count)


def test_batch_records_refuses_bad_arguments() -> None:
    ok = (plain(0), 10, 1000, False, 1, 7, 1)
    with pytest.raises(TypeError, match="named tuple"):
        records_in_c(dict, "t", 0, 0, [ok])
    with pytest.raises(TypeError, match="a batch"):
        records_in_c(ConsumerRecord, "t", 0, 0, [ok[:-1]])
    with pytest.raises(TypeError, match="ints"):
        records_in_c(ConsumerRecord, "t", 0, 0, [(*ok[:-1], None)])
    with pytest.raises(TypeError):
        records_in_c(ConsumerRecord, "t", 0, 0, [(None, *ok[1:])])  # no buffer
    with pytest.raises(TypeError, match="batches a list"):
        records_in_c(ConsumerRecord, "t", 0, 0, (ok,))


def outcome(
    data: bytes, how: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[ConsumerRecord], int | None, int | None]:
    """What poll() hands out of ``data`` until its end or a corrupt batch: the records, the
    position, and the offset of the CorruptRecordError (None if none)."""
    with monkeypatch.context() as mp:
        if how == "python":
            mp.setattr(_fetcher, "_c_records", None)
        c = consumer()
        fill(c, (data, 0, []))

        async def run() -> tuple[list[ConsumerRecord], int | None, int | None]:
            out: list[ConsumerRecord] = []
            while c.fetcher.buffer.fetches:
                try:
                    out += await c.poll(0, 1000)
                except CorruptRecordError as exc:
                    return out, c.subscriptions.position(TP), exc.offset
            return out, c.subscriptions.position(TP), None

        return asyncio.run(run())


def test_damaged_records_give_the_same_verdict_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte of a record changed under a valid CRC (what a faulty producer may write): the
    C reader and the fallback hand out the same records and fail at the same batch."""
    rng = random.Random(23)

    def rows(n: int) -> list[NewRecord]:
        return [
            NewRecord(value=b"v" * rng.randrange(0, 4), key=rng.choice([None, b"k"]),
                      timestamp=i, headers=[("h", b"x")] * rng.randrange(0, 3))
            for i in range(n)
        ]  # fmt: skip

    batches = [build_batch(rows(3), base_offset=3 * j) for j in range(4)]
    corrupt = 0
    for _ in range(300):
        j = rng.randrange(len(batches))
        bad = bytearray(batches[j])
        at = rng.randrange(HEADER_SIZE, len(bad))
        bad[at] = rng.randrange(256)
        data = b"".join(batches[:j]) + crc(bad) + b"".join(batches[j + 1 :])
        c_out, python_out = outcome(data, "c", monkeypatch), outcome(data, "python", monkeypatch)
        assert c_out == python_out
        corrupt += c_out[2] is not None
    assert corrupt > 40  # many changes are caught; others (a value byte, a delta) are no damage
