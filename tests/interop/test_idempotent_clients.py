"""Idempotent producers of three real client libraries against samsa, read back by all three.

Each library creates its own 3-partition topic (through its admin API), produces keyed
records with idempotence on, and collects the (partition, offset) of every delivery report.
Then every library's consumer, in assign mode (no group), reads each topic back: every record
exactly once, in production order per partition, at the offset its delivery report gave.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as CkNewTopic

from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import decode_records, iter_batches
from samsa.testing import fetch_request

N_RECORDS = 3000
PARTITIONS = 3
LIBS = ("confluent", "kafka-python", "aiokafka")
IO_TIMEOUT = 30.0

# (offset, key, value) in production order, per partition
Expected = dict[int, list[tuple[int, bytes, bytes]]]


@dataclass
class Produced:
    lib: str
    topic: str
    expected: Expected


def _key(i: int) -> bytes:
    return b"key-%d" % (i % 41)


def _value(lib: str, i: int) -> bytes:
    return b"%s-%06d" % (lib.encode(), i)


# --- producers: each returns [(partition, offset)] indexed like the records sent ----------


def _produce_confluent(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [CkNewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]
    )
    futures[topic].result(timeout=IO_TIMEOUT)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 30_000,
        }
    )
    acks: list[tuple[int, int] | None] = [None] * N_RECORDS
    errors: list[tuple[int, object]] = []

    def report(i: int) -> Callable[[object, object], None]:
        def on_delivery(err: object, msg: object) -> None:
            if err is not None:
                errors.append((i, err))
            else:
                acks[i] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

        return on_delivery

    for i in range(N_RECORDS):
        producer.produce(topic, key=_key(i), value=_value("confluent", i), on_delivery=report(i))
        if i % 200 == 0:
            producer.poll(0)
    assert producer.flush(IO_TIMEOUT) == 0, "confluent-kafka flush timed out"
    assert errors == []
    assert all(a is not None for a in acks)
    return [a for a in acks if a is not None]


def _produce_kafka_python(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)], timeout_ms=10_000)
    finally:
        admin.close()

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        request_timeout_ms=10_000,
    )
    try:
        futures = [
            producer.send(topic, key=_key(i), value=_value("kafka-python", i))
            for i in range(N_RECORDS)
        ]
        producer.flush(timeout=IO_TIMEOUT)
        metas = [f.get(timeout=IO_TIMEOUT) for f in futures]
    finally:
        producer.close(timeout=5)
    return [(m.partition, m.offset) for m in metas]


def _produce_aiokafka(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run() -> list[tuple[int, int]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, PARTITIONS, 1)], timeout_ms=10_000)
        finally:
            await admin.close()
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=10_000,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(topic, key=_key(i), value=_value("aiokafka", i))
                for i in range(N_RECORDS)
            ]
            await producer.flush()
            metas = await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return [(m.partition, m.offset) for m in metas]

    return asyncio.run(asyncio.wait_for(run(), IO_TIMEOUT))


PRODUCERS = {
    "confluent": _produce_confluent,
    "kafka-python": _produce_kafka_python,
    "aiokafka": _produce_aiokafka,
}


# --- consumers: assign mode, read every partition from the beginning ---------------------


def _consume_confluent(bootstrap: str, topic: str, counts: dict[int, int]) -> Expected:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused-assign-only",  # required by librdkafka; nothing uses the group
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
        }
    )
    got: Expected = {p: [] for p in counts}
    try:
        consumer.assign([CkTopicPartition(topic, p, OFFSET_BEGINNING) for p in counts])
        deadline = time.monotonic() + IO_TIMEOUT
        while any(len(got[p]) < counts[p] for p in counts) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                assert msg.error() is None, msg.error()
                got[msg.partition()].append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return got


def _consume_kafka_python(bootstrap: str, topic: str, counts: dict[int, int]) -> Expected:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=10_000,
    )
    got: Expected = {p: [] for p in counts}
    try:
        tps = [TopicPartition(topic, p) for p in counts]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + IO_TIMEOUT
        while any(len(got[p]) < counts[p] for p in counts) and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend((m.offset, m.key, m.value) for m in msgs)
    finally:
        consumer.close()
    return got


def _consume_aiokafka(bootstrap: str, topic: str, counts: dict[int, int]) -> Expected:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> Expected:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=10_000,
        )
        await consumer.start()
        got: Expected = {p: [] for p in counts}
        try:
            tps = [TopicPartition(topic, p) for p in counts]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while any(len(got[p]) < counts[p] for p in counts):
                for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                    got[tp.partition].extend((m.offset, m.key, m.value) for m in msgs)
        finally:
            await consumer.stop()
        return got

    try:
        return asyncio.run(asyncio.wait_for(run(), IO_TIMEOUT))
    except TimeoutError:
        pytest.fail("aiokafka consumer did not read every record in time")


CONSUMERS = {
    "confluent": _consume_confluent,
    "kafka-python": _consume_kafka_python,
    "aiokafka": _consume_aiokafka,
}


# --- raw views of the log ------------------------------------------------------------------


def _raw_partition(port: int, topic: str, partition: int) -> tuple[int, list]:  # type: ignore[type-arg]
    """(high watermark, every batch view) of a partition, by raw Fetch."""
    batches = []
    offset = 0
    with BlockingConnection("127.0.0.1", port) as conn:
        while True:
            resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, partition): offset}))
            part = resp.responses[0].partitions[0]
            assert part.error_code == ErrorCode.NONE
            hw = int(part.high_watermark)
            new = list(iter_batches(part.records or b""))
            batches.extend(new)
            if new:
                offset = new[-1].next_offset
            if offset >= hw:
                return hw, batches
            assert new, f"fetch at {offset} below high watermark {hw} returned nothing"


@pytest.fixture(scope="module", params=LIBS)
def produced(request: pytest.FixtureRequest, shared_broker) -> Produced:  # type: ignore[no-untyped-def]
    lib: str = request.param
    topic = f"idem-{lib}"
    acks = PRODUCERS[lib](shared_broker.bootstrap, topic)
    assert len(acks) == N_RECORDS
    expected: Expected = {p: [] for p in range(PARTITIONS)}
    for i, (partition, offset) in enumerate(acks):
        expected[partition].append((offset, _key(i), _value(lib, i)))
    return Produced(lib, topic, expected)


@pytest.mark.timeout(60)
def test_delivery_reports_are_dense_and_in_order(produced: Produced, shared_broker) -> None:  # type: ignore[no-untyped-def]
    """Per partition, offsets in production order are 0, 1, 2, ... and the log ends there."""
    for partition, records in produced.expected.items():
        assert records, f"no record went to partition {partition}"
        assert [o for o, _, _ in records] == list(range(len(records)))
        hw, batches = _raw_partition(shared_broker.port, produced.topic, partition)
        assert hw == len(records)
        # one idempotent producer per topic, sequences dense from 0 per partition
        pids = {b.producer_id for b in batches}
        assert len(pids) == 1 and next(iter(pids)) >= 0
        assert {b.producer_epoch for b in batches} == {0}
        assert [b.base_sequence for b in batches] == [b.base_offset for b in batches]
        decoded = [(r.offset, r.key, r.value) for b in batches for r in decode_records(b)]
        assert decoded == records


@pytest.mark.timeout(60)
@pytest.mark.parametrize("consumer", LIBS)
def test_every_client_reads_back_exactly_once_in_order(
    produced: Produced,
    consumer: str,
    shared_broker,  # type: ignore[no-untyped-def]
) -> None:
    counts = {p: len(r) for p, r in produced.expected.items()}
    got = CONSUMERS[consumer](shared_broker.bootstrap, produced.topic, counts)
    for partition, records in produced.expected.items():
        assert len(got[partition]) == len(records), (
            f"{consumer} read {len(got[partition])} of {len(records)} records of "
            f"{produced.topic}-{partition}"
        )
        assert got[partition] == records


def _describe_producers(port: int, topic: str, partitions: list[int]) -> list:  # type: ignore[type-arg]
    req = make_request(
        ApiKey.DESCRIBE_PRODUCERS,
        0,
        "DescribeProducersRequest",
        topics=(
            make_request(
                ApiKey.DESCRIBE_PRODUCERS,
                0,
                "TopicRequest",
                name=topic,
                partition_indexes=tuple(partitions),
            ),
        ),
    )
    with BlockingConnection("127.0.0.1", port) as conn:
        resp = conn.request(ApiKey.DESCRIBE_PRODUCERS, 0, req)
    assert [t.name for t in resp.topics] == [topic]
    return list(resp.topics[0].partitions)


@pytest.mark.timeout(60)
def test_confluent_idempotent_producer_state_in_describe_producers(shared_broker) -> None:  # type: ignore[no-untyped-def]
    topic = "idem-describe"
    bootstrap = shared_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([CkNewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(
        timeout=IO_TIMEOUT
    )
    sent = {0: 10, 1: 7}  # partition 2 gets nothing
    pids = []
    for run in range(2):  # two producer instances: two producer ids
        producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2}
        )
        errors: list[object] = []

        def on_delivery(err: object, _msg: object, errors: list[object] = errors) -> None:
            if err is not None:
                errors.append(err)

        for partition, n in sent.items():
            for i in range(n):
                producer.produce(
                    topic,
                    value=b"%d-%d-%d" % (run, partition, i),
                    partition=partition,
                    timestamp=1_700_000_000_000 + run * 1000 + i,
                    on_delivery=on_delivery,
                )
        assert producer.flush(IO_TIMEOUT) == 0
        assert errors == []
        _, batches = _raw_partition(shared_broker.port, topic, 0)
        pids.append(batches[-1].producer_id)
    assert pids[0] != pids[1] and min(pids) >= 0

    parts = _describe_producers(shared_broker.port, topic, [0, 1, 2, 7])
    by_index = {p.partition_index: p for p in parts}
    assert set(by_index) == {0, 1, 2, 7}
    assert by_index[7].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert by_index[2].error_code == ErrorCode.NONE
    assert by_index[2].active_producers == ()
    for partition, n in sent.items():
        p = by_index[partition]
        assert p.error_code == ErrorCode.NONE
        _, batches = _raw_partition(shared_broker.port, topic, partition)
        states = sorted(p.active_producers, key=lambda s: s.producer_id)
        assert [s.producer_id for s in states] == sorted(pids)
        for s in states:
            mine = [b for b in batches if b.producer_id == s.producer_id]
            assert int(s.producer_epoch) == 0
            assert int(s.last_sequence) == n - 1  # sequences count records, from 0
            assert int(s.last_timestamp) == mine[-1].max_timestamp
            assert int(s.current_txn_start_offset) == -1
            assert int(s.coordinator_epoch) == -1

    # The same view through kafka-python's admin client.
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KpTopicPartition

    kp_admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        tps = [KpTopicPartition(topic, p) for p in range(3)]
        described = kp_admin.describe_producers(tps)
    finally:
        kp_admin.close()
    for tp in tps:
        raw = by_index[tp.partition].active_producers
        assert sorted(
            (s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp)
            for s in described[tp].active_producers
        ) == sorted(
            (int(s.producer_id), int(s.producer_epoch), int(s.last_sequence), int(s.last_timestamp))
            for s in raw
        )
