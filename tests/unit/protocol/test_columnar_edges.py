"""Edge cases of the columnar codec; the equivalences are in tests/property/test_columnar.py."""

from __future__ import annotations

import struct
import tracemalloc

import crc32c
import numpy as np
import pyarrow as pa
import pytest

from samsa.client import murmur2
from samsa.protocol.columnar import (
    ARROW_SCHEMA,
    ARROW_SCHEMA_HEADERS,
    HEADERS_TYPE,
    batch_headers,
    decode_fetched,
    encode_batches,
    murmur2_array,
    partitions_for_keys,
)
from samsa.protocol.constants import READ_COMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    CRC_START,
    HEADER_SIZE,
    TIMESTAMP_TYPE_FLAG,
    Compression,
    ControlType,
    InvalidBatchError,
    NewRecord,
    RecordBatchView,
    build_batch,
    build_control_batch,
    decode_records,
    encode_record,
    set_base_offset,
)
from samsa.spark import _read as spark_read

NOW = 1_700_000_000_000


def log_of(*batches: bytes) -> bytes:
    """Batches one after the other with offsets assigned, as a Fetch response carries them."""
    out = bytearray()
    offset = 0
    for b in batches:
        view = RecordBatchView(b)
        data = bytearray(b)
        set_base_offset(data, 0, offset)
        offset += view.last_offset_delta + 1
        out += data
    return bytes(out)


def encoded(values: list[bytes | None], **kw: object) -> bytes:
    return log_of(*(e.data for e in encode_batches(values, now_ms=NOW, **kw)))  # type: ignore[arg-type]


def test_schema_is_the_spark_sources() -> None:
    assert ARROW_SCHEMA.equals(spark_read.ARROW_SCHEMA)
    assert ARROW_SCHEMA_HEADERS.equals(spark_read.ARROW_SCHEMA_HEADERS)
    assert HEADERS_TYPE.equals(spark_read.HEADERS_TYPE)


def test_empty_input() -> None:
    assert encode_batches([]) == []
    assert encode_batches(pa.array([], pa.binary()), []) == []
    for data in (b"", None):
        got = decode_fetched(data, "t", 0, 5)
        assert got.batch.num_rows == 0 and got.batch.schema.equals(ARROW_SCHEMA)
        assert got.next_offset == 5
    got = decode_fetched(b"", "t", 0, 0, include_headers=True)
    assert got.batch.schema.equals(ARROW_SCHEMA_HEADERS)
    assert murmur2_array([]).shape == (0,)


def test_one_record() -> None:
    (b,) = encode_batches([b"v"], [b"k"], headers=[[("h", b"x")]], timestamps=[NOW])
    assert (b.first, b.count) == (0, 1)
    assert b.data == build_batch([NewRecord(b"v", b"k", NOW, [("h", b"x")])])
    got = decode_fetched(b.data, "t", 3, 0, include_headers=True).batch.to_pylist()
    assert [(r["key"], r["value"], r["partition"], r["offset"]) for r in got] == [
        (b"k", b"v", 3, 0)
    ]
    assert got[0]["headers"] == [{"key": "h", "value": b"x"}]
    assert got[0]["timestamp"].timestamp() * 1000 == NOW


def test_all_nulls() -> None:
    data = encoded([None] * 5, keys=[None] * 5)
    view = RecordBatchView(data)
    assert [(r.key, r.value) for r in decode_records(view)] == [(None, None)] * 5
    batch = decode_fetched(data, "t", 0, 0).batch
    assert batch.column("key").null_count == 5 and batch.column("value").null_count == 5
    assert list(partitions_for_keys([None, None], 3)) == [-1, -1]


def test_huge_value_gets_a_batch_of_its_own() -> None:
    big = bytes(range(256)) * 12_000  # 3 MB: a 4-byte length varint
    values = [b"a", big, b"b", b"c"]
    batches = encode_batches(values, max_batch_bytes=1024 * 1024, now_ms=NOW)
    assert [(b.first, b.count) for b in batches] == [(0, 1), (1, 1), (2, 2)]
    got = decode_fetched(log_of(*(b.data for b in batches)), "t", 0, 0).batch
    assert got.column("value").to_pylist() == values
    assert got.column("offset").to_pylist() == [0, 1, 2, 3]


