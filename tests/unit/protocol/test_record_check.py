"""protocol/record_check.py: records read as a stream, in bounded pieces, whatever the split."""

from __future__ import annotations

import random
import struct
import tracemalloc
import zlib

import crc32c
import pytest
import zstandard

from samsa.protocol.errors import ErrorCode
from samsa.protocol.record_check import (
    _BIG_RECORD,
    _LAYOUTS,
    INFLATE_CHUNK,
    SCRATCH_BYTES,
    RecordChecker,
    RecordRules,
    Unfinished,
    check_records,
    inflate,
    new_scratch,
)
from samsa.protocol.records import (
    XERIAL_BLOCK,
    XERIAL_HEADER,
    Compression,
    InvalidBatchError,
    NewRecord,
    RecordBatchView,
    build_batch,
    decode_records,
    encode_record,
    xerial_block,
)


@pytest.fixture(params=["c", "numpy"])
def walker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test reads its records with the C walker (protocol/_records.c), then with numpy."""
    if request.param == "numpy":
        monkeypatch.setattr(RecordChecker, "walk", None)
    elif RecordChecker.walk is None:
        pytest.skip("samsa.protocol._records was not built")
    return str(request.param)


def _raw_batch(body: bytes, count: int, codec: int = Compression.NONE) -> RecordBatchView:
    after = struct.pack(">hiqqqhii", codec, count - 1, 0, 0, -1, -1, -1, count) + body
    head = struct.pack(">qiibI", 0, len(after) + 9, 0, 2, crc32c.crc32c(after))
    return RecordBatchView(head + after)


def _mixed_records(n: int, seed: int) -> list[NewRecord]:
    rng = random.Random(seed)
    return [
        NewRecord(
            key=None if rng.random() < 0.2 else rng.randbytes(rng.randrange(0, 20)),
            value=None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 300)),
            timestamp=1000 + rng.randrange(0, 200),
            headers=[
                (f"h{j}", rng.randbytes(rng.randrange(0, 5))) for j in range(rng.randrange(3))
            ],
        )
        for _ in range(n)
    ]


def _feed_split(view: RecordBatchView, cuts: list[int], rules: RecordRules) -> int:
    body = bytes(view.buf[61:])
    checker = RecordChecker(view, rules)
    last = 0
    for cut in [*sorted(cuts), len(body)]:
        checker.feed(body[last:cut])
        last = cut
    return checker.finish().count


def test_every_split_of_the_records_reads_the_same(walker: str) -> None:
    """A record, a varint or a header cut by a chunk's end is read whole from the next."""
    view = RecordBatchView(build_batch(_mixed_records(40, 1), now_ms=1000))
    size = view.size - 61
    for cut in range(size + 1):
        assert _feed_split(view, [cut], RecordRules()) == 40
    rng = random.Random(2)
    for _ in range(50):
        assert _feed_split(view, rng.sample(range(size), 12), RecordRules()) == 40


def test_every_split_of_a_bad_batch_is_refused(walker: str) -> None:
    # the last record's length says one byte more than its fields: refused wherever cut
    good = encode_record(0, 0, b"k", b"v") + encode_record(1, 0, b"k", b"v")
    bad = good[:-9] + bytes([good[-9] + 2]) + good[-8:] + b"\x00"  # length 9, fields 8
    view = _raw_batch(bad, 2)
    for cut in range(len(bad) + 1):
        with pytest.raises(InvalidBatchError) as exc:
            _feed_split(view, [cut], RecordRules())
        assert exc.value.code == ErrorCode.INVALID_RECORD


