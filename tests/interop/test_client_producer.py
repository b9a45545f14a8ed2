"""samsa's per-record producer against a samsa broker: what produce() promises.

* produce() returns nothing; on_delivery runs in the caller's thread, from poll()/flush();
* records keep their order per partition whatever mix of plain and explicit-partition,
  keyed and unkeyed, headers or not, crosses the loop thread in one burst;
* buffer.memory bounds what the producer holds: a caller faster than the broker blocks up to
  max.block.ms, then gets BufferExhaustedError, and every record it had accepted is still
  delivered once the broker answers again;
* a bad record raises in produce() and costs no other record.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

from samsa.client import (
    Admin,
    BufferExhaustedError,
    KafkaError,
    Producer,
    RecordMetadata,
    partition_for_key,
)
from samsa.testing import read_topic


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"prod-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


def test_produce_returns_nothing_and_callbacks_run_in_poll_and_flush(shared_broker: Any) -> None:
    topic = _topic(shared_broker.bootstrap, 2)
    seen: list[tuple[int, BaseException | None, RecordMetadata | None]] = []
    main = threading.get_ident()
    with Producer({"bootstrap.servers": shared_broker.bootstrap, "linger.ms": 0}) as p:

        def cb(err: BaseException | None, md: RecordMetadata | None) -> None:
            seen.append((threading.get_ident(), err, md))

        assert p.produce(topic, b"first", partition=0, on_delivery=cb) is None
        fut = p.send(topic, b"second", partition=0, on_delivery=cb)
        assert fut.result(15).offset == 1
        assert seen == []  # delivered, but callbacks wait for poll()/flush()
        assert p.poll(5) == 2
        p.produce(topic, b"third", b"k", on_delivery=cb)
        assert p.flush(15) == 0
        assert len(p) == 0
    assert [t for t, _, _ in seen] == [main] * 3
    assert [e for _, e, _ in seen] == [None] * 3
    mds = [md for _, _, md in seen]
    assert [(m.partition, m.offset) for m in mds[:2]] == [(0, 0), (0, 1)]  # type: ignore[union-attr]
    assert mds[2].partition == partition_for_key(b"k", 2)  # type: ignore[union-attr]


def test_order_per_partition_holds_for_any_mix_of_records(shared_broker: Any) -> None:
    partitions, n = 3, 12_000
    topic = _topic(shared_broker.bootstrap, partitions)
    failed: list[BaseException] = []

    def cb(err: BaseException | None, _md: RecordMetadata | None) -> None:
        if err is not None:
            failed.append(err)

    expected: dict[int, list[bytes]] = defaultdict(list)
    config = {"bootstrap.servers": shared_broker.bootstrap, "batch.size": 4096}
    with Producer(config) as p:
        for i in range(n):
            value = b"%06d" % i
            kind = i % 5
            if kind == 0:  # explicit partition, headers
                part = i % partitions
                p.produce(topic, value, partition=part, headers=[("i", value)])
                expected[part].append(value)
            elif kind == 1:  # keyed, with a delivery callback
                key = b"k%d" % (i % 11)
                p.produce(topic, value, key, on_delivery=cb)
                expected[partition_for_key(key, partitions)].append(value)
            elif kind == 2:  # explicit partition given with a key too: the partition wins
                p.produce(topic, value, b"x", partition=2, timestamp=1_000 + i)
                expected[2].append(value)
            else:  # keyed, plain (the inline path)
                key = b"q%d" % (i % 13)
                p.produce(topic, value, key)
                expected[partition_for_key(key, partitions)].append(value)
        assert p.flush(60) == 0
        # the byte accounting came back to zero: nothing is held any more
        assert p._core.buffer.held() == 0
    assert failed == []
    records = read_topic(shared_broker.bootstrap, topic, timeout=60)
    got: dict[int, list[bytes]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        got[r.partition].append(r.value)
        i = int(r.value)
        if i % 5 == 0:
            assert r.headers == (("i", r.value),)
        elif i % 5 == 2:
            assert r.timestamp == 1_000 + i
    assert got == expected


def test_buffer_memory_blocks_then_raises_and_loses_nothing(broker: Any) -> None:
    topic = _topic(broker.bootstrap, 1)
    value = b"v" * 1000
    config = {
        "bootstrap.servers": broker.bootstrap,
        "buffer.memory": 50_000,
        "max.block.ms": 600,
        "linger.ms": 0,
    }
    delivered: list[int] = []
    with Producer(config) as p:
        p.send(topic, b"warm-up").result(15)  # metadata and connection are in place
        broker.proc.send_signal(signal.SIGSTOP)  # the broker stops answering
        try:
            accepted = 0
            t0 = time.monotonic()
            with pytest.raises(BufferExhaustedError, match=r"buffer\.memory"):
                for i in range(1000):
                    p.produce(
                        topic,
                        value,
                        on_delivery=lambda e, md, i=i: delivered.append(i) if e is None else None,
                    )
                    accepted += 1
            blocked = time.monotonic() - t0
            # Held: at most buffer.memory, counting each record's ~1 KB (and its framing)
            assert 0 < accepted <= 50_000 // 1000
            assert 0.55 <= blocked < 1.4  # max.block.ms, and not much more
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        # room again once the broker answers: produce() goes on, nothing was lost
        p.produce(topic, b"after", on_delivery=lambda e, md: delivered.append(-1))
        assert p.flush(30) == 0
    assert delivered == [*range(accepted), -1]
    values = [r.value for r in read_topic(broker.bootstrap, topic)]
    assert values == [b"warm-up", *[value] * accepted, b"after"]


def test_a_record_larger_than_buffer_memory_fails_at_once(shared_broker: Any) -> None:
    topic = _topic(shared_broker.bootstrap, 1)
    config = {"bootstrap.servers": shared_broker.bootstrap, "buffer.memory": 10_000}
    with Producer(config) as p:
        t0 = time.monotonic()
        with pytest.raises(KafkaError, match=r"MESSAGE_TOO_LARGE.*buffer\.memory"):
            p.produce(topic, b"x" * 20_000)
        assert time.monotonic() - t0 < 1  # no waiting for room that can never come
        p.produce(topic, b"small")
        assert p.flush(15) == 0


def test_a_bad_record_raises_in_produce_and_costs_no_other(shared_broker: Any) -> None:
    topic = _topic(shared_broker.bootstrap, 1)
    with Producer({"bootstrap.servers": shared_broker.bootstrap}) as p:
        p.produce(topic, b"before")
        with pytest.raises(TypeError, match="value"):
            p.produce(topic, 42)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="header"):
            p.produce(topic, b"v", headers=[("h", 3.5)])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="timestamp"):
            p.produce(topic, b"v", timestamp=-5)
        p.produce(topic, "after")
        assert p.flush(15) == 0
    assert [r.value for r in read_topic(shared_broker.bootstrap, topic)] == [b"before", b"after"]