def test_batches_respect_max_batch_bytes_and_carry_sequences() -> None:
    values = [b"x" * 100] * 1000
    batches = encode_batches(
        values,
        producer_id=7,
        producer_epoch=3,
        base_sequence=2**31 - 300,
        max_batch_bytes=16384,
        now_ms=NOW,
    )
    assert sum(b.count for b in batches) == 1000 and len(batches) > 5
    for b in batches:
        view = RecordBatchView(b.data)
        assert len(b.data) <= 16384
        assert (view.producer_id, view.producer_epoch) == (7, 3)
        assert view.base_sequence == b.base_sequence == (2**31 - 300 + b.first) % 2**31
    # nearly full: the split is on a tight bound, not a loose one
    assert all(len(b.data) > 16384 - 2 * 120 for b in batches[:-1])
    assert batches[1].first == batches[0].count


def test_input_forms_agree() -> None:
    values = ["é", b"\x00", None, "abc"]
    keys = ["k1", None, b"k3", ""]
    reference = encode_batches(values, keys, timestamps=[NOW, NOW + 1, NOW + 2, NOW + 3])
    padded = pa.array(
        [b"pad", *[v.encode() if isinstance(v, str) else v for v in values]], pa.large_binary()
    )
    variants = [
        encode_batches(
            padded.slice(1),  # an Arrow slice: its offsets do not start at 0
            pa.chunked_array([pa.array(keys[:2], pa.string()), pa.array(keys[2:], pa.string())]),
            timestamps=np.array([NOW, NOW + 1, NOW + 2, NOW + 3], dtype="datetime64[ms]"),
        ),
        encode_batches(
            pa.array([*values[:2], None, "abc"], pa.large_string()),
            pa.array([b"k1", None, b"k3", b""], pa.large_binary()),
            timestamps=pa.array([(NOW + i) * 1000 for i in range(4)], pa.timestamp("us")),
        ),
        encode_batches(
            np.array(values, dtype=object),
            keys,
            timestamps=np.arange(NOW, NOW + 4),
        ),
    ]
    for v in variants:
        assert [b.data for b in v] == [b.data for b in reference]
    no_nulls = pa.array([b"pad", b"a", b"bc"], pa.large_binary()).slice(1)
    assert [b.data for b in encode_batches(no_nulls, no_nulls, now_ms=NOW)] == [
        b.data for b in encode_batches([b"a", b"bc"], [b"a", b"bc"], now_ms=NOW)
    ]
    assert list(murmur2_array(no_nulls)) == [murmur2(b"a"), murmur2(b"bc")]


def test_timestamps_default_to_now_and_fill_nulls() -> None:
    (b,) = encode_batches([b"a", b"b"], timestamps=[None, 5], now_ms=NOW)
    assert [r.timestamp for r in decode_records(RecordBatchView(b.data))] == [NOW, 5]
    (b,) = encode_batches([b"a"], timestamps=42)
    assert decode_records(RecordBatchView(b.data))[0].timestamp == 42


