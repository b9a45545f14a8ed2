"""Topic configs that act on each append, through confluent-kafka (docs/semantics.md):
compression.type re-encodes what producers send (rule 39), min.insync.replicas refuses acks=all
(rule 40), CreateTime windows refuse out-of-range timestamps (rule 41); the admin client and
`samsa configs` round-trip the keys (rules 39-43)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic

from samsa.protocol.records import Compression, RecordBatchView, scan_batches

TIMEOUT = 15.0


def _create(bootstrap: str, name: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(TIMEOUT)


def _consume(bootstrap: str, topic: str, n: int, **extra: Any) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False, **extra}
    )
    consumer.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
    out: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(out) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(msg.value())
        # Nothing more arrives (read_committed must not show aborted records late).
        extra_msg = consumer.poll(0.5)
        assert extra_msg is None or extra_msg.error() is not None, extra_msg.value()
    finally:
        consumer.close()
    return out


def _on_disk(data_dir: Path, topic: str) -> list[RecordBatchView]:
    """The partition's batches as samsa's log reader scans its segment files."""
    batches: list[RecordBatchView] = []
    for path in sorted((data_dir / f"{topic}-0").glob("*.log")):
        scan = scan_batches(path.read_bytes())
        assert scan.problem is None
        batches += scan.batches
    return batches


def test_lz4_from_confluent_is_stored_as_zstd_and_read_back(shared_broker: Any) -> None:
    """Rule 38: a compression.type=zstd topic stores zstd whatever the producer sent."""
    bootstrap = shared_broker.bootstrap
    _create(bootstrap, "zstd-topic", {"compression.type": "zstd"})
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5})
    sent = [b"value %d " % i * 20 for i in range(200)]
    for value in sent:
        producer.produce("zstd-topic", value)
    assert producer.flush(TIMEOUT) == 0
    assert _consume(bootstrap, "zstd-topic", len(sent)) == sent
    batches = _on_disk(shared_broker.data_dir, "zstd-topic")
    assert batches and {b.compression for b in batches} == {Compression.ZSTD}
    assert sum(b.record_count for b in batches) == len(sent)
    assert all(b.crc_is_valid() for b in batches)


def test_transactions_through_a_re_encoding_topic(shared_broker: Any) -> None:
    """Rule 38: transactional batches keep their flag and producer fields when re-encoded, so
    read_committed sees committed records only."""
    bootstrap = shared_broker.bootstrap
    _create(bootstrap, "gzip-txn", {"compression.type": "gzip"})
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "lz4",
            "transactional.id": "recompress-txn",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(TIMEOUT)
    for label, commit in ((b"a", True), (b"b", False), (b"c", True)):
        producer.begin_transaction()
        for i in range(10):
            producer.produce("gzip-txn", label + b"%d" % i)
        if commit:
            producer.commit_transaction(TIMEOUT)
        else:
            producer.abort_transaction(TIMEOUT)
    committed = [label + b"%d" % i for label in (b"a", b"c") for i in range(10)]
    got = _consume(bootstrap, "gzip-txn", 20, **{"isolation.level": "read_committed"})
    assert got == committed
    data = [b for b in _on_disk(shared_broker.data_dir, "gzip-txn") if not b.is_control]
    assert data and all(b.is_transactional and b.compression == Compression.GZIP for b in data)
    assert all(b.producer_id >= 0 and b.base_sequence >= 0 for b in data)


def test_uncompressed_and_producer_topics(shared_broker: Any) -> None:
    """Rule 38: 'uncompressed' stores no codec; 'producer' (the default) keeps the producer's."""
    bootstrap = shared_broker.bootstrap
    _create(bootstrap, "plain-topic", {"compression.type": "uncompressed"})
    _create(bootstrap, "as-sent", {})
    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": "snappy", "linger.ms": 5}
    )
    for topic in ("plain-topic", "as-sent"):
        for i in range(50):
            producer.produce(topic, b"x%d" % i * 30)
    assert producer.flush(TIMEOUT) == 0
    assert _consume(bootstrap, "plain-topic", 50) == [b"x%d" % i * 30 for i in range(50)]
    assert {b.compression for b in _on_disk(shared_broker.data_dir, "plain-topic")} == {
        Compression.NONE
    }
    assert {b.compression for b in _on_disk(shared_broker.data_dir, "as-sent")} == {
        Compression.SNAPPY
    }


def _deliver(bootstrap: str, topic: str, acks: str) -> list[Any]:
    """The delivery reports of three records sent with ``acks``: errors or None."""
    reports: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "enable.idempotence": False,
            # NOT_ENOUGH_REPLICAS is retriable: no retries, so the callback sees it (with
            # retries, librdkafka reports the message timeout instead), and a bound anyway.
            "retries": 0,
            "message.timeout.ms": 5000,
            "linger.ms": 0,
        }
    )
    for i in range(3):
        producer.produce(topic, b"m%d" % i, on_delivery=lambda err, _msg: reports.append(err))
    producer.flush(TIMEOUT)
    return reports


