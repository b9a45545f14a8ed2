"""The client's Arrow columns built from buffers (no ``pa.array``: it imports pandas) hold what
``pa.array`` would make of the same Python objects, and reject what it would reject."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from samsa.protocol import columnar as col


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [b""],
        [b"a", b"bc", b""],
        [b"x" * 8] * 5,
        [None, b"a", None],
        ["é", b"\x00\xff", bytearray(b"ba"), memoryview(b"mv"), None],
        [None, None],
    ],
)
def test_binary_array_matches_pa_array(rows: list[object]) -> None:
    expected = pa.array(
        [r.encode() if isinstance(r, str) else None if r is None else bytes(r) for r in rows],  # type: ignore[arg-type]
        pa.large_binary(),
    )
    got = col.binary_array(rows, "values")
    assert got.equals(expected)
    assert got.null_count == sum(r is None for r in rows)


def test_binary_array_rejects_other_types_by_row() -> None:
    with pytest.raises(TypeError, match=r"keys: cannot be read as binary \(row 1 is int\)"):
        col.binary_array([b"a", 5], "keys")
    # a memoryview of ints: len() counts items, not bytes
    ints = memoryview(np.arange(3, dtype=np.int32).tobytes()).cast("i")
    assert col.binary_array([ints], "v")[0].as_py() == bytes(ints)


def test_int64_columns_from_python_rows() -> None:
    arr = col._to_arrow([1, None, 3], "partition", pa.int64())
    assert arr.equals(pa.array([1, None, 3], pa.int64()))
    assert col.to_numpy(arr, fill=-1).tolist() == [1, -1, 3]
    for bad in ([1.5], [True], ["1"], [1 << 64]):
        with pytest.raises(TypeError, match="partition: cannot be read as int64"):
            col._to_arrow(bad, "partition", pa.int64())


def test_to_numpy_reads_slices_and_timestamps() -> None:
    arr = pa.array([5, 6, 7, 8], pa.int32()).slice(1, 2)
    assert col.to_numpy(arr).tolist() == [6, 7]
    ts = pa.array([1000, None], pa.timestamp("us", tz="UTC"))
    assert col.to_numpy(ts, fill=9).tolist() == [1000, 9]
    with pytest.raises(TypeError):
        col.to_numpy(pa.array([b"x"]))


def test_headers_from_python_rows() -> None:
    rows = [[("a", b"1"), (b"b", None)], None, []]
    got = col._to_arrow(rows, "headers", col._LARGE_HEADERS_TYPE)
    assert got.to_pylist() == [
        [{"key": b"a", "value": b"1"}, {"key": b"b", "value": None}],
        None,
        [],
    ]
    with pytest.raises(TypeError, match="a header must be a"):
        col._to_arrow([[("a", b"1", b"2")]], "headers", col._LARGE_HEADERS_TYPE)
    with pytest.raises(ValueError, match="a header key is null"):
        col._to_arrow([[(None, b"1")]], "headers", col._LARGE_HEADERS_TYPE)


def test_empty_batch_has_the_schema() -> None:
    b = col.empty_batch(col.ARROW_SCHEMA_HEADERS)
    assert b.num_rows == 0 and b.schema == col.ARROW_SCHEMA_HEADERS