def test_headers_forms() -> None:
    rows = [{"a": b"1", "b": None}, None, [("c", "text")], []]
    arrow = pa.array(
        [[("a", b"1"), ("b", None)], None, [("c", b"text")], []],
        HEADERS_TYPE,
    )
    one = encode_batches([b"v"] * 4, headers=rows, now_ms=NOW)
    two = encode_batches([b"v"] * 4, headers=arrow, now_ms=NOW)
    assert [b.data for b in one] == [b.data for b in two]
    got = [r.headers for r in decode_records(RecordBatchView(one[0].data))]
    assert got == [(("a", b"1"), ("b", None)), (), (("c", b"text"),), ()]
    # every row without headers: the same bytes as no headers at all
    assert encode_batches([b"v"], headers=[[]], now_ms=NOW)[0].data == build_batch(
        [NewRecord(b"v")], now_ms=NOW
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"values": [b"a"], "keys": [b"a", b"b"]}, ValueError, "keys: 2 given for 1"),
        ({"values": [b"a"], "timestamps": [1, 2]}, ValueError, "timestamps: 2 given"),
        ({"values": [b"a"], "timestamps": [-5]}, ValueError, "invalid timestamp -5"),
        ({"values": [b"a"], "headers": [[(None, b"x")]]}, ValueError, "header key is null"),
        ({"values": [b"a"], "headers": [[], []]}, ValueError, "headers: 2 given"),
        ({"values": [1, 2]}, TypeError, "values: cannot be read"),
        ({"values": b"abc"}, TypeError, "expected a column"),
        ({"values": [b"a"], "compression": 7}, ValueError, "unknown compression codec 7"),
        ({"values": [b"a"], "max_batch_bytes": 60}, ValueError, "max_batch_bytes"),
        ({"values": [b"a"], "compression": 2, "compression_level": 1}, ValueError, "applies"),
        ({"values": [b"a"], "compression": 3, "compression_level": 18}, ValueError, r"\[1, 17\]"),
    ],
)
def test_bad_input_is_refused_clearly(kwargs: dict, error: type, text: str) -> None:
    values = kwargs.pop("values")
    with pytest.raises(error, match=text):
        encode_batches(values, **kwargs)


def test_murmur2_matches_java_vectors() -> None:
    # Kafka's UtilsTest vectors, plus every tail length and a long key
    keys = [b"21", b"foobar", b"a-little-bit-long-string", b"abc", b"", b"x" * 1001, b"\xff" * 7]
    assert list(murmur2_array(keys)[:4]) == [-973932308, -790332482, -985981536, 479470107]
    assert list(murmur2_array(keys)) == [murmur2(k) for k in keys]
    assert list(partitions_for_keys([*keys, None], 7)) == [
        (murmur2(k) & 0x7FFFFFFF) % 7 for k in keys
    ] + [-1]
    with pytest.raises(ValueError, match="num_partitions"):
        partitions_for_keys(keys, 0)


def test_partial_trailing_batch_is_left_for_the_next_fetch() -> None:
    data = encoded([b"a", b"b"], max_batch_bytes=HEADER_SIZE + 10)
    assert RecordBatchView(data).record_count == 1
    whole = RecordBatchView(data).size
    for cut in (whole + 1, whole + 30, len(data) - 1):
        got = decode_fetched(data[:cut], "t", 0, 0)
        assert got.batch.column("value").to_pylist() == [b"a"] and got.next_offset == 1


def test_batch_headers_are_the_headers_of_the_whole_batches() -> None:
    """Read column-wise, each whole batch's base offset, next offset, producer id and leader
    epoch are its header's; the walk stops at a partial batch and at a length too short for
    a header (the decoder refuses that one)."""
    batches = [
        build_batch([NewRecord(value=b"a")], base_offset=0),
        build_batch(
            [NewRecord(value=b"b" * 300), NewRecord(value=b"c")],
            base_offset=1,
            producer_id=2**40 + 7,
            producer_epoch=3,
            base_sequence=0,
            partition_leader_epoch=5,
        ),
        build_control_batch(
            ControlType.COMMIT,
            producer_id=2**40 + 7,
            producer_epoch=3,
            coordinator_epoch=0,
            base_offset=3,
        ),
        build_batch([NewRecord(value=b"d")] * 3, base_offset=9, partition_leader_epoch=2**31 - 1),
    ]
    data = b"".join(batches)
    views = [RecordBatchView(b) for b in batches]
    want = [(v.base_offset, v.next_offset, v.producer_id, v.partition_leader_epoch) for v in views]

    def got(buf: bytes) -> list[tuple[int, ...]]:
        h = batch_headers(buf)
        cols = (h.base_offset, h.next_offset, h.producer_id, h.leader_epoch)
        return [tuple(int(c[i]) for c in cols) for i in range(len(h.base_offset))]

    assert got(data) == want
    assert batch_headers(data).end_offset(0) == 12 and batch_headers(b"").end_offset(7) == 7
    assert got(data[:-1]) == want[:3]  # the last batch cut: left for the next fetch
    short = bytearray(data)
    struct.pack_into(">i", short, len(b"".join(batches[:2])) + 8, 20)
    assert got(bytes(short)) == want[:2]


