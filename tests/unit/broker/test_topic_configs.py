"""Topic configs given at creation: validated, persisted with the topic, applied to its logs;
the internal topics are always compacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from samsa.broker.config import BrokerConfig, ConfigError
from samsa.broker.topics import TopicError, TopicManager
from samsa.log.log import LogConfig
from samsa.protocol.errors import ErrorCode

NOW = 1_800_000_000_000


def test_configs_are_persisted_and_applied_after_a_restart(tmp_path: Path) -> None:
    topics = TopicManager(tmp_path, LogConfig())
    configs = {"cleanup.policy": "compact,delete", "delete.retention.ms": "1000"}
    created = topics.create("t", 2, NOW, configs)
    assert created.configs == configs
    assert all(p.log.config.compact and p.log.config.delete for p in created.partitions)
    plain = topics.create("plain", 1, NOW)
    assert not plain.partitions[0].log.config.compact
    topics.close(NOW)
    again = TopicManager(tmp_path, LogConfig())
    again.load(NOW)
    for p in again.topics["t"].partitions:
        assert p.log.config.cleanup_policy == "compact,delete"
        assert p.log.config.delete_retention_ms == 1000
    assert again.topics["plain"].partitions[0].log.config.cleanup_policy == "delete"
    again.close(NOW)


@pytest.mark.parametrize(
    ("configs", "words"),
    [
        ({"cleanup.policy": "shred"}, "cleanup.policy"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "between 0 and 1"),
        ({"delete.retention.ms": "-5"}, "at least 0"),
        ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, "larger than"),
    ],
)
def test_invalid_values_are_refused_and_nothing_is_created(
    tmp_path: Path, configs: dict[str, str], words: str
) -> None:
    topics = TopicManager(tmp_path, LogConfig())
    with pytest.raises(TopicError) as info:
        topics.create("t", 1, NOW, configs)
    assert info.value.code == ErrorCode.INVALID_CONFIG and words in str(info.value)
    assert "t" not in topics.topics and not list(tmp_path.iterdir())


def test_internal_topics_are_always_compacted(tmp_path: Path) -> None:
    topics = TopicManager(tmp_path, LogConfig())
    for name in ("__consumer_offsets", "__transaction_state"):
        topic = topics.create(name, 1, NOW, {"cleanup.policy": "delete"})
        assert topic.partitions[0].log.config.cleanup_policy == "compact"
    topics.close(NOW)


def test_internal_topics_take_their_own_segment_size(tmp_path: Path) -> None:
    sizes = {"__consumer_offsets": 2048, "__transaction_state": 4096}
    topics = TopicManager(tmp_path, LogConfig(segment_bytes=1 << 30), sizes)
    for name, size in sizes.items():
        assert topics.create(name, 1, NOW).partitions[0].log.config.segment_bytes == size
    assert topics.create("user", 1, NOW).partitions[0].log.config.segment_bytes == 1 << 30
    topics.close(NOW)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("log.cleaner.min.cleanable.ratio", "1.5", "between 0 and 1"),
        ("log.cleaner.io.max.bytes.per.second", "0", "must be positive"),
        ("log.cleaner.dedupe.buffer.size", "1000", "at least 1048576"),
        ("log.cleaner.delete.retention.ms", "-1", "at least 0"),
        ("offsets.topic.segment.bytes", "0", "at least 1"),
    ],
)
def test_cleaner_settings_are_checked(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        BrokerConfig().with_properties({key: value}).validate()
    assert key in str(caught.value) and message in str(caught.value)


def test_cleaner_settings_are_read_by_kafkas_names() -> None:
    c = BrokerConfig().with_properties(
        {"log.cleaner.min.cleanable.ratio": "0.25", "log.cleaner.enable": "false"}
    )
    assert c.validate().log_cleaner_min_cleanable_ratio == 0.25 and not c.log_cleaner_enable