def test_a_long_record_is_skipped_through_not_gathered(walker: str) -> None:
    """A record longer than two chunks is read field by field: the checker never holds more
    than a chunk of it, and a keyless one still counts as keyless."""
    records = [
        NewRecord(key=b"a", value=b"x" * 10, timestamp=5),
        NewRecord(key=None, value=b"y" * (5 * INFLATE_CHUNK), headers=[("h", b"z" * 9)]),
        NewRecord(key=b"c", value=b"w", timestamp=5),
    ]
    view = RecordBatchView(build_batch(records, now_ms=5))
    body = bytes(view.buf[61:])
    checker = RecordChecker(view, RecordRules(need_key=True))
    for i in range(0, len(body), 4096):
        checker.feed(body[i : i + 4096])
        assert len(checker._tail) <= _BIG_RECORD
    summary = checker.finish()
    assert summary.count == 3
    assert [i for i, _ in summary.record_errors] == [1]


def test_inflation_stops_at_the_limit_in_bounded_pieces() -> None:
    """A 64 MB gzip bomb against an 8 MB limit: refused once past it, Python never holding
    more than a chunk at a time."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    record = encode_record(0, 0, b"k", bytes(64 << 20))  # one record, its value 64 MB
    body = z.compress(record) + z.flush()
    del record
    view = _raw_batch(body, 1, Compression.GZIP)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidBatchError) as exc:
            check_records(view, RecordRules(), 8 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert peak < 4 * INFLATE_CHUNK + len(body) + (1 << 20), peak


def test_every_chunk_is_bounded_for_every_codec() -> None:
    data = bytes(range(256)) * 8192  # 2 MiB
    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        view = RecordBatchView(build_batch([NewRecord(value=data)], compression=codec))
        body = memoryview(view.buf)[61:]
        chunks = list(inflate(codec, body, 1 << 30))
        assert b"".join(chunks)[-len(data) - 1 : -1] == data, codec  # then the header count
        assert max(len(c) for c in chunks) <= max(INFLATE_CHUNK, 32 * 1024), codec


def test_a_snappy_block_declaring_too_much_is_refused_before_inflating() -> None:
    declared = bytearray()
    n = 1 << 30
    while n >= 0x80:
        declared.append((n & 0x7F) | 0x80)
        n >>= 7
    declared.append(n)
    view = _raw_batch(bytes(declared) + b"\x00" * 50, 1, Compression.SNAPPY)
    with pytest.raises(InvalidBatchError) as exc:
        check_records(view, RecordRules(), 8 << 20)
    assert exc.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_snappy_blocks_held_together_count_against_the_limit() -> None:
    """xerial blocks are handed on a few at a time; the ones held count: against a 100 KB
    limit the fourth 32 KB block is refused before it is inflated."""
    import cramjam

    body = XERIAL_HEADER + b"".join(xerial_block(bytes([i]) * XERIAL_BLOCK) for i in range(8))
    inflated = []
    real = cramjam.snappy.decompress_raw

    def counted(block: bytes) -> object:
        inflated.append(len(block))
        return real(block)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cramjam.snappy, "decompress_raw", counted)
        with pytest.raises(InvalidBatchError) as exc:
            list(inflate(Compression.SNAPPY, body, 100 << 10))
    assert exc.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert len(inflated) == 3


def test_gzip_read_at_once_or_streamed_gives_the_same_verdict() -> None:
    """A small gzip stream is inflated at once (cramjam) when it fits what its trailer says;
    any failure there falls back to zlib's streamed reading, which alone refuses: two members,
    a trailer lying about the size, a flipped byte, a cut stream all get the streamed verdict."""
    from samsa.protocol import record_check

    records = [encode_record(i, 0, b"k%d" % i, b"v" * 50) for i in range(40)]
    one = zlib.compress(b"".join(records), wbits=31)
    two = zlib.compress(b"".join(records[:20]), wbits=31)
    two += zlib.compress(b"".join(records[20:]), wbits=31)
    lying = one[:-4] + (len(b"".join(records)) - 10).to_bytes(4, "little")
    flipped = bytearray(one)
    flipped[len(one) // 2] ^= 0x40
    streams = [one, two, lying, bytes(flipped), one[:-3], one + b"\x1f"]
    assert record_check._gzip_whole(one) is not None  # the fast path is taken

    def verdicts() -> list[object]:
        out: list[object] = []
        for body in streams:
            try:
                out.append(
                    check_records(
                        _raw_batch(body, 40, Compression.GZIP), RecordRules(), 1 << 20
                    ).count
                )
            except InvalidBatchError as exc:
                out.append((exc.code, str(exc)))
        return out

    fast = verdicts()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(record_check, "_gzip_whole", lambda data, out=None: None)
        assert verdicts() == fast
    assert fast[:2] == [40, 40] and all(isinstance(v, tuple) for v in fast[2:])


@pytest.mark.parametrize("codec", [Compression.ZSTD, Compression.SNAPPY])
def test_records_inflated_into_a_reused_scratch_are_read_whole(walker: str, codec: int) -> None:
    """A batch inflating to 2.5 scratches, records of changing sizes straddling each step:
    every record read (nothing of a step kept past it: the next overwrites it), twice with
    the same scratch, and the inflation allocating nothing of a step's size."""
    rng = random.Random(27)
    records = [
        NewRecord(key=b"k%d" % i, value=b"%06d" % i * rng.randrange(50, 250)) for i in range(3000)
    ]
    view = RecordBatchView(build_batch(records, compression=codec, now_ms=5))
    assert view.size < 200 * 1024
    scratch = new_scratch()
    for _ in range(2):
        tracemalloc.start()
        try:
            summary = check_records(view, RecordRules(need_key=True), 64 << 20, scratch=scratch)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert summary.count == 3000 and not summary.error_count
        assert summary.inflated_bytes > 2 * SCRATCH_BYTES
        assert peak < view.size + 64 * 1024 or walker == "numpy", peak  # numpy copies


