"""Topic configs given at creation: validated, persisted with the topic, applied to its logs;
the internal topics are always compacted."""

from __future__ import annotations

from pathlib import Path

import pytest

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
