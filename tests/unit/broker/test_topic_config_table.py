"""The topic config table (docs/semantics.md, rules 27, 28 and 32): validation, sources and
synonyms, incremental edits; the TopicManager persisting altered configs and added partitions;
DeleteRecords' offset rules (rule 31); the rest of Kafka's keys, those trivially true on one
broker and the tiered-storage ones refused (rule 43)."""

from __future__ import annotations

from pathlib import Path

import pytest

from samsa.broker.config import BrokerConfig
from samsa.broker.topic_config import (
    AlterOp,
    ConfigSource,
    InvalidConfigError,
    UnknownOperationError,
    apply_incremental,
    describe_topic_configs,
    parse_topic_configs,
)
from samsa.broker.topics import TopicError, TopicManager
from samsa.log.log import LogConfig
from samsa.protocol.errors import ErrorCode

NOW = 1_800_000_000_000


@pytest.mark.parametrize(
    ("configs", "words"),
    [
        ({"retention.ms": "-2"}, "at least -1"),
        (
            {"retention.ms": "soon"},
            "Invalid value soon for configuration retention.ms: Not a number of type LONG",
        ),
        ({"segment.bytes": "100"}, "at least 1048576"),
        ({"segment.bytes": str(2**31)}, "at most 2147483647"),
        ({"segment.ms": "0"}, "at least 1"),
        ({"message.timestamp.type": "Now"}, "CreateTime, LogAppendTime"),
        ({"max.message.bytes": "-1"}, "at least 0"),
        ({"no.such.config": "1"}, "Unknown topic config name: no.such.config"),
        ({"compression.type": "brotli"}, "must be one of uncompressed, zstd"),
        ({"compression.gzip.level": "0"}, "between 1 and 9 or -1"),
        ({"compression.lz4.level": "18"}, "between 1 and 17"),
        ({"compression.zstd.level": "23"}, "between -131072 and 22"),
        ({"min.insync.replicas": "0"}, "at least 1"),
        ({"message.timestamp.after.max.ms": "-1"}, "at least 0"),
        ({"message.timestamp.difference.max.ms": "1000"}, "removed in Kafka 4.0 (KIP-937)"),
        ({"unclean.leader.election.enable": "yes"}, "must be true or false"),
        ({"leader.replication.throttled.replicas": "0-1"}, "partitionId:brokerId"),
        ({"follower.replication.throttled.replicas": "0:1,*"}, "partitionId:brokerId"),
        ({"remote.storage.enable": "true"}, "samsa has no tiered storage"),
        ({"local.retention.ms": "1000"}, "samsa has no tiered storage"),
        ({"local.retention.bytes": "-1"}, "samsa has no tiered storage"),
        ({"segment.index.bytes": "3"}, "at least 4"),
        ({"segment.jitter.ms": "-1"}, "at least 0"),
        ({"preallocate": "maybe"}, "must be true or false"),
        ({"file.delete.delay.ms": "-1"}, "at least 0"),
        ({"flush.messages": "0"}, "at least 1"),
        ({"flush.ms": "-1"}, "at least 0"),
        ({"cleanup.policy": "delete,"}, "without blanks"),
    ],
)
def test_bad_values_and_unknown_keys_are_refused(configs: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        parse_topic_configs(configs)
    assert words in str(info.value)


def test_values_set_log_config_fields() -> None:
    values = parse_topic_configs(
        {"retention.ms": "-1", "segment.ms": "5", "message.timestamp.type": "LogAppendTime"}
    )
    assert values == {
        "retention_ms": -1,
        "segment_ms": 5,
        "message_timestamp_type": "LogAppendTime",
    }


def test_sources_and_synonyms_in_kafkas_order() -> None:
    broker = BrokerConfig().with_properties({"log.retention.ms": "5000"})
    described = {d.name: d for d in describe_topic_configs(broker, {"segment.bytes": "2097152"})}
    seg = described["segment.bytes"]
    assert (seg.value, seg.source) == ("2097152", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert [(s.name, s.value, s.source) for s in seg.synonyms] == [
        ("segment.bytes", "2097152", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("log.segment.bytes", "1073741824", ConfigSource.DEFAULT_CONFIG),
    ]
    ret = described["retention.ms"]
    assert (ret.value, ret.source) == ("5000", ConfigSource.STATIC_BROKER_CONFIG)
    assert [(s.name, s.source) for s in ret.synonyms] == [
        ("log.retention.ms", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.retention.hours", ConfigSource.DEFAULT_CONFIG),
    ]  # as Kafka 4.4: the group's default (in hours) follows a log.retention.ms set anywhere
    # (with none set it is cut, tests/oracle/test_kafka_tools.py compares both cases)
    ts = described["message.timestamp.type"]
    assert (ts.value, ts.source) == ("CreateTime", ConfigSource.DEFAULT_CONFIG)


def test_the_rest_of_kafkas_keys_parse_and_describe() -> None:
    """Rule 42: every Kafka 4 topic key samsa takes is validated to its LogConfig field and
    listed by DescribeConfigs with Kafka's default; keys without a broker synonym have none."""
    values = parse_topic_configs(
        {
            "compression.type": "zstd",
            "compression.zstd.level": "-5",
            "min.insync.replicas": "2",
            "message.timestamp.after.max.ms": "0",
            "flush.ms": "0",
            "unclean.leader.election.enable": "TRUE",
            "leader.replication.throttled.replicas": " 0:1, 1:1 ",
            "follower.replication.throttled.replicas": "*",
            "remote.copy.lag.ms": "0",
            "errors.deadletterqueue.group.enable": "false",
            "preallocate": "true",
            "segment.jitter.ms": "100",
            "segment.index.bytes": "4096",
            "index.interval.bytes": "0",
            "file.delete.delay.ms": "0",
            "remote.storage.enable": "false",
            "local.retention.ms": "-2",
        }
    )
    assert values == {
        "compression_type": "zstd",
        "compression_zstd_level": -5,
        "min_insync_replicas": 2,
        "message_timestamp_after_max_ms": 0,
        "flush_ms": 0,
        "unclean_leader_election_enable": True,
        "leader_replication_throttled_replicas": "0:1,1:1",
        "follower_replication_throttled_replicas": "*",
        "remote_copy_lag_ms": 0,
        "errors_deadletterqueue_group_enable": False,
        "preallocate": True,
        "segment_jitter_ms": 100,
        "segment_index_bytes": 4096,
        "index_interval_bytes": 0,
        "file_delete_delay_ms": 0,
        "remote_storage_enable": False,
        "local_retention_ms": -2,
    }
    broker = BrokerConfig().with_properties({"log.flush.interval.messages": "1"})
    described = {d.name: d for d in describe_topic_configs(broker, {})}
    defaults = {
        "compression.type": "producer",
        "compression.gzip.level": "-1",
        "compression.lz4.level": "9",
        "compression.zstd.level": "3",
        "min.insync.replicas": "1",
        "message.timestamp.before.max.ms": str(2**63 - 1),
        "message.timestamp.after.max.ms": "3600000",
        "flush.ms": str(2**63 - 1),
        "unclean.leader.election.enable": "false",
        "remote.log.copy.disable": "false",
        "remote.log.delete.on.disable": "false",
        "errors.deadletterqueue.group.enable": "false",
        "preallocate": "false",
        "segment.jitter.ms": "0",
        "segment.index.bytes": "10485760",
        "index.interval.bytes": "4096",
        "file.delete.delay.ms": "60000",
        "remote.storage.enable": "false",
        "local.retention.ms": "-2",
        "local.retention.bytes": "-2",
        "leader.replication.throttled.replicas": "",
    }
    for name, value in defaults.items():
        assert (described[name].value, described[name].source) == (
            value,
            ConfigSource.DEFAULT_CONFIG,
        ), name
    assert described["leader.replication.throttled.replicas"].synonyms == ()
    assert [(s.name, s.source) for s in described["compression.type"].synonyms] == [
        ("compression.type", ConfigSource.DEFAULT_CONFIG)
    ]
    flush = described["flush.messages"]
    assert (flush.value, flush.source) == ("1", ConfigSource.STATIC_BROKER_CONFIG)
    assert "samsa" in described["unclean.leader.election.enable"].doc
    lag = described["remote.copy.lag.ms"]  # Kafka 4.4 lists its broker default as a synonym
    assert [(x.name, x.value, x.source) for x in lag.synonyms] == [
        ("log.remote.copy.lag.ms", "0", ConfigSource.DEFAULT_CONFIG)
    ]
    assert "message.downconversion.enable" not in described  # gone from Kafka 4.4's list


def test_incremental_operations() -> None:
    current = {"retention.ms": "10", "segment.ms": "20"}
    out = apply_incremental(
        current,
        [
            ("retention.ms", AlterOp.DELETE, None),
            ("segment.ms", AlterOp.SET, "30"),
            ("cleanup.policy", AlterOp.APPEND, "compact"),  # onto the default, "delete"
        ],
    )
    assert out == {"segment.ms": "30", "cleanup.policy": "delete,compact"}
    out = apply_incremental(out, [("cleanup.policy", AlterOp.SUBTRACT, "delete")])
    assert out["cleanup.policy"] == "compact"
    with pytest.raises(InvalidConfigError, match="append is not allowed"):
        apply_incremental(out, [("retention.ms", AlterOp.APPEND, "5")])
    with pytest.raises(UnknownOperationError, match="unknown config operation"):
        apply_incremental(out, [("retention.ms", 7, "5")])


def test_altered_configs_apply_at_once_and_survive_a_restart(tmp_path: Path) -> None:
    topics = TopicManager(tmp_path, LogConfig())
    topics.create("t", 2, NOW, {"retention.ms": "1000"})
    topics.alter_configs("t", {"segment.ms": "60000"}, validate_only=False)  # replaces all
    for p in topics.topics["t"].partitions:
        assert p.log.config.segment_ms == 60000 and p.log.config.retention_ms == 604_800_000
    topics.alter_configs("t", {"segment.ms": "5"}, validate_only=True)
    assert topics.topics["t"].partitions[0].log.config.segment_ms == 60000
    with pytest.raises(TopicError) as info:
        topics.alter_configs("t", {"segment.ms": "0"}, validate_only=False)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    topics.close(NOW)
    again = TopicManager(tmp_path, LogConfig())
    again.load(NOW)
    assert again.topics["t"].configs == {"segment.ms": "60000"}
    assert all(p.log.config.segment_ms == 60000 for p in again.topics["t"].partitions)
    again.close(NOW)


def test_partitions_only_grow_and_inherit_the_configs(tmp_path: Path) -> None:
    topics = TopicManager(tmp_path, LogConfig())
    topic = topics.create("t", 1, NOW, {"segment.ms": "60000"})
    topics.add_partitions("t", 3, NOW, validate_only=True)
    assert len(topic.partitions) == 1
    topics.add_partitions("t", 3, NOW, validate_only=False)
    assert [p.index for p in topic.partitions] == [0, 1, 2]
    assert topic.partitions[2].log.config.segment_ms == 60000
    for count in (3, 2):
        with pytest.raises(TopicError) as info:
            topics.add_partitions("t", count, NOW, validate_only=False)
        assert info.value.code == ErrorCode.INVALID_PARTITIONS
    (tmp_path / f"{topic.topic_id.hex}-3.adding").mkdir()  # as a crash would leave it
    topics.close(NOW)
    again = TopicManager(tmp_path, LogConfig())
    again.load(NOW)
    t = again.topics["t"]
    assert len(t.partitions) == 3 and t.topic_id == topic.topic_id
    assert t.partitions[2].log.config.segment_ms == 60000
    assert not (tmp_path / f"{topic.topic_id.hex}-3.adding").exists()
    again.close(NOW)


def test_delete_records_rules(tmp_path: Path) -> None:
    from samsa.protocol.records import NewRecord, RecordBatchView, build_batch

    topics = TopicManager(tmp_path, LogConfig())
    topics.create("t", 1, NOW)
    topics.create("c", 1, NOW, {"cleanup.policy": "compact"})
    data = RecordBatchView(build_batch([NewRecord(b"v", key=b"k")] * 4))
    topics.get_partition("t", 0).log.append(data, NOW)  # type: ignore[union-attr]
    assert topics.delete_records("t", 0, 5) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert topics.delete_records("t", 0, -2) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)
    assert topics.delete_records("t", 1, 0) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)
    assert topics.delete_records("c", 0, 0) == (ErrorCode.POLICY_VIOLATION, -1)
    topics.create("n", 1, NOW, {"cleanup.policy": ""})  # neither: DeleteRecords may (KIP-1161)
    assert topics.delete_records("n", 0, 0) == (ErrorCode.NONE, 0)
    assert topics.delete_records("t", 0, 2) == (ErrorCode.NONE, 2)
    assert topics.delete_records("t", 0, -1) == (ErrorCode.NONE, 4)  # the high watermark
    topics.close(NOW)


def test_broker_defaults_of_topic_configs_are_read_and_checked() -> None:
    from samsa.broker.config import ConfigError

    c = BrokerConfig().with_properties({"log.roll.hours": "2", "log.cleanup.policy": "compact"})
    assert (c.validate().log_roll_ms, c.log_cleanup_policy) == (7_200_000, "compact")
    described = {d.name: d for d in describe_topic_configs(c, {})}
    assert (described["segment.ms"].value, described["segment.ms"].source) == (
        "7200000",
        ConfigSource.STATIC_BROKER_CONFIG,
    )
    for key, value in (
        ("log.cleanup.policy", "shred"),
        ("log.cleanup.policy", "compact,,delete"),
        ("log.message.timestamp.type", "Now"),
        ("compression.type", "brotli"),
        ("compression.gzip.level", "0"),
        ("compression.zstd.level", "23"),
        ("min.insync.replicas", "0"),
        ("log.message.timestamp.after.max.ms", "-1"),
        ("log.flush.interval.ms", "-1"),
        ("log.roll.jitter.ms", "-1"),
    ):
        with pytest.raises(ConfigError, match=key):
            BrokerConfig().with_properties({key: value}).validate()


def test_an_empty_cleanup_policy_keeps_the_log_whole(tmp_path: Path) -> None:
    """KIP-1161: cleanup.policy "" (or SUBTRACT of the last policy) neither deletes by
    retention nor compacts; the same log under "delete" loses its old segments."""
    import asyncio

    from samsa.broker.broker import Broker, now_ms
    from samsa.protocol.records import NewRecord, RecordBatchView, build_batch

    broker = Broker(BrokerConfig(data_dir=tmp_path))
    broker.start()
    try:
        short = {"retention.ms": "1", "retention.bytes": "1", "segment.ms": "1"}
        broker.create_topic("kept", 1, {**short, "cleanup.policy": "delete"})
        configs = apply_incremental(
            short | {"cleanup.policy": "delete"},
            [("cleanup.policy", AlterOp.SUBTRACT, "delete")],
        )
        assert configs["cleanup.policy"] == ""
        broker.topics.alter_configs("kept", configs, validate_only=False)
        broker.create_topic("deleted", 1, {**short, "cleanup.policy": "delete"})
        old = now_ms() - 3_600_000
        for name in ("kept", "deleted"):
            plog = broker.topics.get_partition(name, 0).log  # type: ignore[union-attr]
            for i in range(3):  # three segments (segment.ms), records of one key
                record = NewRecord(b"v%d" % i, key=b"k", timestamp=old + i * 1000)
                batch = build_batch([record])
                plog.append(RecordBatchView(batch), old + i * 1000)
        broker.apply_retention()
        assert asyncio.run(broker.clean_logs()) == 0
        kept = broker.topics.get_partition("kept", 0).log  # type: ignore[union-attr]
        deleted = broker.topics.get_partition("deleted", 0).log  # type: ignore[union-attr]
        assert (kept.log_start_offset, kept.log_end_offset, len(kept.segments)) == (0, 3, 3)
        assert deleted.log_start_offset == 2
        described = {d.name: d for d in broker.describe_topic(configs)}
        assert described["cleanup.policy"].value == ""
    finally:
        broker.close()


def test_broker_settings_are_the_defaults_of_the_new_keys(tmp_path: Path) -> None:
    """Rules 27 and 38-41: compression.type, min.insync.replicas, the KIP-937 window and
    log.flush.interval.ms set broker-wide are what a topic without its own value gets, and
    DescribeConfigs names them as STATIC_BROKER_CONFIG."""
    from samsa.broker.broker import Broker

    props = {
        "compression.type": "zstd",
        "compression.zstd.level": "7",
        "min.insync.replicas": "2",
        "log.message.timestamp.before.max.ms": "1000",
        "log.message.timestamp.after.max.ms": "2000",
        "log.flush.interval.ms": "0",
        "log.roll.jitter.ms": "10",
    }
    config = BrokerConfig(data_dir=tmp_path, port=0).with_properties(props)
    broker = Broker(config)
    try:
        cfg = broker.log_config
        assert (cfg.compression_type, cfg.compression_zstd_level) == ("zstd", 7)
        assert cfg.min_insync_replicas == 2
        assert (cfg.message_timestamp_before_max_ms, cfg.message_timestamp_after_max_ms) == (
            1000,
            2000,
        )
        assert (cfg.flush_ms, cfg.segment_jitter_ms) == (0, 10)
    finally:
        broker.topics.close(NOW)
    described = {d.name: d for d in describe_topic_configs(config, {"min.insync.replicas": "1"})}
    for name, value in (
        ("compression.type", "zstd"),
        ("compression.zstd.level", "7"),
        ("message.timestamp.before.max.ms", "1000"),
        ("message.timestamp.after.max.ms", "2000"),
        ("flush.ms", "0"),
        ("segment.jitter.ms", "10"),
    ):
        assert (described[name].value, described[name].source) == (
            value,
            ConfigSource.STATIC_BROKER_CONFIG,
        ), name
    misr = described["min.insync.replicas"]
    assert (misr.value, misr.source) == ("1", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert [(s.name, s.value, s.source) for s in misr.synonyms] == [
        ("min.insync.replicas", "1", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("min.insync.replicas", "2", ConfigSource.STATIC_BROKER_CONFIG),
        ("min.insync.replicas", "1", ConfigSource.DEFAULT_CONFIG),
    ]


def test_partitions_are_bounded_by_max_partitions(tmp_path: Path) -> None:
    topics = TopicManager(tmp_path, LogConfig(), max_partitions=4)
    topics.create("a", 3, NOW)
    for attempt in (
        lambda: topics.create("b", 2, NOW),
        lambda: topics.add_partitions("a", 5, NOW, False),
    ):
        with pytest.raises(TopicError) as info:
            attempt()
        assert info.value.code == ErrorCode.INVALID_PARTITIONS and "max.partitions" in str(
            info.value
        )
    assert "b" not in topics.topics and len(topics.topics["a"].partitions) == 3
    topics.add_partitions("a", 4, NOW, validate_only=False)
    topics.close(NOW)
