"""Compacted topics through real clients: created with ``cleanup.policy=compact`` by the
admin clients, keyless records refused with INVALID_RECORD, and a consumer reading a log the
broker's cleaner compacted (offset gaps, emptied batches) gets the last value of each key."""

from __future__ import annotations

import re
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT = 15.0
CLEANED = re.compile(r"cmp-0: cleaned offsets \d+-(\d+)")


def _create(bootstrap: str, name: str, configs: dict[str, str]) -> int | None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, num_partitions=1, replication_factor=1, config=configs)
    try:
        admin.create_topics([topic])[name].result(timeout=TIMEOUT)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def _produce(bootstrap: str, topic: str, items: list[tuple[bytes | None, bytes]]) -> list:  # type: ignore[type-arg]
    errors: list = []  # type: ignore[type-arg]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "retries": 0})
    for key, value in items:
        producer.produce(topic, value, key, on_delivery=lambda err, _msg: errors.append(err))
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0
    return errors


def test_compacted_topic_refuses_keyless_records_and_bad_configs(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory().start()
    assert _create(broker.bootstrap, "cmp", {"cleanup.policy": "compact"}) is None
    assert _create(broker.bootstrap, "bad", {"cleanup.policy": "shred"}) == (
        KafkaError.INVALID_CONFIG
    )
    assert _produce(broker.bootstrap, "cmp", [(b"k", b"v")]) == [None]
    errors = _produce(broker.bootstrap, "cmp", [(None, b"no key")])
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]
    # The policy is the topic's, durably: still refused after a restart.
    assert broker.stop() == 0
    broker.start()
    errors = _produce(broker.bootstrap, "cmp", [(None, b"no key")])
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]


def test_kafka_python_admin_creates_a_compacted_topic(broker_factory) -> None:  # type: ignore[no-untyped-def]
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    broker = broker_factory().start()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics(
            [KpNewTopic("kp-cmp", 1, 1, topic_configs={"cleanup.policy": "compact"})]
        )
    finally:
        admin.close()
    errors = _produce(broker.bootstrap, "kp-cmp", [(None, b"no key")])
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]


def _cleaned_up_to(log: list[str]) -> int:
    """The highest end offset of a "cmp-0: cleaned offsets A-B" line in the broker's log."""
    ends = [int(m.group(1)) for line in log if (m := CLEANED.search(line))]
    return max(ends, default=-1)


def test_a_consumer_reads_the_last_value_of_each_key_after_compaction(broker_factory) -> None:  # type: ignore[no-untyped-def]
    overrides = {
        "log.segment.bytes": str(1024 * 1024),
        "log.cleaner.backoff.ms": "100",
        "log.cleaner.min.cleanable.ratio": "0.01",
    }
    broker = broker_factory(overrides=overrides).start()
    assert _create(broker.bootstrap, "cmp", {"cleanup.policy": "compact"}) is None
    items = [(b"key-%d" % (i % 100), b"%d:" % i + b"x" * 200) for i in range(8000)]
    assert _produce(broker.bootstrap, "cmp", items) == [None] * len(items)
    # The active segment is never cleaned: wait until the cleaner has reached its base offset.
    # (How many records a segment holds depends on how the client batched them, so this is read
    # off the data directory rather than assumed.)
    active_base = max(int(f.stem) for f in (broker.data_dir / "cmp-0").glob("*.log"))
    assert active_base > 0  # at least one segment rolled, so there is something to clean
    deadline = time.monotonic() + 30
    while _cleaned_up_to(broker.log) < active_base and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _cleaned_up_to(broker.log) >= active_base
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "compacted-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe(["cmp"])
    seen: dict[bytes, tuple[int, bytes]] = {}
    count = 0
    try:
        last_offset = -1
        deadline = time.monotonic() + 30
        while last_offset < len(items) - 1 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            assert msg.offset() > last_offset
            last_offset = msg.offset()
            seen[msg.key()] = (msg.offset(), msg.value())
            count += 1
    finally:
        consumer.close()
    expected = {}
    for offset, (key, value) in enumerate(items):
        expected[key] = (offset, value)
    assert seen == expected  # the last value of each key, at the offset it was written at
    # and below the active segment only the last record of each of the 100 keys is left
    assert count <= 100 + (len(items) - active_base)
