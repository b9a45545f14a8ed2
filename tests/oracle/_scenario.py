"""Small helpers the differential scenarios (tests/oracle/test_differential_*) share."""

from __future__ import annotations

import time

from samsa.testing import idempotent_batch
from samsa.testing.oracle import Side

# Record timestamps are compared, so both sides write the same ones; recent, since producer
# expiry and retention count from them.
TS = (time.time_ns() // 1_000_000) - 60_000


def batch(pid: int, epoch: int, seq: int, count: int = 1, value: bytes = b"v") -> bytes:
    """An idempotent batch of ``count`` records stamped :data:`TS`."""
    return idempotent_batch(pid, epoch, seq, count, value=value, timestamp=TS)


def producer(
    side: Side, label: str = "init", transactional_id: str | None = None
) -> tuple[int, int]:
    """InitProducerId (recorded under ``label``): (producer id, epoch)."""
    resp = side.init_producer_id(label, transactional_id)
    return int(resp.producer_id), int(resp.producer_epoch)


def topic(side: Side, partitions: int = 1, suffix: str = "t") -> str:
    """The scenario's topic, created and served."""
    name = side.unique(suffix)
    side.create_topic(name, partitions)
    return name
