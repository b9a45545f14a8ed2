"""murmur2 must equal Kafka's Utils.murmur2 (vectors from Kafka's UtilsTest)."""

from __future__ import annotations

import pytest

from samsa.client import murmur2, partition_for_key
from samsa.client._partitioner import StickyPartitioner


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
    ],
)
def test_murmur2_matches_java(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_partition_is_positive_modulo() -> None:
    for i in range(1000):
        key = b"key-%d" % i
        assert partition_for_key(key, 7) == (murmur2(key) & 0x7FFFFFFF) % 7


def test_sticky_partitioner_moves_on_when_batch_closes() -> None:
    sp = StickyPartitioner()
    first = sp.partition("t", 4)
    assert all(sp.partition("t", 4) == first for _ in range(10))
    sp.batch_closed("t", first, 4)
    assert sp.partition("t", 4) != first
    assert sp.partition("one", 1) == 0
