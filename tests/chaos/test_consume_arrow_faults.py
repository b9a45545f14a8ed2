"""consume_arrow() through a fault proxy (lost responses, resets): exactly the committed
records, each once, in order, although fetches run ahead and answers go missing.

Committed and aborted transactions are written directly; a read_committed consumer with
tiny fetches (many requests to hit, fetched ahead) reads them through the proxy with
consume_arrow(), and another with poll() and consume_arrow() in turn.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from _broker import BrokerProcess
from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.testing import FaultProxy, Faults

PARTITIONS = 3
CLIENT = {
    "request.timeout.ms": 4000,
    "retry.backoff.ms": 20,
    "retry.backoff.max.ms": 200,
    "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 200,
    "default.api.timeout.ms": 30_000,
}
OVERRIDES = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("arrow-faults"), OVERRIDES).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def topic(broker: BrokerProcess) -> tuple[str, dict[int, list[bytes]]]:
    """A topic of committed and aborted transactions; the committed values per partition."""
    name = f"arrow-faults-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topic(name, PARTITIONS)
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    cfg = {"bootstrap.servers": broker.bootstrap, "transactional.id": f"t-{name}"}
    with Producer(cfg) as p:
        p.init_transactions(20)
        for t in range(8):
            commit = t % 3 != 1
            p.begin_transaction()
            for i in range(60):
                v = b"t%d-%03d" % (t, i)
                p.produce(name, v, partition=i % PARTITIONS)
                if commit:
                    expected[i % PARTITIONS].append(v)
            p.flush(20)
            if commit:
                p.commit_transaction(20)
            else:
                p.abort_transaction(20)
    return name, expected


@pytest.mark.parametrize(("seed", "mixed"), [(41, False), (42, True)])
def test_consume_arrow_exactly_once_through_faults(
    broker: BrokerProcess, topic: tuple[str, dict[int, list[bytes]]], seed: int, mixed: bool
) -> None:
    name, expected = topic
    n = sum(len(v) for v in expected.values())
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    faults = Faults(reset_rate=0.10, drop_response_rate=0.05)
    with FaultProxy(("127.0.0.1", broker.port), faults=faults, seed=seed).start() as proxy:
        config = {
            **CLIENT,
            "bootstrap.servers": proxy.address,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": 300,  # many small fetches: many requests to hit
        }
        with Consumer(config) as c:
            c.assign([TopicPartition(name, p) for p in range(PARTITIONS)])
            deadline = time.monotonic() + 60
            i = 0
            while sum(map(len, got.values())) < n and time.monotonic() < deadline:
                i += 1
                if mixed and i % 2:
                    for r in c.poll(0.2, 17):
                        assert r.value is not None
                        got[r.partition].append(r.value)
                else:
                    b = c.consume_arrow(17, 0.2)
                    for p, v in zip(
                        b.column("partition").to_pylist(),
                        b.column("value").to_pylist(),
                        strict=True,
                    ):
                        got[p].append(v)
            assert c.consume_arrow(100, 0.3).num_rows == 0  # nothing more may come
        assert proxy.stats.faults > 0, proxy.stats
    assert got == expected