def test_start_offset_inside_a_batch_and_max_records() -> None:
    data = encoded([b"%d" % i for i in range(10)], max_batch_bytes=HEADER_SIZE + 40)
    got = decode_fetched(data, "t", 0, 4)
    assert got.batch.column("offset").to_pylist() == list(range(4, 10)) and got.next_offset == 10
    got = decode_fetched(data, "t", 0, 4, max_records=3)
    assert got.batch.column("value").to_pylist() == [b"4", b"5", b"6"] and got.next_offset == 7
    with pytest.raises(ValueError):
        decode_fetched(data, "t", 0, 0, max_records=0)


def _with_attributes(batch: bytes, flags: int, max_ts: int) -> bytes:
    data = bytearray(batch)
    attrs = struct.unpack_from(">h", data, 21)[0] | flags
    struct.pack_into(">h", data, 21, attrs)
    struct.pack_into(">q", data, 35, max_ts)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[CRC_START:])))
    return bytes(data)


def test_log_append_time_uses_the_batch_timestamp() -> None:
    (b,) = encode_batches([b"a", b"b"], timestamps=[1, 2])
    got = decode_fetched(_with_attributes(b.data, TIMESTAMP_TYPE_FLAG, NOW), "t", 0, 0).batch
    assert got.column("timestampType").to_pylist() == [1, 1]
    assert [t.timestamp() * 1000 for t in got.column("timestamp").to_pylist()] == [NOW, NOW]


def test_read_committed_skips_aborted_and_control_batches() -> None:
    (t1,) = encode_batches([b"aborted"], producer_id=9, producer_epoch=0, base_sequence=0,
                           transactional=True)  # fmt: skip
    (t2,) = encode_batches([b"committed"], producer_id=9, producer_epoch=0, base_sequence=1,
                           transactional=True)  # fmt: skip
    abort = build_control_batch(ControlType.ABORT, producer_id=9, producer_epoch=0,
                                coordinator_epoch=0)  # fmt: skip
    commit = build_control_batch(ControlType.COMMIT, producer_id=9, producer_epoch=0,
                                 coordinator_epoch=0)  # fmt: skip
    data = log_of(t1.data, abort, t2.data, commit)
    committed = decode_fetched(data, "t", 0, 0, isolation_level=READ_COMMITTED, aborted=[(9, 0)])
    assert committed.batch.column("value").to_pylist() == [b"committed"]
    assert committed.next_offset == 4
    everything = decode_fetched(data, "t", 0, 0, aborted=[(9, 0)])
    assert everything.batch.column("value").to_pylist() == [b"aborted", b"committed"]
    only_markers = decode_fetched(data, "t", 0, 3)
    assert only_markers.batch.num_rows == 0 and only_markers.next_offset == 4


def test_corrupt_crc_is_a_clear_error() -> None:
    data = bytearray(encoded([b"hello", b"world"]))
    data[-2] ^= 0x01
    with pytest.raises(InvalidBatchError, match=r"t-2 at offset 0: .*CRC-32C") as err:
        decode_fetched(bytes(data), "t", 2, 0)
    assert err.value.code == ErrorCode.CORRUPT_MESSAGE


def _recrc(data: bytearray) -> bytes:
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[CRC_START:])))
    return bytes(data)


