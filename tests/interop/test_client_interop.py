"""samsa's client against samsa and against Tansu, cross-checked with confluent-kafka.

* idempotent round trip: every record once, in order, at the offset its future gave;
* keys land on the partitions confluent-kafka's Java-compatible partitioner
  (``murmur2_random``) picks for the same keys;
* every compression codec written by samsa's producer is read back by confluent-kafka.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import Producer as CkProducer
from confluent_kafka import TopicPartition as CkTP

from samsa.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import Compression, NewRecord, build_batch, iter_batches
from samsa.testing import fetch_request, produce_one


@pytest.fixture(params=["samsa", "tansu"])
def bootstrap(request: pytest.FixtureRequest) -> str:
    if request.param == "samsa":
        return str(request.getfixturevalue("shared_broker").bootstrap)
    return str(request.getfixturevalue("tansu"))


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"client-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


def read_all(
    bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 30
) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            out += c.poll(0.5)
        out += c.poll(0.3)  # anything beyond the expected count is a duplicate
    return out


def test_idempotent_round_trip(bootstrap: str) -> None:
    topic = _topic(bootstrap, 3)
    n = 3000
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
        futures = [
            p.send(topic, b"v-%05d" % i, b"k-%d" % (i % 37), headers=[("i", b"%d" % i)])
            for i in range(n)
        ]
        assert p.flush(30) == 0
        meta = [f.result() for f in futures]
        assert p.producer_id >= 0
    records = read_all(bootstrap, topic, 3, n)
    assert len(records) == n
    by_value = {r.value: r for r in records}
    assert len(by_value) == n
    for i, md in enumerate(meta):
        r = by_value[b"v-%05d" % i]
        assert (r.partition, r.offset) == (md.partition, md.offset)
        assert r.key == b"k-%d" % (i % 37) and r.headers == (("i", b"%d" % i),)
    for part in range(3):
        got = [int(r.value[2:]) for r in records if r.partition == part]
        assert got == sorted(got)  # production order within a partition


def test_keys_land_where_confluent_puts_them(bootstrap: str) -> None:
    topic = _topic(bootstrap, 7)
    keys = [b"user-%d" % i for i in range(200)] + [b"", b"x", b"\xff\x00\x01"]
    ck = CkProducer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
        }
    )
    placed: dict[bytes, int] = {}

    def report(err: object, msg: object) -> None:
        assert err is None, err
        placed[msg.key()] = msg.partition()  # type: ignore[attr-defined]

    for k in keys:
        ck.produce(topic, b"ck", key=k, on_delivery=report)
    assert ck.flush(30) == 0
    with Producer({"bootstrap.servers": bootstrap}) as p:
        ours = {k: p.send(topic, b"samsa", k) for k in keys}
        p.flush(30)
    for k in keys:
        if k == b"":
            continue  # librdkafka treats an empty key like a missing one (random)
        assert ours[k].result().partition == placed[k], k


def _stored_batches(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    """(compression codec, record count) of each batch of partition 0, as the broker stores
    and serves it (a raw Fetch: no client decompresses anything)."""
    host, port = bootstrap.rsplit(":", 1)
    with BlockingConnection(host, int(port)) as conn:
        # Tansu answers a Fetch with max wait 0 with no partitions at all; data is there, so
        # a longer wait returns at once.
        resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): 0}, max_wait_ms=500))
    part = resp.responses[0].partitions[0]
    assert part.error_code == 0, part
    return [(b.compression, b.record_count) for b in iter_batches(part.records or b"")]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_read_by_confluent(bootstrap: str, codec: str) -> None:
    topic = _topic(bootstrap, 1)
    values = [b"%s record %d " % (codec.encode(), i) * 5 for i in range(500)]
    with Producer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20}
    ) as p:
        futures = [p.send(topic, v) for v in values]
        p.flush(30)
        offsets = [f.result().offset for f in futures]
    assert offsets == list(range(500))
    batches = _stored_batches(bootstrap, topic)
    assert {c for c, _ in batches} == {getattr(Compression, codec.upper())}, batches
    assert sum(n for _, n in batches) == 500
    c = CkConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        c.assign([CkTP(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < len(values) and time.monotonic() < deadline:
            for m in c.consume(500, 1.0):
                assert m.error() is None, m.error()
                got.append(m.value())
    finally:
        c.close()
    assert got == values


def test_producer_auto_creates_topics_like_javas(shared_broker) -> None:  # type: ignore[no-untyped-def]
    """The broker auto-creates only for Metadata (as Kafka): a raw Produce to a new topic is
    UNKNOWN_TOPIC_OR_PARTITION and leaves it uncreated; the producer asks Metadata first."""
    topic = f"auto-{uuid.uuid4().hex[:8]}"
    with BlockingConnection("127.0.0.1", shared_broker.port) as conn:
        code, _ = produce_one(conn, topic, 0, build_batch([NewRecord(b"v")]))
    assert code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    config = {"bootstrap.servers": shared_broker.bootstrap, "linger.ms": 0}
    with Producer(config) as p:
        meta = p.send(topic, value=b"v").result(timeout=15)
    assert (meta.partition, meta.offset) == (0, 0)
    with Producer({**config, "allow.auto.create.topics": False, "max.block.ms": 1000}) as p:
        with pytest.raises(Exception, match="UNKNOWN_TOPIC_OR_PARTITION"):
            p.send(f"{topic}-no", value=b"v").result(timeout=15)