def test_the_loop_try_inflates_a_byte_past_give_up_at_most() -> None:
    """The event loop's try (``give_up``) stops a zstd stream a byte past it, and a gzip
    stream whose trailer claims more before inflating any: the rest is a worker's."""
    records = [NewRecord(key=b"k", value=bytes(1000)) for _ in range(1000)]  # ~1 MB
    for codec, written in ((Compression.ZSTD, (64 << 10) + 1), (Compression.GZIP, 0)):
        view = RecordBatchView(build_batch(records, compression=codec))
        scratch = new_scratch()
        scratch[:] = b"\xaa" * len(scratch)
        with pytest.raises(Unfinished):
            check_records(view, RecordRules(), 64 << 20, give_up=64 << 10, scratch=scratch)
        assert scratch[written:].tobytes().strip(b"\xaa") == b"", codec
        if written:
            assert b"\xaa" not in scratch[:written].tobytes()


def test_a_zstd_frame_asking_for_a_huge_window_is_refused() -> None:
    """The decoder would keep 128 MiB of history for it: refused before decoding."""
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
    body = cobj.compress(encode_record(0, 0, b"k", b"v")) + cobj.flush()
    with pytest.raises(InvalidBatchError) as exc:
        check_records(_raw_batch(body, 1, Compression.ZSTD), RecordRules(), 64 << 20)
    assert exc.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert "window" in str(exc.value)


def test_record_errors_are_capped_but_counted(walker: str) -> None:
    view = RecordBatchView(build_batch([NewRecord(value=b"v")] * 3000, now_ms=1))
    summary = check_records(view, RecordRules(need_key=True, partition="t-0"), 1 << 20)
    assert summary.error == ErrorCode.INVALID_RECORD
    assert summary.error_count == 3000 and len(summary.record_errors) == 1000
    assert summary.record_errors[0] == (
        0,
        "Compacted topic cannot accept message without key in topic partition t-0",
    )


