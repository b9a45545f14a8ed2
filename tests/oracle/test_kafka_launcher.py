"""The Kafka launcher (samsa.testing.kafka): a node starts formatted and serving, survives
SIGKILL and SIGSTOP as a real broker does, a cluster of three replicates, and Kafka's tools
answer in the shared tool JVM as each in a JVM of its own."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from samsa.testing.kafka import (
    KAFKA_VERSION,
    KafkaCluster,
    KafkaNode,
    run_tool,
    run_tool_in_process,
)

REPO = Path(__file__).resolve().parents[2]


def test_pinned_version_is_the_poms() -> None:
    pom = (REPO / "kafka" / "pom.xml").read_text()
    assert re.search(r"<kafka.version>(.*?)</kafka.version>", pom).group(1) == KAFKA_VERSION


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for v in values:
        p.produce(topic, v)
    assert p.flush(30) == 0


def _read(bootstrap: str, topic: str, count: int, timeout: float = 30) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    return got


def test_node_serves_survives_sigkill_and_sigstop(tmp_path: Path) -> None:
    node = KafkaNode(tmp_path / "k").start()
    try:
        assert node.started_s > 0 and node.rss_mb > 50
        _produce(node.bootstrap, "t", [b"a", b"b"])
        pid = node.pid
        node.kill()
        assert not node.alive()
        node.start()
        assert node.pid != pid  # a new process, the same port and data
        assert _read(node.bootstrap, "t", 2) == [b"a", b"b"]

        node.pause()
        p = Producer({"bootstrap.servers": node.bootstrap, "message.timeout.ms": 1000})
        errors: list[object] = []
        p.produce("t", b"c", on_delivery=lambda err, _msg: errors.append(err))
        p.flush(5)
        assert len(errors) == 1 and errors[0] is not None  # nothing answers while stopped
        node.resume()
        _produce(node.bootstrap, "t", [b"d"])
        assert _read(node.bootstrap, "t", 3)[-1] == b"d"

        out = run_tool_in_process("kafka-topics", "--bootstrap-server", node.bootstrap,
                                  "--describe", "--topic", "t")  # fmt: skip
        assert "PartitionCount: 1" in out.stdout, out.stderr
    finally:
        node.stop()
    assert not node.alive()


def test_cluster_of_three_replicates_and_fails_over(kafka_cluster: KafkaCluster) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic("r", 1, 3)])["r"].result(30)
    _produce(kafka_cluster.bootstrap, "r", [b"x"])
    meta = admin.list_topics("r", timeout=10).topics["r"].partitions[0]
    assert sorted(meta.replicas) == [1, 2, 3]
    leader = meta.leader
    kafka_cluster.node(leader).kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = admin.list_topics("r", timeout=10).topics["r"].partitions[0].leader
        if new not in (leader, -1):
            break
        time.sleep(0.2)
    assert new not in (leader, -1)
    _produce(kafka_cluster.bootstrap, "r", [b"y"])
    assert _read(kafka_cluster.bootstrap, "r", 2) == [b"x", b"y"]
    kafka_cluster.node(leader).start()
    kafka_cluster.wait_brokers(3)


def _comparable(r: subprocess.CompletedProcess[str]) -> tuple[int, str, list[str]]:
    """A tool run less what differs between any two runs: log timestamps, stack frames."""
    err = [re.sub(r"^\[[\d\-: ,]+\] ", "", line) for line in r.stderr.splitlines()]
    return r.returncode, r.stdout, [line for line in err if not line.startswith("\tat ")]


def test_tools_in_the_shared_jvm_answer_as_in_their_own(
    differential_kafka: KafkaNode, tmp_path: Path
) -> None:
    """run_tool_in_process answers as run_tool: the exit code of Exit.exit, output up to it,
    the clients' numbered default ids (adminclient-1) of a fresh JVM at every command."""
    bs = differential_kafka.bootstrap
    topic = f"tool-jvm-{uuid.uuid4().hex[:8]}"
    made = run_tool_in_process(
        "kafka-topics", "--bootstrap-server", bs, "--create", "--topic", topic
    )
    assert made.returncode == 0, made.stderr
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 5}]}))
    delete = ("kafka-delete-records", "--bootstrap-server", bs, "--offset-json-file", str(offsets))
    # no action: the usage, then Exit.exit(1) from within the tool's catch-all
    usage = ("kafka-topics", "--bootstrap-server", bs)
    for args in (delete, usage):
        own = _comparable(run_tool(*args))
        for _ in range(2):
            assert _comparable(run_tool_in_process(*args)) == own
        if args is delete:
            assert "[AdminClient clientId=adminclient-1]" in "\n".join(own[2]), own
        else:
            assert own[0] == 1 and own[2][0].startswith("Command must include exactly one"), own


def test_a_tool_past_its_timeout_takes_its_jvm_down(differential_kafka: KafkaNode) -> None:
    consume = ("kafka-console-consumer", "--bootstrap-server", differential_kafka.bootstrap,
               "--topic", f"idle-{uuid.uuid4().hex[:8]}")  # fmt: skip
    with pytest.raises(subprocess.TimeoutExpired):
        run_tool_in_process(*consume, timeout=3)  # reads until stopped
    assert run_tool_in_process("kafka-topics", "--version").stdout.strip() == KAFKA_VERSION
