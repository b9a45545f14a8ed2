"""The producer's accumulator: intake checks, partitioning, batches from columns to bytes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from samsa.client._accumulator import (
    COLUMNAR_ENCODE_MIN,
    COLUMNAR_HASH_MIN,
    Batch,
    RowSink,
    Tally,
    _encode_plain,
    assign_partitions,
    columnar_ready,
    encode_sealed,
    group_by_partition,
    make_columns,
    make_item,
    normalize_headers,
    record_size,
    register_sink,
    run_columns,
    unregister_sink,
)
from samsa.client._partitioner import partition_for_key
from samsa.client._types import RecordMetadata, TopicPartition
from samsa.protocol.records import (
    TRANSACTIONAL_FLAG,
    Compression,
    RecordBatchView,
    decode_records,
    encode_record,
    validate_produce_batch,
)

TP = TopicPartition("t", 3)


@pytest.fixture(autouse=True)
def _columnar_loaded() -> None:
    """Large inputs take the columnar paths only once the codec is loaded: load it."""
    assert columnar_ready(wait=True)


class Sinks:
    """Records every sink call, by row."""

    def __init__(self) -> None:
        self.calls: dict[int, list[tuple[BaseException | None, RecordMetadata | None]]] = {}

    def sink(self, row: int) -> Any:
        def call(err: BaseException | None, md: RecordMetadata | None) -> None:
            self.calls.setdefault(row, []).append((err, md))

        return call


def _rows(n: int, *, headers: bool = False, seed: int = 0) -> dict[str, list[Any]]:
    rng = random.Random(seed)
    values: list[bytes | None] = [
        None if i % 17 == 5 else rng.randbytes(rng.randrange(0, 300)) for i in range(n)
    ]
    keys: list[bytes | None] = [None if i % 5 == 0 else b"k%d" % i for i in range(n)]
    timestamps = [1_700_000_000_000 + rng.randrange(-5000, 5000) for _ in range(n)]
    hdrs = [normalize_headers([("h", b"%d" % i), ("n", None)]) if i % 3 else None for i in range(n)]
    return {
        "values": values,
        "keys": keys,
        "timestamps": timestamps,
        "headers": hdrs if headers else None,
        "sizes": [
            record_size(v, k, h if headers else None)
            for v, k, h in zip(values, keys, hdrs, strict=True)
        ],
    }


def _open(rows: dict[str, list[Any]], sinks: list[Any] | None = None) -> Batch:
    b = Batch(TP, 0.0)
    b.extend(
        rows["values"], rows["keys"], rows["timestamps"], rows["headers"], sinks, rows["sizes"]
    )
    return b


def _decoded(payload: bytes) -> list[tuple[Any, ...]]:
    view = validate_produce_batch(payload)  # CRC, lengths, magic: what the broker checks
    return [(r.key, r.value, r.timestamp, tuple(r.headers)) for r in decode_records(view)]


def _expected(rows: dict[str, list[Any]], a: int, b: int) -> list[tuple[Any, ...]]:
    hdrs = rows["headers"] or [None] * len(rows["values"])
    return [
        (rows["keys"][i], rows["values"][i], rows["timestamps"][i], tuple(hdrs[i] or ()))
        for i in range(a, b)
    ]


# --- intake checks -------------------------------------------------------------------------


def test_make_item_plain_record_has_no_extras() -> None:
    item = make_item("t", "välue", b"k")
    assert item == ("t", "välue".encode(), b"k", record_size("välue".encode(), b"k", None), None)


def test_make_item_keeps_extras_and_normalises_headers() -> None:
    def sink(err: BaseException | None, md: RecordMetadata | None) -> None:
        pass

    item = make_item("t", b"v", None, 2, 5, {"a": "x", "b": None}, sink)
    assert item[4] == (2, 5, (("a", b"x"), ("b", None)), sink)
    assert item[3] == record_size(b"v", None, (("a", b"x"), ("b", None)))


def test_make_item_partition_minus_one_means_any() -> None:
    assert make_item("t", b"v", None, -1)[4] is None  # confluent-kafka's default


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"value": 5}, TypeError, "value must be bytes"),
        ({"key": 1.5}, TypeError, "key must be bytes"),
        ({"timestamp": -3}, ValueError, "non-negative"),
        ({"timestamp": "now"}, ValueError, "non-negative"),
        ({"partition": -2}, ValueError, "partition must be >= 0"),
        ({"partition": "0"}, TypeError, "partition must be an int"),
        ({"headers": [("a",)]}, TypeError, "pair"),
        ({"headers": [(1, b"x")]}, TypeError, "header name must be str"),
        ({"headers": [("a", 7)]}, TypeError, "header 'a'"),
        ({"topic": b"t"}, TypeError, "topic"),
        ({"topic": ""}, TypeError, "topic"),
    ],
)
def test_make_item_refuses_bad_records(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {"topic": "t", "value": b"v", "key": None}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        make_item(**args)


# --- partitioning --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [COLUMNAR_HASH_MIN - 1, COLUMNAR_HASH_MIN * 4])
def test_keys_hash_like_the_java_client_small_and_vectorised(n: int) -> None:
    keys = [b"key-%d" % i for i in range(n)]
    parts = assign_partitions(keys, None, 7, lambda: pytest.fail("no sticky for keyed records"))
    assert list(parts) == [partition_for_key(k, 7) for k in keys]  # type: ignore[arg-type]


def test_unkeyed_records_go_to_the_sticky_partition_keyed_ones_by_hash() -> None:
    keys: list[bytes | None] = [None if i % 2 else b"k%d" % i for i in range(200)]
    parts = assign_partitions(keys, None, 5, lambda: 4)
    assert not isinstance(parts, int)
    for k, p in zip(keys, parts, strict=True):
        assert p == (4 if k is None else partition_for_key(k, 5))
    assert assign_partitions([None] * 10, None, 5, lambda: 2) == 2
    assert assign_partitions([b"a", None], None, 1, lambda: 0) == 0


def test_explicit_partitions_win_and_unknown_ones_are_marked() -> None:
    keys: list[bytes | None] = [b"a", b"b", None, None]
    parts = assign_partitions(keys, [1, None, 9, None], 3, lambda: 2)
    assert list(parts) == [1, partition_for_key(b"b", 3), -1, 2]  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [10, COLUMNAR_HASH_MIN * 10])
def test_grouping_keeps_each_partitions_order(n: int) -> None:
    rng = random.Random(n)
    parts = [rng.randrange(-1, 6) for _ in range(n)]
    groups = group_by_partition(parts)
    assert sorted(i for rows in groups.values() for i in rows) == list(range(n))
    for p, rows in groups.items():
        assert rows == [i for i in range(n) if parts[i] == p]


# --- batches -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, COLUMNAR_ENCODE_MIN - 1, COLUMNAR_ENCODE_MIN + 50])
@pytest.mark.parametrize("codec", [Compression.NONE, Compression.ZSTD])
def test_sealed_batch_decodes_to_its_rows_with_the_identity_it_is_built_for(
    n: int, codec: int
) -> None:
    rows = _rows(n, headers=True, seed=n)
    b = _open(rows)
    payload = b.build(7, 3, 100, True, codec)
    view = RecordBatchView(payload)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (7, 3, 100)
    assert view.attributes & TRANSACTIONAL_FLAG
    assert view.compression == codec
    assert view.record_count == n
    assert view.base_timestamp == rows["timestamps"][0]
    assert view.max_timestamp == max(rows["timestamps"])
    assert _decoded(payload) == _expected(rows, 0, n)
    # A new identity (a renumbering) rewrites the header only: same records, valid CRC.
    again = b.build(8, 0, 0, False, codec)
    view = RecordBatchView(again)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (8, 0, 0)
    assert not view.attributes & TRANSACTIONAL_FLAG
    assert again[61:] == payload[61:]
    assert _decoded(again) == _expected(rows, 0, n)


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.ZSTD])
def test_a_columnar_batch_is_built_in_place_without_copying_its_records(codec: int) -> None:
    rows = _rows(COLUMNAR_ENCODE_MIN + 50, seed=3)
    b = _open(rows)
    b.seal(codec)
    section = b.section
    assert isinstance(section, memoryview)
    payload = b.build(7, 3, 100, False, codec)
    # the section's own buffer, its header written in front: no copy of the records
    assert isinstance(payload, memoryview) and payload.obj is section.obj
    assert _decoded(payload) == _expected(rows, 0, len(rows["values"]))
    again = b.build(9, 1, 5, True, codec)
    assert isinstance(again, memoryview) and again.obj is section.obj
    view = validate_produce_batch(again)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (9, 1, 5)
    assert view.attributes & TRANSACTIONAL_FLAG
    assert _decoded(again) == _expected(rows, 0, len(rows["values"]))


@pytest.mark.parametrize("nulls", ["none", "some", "all"])
def test_a_run_becomes_columns_with_the_sizes_its_records_reserved(nulls: str) -> None:
    values = [b"v%d" % i * (i % 5) for i in range(300)]
    keys: list[bytes | None] = [
        None if nulls == "all" or (nulls == "some" and i % 3 == 0) else b"k%d" % i
        for i in range(300)
    ]
    cols = run_columns(values, keys, 123)
    assert cols.values.to_pylist() == values
    if nulls == "all":
        assert cols.keys is None
    else:
        assert cols.keys is not None and cols.keys.to_pylist() == keys
    assert cols.sizes.tolist() == [
        record_size(v, k, None) for v, k in zip(values, keys, strict=True)
    ]
    assert cols.timestamps.tolist() == [123] * 300
    assert cols.headers is None and cols.partitions is None


def test_one_encode_seals_each_partitions_rows_in_batches_of_their_own() -> None:
    # The columnar intake encodes every partition's rows of a burst in one call: a batch
    # never holds two partitions' rows (a span of one row included), each decodes to its
    # rows in order, and the sizes add up per partition.
    rows = _rows(2_000, headers=True, seed=9)
    cols = make_columns(rows["values"], rows["keys"], None, rows["headers"], rows["timestamps"])
    tps = [TopicPartition("t", p) for p in (0, 2, 5)]
    spans = [(tps[0], 0, 700), (tps[1], 700, 701), (tps[2], 701, 2_000)]
    batch_size = 4096
    tally = Tally("t", 2_000, lambda err, md: None)
    sealed = encode_sealed(spans, cols, Compression.NONE, batch_size, 1.0, tally)
    assert len(sealed) == 3
    for (tp, a, b), batches in zip(spans, sealed, strict=True):
        first = a
        for s in batches:
            assert s.tp == tp and s.full and s.handle is tally
            payload = s.build(1, 0, 0, False, Compression.NONE)
            assert len(payload) <= batch_size or s.count == 1
            assert _decoded(payload) == _expected(rows, first, first + s.count)
            first += s.count
        assert first == b
        assert sum(s.size for s in batches) == int(cols.sizes[a:b].sum())


@pytest.mark.parametrize("n", [60, 3000])  # per-record encoder, columnar encoder
def test_seal_full_cuts_whole_batches_and_keeps_the_rest_open(n: int) -> None:
    rows = _rows(n, headers=n < 100, seed=1)
    sinks = Sinks()
    every = [sinks.sink(i) if i % 7 == 0 else None for i in range(n)]
    b = _open(rows, every)
    size_before = b.size
    batch_size = 2048
    sealed = b.seal_full(batch_size, Compression.NONE, 5.0)
    assert sealed and all(s.sealed and s.full for s in sealed)
    assert not b.sealed and b.created == 5.0
    # every row is in exactly one batch, in order; the byte accounting is unchanged
    assert sum(s.count for s in sealed) + b.count == n
    assert sum(s.size for s in sealed) + b.size == size_before
    assert b.size < batch_size  # what stays open is less than one batch
    first = 0
    for s in sealed:
        payload = s.build(1, 0, first, False, Compression.NONE)
        assert len(payload) <= batch_size or s.count == 1
        assert _decoded(payload) == _expected(rows, first, first + s.count)
        first += s.count
    rest = b.build(1, 0, first, False, Compression.NONE)
    assert _decoded(rest) == _expected(rows, first, n)
    # sinks follow their rows: row i of the input gets offset 1000 + i
    first = 0
    for s in [*sealed, b]:
        s.succeed(1000 + first, -1, False)
        first += s.count
    assert sorted(sinks.calls) == [i for i in range(n) if i % 7 == 0]
    for i, calls in sinks.calls.items():
        ((err, md),) = calls
        assert err is None and md is not None
        assert (md.topic, md.partition, md.offset) == ("t", 3, 1000 + i)
        assert md.timestamp == rows["timestamps"][i]


def test_a_record_larger_than_batch_size_is_sealed_alone() -> None:
    rows = {
        "values": [b"x" * 5000, b"y"],
        "keys": [None, None],
        "timestamps": [1, 2],
        "headers": None,
        "sizes": [record_size(b"x" * 5000, None, None), record_size(b"y", None, None)],
    }
    b = _open(rows)
    sealed = b.seal_full(1024, Compression.NONE, 0.0)
    assert [s.count for s in sealed] == [1]
    assert b.count == 1 and b.values == [b"y"]


@pytest.mark.parametrize("n", [20, COLUMNAR_ENCODE_MIN * 2])
def test_drop_first_resolves_written_records_as_duplicates(n: int) -> None:
    rows = _rows(n, headers=True, seed=3)
    sinks = Sinks()
    b = _open(rows, [sinks.sink(i) for i in range(n)])
    size = b.size
    b.seal(Compression.LZ4)
    b.payload = b.build(1, 0, 0, False, Compression.LZ4)
    k = n // 3
    b.drop_first(k)
    assert b.count == n - k and b.payload is None and b.size == size
    for i in range(k):
        ((err, md),) = sinks.calls[i]
        assert err is None and md is not None
        assert md.duplicate and md.offset == -1 and md.timestamp == rows["timestamps"][i]
    assert all(i not in sinks.calls for i in range(k, n))
    assert _decoded(b.build(1, 0, k, False, Compression.LZ4)) == _expected(rows, k, n)
    assert b.size == size  # re-sealed: its release still gives back what the intake took
    b.drop_first(1)  # and again (decoded from the re-sealed batch)
    assert _decoded(b.build(1, 0, k + 1, False, Compression.LZ4)) == _expected(rows, k + 1, n)
    assert b.size == size
    b.succeed(50, -1, False)
    for i in range(k + 1, n):
        ((_, md),) = sinks.calls[i]
        assert md is not None and md.offset == 50 + i - k - 1


def test_outcome_reaches_each_sink_once_even_if_one_raises() -> None:
    sinks = Sinks()

    def bad(err: BaseException | None, md: RecordMetadata | None) -> None:
        raise RuntimeError("user callback bug")

    rows = _rows(3)
    b = _open(rows, [sinks.sink(0), bad, sinks.sink(2)])
    err = RuntimeError("gone")
    b.fail(err)
    b.fail(RuntimeError("again"))
    b.succeed(0, -1, False)
    assert sinks.calls == {0: [(err, None)], 2: [(err, None)]}


def test_log_append_time_replaces_the_record_timestamp() -> None:
    sinks = Sinks()
    b = _open(_rows(2), [sinks.sink(0), None])
    b.succeed(9, 123456, False)
    ((_, md),) = sinks.calls[0]
    assert md is not None and (md.offset, md.timestamp) == (9, 123456)


@pytest.mark.parametrize("duplicate", [False, True])
def test_each_sink_gets_a_record_metadata_with_its_fields_by_name(duplicate: bool) -> None:
    sinks = Sinks()
    rows = _rows(3)
    b = _open(rows, [sinks.sink(i) for i in range(3)])
    b.succeed(40, -1, duplicate)
    for i in range(3):
        ((err, md),) = sinks.calls[i]
        want = RecordMetadata(
            topic="t",
            partition=3,
            offset=40 + i,
            timestamp=rows["timestamps"][i],
            duplicate=duplicate,
        )
        assert err is None and type(md) is RecordMetadata and md == want
        assert (md.topic, md.partition, md.offset) == ("t", 3, 40 + i)
        assert (md.timestamp, md.duplicate) == (rows["timestamps"][i], duplicate)
        with pytest.raises(AttributeError):
            md.offset = 0  # type: ignore[misc]


@pytest.mark.parametrize("seed", range(4))
def test_plain_records_encode_as_encode_record_writes_them(seed: int) -> None:
    # Records without headers take the table-driven encoder; a field beyond its table (a
    # value of 5000+ bytes, timestamps seconds apart, a batch of 5000 rows) is encoded by
    # encode_record within the same section. The bytes must be encode_record's either way.
    rng = random.Random(seed)
    n = rng.choice([3, 100, 5000])
    values = [
        None if i % 11 == 3 else rng.randbytes(rng.choice([0, 1, 63, 64, 100, 8200]))
        for i in range(n)
    ]
    keys = [None if i % 4 == 0 else rng.randbytes(rng.choice([0, 8, 70])) for i in range(n)]
    base = 1_700_000_000_000
    stamps = [base + rng.choice([0, 1, -64, 63, 4095, -4097, 100_000]) for _ in range(n)]
    got = _encode_plain(values, keys, stamps, 0, n)
    want = b"".join(encode_record(i, stamps[i] - stamps[0], keys[i], values[i]) for i in range(n))
    assert got == want
    # and a batch sealed from these rows (the per-record path: no headers) decodes to them
    rows = {
        "values": values[:100],
        "keys": keys[:100],
        "timestamps": stamps[:100],
        "headers": None,
        "sizes": [record_size(v, k, None) for v, k in zip(values[:100], keys[:100], strict=True)],
    }
    payload = _open(rows).build(1, 0, 0, False, Compression.NONE)
    assert _decoded(payload) == _expected(rows, 0, len(rows["values"]))


class _Rows(RowSink):
    __slots__ = ("calls",)

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, err: BaseException | None, md: RecordMetadata | None) -> None:
        self.calls.append(("one", err, md))

    def landed_rows(self, *args: Any) -> None:
        self.calls.append(("rows", *args))


@pytest.mark.parametrize("append_time", [-1, 1_800_000_000_000])
def test_a_batch_whose_records_share_a_row_sink_is_delivered_in_one_call(
    append_time: int,
) -> None:
    rows = _rows(300, seed=3)
    shared = _Rows()
    handle = register_sink(shared)  # records carry the handle, an int
    b = _open(rows, [handle if i % 2 else None for i in range(300)])
    b.seal_full(2048, Compression.NONE, 1.0)  # the sealed part keeps its sinks, rebased
    b.succeed(500, append_time, False)
    ((kind, *args),) = shared.calls
    assert kind == "rows"
    topic, partition, base, got_rows, stamps, at, dup = args
    assert (topic, partition, base, at, dup) == ("t", 3, 500, append_time, False)
    first = 300 - b.count  # the rows left open after the sealed batches
    assert got_rows == [i - first for i in range(first, 300) if i % 2]
    if append_time < 0:
        assert [stamps[r] for r in got_rows] == [rows["timestamps"][first + r] for r in got_rows]
    else:
        assert stamps is None
    # two different sinks in a batch: each record gets its own call, with its metadata
    mixed, other = _Rows(), _Rows()
    hm, ho = register_sink(mixed), register_sink(other)
    b = _open(rows, [hm if i % 2 else ho for i in range(300)])
    b.succeed(0, -1, False)
    assert len(mixed.calls) == 150 and len(other.calls) == 150
    assert [md.offset for _, _, md in mixed.calls] == list(range(1, 300, 2))
    # and a failure reaches each record's sink through its handle
    b = _open(rows, [hm if i % 2 else None for i in range(300)])
    b.fail(RuntimeError("lost"))
    assert len(mixed.calls) == 300 and all(
        isinstance(e, RuntimeError) for _, e, _ in mixed.calls[150:]
    )
    for h in (handle, hm, ho):
        unregister_sink(h)
