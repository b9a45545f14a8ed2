"""Differential scenarios across a restart of each broker (rule 13): the producer state that
judges retries is rebuilt from the log and snapshots, so a retry after the restart must be
answered as Kafka answers it. These scenarios restart their brokers, so the module has its own
samsa broker and Kafka node."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from _scenario import batch, producer

from _broker import BrokerProcess
from samsa.testing.kafka import KafkaNode
from samsa.testing.oracle import Deviation, Outcome, Side, Target

Run = Callable[..., Outcome]


@pytest.fixture(scope="module")
def own_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    node = KafkaNode(tmp_path_factory.mktemp("kafka-restart")).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def own_samsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("samsa-restart")).start()
    yield broker
    broker.stop()


def _targets(samsa: BrokerProcess, kafka: KafkaNode, clean: bool) -> tuple[Target, Target]:
    def restart_samsa() -> None:
        samsa.stop() if clean else samsa.kill()
        samsa.start()

    def restart_kafka() -> None:
        kafka.stop() if clean else kafka.kill()
        kafka.start()

    return Target("samsa", samsa.bootstrap, restart_samsa), Target(
        "kafka", kafka.bootstrap, restart_kafka
    )


def _retries_after_restart(s: Side) -> None:
    t = s.unique("t")
    s.create_topic(t)
    pid, epoch = producer(s)
    batches = [batch(pid, epoch, i) for i in range(7)]
    for i, b in enumerate(batches):
        s.produce(f"seq{i}", {(t, 0): b})
    s.restart()
    s.wait_leaders(t, 1)
    s.produce("dup-seq6-last", {(t, 0): batches[6]})
    s.produce("dup-seq4-in-window", {(t, 0): batches[4]})
    s.produce("dup-seq1-too-old", {(t, 0): batches[1]})
    s.produce("gap", {(t, 0): batch(pid, epoch, 9)})
    s.produce("old-epoch", {(t, 0): batch(pid, epoch - 1, 7)})
    s.produce("seq7", {(t, 0): batch(pid, epoch, 7)})
    s.init_producer_id("init-after-restart")  # a fresh producer id, never one handed out
    s.fetch("log", {(t, 0): 0})


_RETRY = "dup-seq4-in-window.responses[0].partition_responses[0]"
DEVIATIONS = [
    Deviation(f"{_RETRY}.error_code", "NONE", "OUT_OF_ORDER_SEQUENCE_NUMBER", "D-IDEM-1"),
    Deviation(f"{_RETRY}.base_offset", 4, -1, "D-IDEM-1"),
    Deviation(f"{_RETRY}.log_append_time", "<any>", None, "D-IDEM-1"),
    # The record written after the restart.
    Deviation(
        "log.responses[0].partitions[0].records[7].partition_leader_epoch", 0, 2, "D-FETCH-1"
    ),
]


def test_retries_after_sigkill_of_each_broker(
    differential: Run, own_samsa: BrokerProcess, own_kafka: KafkaNode
) -> None:
    """After a crash Kafka rebuilds its producer state from its last snapshot, which keeps
    only each producer's last batch: the retry of an earlier batch of the five is out of
    order there, a duplicate answered with its offset in samsa (D-IDEM-1). Kafka's controller
    takes leadership from the restarted node and gives it back, two leader epochs; samsa's
    stays 0 (D-FETCH-1)."""
    samsa, kafka = _targets(own_samsa, own_kafka, clean=False)
    differential(_retries_after_restart, samsa=samsa, kafka=kafka, deviations=DEVIATIONS)


def test_retries_after_clean_restart_of_each_broker(
    differential: Run, own_samsa: BrokerProcess, own_kafka: KafkaNode
) -> None:
    """The same after a clean shutdown, which writes the snapshot Kafka then loads."""
    samsa, kafka = _targets(own_samsa, own_kafka, clean=True)
    differential(_retries_after_restart, samsa=samsa, kafka=kafka, deviations=DEVIATIONS)