def test_corrupted_batches_are_refused_or_read_as_the_decoder_reads_them(walker: str) -> None:
    """One byte of a valid batch's records changed (its CRC made right again), 1,500 times:
    the check refuses it with InvalidBatchError, or the per-record decoder reads the records
    it accepted, at offsets 0..n-1. No other exception, whatever the bytes."""
    rng = random.Random(6)
    accepted = 0
    for _ in range(1500):
        n = rng.randrange(1, 80)
        records = [
            NewRecord(
                key=rng.randbytes(rng.randrange(0, 5)),
                value=rng.randbytes(rng.choice([3, 3, rng.randrange(0, 200)])),
                timestamp=1000,
            )
            for _ in range(n)
        ]
        body = bytearray(build_batch(records, now_ms=1000)[61:])
        body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.2:
            del body[rng.randrange(len(body)) :]
        codec = rng.choice([Compression.NONE, Compression.NONE, Compression.GZIP])
        sent = zlib.compress(bytes(body), wbits=31) if codec else bytes(body)
        view = _raw_batch(sent, n, codec)
        try:
            check_records(view, RecordRules(need_key=True), 1 << 20)
        except InvalidBatchError:
            continue
        accepted += 1
        assert [r.offset for r in decode_records(view)] == list(range(n))
    assert 500 < accepted < 1500  # both outcomes were exercised


