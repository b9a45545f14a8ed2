"""Kafka's system-test tools judge samsa (issue 22, part 4), and judge a Kafka node on the same
run for reference, so that a check Kafka itself fails is seen as such.

* An idempotent ``VerifiableProducer`` and a ``VerifiableConsumer`` per group protocol
  (classic and consumer, committing after every poll) while the broker is SIGKILLed and
  restarted twice: every acknowledged record is consumed, no record is written twice, and
  committed offsets never move back (a consumer rereads only from an acknowledged commit).
* Three ``TransactionalMessageCopier`` (Kafka's exactly-once system test: read_committed input,
  output and offsets in one transaction, random aborts), one per input partition, SIGKILLed and
  restarted, with the broker SIGKILLed once: the output, read_committed by Kafka's consumer,
  holds every input record exactly once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _broker import BrokerProcess
from samsa.client import Admin, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing.judges import (
    check_copy,
    check_delivery,
    copier_run,
    produce_consume_run,
    read_committed,
    seed,
)
from samsa.testing.kafka import KafkaNode

log = logging.getLogger(__name__)

# The Kafka node of tests/oracle/conftest.py starts groups without delay; samsa does the same.
SAMSA_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}


class Target:
    """A broker under judgement and the way to SIGKILL and restart it."""

    def __init__(self, name: str, bootstrap: str, bounce: Callable[[], None], slack: float):
        self.name = name
        self.bootstrap = bootstrap
        self.bounce = bounce
        # Bounds, not durations: a Kafka restart is a JVM start, tens of seconds on a loaded
        # machine where samsa needs a few.
        self.slack = slack

    def create_topics(self, *names: str, partitions: int = 3) -> None:
        with Admin({"bootstrap.servers": self.bootstrap}) as admin:
            for name in names:
                admin.create_topic(name, partitions)


@pytest.fixture(params=["samsa", "kafka"])
def target(request: pytest.FixtureRequest, broker_factory: type[BrokerProcess]) -> Iterator[Target]:
    if request.param == "samsa":
        broker = broker_factory(overrides=SAMSA_OVERRIDES).start()

        def bounce() -> None:
            broker.kill()
            broker.start()

        yield Target("samsa", broker.bootstrap, bounce, 0.0)
    else:
        node: KafkaNode = request.getfixturevalue("kafka")
        yield Target("kafka", node.bootstrap, node.restart, 90.0)


def test_verifiable_producer_and_consumers_survive_broker_kills(
    target: Target, tmp_path: Path
) -> None:
    topic = f"judged-{time.monotonic_ns()}"
    target.create_topics(topic)
    produced, consumed = produce_consume_run(
        target.bootstrap, topic, tmp_path, bounce=target.bounce, bounces=2, messages=3000,
        throughput=600, timeout=120 + 2 * target.slack,
    )  # fmt: skip
    reports = [check_delivery(produced, events, group) for group, events in consumed.items()]
    for r in reports:
        log.info("%s %s: %s", target.name, r.group, r)
        problems = r.problems
        twice = []
        if target.name == "kafka":
            # Kafka's lone node once (2026-11-27, load ~15) kept a retried batch twice across
            # its SIGKILL: a producer that finds its state gone bumps its epoch and resends
            # (KIP-360). The judge reports it for Kafka; samsa is held to exactly once.
            twice = [p for p in problems if "written twice" in p]
            problems = [p for p in problems if p not in twice]
        assert problems == [], (target.name, r.group, r.problems)
        assert r.acked == 3000 and r.send_errors == 0
        if not twice:  # a second copy is read too, beside the acknowledged one
            assert r.consumed == r.acked + r.redelivered
        assert len(r.last_commits) == 3  # every partition got records
    # The broker holds what the consumers last committed, after both kills.
    with Admin({"bootstrap.servers": target.bootstrap}) as admin:
        for r in reports:
            held = admin.list_group_offsets(r.group)
            assert held == {TopicPartition(topic, p): o for p, o in r.last_commits.items()}
    # D-JAVA-1: Kafka's lone node starts a new leader epoch at each restart; samsa keeps 0.
    epochs = leader_epochs(target.bootstrap, topic)
    if target.name == "kafka":
        assert min(epochs) >= 2, epochs
    else:
        assert epochs == [0, 0, 0]


def leader_epochs(bootstrap: str, topic: str) -> list[int]:
    """The leader epoch of each partition of ``topic``, as Metadata v12 reports them."""
    host, port = bootstrap.split(":")
    topics = (make_request(ApiKey.METADATA, 12, "MetadataRequestTopic", name=topic, topic_id=None),)
    req = make_request(
        ApiKey.METADATA, 12, "MetadataRequest", topics=topics, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )  # fmt: skip
    with BlockingConnection(host, int(port), timeout=10) as conn:
        (meta,) = conn.request(ApiKey.METADATA, 12, req).topics
    return [int(p.leader_epoch) for p in sorted(meta.partitions, key=lambda p: p.partition_index)]


def test_transactional_copiers_copy_exactly_once(target: Target, tmp_path: Path) -> None:
    source, sink = f"copy-in-{time.monotonic_ns()}", f"copy-out-{time.monotonic_ns()}"
    target.create_topics(source, sink)
    inputs = seed(target.bootstrap, source, 3000, tmp_path, timeout=30)
    assert len(inputs) == 3000
    try:
        stats = copier_run(
            target.bootstrap, source, sink, 3, tmp_path, bounce=target.bounce, copier_kills=2,
            broker_kills=1, timeout=120 + target.slack,
        )  # fmt: skip
    except TimeoutError as e:
        # Kafka's lone node once (2026-11-27, a fresh-clone run at load ~10) kept a copier's
        # transactional offset commit unstable for minutes after its restart: the restarted
        # copier never learned its input position ("... before the position for partition
        # ... could be determined", three times over). The judge reports that for Kafka; what
        # Kafka did copy must still hold nothing twice. samsa is held to the whole check.
        if target.name != "kafka" or "could be determined" not in str(e):
            raise
        log.warning("kafka copy stalled on Kafka's side, judged for duplicates only: %s", e)
        report = check_copy(inputs, read_committed(target.bootstrap, sink, 1, tmp_path, 30))
        assert (report.duplicated, report.unexpected) == (0, 0), report.problems
        return
    outputs = read_committed(target.bootstrap, sink, len(inputs), tmp_path, timeout=30)
    report = check_copy(inputs, outputs)
    log.info("%s copy: %s %s", target.name, stats, report)
    assert (stats.copier_kills, stats.broker_kills) == (2, 1)
    assert report.problems == [], (target.name, report.problems)
