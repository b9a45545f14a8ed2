"""The samsa Admin's config, partition and record calls round trip through a broker:
describe / incremental-alter / alter configs, create partitions, delete records, with each
resource's or partition's error in the result."""

from __future__ import annotations

import pytest

from _broker import BrokerProcess
from samsa.client import (
    Admin,
    AlterConfigOp,
    ConfigResource,
    KafkaError,
    Producer,
    TopicPartition,
)
from samsa.protocol.constants import EARLIEST
from samsa.protocol.errors import ErrorCode

DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5


def test_admin_configs_partitions_and_records(broker_factory: type[BrokerProcess]) -> None:
    broker = broker_factory().start()
    topic = ConfigResource(ConfigResource.TOPIC, "cfg")
    missing = ConfigResource(ConfigResource.TOPIC, "no-such-topic")
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topic("cfg", 1)

        # describe: defaults, with their source
        retention = admin.describe_configs([topic])[topic]["retention.ms"]
        assert (retention.value, retention.source) == ("604800000", DEFAULT_CONFIG)
        with pytest.raises(KafkaError) as unknown:
            admin.describe_configs([missing])
        assert unknown.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

        # incremental: SET two, then DELETE one; the other stays
        set_two = [
            AlterConfigOp("retention.ms", "1234", AlterConfigOp.SET),
            AlterConfigOp("segment.bytes", "1048576", AlterConfigOp.SET),
        ]
        errors = admin.incremental_alter_configs({topic: set_two, missing: set_two})
        assert errors[topic] is None
        assert errors[missing] is not None
        assert errors[missing].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        configs = admin.describe_configs([topic])[topic]
        assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
            "1234",
            DYNAMIC_TOPIC_CONFIG,
        )
        delete_one = [AlterConfigOp("retention.ms", None, AlterConfigOp.DELETE)]
        assert admin.incremental_alter_configs({topic: delete_one}) == {topic: None}
        configs = admin.describe_configs([topic])[topic]
        assert configs["retention.ms"].value == "604800000"
        assert configs["segment.bytes"].value == "1048576"

        # validate_only changes nothing; a bad value is the resource's error
        bad = [AlterConfigOp("retention.ms", "soon", AlterConfigOp.SET)]
        (err,) = admin.incremental_alter_configs({topic: bad}).values()
        assert err is not None and err.code == ErrorCode.INVALID_CONFIG
        ok = [AlterConfigOp("retention.ms", "99", AlterConfigOp.SET)]
        assert admin.incremental_alter_configs({topic: ok}, validate_only=True) == {topic: None}
        assert admin.describe_configs([topic])[topic]["retention.ms"].value == "604800000"

        # legacy AlterConfigs replaces the whole dynamic set: segment.bytes goes back
        assert admin.alter_configs({topic: {"retention.ms": "4321"}}) == {topic: None}
        configs = admin.describe_configs([topic])[topic]
        assert configs["retention.ms"].value == "4321"
        assert configs["segment.bytes"].source == DEFAULT_CONFIG

        # create partitions: grows, and refuses to shrink
        assert admin.create_partitions({"cfg": 3}) == {"cfg": None}
        (described,) = admin.describe_topics(["cfg"])
        assert len(described.partitions) == 3
        shrink = admin.create_partitions({"cfg": 2})["cfg"]
        assert shrink is not None and shrink.code == ErrorCode.INVALID_PARTITIONS

        # delete records: the log start moves; beyond the end and unknown partitions fail
        with Producer({"bootstrap.servers": broker.bootstrap}) as p:
            for i in range(10):
                p.produce("cfg", b"%d" % i, partition=0)
            assert p.flush(30) == 0
        tp0, tp1, tp9 = (TopicPartition("cfg", n) for n in (0, 1, 9))
        deleted = admin.delete_records({tp0: 4, tp1: 100, tp9: 0})
        assert (deleted[tp0].low_watermark, deleted[tp0].error) == (4, None)
        assert deleted[tp1].error is not None
        assert deleted[tp1].error.code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert deleted[tp9].error is not None
        assert deleted[tp9].error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert admin.list_offsets([tp0], EARLIEST) == {tp0: 4}
        assert admin.delete_records({tp0: -1})[tp0].low_watermark == 10
