"""Broker settings under Kafka's names, and the durable producer-id allocator: ids are never
reused, across restarts too (docs/semantics.md, rule 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from samsa.broker.config import BrokerConfig, ConfigError, parse_properties
from samsa.broker.producer_ids import ProducerIdAllocator


def test_kafka_names_are_understood() -> None:
    props = parse_properties(
        "# comment\nnum.partitions=3\nlog.flush.interval.messages = 1\n"
        "auto.create.topics.enable=false\nlisteners=PLAINTEXT://127.0.0.1:9999\n"
    )
    c = BrokerConfig().with_properties(props)
    assert (c.num_partitions, c.log_flush_interval_messages, c.auto_create_topics_enable) == (
        3,
        1,
        False,
    )
    assert c.advertised == ("127.0.0.1", 9999)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        BrokerConfig().with_properties({"no.such.thing": "1"})
    with pytest.raises(ConfigError, match="not a valid"):
        BrokerConfig().with_properties({"num.partitions": "many"})


def test_producer_ids_never_reused_across_restarts(tmp_path: Path) -> None:
    first = ProducerIdAllocator(tmp_path, block_size=10)
    ids = [first.allocate() for _ in range(15)]
    # A crash right now: the new allocator starts past every block reserved so far.
    second = ProducerIdAllocator(tmp_path, block_size=10)
    later = [second.allocate() for _ in range(15)]
    assert len(set(ids + later)) == 30
    assert min(later) > max(ids)


def test_corrupt_producer_id_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "producer-ids").write_text("garbage")
    with pytest.raises(RuntimeError, match="corrupt"):
        ProducerIdAllocator(tmp_path)


def test_retention_settings_in_kafkas_units() -> None:
    c = BrokerConfig().with_properties({"log.retention.hours": "2", "log.retention.bytes": "4096"})
    assert (c.log_retention_ms, c.log_retention_bytes) == (7_200_000, 4096)
    assert BrokerConfig().with_properties({"log.retention.ms": "-1"}).log_retention_ms == -1
    assert BrokerConfig().log_retention_ms == 168 * 3_600_000


@pytest.mark.parametrize("flip", [0, 1, 5], ids=["first-digit", "last-digit", "checksum"])
def test_a_flipped_bit_in_the_producer_id_file_is_refused(tmp_path: Path, flip: int) -> None:
    ProducerIdAllocator(tmp_path, block_size=20).allocate()
    path = tmp_path / "producer-ids"
    data = bytearray(path.read_bytes())
    assert data.startswith(b"20 ")
    data[flip] ^= 0x01  # "30", "21" or a checksum digit off by one bit: all still parse
    path.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="checksum mismatch"):
        ProducerIdAllocator(tmp_path)


def test_a_producer_id_file_without_a_checksum_is_read_as_before(tmp_path: Path) -> None:
    (tmp_path / "producer-ids").write_text("4000\n")
    assert ProducerIdAllocator(tmp_path).allocate() == 4000
