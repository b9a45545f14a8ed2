"""Partitioners identical to the Java client's, so keys land where other clients put them.

Keyed records: ``toPositive(murmur2(key)) % partitions`` (Java's BuiltInPartitioner;
librdkafka's ``murmur2_random``). Unkeyed records are sticky: they go to one partition
until its current batch is sent, then another partition is chosen (KIP-480).
"""

from __future__ import annotations

import random

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as a signed 32-bit int, like Utils.murmur2."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    tail = length & ~3
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Chooses the partition of unkeyed records: one per topic until told to move on."""

    def __init__(self) -> None:
        self._current: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        p = self._current.get(topic)
        if p is None or p >= num_partitions:
            p = random.randrange(num_partitions)
            self._current[topic] = p
        return p

    def batch_closed(self, topic: str, partition: int, num_partitions: int) -> None:
        """The sticky partition's batch left: pick a different partition for the next."""
        if self._current.get(topic) == partition and num_partitions > 1:
            p = random.randrange(num_partitions - 1)
            self._current[topic] = p if p < partition else p + 1
