"""Producer retries under network faults: no loss, no duplicate, no reordering.

A fault-injecting proxy (samsa.testing.FaultProxy) sits between the client and the broker
and rewrites the broker's address in Metadata so every connection goes through it. It swallows
responses of requests the broker executed and resets connections, before or after the
broker saw a request. Afterwards the log must hold every record exactly once, in production
order per partition, and each future's offset must be the record's real offset
(docs/semantics.md, rules 20 and 22: the idempotent producer and what it retries).
"""

from __future__ import annotations

import time
import uuid

import pytest

from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.testing import FaultProxy

PARTITIONS = 3


@pytest.fixture
def proxied(broker_factory):  # type: ignore[no-untyped-def]
    b = broker_factory().start()
    proxy = FaultProxy(("127.0.0.1", b.port), seed=1234).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def _check_log(bootstrap: str, topic: str, sent: dict[bytes, tuple[int, int]], n: int) -> None:
    got = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += c.poll(0.5)
        got += c.poll(0.5)
    values = [r.value for r in got]
    assert len(values) == n, f"{len(values)} records in the log for {n} sent"
    assert len(set(values)) == n, "duplicates in the log"
    for r in got:
        assert r.value is not None
        assert sent[r.value] == (r.partition, r.offset)
    for p in range(PARTITIONS):
        seq = [int(r.value.split(b"-")[1]) for r in got if r.partition == p]  # type: ignore[union-attr]
        assert seq == sorted(seq), f"partition {p} out of order"


@pytest.mark.parametrize(("drop_response", "reset_before"), [(0.15, 0.0), (0.0, 0.15), (0.1, 0.1)])
def test_every_record_once_in_order_at_its_future_offset(
    proxied: FaultProxy, drop_response: float, reset_before: float
) -> None:
    topic = f"faults-{uuid.uuid4().hex[:6]}"
    with Admin({"bootstrap.servers": proxied.address}) as admin:
        admin.create_topic(topic, PARTITIONS)
    n = 4000
    config = {
        "bootstrap.servers": proxied.address,
        "linger.ms": 2,
        "batch.size": 600,  # many small batches: many requests to hit
        "request.timeout.ms": 3000,
        "retry.backoff.ms": 20,
        "delivery.timeout.ms": 60_000,
    }
    with Producer(config) as producer:
        proxied.set_faults(drop_response_rate=drop_response, reset_rate=reset_before)
        futures = {}
        for i in range(n):
            value = b"rec-%06d" % i
            futures[value] = producer.send(topic, value, b"key-%d" % (i % 11))
            if i % 500 == 499:
                time.sleep(0.02)  # let several requests be in flight at different points
        assert producer.flush(60) == 0
        proxied.set_faults()
        sent = {v: (f.result().partition, f.result().offset) for v, f in futures.items()}
    stats = proxied.stats
    assert stats.faults >= 5, stats
    assert stats.rewritten_responses > 0, stats
    _check_log(proxied.address, topic, sent, n)
