"""KIP-932 share groups with Apache Kafka's Java ``KafkaShareConsumer`` (kafka-clients of the
pinned Kafka), against samsa and against a Kafka node, each scenario's result the same on
both: three share consumers on one partition consume every record once; a record released on
every delivery is archived after ``share.delivery.count.limit`` (5) deliveries; a consumer
killed while holding records (no acknowledgement, no session close) has them redelivered to
another once their acquisition lock expires. tests/oracle/java/ShareConsumerCheck.java runs
the scenarios."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

from _broker import BrokerProcess
from samsa.testing.kafka import KafkaNode, classpath

PROGRAM = Path(__file__).parent / "java" / "ShareConsumerCheck.java"
SCENARIOS = ("share-many", "share-poison")


def run_java(bootstrap: str, suffix: str, *scenarios: str) -> dict[str, Any]:
    cmd = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath(), str(PROGRAM),
           bootstrap, suffix, *scenarios]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    return {line["scenario"]: line.get("result", line) for line in lines}


def test_share_consumers_answer_as_kafka(
    differential_kafka: KafkaNode, shared_broker: BrokerProcess
) -> None:
    suffix = uuid.uuid4().hex[:8]
    want = run_java(differential_kafka.bootstrap, suffix, *SCENARIOS)
    got = run_java(shared_broker.bootstrap, suffix, *SCENARIOS)
    assert want == {
        "share-many": {"consumed": 30, "duplicates": 0},
        "share-poison": {"accepted": 1, "poison_deliveries": 5},
    }
    assert got == want


def test_records_of_a_killed_share_consumer_are_redelivered(
    broker_factory: type[BrokerProcess],
) -> None:
    # A short lock, so the test waits seconds, not Kafka's default 30.
    broker = broker_factory(overrides={"group.share.record.lock.duration.ms": "2000"}).start()
    suffix = uuid.uuid4().hex[:8]
    assert run_java(broker.bootstrap, suffix, "share-hold") == {"share-hold": {"held": True}}
    drained = run_java(broker.bootstrap, suffix, "share-drain")
    assert drained == {"share-drain": {"consumed": 10, "some_redelivered": True}}


def test_share_state_survives_a_broker_sigkill(broker_factory: type[BrokerProcess]) -> None:
    # Five records accepted, five held, then the broker is SIGKILLed: after the restart the
    # held five are delivered again (the lock died with the broker, the delivery did not),
    # and not one accepted record.
    broker = broker_factory().start()
    suffix = uuid.uuid4().hex[:8]
    assert run_java(broker.bootstrap, suffix, "share-accept-half") == {
        "share-accept-half": {"accepted": 5}
    }
    broker.kill()
    broker.start()
    got = run_java(broker.bootstrap, suffix, "share-rest")
    assert got == {"share-rest": {"values": "v5+v6+v7+v8+v9"}}
