"""Fixtures for the tests that run Apache Kafka (the pinned release, see kafka/pom.xml) beside
samsa. Kafka nodes are JVMs that take seconds to start, so they are shared per test module;
a test that needs a node of its own builds a ``KafkaNode`` itself. Kafka missing fails these
tests (``make test`` resolves it): they are comparisons, not optional."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from samsa.testing.kafka import FAST_FAILOVER, KafkaCluster, KafkaNode


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    """One fresh KRaft node (broker + controller) shared by the module's tests."""
    node = KafkaNode(tmp_path_factory.mktemp("kafka")).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft nodes with fast failure detection, shared by the module's tests."""
    cluster = KafkaCluster(
        tmp_path_factory.mktemp("kafka-cluster"),
        overrides=FAST_FAILOVER,
    ).start(timeout=300)  # JVMs start slowly on a loaded machine
    yield cluster
    cluster.stop()
