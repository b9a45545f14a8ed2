"""produce_batch() under network faults: every record once, in call order per partition.

The columnar path shares the idempotent sender with produce(): its batches get sequences
when first drained and keep their bytes on every retry, so the broker recognises a batch
it wrote whose answer was lost. A FaultProxy swallows answers and resets connections; the
log must then hold every row exactly once, in order per partition, at the offsets the
call's future reported. In a transaction, committed calls are visible and aborted ones not.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from samsa.client import Admin, BatchMetadata, Producer
from samsa.testing import FaultProxy, read_topic

PARTITIONS = 3


@pytest.fixture
def proxied(broker_factory):  # type: ignore[no-untyped-def]
    b = broker_factory().start()
    proxy = FaultProxy(("127.0.0.1", b.port), seed=4321).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def _offsets(md: BatchMetadata, part: int) -> list[int]:
    return [o for base, c in md.offsets.get(part, []) for o in range(base, base + c)]


def _config(address: str, **extra: Any) -> dict[str, Any]:
    config = {
        "bootstrap.servers": address,
        "linger.ms": 2,
        "batch.size": 2048,  # many small batches: many requests to hit
        "request.timeout.ms": 3000,
        "retry.backoff.ms": 20,
        "delivery.timeout.ms": 60_000,
        **extra,
    }
    # produce_batch() batches grow up to max.request.size: keep them at batch.size
    config["max.request.size"] = config["batch.size"]
    return config


@pytest.mark.parametrize(("drop_response", "reset_before"), [(0.15, 0.0), (0.1, 0.1)])
def test_every_row_once_in_order_at_the_reported_offsets(
    proxied: FaultProxy, drop_response: float, reset_before: float
) -> None:
    topic = f"pbf-{uuid.uuid4().hex[:6]}"
    with Admin({"bootstrap.servers": proxied.address}) as admin:
        admin.create_topic(topic, PARTITIONS)
    calls, rows = 8, 500
    with Producer(_config(proxied.address)) as producer:
        proxied.set_faults(drop_response_rate=drop_response, reset_rate=reset_before)
        futures = []
        for c in range(calls):
            values = [b"rec-%02d-%04d" % (c, i) for i in range(rows)]
            keys = [None if i % 4 == 0 else b"key-%d" % (i % 11) for i in range(rows)]
            futures.append(producer.produce_batch(topic, values, keys))
        assert producer.flush(60) == 0
        proxied.set_faults()
        mds = [f.result(0) for f in futures]
    stats = proxied.stats
    assert stats.faults >= 5, stats
    got = read_topic(proxied.address, topic)
    values = [r.value for r in got]
    assert len(values) == calls * rows, f"{len(values)} records for {calls * rows} sent"
    assert len(set(values)) == len(values), "duplicates in the log"
    for p in range(PARTITIONS):
        recs = [r for r in got if r.partition == p]
        assert [r.value for r in recs] == sorted(r.value for r in recs), f"partition {p} order"
        # every call's rows sit at the offsets its future reported (none without one: a
        # duplicate answer carries the original offset)
        reported = sorted(o for md in mds for o in _offsets(md, p))
        assert reported == [r.offset for r in recs]
    assert sum(md.without_offset for md in mds) == 0


def test_transactions_through_faults_commit_once_abort_never(proxied: FaultProxy) -> None:
    topic = f"pbt-{uuid.uuid4().hex[:6]}"
    with Admin({"bootstrap.servers": proxied.address}) as admin:
        admin.create_topic(topic, PARTITIONS)
    tid = f"pbt-{uuid.uuid4().hex[:6]}"
    config = _config(proxied.address, **{"transactional.id": tid, "batch.size": 600})
    with Producer(config) as producer:
        producer.init_transactions()
        proxied.set_faults(drop_response_rate=0.1, reset_rate=0.05)
        for t in range(6):
            producer.begin_transaction()
            values = [b"t%d-%04d" % (t, i) for i in range(600)]
            producer.produce_batch(topic, values, [b"k%d" % (i % 7) for i in range(600)])
            if t % 2:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
        proxied.set_faults()
    assert proxied.stats.faults >= 3, proxied.stats
    got = sorted(r.value for r in read_topic(proxied.address, topic))
    assert got == sorted(b"t%d-%04d" % (t, i) for t in (0, 2, 4) for i in range(600))