def test_giving_up_early_is_not_a_refusal() -> None:
    """With ``give_up`` under the limit, records inflating past it stop the check (Unfinished,
    a chunk at most past it), and the limit refuses them as before when it is the lower."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = z.compress(encode_record(0, 0, b"k", bytes(4 << 20))) + z.flush()
    view = _raw_batch(body, 1, Compression.GZIP)
    with pytest.raises(Unfinished):
        check_records(view, RecordRules(), 8 << 20, give_up=1 << 20)
    with pytest.raises(InvalidBatchError) as exc:
        check_records(view, RecordRules(), 2 << 20, give_up=3 << 20)
    assert exc.value.code == ErrorCode.MESSAGE_TOO_LARGE
    assert check_records(view, RecordRules(), 8 << 20, give_up=5 << 20).count == 1


def test_giving_up_bounds_the_reading_of_uncompressed_records(walker: str) -> None:
    """Nothing to inflate: ``give_up`` bounds the reading instead. A megabyte of records laid
    out alike is read within 64 KB's worth (numpy compares their columns a run at a time, C
    charges a 32nd of a byte a byte); as many bytes of records of changing sizes are too only
    in C (numpy reads them one by one). Records the bound would not cover are not read at
    all, and a verdict still comes without it."""
    uniform = build_batch([NewRecord(value=b"%090d" % i) for i in range(10_000)], now_ms=1)
    summary = check_records(RecordBatchView(uniform), RecordRules(), 8 << 20, give_up=64 << 10)
    assert summary.count == 10_000
    rng = random.Random(27)
    varied = [NewRecord(value=rng.randbytes(rng.randrange(180))) for _ in range(10_000)]
    view = RecordBatchView(build_batch(varied, now_ms=1))
    read: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        if walker == "c":
            real_walk = RecordChecker.walk
            assert real_walk is not None
            assert check_records(view, RecordRules(), 8 << 20, give_up=64 << 10).count == 10_000

            def walk(*args: object) -> tuple[int, int, int, int, int]:
                read.append(1)
                return real_walk(*args)

            mp.setattr(RecordChecker, "walk", walk)
            too_little = 16 << 10
        else:
            real_starts = RecordChecker._starts

            def starts(self: RecordChecker, *args: object) -> object:
                read.append(1)
                return real_starts(self, *args)

            mp.setattr(RecordChecker, "_starts", starts)
            too_little = 64 << 10
        with pytest.raises(Unfinished):  # before reading what would be read past the bound
            check_records(view, RecordRules(), 8 << 20, give_up=too_little)
        assert not read
    assert check_records(view, RecordRules(), 8 << 20).count == 10_000


def _verdict(view: RecordBatchView) -> object:
    try:
        summary = check_records(view, RecordRules(need_key=True), 1 << 20)
    except InvalidBatchError as exc:
        return exc.code, str(exc)
    return summary.count, summary.error, summary.record_errors


def test_a_layout_guessed_from_an_earlier_batch_changes_no_verdict() -> None:
    """A run is first tried with the layout of an earlier run that began with the same bytes:
    a batch with one byte changed gets the verdict it gets with nothing remembered, after its
    unchanged original (same layout) was read."""
    rng = random.Random(27)
    for _ in range(600):
        n = rng.randrange(1, 150)
        klen, vlen = rng.choice([0, 1, 3]), rng.choice([0, 5, 60, 200])
        records = [
            NewRecord(
                key=rng.choice([None, rng.randbytes(klen)]) if rng.random() < 0.1 else b"k" * klen,
                value=rng.randbytes(vlen),
                timestamp=1000 + rng.choice([0, 0, 0, rng.randrange(0, 100)]),
            )
            for _ in range(n)
        ]
        original = build_batch(records, now_ms=1000)
        body = bytearray(original[61:])
        size = len(body) // n
        at = rng.randrange(min(len(body), 2 * size)) if rng.random() < 0.7 else None
        body[at if at is not None else rng.randrange(len(body))] = rng.randrange(256)
        view = _raw_batch(bytes(body), n)
        _LAYOUTS.clear()
        fresh = _verdict(view)
        _verdict(RecordBatchView(original))
        assert _verdict(view) == fresh


def test_zstd_streams_never_share_a_decompression_context() -> None:
    """Contexts are reused (making one costs ~10 us) but one stream's is its own until it
    ends: two streams read interleaved, then a third, inflate correctly."""
    one, two = bytes(range(256)) * 4096, b"".join(b"%07d" % i for i in range(150_000))
    cctx = zstandard.ZstdCompressor()
    first = inflate(Compression.ZSTD, cctx.compress(one), 1 << 30)
    head = next(first)
    assert b"".join(inflate(Compression.ZSTD, cctx.compress(two), 1 << 30)) == two
    assert head + b"".join(first) == one
    assert b"".join(inflate(Compression.ZSTD, cctx.compress(one), 1 << 30)) == one


def test_a_five_byte_int_loses_its_high_bits_as_in_java(walker: str) -> None:
    """Java's ByteUtils.readVarint keeps 32 bits of a five-byte varint: a length or offset
    delta whose fifth byte carries more (0x70 here) is the value of its low 32 bits, as Kafka
    4.4 reads it (checked with its ByteUtils: [0x94, 0x80, 0x80, 0x80, 0x70] is 10)."""
    fat = bytes([0x80, 0x80, 0x80, 0x70])  # four more bytes, adding only bits 32..34
    record = encode_record(0, 0, b"k", b"v")  # length, attributes, ts delta, offset delta 0
    body = record[1:]
    wide = bytes([record[0] | 0x80]) + fat + body[:2] + bytes([body[2] | 0x80]) + fat + body[3:]
    wide = bytes([(len(wide) - 5) * 2 | 0x80]) + fat + wide[5:]  # its body grew by 4
    summary = check_records(_raw_batch(wide, 1), RecordRules(), 1 << 20)
    assert summary.count == 1 and summary.error == ErrorCode.NONE


def test_record_errors_are_listed_in_batch_order(walker: str) -> None:
    """As Kafka's LogValidator lists them: one error a record, the key's first, by index."""
    records = [
        NewRecord(key=b"a", value=b"v", timestamp=5),  # out of the window
        NewRecord(key=None, value=b"v", timestamp=1000),  # no key on a compacted topic
        NewRecord(key=None, value=b"v", timestamp=5),  # both: the key is reported
        NewRecord(key=b"d", value=b"v", timestamp=1000),
    ]
    view = RecordBatchView(build_batch(records, now_ms=1000))
    rules = RecordRules(need_key=True, partition="t-0", min_timestamp=900, max_timestamp=1100)
    summary = check_records(view, rules, 1 << 20)
    assert [i for i, _ in summary.record_errors] == [0, 1, 2]
    assert summary.record_errors[0][1].startswith("Timestamp 5 of message with offset 0")
    assert summary.record_errors[2][1].startswith("Compacted topic cannot accept")
    assert summary.error == ErrorCode.INVALID_TIMESTAMP and summary.error_count == 3
