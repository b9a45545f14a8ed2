"""poll()'s ConsumerRecords made in C (protocol/_records.c's ``records``) against the Python
fallback the consumer uses where the extension was not built: the same records, field by
field, on crafted fetch data; malformed columns or headers are errors, never a crash.
"""

from __future__ import annotations

import asyncio
import gc
import struct
from typing import Any

import crc32c
import numpy as np
import pytest
from test_consume_arrow import TP, consumer, fill, mixed_log

from _fetch_reference import parse_fetched
from samsa.client import ConsumerRecord, CorruptRecordError, _fetcher
from samsa.log.log import with_log_append_time
from samsa.protocol.columnar import batch_headers, decode_columns
from samsa.protocol.records import (
    CRC_START,
    Compression,
    NewRecord,
    RecordBatchView,
    build_batch,
)

records_in_c = pytest.importorskip("samsa.protocol._records").records


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


def _columns() -> tuple[bytes, list[Any]]:
    data = build_batch(
        [NewRecord(value=b"v%d" % i, key=b"k", headers=[("h", b"1")]) for i in range(3)],
        producer_id=9,
        producer_epoch=0,
        base_sequence=0,
    )
    cols, _ = decode_columns(data, "t", 0, 0)
    assert cols is not None
    heads = batch_headers(data)
    at = heads.owner(cols.offsets)
    return data, [
        cols.offsets, cols.timestamps, cols.log_append, *cols.keys, *cols.values,
        cols.header_at, cols.header_count, cols.ends, heads.producer_id[at],
        heads.leader_epoch[at],
    ]  # fmt: skip


def test_records_in_c_checks_every_position() -> None:
    """Columns that do not fit the bytes they point into are a clear error: a RecordError
    (a ValueError, so the consumer treats it as a corrupt batch) or, for columns that do
    not line up, a TypeError; nothing is read outside the buffer."""
    from samsa.protocol._records import RecordError

    data, cols = _columns()
    good = records_in_c(ConsumerRecord, "t", 0, data, *cols)
    assert [r.value for r in good] == [b"v0", b"v1", b"v2"]
    assert all(r.headers == (("h", b"1"),) and r.producer_id == 9 for r in good)
    names = ["offset", "timestamp", "log_append", "key_start", "key_end", "key_null",
             "value_start", "value_end", "value_null", "header_at", "header_count", "end",
             "producer_id", "leader_epoch"]  # fmt: skip
    faults = {
        "key_end": 10**12,  # past the buffer
        "value_start": -5,
        "value_end": 0,  # before its start
        "end": len(data) + 1,
        "header_at": 0,  # the headers would start before the record: too many to fit...
        "header_count": 2**40,
    }
    for name, v in faults.items():
        bad = [c.copy() for c in cols]
        bad[names.index(name)][1] = v
        with pytest.raises(RecordError, match=r"t-0: .*\(row 1\)"):
            records_in_c(ConsumerRecord, "t", 0, data, *bad)
    with pytest.raises(RecordError, match="record length does not match its fields"):
        bad = [c.copy() for c in cols]
        bad[names.index("header_count")][2] = 0
        records_in_c(ConsumerRecord, "t", 0, data, *bad)
    with pytest.raises(TypeError, match="columns of different lengths"):
        records_in_c(ConsumerRecord, "t", 0, data, *cols[:-1], cols[-1][:2])
    with pytest.raises(TypeError, match="columns of different lengths"):
        records_in_c(ConsumerRecord, "t", 0, data, *cols[:-1], cols[-1].astype(np.int32))
    with pytest.raises(TypeError, match="named tuple"):
        records_in_c(dict, "t", 0, data, *cols)
    with pytest.raises(TypeError):
        records_in_c(ConsumerRecord, "t", 0, data, *cols[:-1])
    with pytest.raises(ValueError, match="contiguous"):
        records_in_c(ConsumerRecord, "t", 0, data, cols[0][::-1], *cols[1:])
    # cut buffer: every record ends past it
    with pytest.raises(RecordError, match="outside the fetched data"):
        records_in_c(ConsumerRecord, "t", 0, data[:40], *cols)