def test_min_insync_replicas_with_confluent_acks(shared_broker: Any) -> None:
    """Rule 39: acks=all to a min.insync.replicas=2 topic fails with NOT_ENOUGH_REPLICAS (a
    retriable error); acks=1 succeeds."""
    bootstrap = shared_broker.bootstrap
    _create(bootstrap, "misr", {"min.insync.replicas": "2"})
    failed = _deliver(bootstrap, "misr", "all")
    assert [err.code() if err else None for err in failed] == [KafkaError.NOT_ENOUGH_REPLICAS] * 3
    assert _deliver(bootstrap, "misr", "1") == [None, None, None]
    assert _consume(bootstrap, "misr", 3) == [b"m0", b"m1", b"m2"]


def test_out_of_window_timestamps_are_refused(shared_broker: Any) -> None:
    """Rule 40: confluent-kafka producing a two-day-old and a two-hour-ahead timestamp to a
    topic with message.timestamp.before.max.ms of a day gets INVALID_TIMESTAMP for both."""
    bootstrap = shared_broker.bootstrap
    _create(bootstrap, "window", {"message.timestamp.before.max.ms": "86400000"})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    reports: dict[bytes, Any] = {}
    now = int(time.time() * 1000)
    for value, ts in ((b"old", now - 2 * 86_400_000), (b"ahead", now + 7_200_000), (b"now", now)):
        producer.produce(
            "window",
            value,
            timestamp=ts,
            on_delivery=lambda err, msg: reports.__setitem__(msg.value(), err),
        )
        producer.flush(TIMEOUT)  # one batch each
    codes = {v: (err.code() if err else None) for v, err in reports.items()}
    assert codes == {
        b"old": KafkaError.INVALID_TIMESTAMP,
        b"ahead": KafkaError.INVALID_TIMESTAMP,
        b"now": None,
    }
    assert _consume(bootstrap, "window", 1) == [b"now"]


def test_confluent_admin_round_trips_kafkas_keys(shared_broker: Any) -> None:
    """Rules 27 and 38-42: CreateTopics with a mix of the keys, then DescribeConfigs shows
    each as the topic's own value, and Kafka's defaults for the rest; tiered storage refused."""
    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    mix = {
        "compression.type": "lz4",
        "compression.lz4.level": "12",
        "min.insync.replicas": "1",
        "message.timestamp.after.max.ms": "60000",
        "flush.messages": "10",
        "unclean.leader.election.enable": "true",
        "leader.replication.throttled.replicas": "0:0",
        "remote.copy.lag.bytes": "-1",
        "preallocate": "true",
        "segment.jitter.ms": "1000",
        "file.delete.delay.ms": "0",
        "remote.storage.enable": "false",
    }
    admin.create_topics([NewTopic("mix", 1, 1, config=mix)])["mix"].result(TIMEOUT)
    res = ConfigResource("topic", "mix")
    described = admin.describe_configs([res])[res].result(TIMEOUT)
    for name, value in mix.items():
        entry = described[name]
        assert (entry.value, entry.source) == (value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    for name, value in (("compression.zstd.level", "3"), ("local.retention.ms", "-2")):
        assert (described[name].value, described[name].source) == (
            value,
            ConfigSource.DEFAULT_CONFIG.value,
        )
    futures = admin.create_topics(
        [NewTopic("tiered", 1, 1, config={"remote.storage.enable": "true"})]
    )
    with pytest.raises(KafkaException) as info:
        futures["tiered"].result(TIMEOUT)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "no tiered storage" in info.value.args[0].str()


def _samsa(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "samsa", *args, "--bootstrap-server", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_samsa_configs_alters_the_codec_of_a_live_topic(shared_broker: Any) -> None:
    """Rule 38 with rule 28: `samsa configs --alter --add-config compression.type=zstd` applies
    to the next append of an existing topic."""
    bootstrap = shared_broker.bootstrap
    _create(bootstrap, "later-zstd", {})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    producer.produce("later-zstd", b"before" * 20)
    assert producer.flush(TIMEOUT) == 0
    entity = ["configs", "--entity-type", "topics", "--entity-name", "later-zstd"]
    out = _samsa(bootstrap, *entity, "--alter", "--add-config", "compression.type=zstd")
    assert out.returncode == 0, out.stderr
    assert (
        "  compression.type=zstd sensitive=false" in _samsa(bootstrap, *entity, "--describe").stdout
    )
    producer.produce("later-zstd", b"after" * 20)
    assert producer.flush(TIMEOUT) == 0
    codecs = [b.compression for b in _on_disk(shared_broker.data_dir, "later-zstd")]
    assert codecs == [Compression.NONE, Compression.ZSTD]
    assert _consume(bootstrap, "later-zstd", 2) == [b"before" * 20, b"after" * 20]
