"""Consumer.consume_arrow() against a samsa broker: the same rows as consume().

One topic gets plain, compressed, keyed and headered records and committed and aborted
transactions from samsa's producer; consumers read it with poll() and with consume_arrow()
under both isolation levels, and must see the same records, offsets and final positions.
Also: commits after consume_arrow, the fetch sent ahead while the caller holds the rows,
and the bound on what that prefetch may buffer.
"""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.client import Admin, Consumer, Producer, TopicPartition

T = 20.0
OVERRIDES = {
    "transaction.state.log.num.partitions": "2",
    "offsets.topic.num.partitions": "2",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    b = BrokerProcess(tmp_path_factory.mktemp("consume-arrow"), OVERRIDES).start()
    yield b.bootstrap
    b.stop()


def _topic(bootstrap: str, partitions: int = 2) -> str:
    name = f"arrow-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


@pytest.fixture(scope="module")
def mixed_topic(bootstrap: str) -> tuple[str, int]:
    """A topic with every kind of batch; returns it and the number of committed records."""
    topic = _topic(bootstrap)
    n = 0
    for codec in ("none", "gzip", "zstd"):
        with Producer({"bootstrap.servers": bootstrap, "compression.type": codec}) as p:
            for i in range(300):
                p.produce(
                    topic,
                    f"{codec}-{i}".encode() * (i % 7),
                    key=None if i % 5 == 0 else f"k{i}".encode(),
                    headers=[("h", str(i).encode()), ("n", None)] if i % 3 == 0 else None,
                )
                n += 1
            p.flush(T)
    txn = {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"}
    with Producer(txn) as p:
        p.init_transactions(T)
        for commit in (True, False, True):
            p.begin_transaction()
            for i in range(200):
                p.produce(topic, f"txn-{commit}-{i}".encode(), key=f"{i}".encode())
            p.flush(T)  # written, then aborted: read_uncommitted sees them
            if commit:
                p.commit_transaction(T)
                n += 200
            else:
                p.abort_transaction(T)
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(50):
            p.produce(topic, f"tail-{i}".encode())
        p.flush(T)
    return topic, n + 50


def _read(bootstrap: str, topic: str, isolation: str, how: str, expect: int) -> Any:
    cfg = {
        "bootstrap.servers": bootstrap,
        "isolation.level": isolation,
        # small fetches: many responses, fetched ahead while earlier ones are handed out
        "max.partition.fetch.bytes": "4096",
        "fetch.max.bytes": "1048576",
    }
    rows: list[tuple[Any, ...]] = []
    with Consumer(cfg) as c:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        c.assign(tps)
        c.seek_to_beginning()
        end = time.monotonic() + T
        while len(rows) < expect and time.monotonic() < end:
            if how == "poll":
                for r in c.poll(1.0, 97):
                    hdrs = [{"key": k, "value": v} for k, v in r.headers]
                    rows.append((r.partition, r.offset, r.key, r.value, r.timestamp, hdrs))
            else:
                b = c.consume_arrow(97, 1.0, include_headers=True)
                assert b.num_rows <= 97
                d = b.to_pydict()
                ts = [round(t.timestamp() * 1000) for t in d["timestamp"]]
                rows += zip(
                    d["partition"],
                    d["offset"],
                    d["key"],
                    d["value"],
                    ts,
                    d["headers"],
                    strict=True,
                )
            # what is buffered stays within the bound (checked on the loop's thread)
            core = c._core
            held = c._lt.run_sync(
                lambda core=core: (
                    [len(q) for q in core.fetcher.buffer.fetches.values()]
                    + [core.fetcher.buffer.size()]
                )
            )
            assert max(held[:-1], default=0) <= 2 and held[-1] <= 2 * 2 * 4096
        assert c.poll(0.3) == [] and c.consume_arrow(10, 0.3).num_rows == 0
        positions = {tp.partition: c.position(tp) for tp in tps}
    return sorted(rows), positions


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_consume_arrow_reads_what_consume_reads(
    bootstrap: str, mixed_topic: tuple[str, int], isolation: str
) -> None:
    topic, committed = mixed_topic
    expect = committed if isolation == "read_committed" else committed + 200
    polled, pos1 = _read(bootstrap, topic, isolation, "poll", expect)
    arrow, pos2 = _read(bootstrap, topic, isolation, "arrow", expect)
    assert len(polled) == expect
    assert arrow == polled
    assert pos1 == pos2
    values = {r[3] for r in polled}
    assert (b"txn-False-0" in values) == (isolation == "read_uncommitted")
    assert b"txn-True-199" in values and b"tail-49" in values


def test_commit_after_consume_arrow_and_fetch_ahead(bootstrap: str) -> None:
    topic = _topic(bootstrap, 1)
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(2000):
            p.produce(topic, b"%05d" % i, partition=0)
        p.flush(T)
    group = f"g-{topic}"
    cfg = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
        "max.partition.fetch.bytes": "8192",
    }
    tp = TopicPartition(topic, 0)
    with Consumer(cfg) as c:
        c.subscribe([topic])
        got = c.consume_arrow(10, T)
        end = time.monotonic() + T
        while got.num_rows == 0 and time.monotonic() < end:
            got = c.consume_arrow(10, 1.0)
        assert got.column("offset").to_pylist() == list(range(10))
        # the next Fetch was sent before consume_arrow returned: it answers meanwhile
        assert c._lt.run_sync(lambda: c._core.fetcher.fetching is not None)
        c.commit()
        assert c.committed([tp])[tp] == 10 == c.position(tp)
        c.seek(tp, 1500)
        assert c.consume_arrow(3, T).column("value").to_pylist() == [b"01500", b"01501", b"01502"]
    with Consumer(cfg) as c:  # a new member goes on from the commit
        c.subscribe([topic])
        rows = c.consume_arrow(5, T)
        end = time.monotonic() + T
        while rows.num_rows == 0 and time.monotonic() < end:
            rows = c.consume_arrow(5, 1.0)
        assert rows.column("offset").to_pylist() == [10, 11, 12, 13, 14]


def test_close_with_a_fetch_ahead_in_flight_leaves_nothing_unread(
    bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """close() cancels the round fetched ahead; the answer it no longer waits for (or the
    connection's closing error) must not surface as an unretrieved asyncio future."""
    topic = _topic(bootstrap, 1)
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(500):
            p.produce(topic, b"%05d" % i, partition=0)
        p.flush(T)
    cfg = {"bootstrap.servers": bootstrap, "max.partition.fetch.bytes": "1024"}
    for _ in range(3):
        with Consumer(cfg) as c:
            c.assign([TopicPartition(topic, 0)])
            c.seek(TopicPartition(topic, 0), 0)
            end = time.monotonic() + T
            while c.consume_arrow(10, 1.0).num_rows == 0 and time.monotonic() < end:
                pass
            assert c._lt.run_sync(lambda c=c: c._core.fetcher.fetching is not None)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