def test_malformed_records_with_a_valid_crc_are_refused() -> None:
    good = bytearray(encoded([b"hello", b"world"], keys=[b"k", b"l"]))
    bad_count = bytearray(good)
    struct.pack_into(">i", bad_count, 57, 2**31 - 1)  # far more records than bytes
    longer = bytearray(good)
    longer[HEADER_SIZE] += 2  # first record claims one more byte
    bad_key = bytearray(good)
    bad_key[HEADER_SIZE + 4] = 0x7E  # key length 63: past the record
    trailing = bytearray(good)  # records end before the batch does (Java refuses it too)
    trailing[HEADER_SIZE + len(encode_record(0, 0, b"k", b"hello")) :] = (
        encode_record(1, 0, b"l", b"worl") + b"\x00"
    )
    many_headers = bytearray(good)  # header count 2^30: more than the bytes could hold
    at = HEADER_SIZE + len(encode_record(0, 0, b"k", b"hello")) - 1
    many_headers[at : at + 1] = b"\x80\x80\x80\x80\x08"
    many_headers[HEADER_SIZE] += 8  # the record is 4 bytes longer (zigzag: 2 per byte)
    struct.pack_into(">i", many_headers, 8, len(many_headers) - 12)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidBatchError, match="bad header count"):
            decode_fetched(_recrc(many_headers), "t", 0, 0, include_headers=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # refused before anything is sized by the count
    for data in (bad_count, longer, bad_key, trailing):
        with pytest.raises(InvalidBatchError) as err:
            decode_fetched(_recrc(data), "t", 0, 0, include_headers=True)
        assert err.value.code == ErrorCode.CORRUPT_MESSAGE
    garbled = bytearray(encoded([b"x"], compression=Compression.LZ4))
    garbled[HEADER_SIZE + 8] ^= 0xFF
    with pytest.raises(InvalidBatchError, match=r"cannot decompress|record"):
        decode_fetched(_recrc(garbled), "t", 0, 0)


def test_uniform_and_varied_record_sizes_decode_alike() -> None:
    """Past 8192 records the offset delta needs 3 bytes; varied sizes defeat the guesses."""
    rng = np.random.default_rng(7)
    uniform = [b"u" * 100] * 9000
    varied = [b"v" * int(n) for n in rng.integers(0, 300, 3000)]
    for values in (uniform, varied):
        ts = [NOW + int(d) for d in rng.integers(0, 20_000, len(values))]
        data = encoded(values, timestamps=ts, max_batch_bytes=8 << 20)
        got = decode_fetched(data, "t", 0, 0).batch
        assert got.column("value").to_pylist() == values
        assert [t.timestamp() * 1000 for t in got.column("timestamp").to_pylist()] == ts


def test_walk_past_the_end_is_a_clear_error() -> None:
    """Varied sizes are walked in Python; a length pointing past the data must not escape
    as an IndexError."""
    values = [b"v" * n for n in range(1, 40)]
    data = bytearray(encoded(values))
    starts, pos = [], HEADER_SIZE
    for r in decode_records(RecordBatchView(bytes(data))):
        starts.append(pos)
        pos += len(encode_record(r.offset, 0, None, r.value))
    data[starts[-3] : starts[-3] + 2] = b"\xfe\x7f"  # 8191 bytes long: past the end
    with pytest.raises(InvalidBatchError, match="past"):
        decode_fetched(_recrc(data), "t", 0, 0)


def test_batch_length_below_a_header_is_refused() -> None:
    """A negative or tiny batch length would walk backwards or stand still: refused."""
    for length in (-12, -1, 0, 48):
        data = bytearray(encoded([b"a"]))
        struct.pack_into(">i", data, 8, length)
        with pytest.raises(InvalidBatchError, match="batch length"):
            decode_fetched(bytes(data), "t", 0, 0, check_crcs=False)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_compression_levels(codec: int) -> None:
    values = [b"%d" % (i % 7) * 50 for i in range(200)]
    default = encode_batches(values, compression=codec, now_ms=NOW)
    for level in (1, 9):
        (b,) = encode_batches(values, compression=codec, compression_level=level, now_ms=NOW)
        view = RecordBatchView(b.data)
        assert view.compression == codec and view.crc_is_valid()
        assert [r.value for r in decode_records(view)] == values
        assert len(b.data) < len(values) * 50 / 5
    fast = encode_batches(values, compression=codec, compression_level=1, now_ms=NOW)
    assert codec == Compression.GZIP or fast[0].data != default[0].data


def test_a_record_length_past_any_int64_is_corrupt_not_an_overflow() -> None:
    # Found by the property test: a flipped byte made a length varint of ten bytes, whose value
    # does not fit the int64 array of record starts.
    from array import array

    from samsa.protocol.columnar import _walk

    buf = memoryview(bytes([0xFF] * 9 + [0x7F]) + bytes(4))
    with pytest.raises(InvalidBatchError, match="run past the batch"):
        _walk(buf, 0, 4, array("q"))
