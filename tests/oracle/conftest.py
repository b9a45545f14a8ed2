"""Fixtures for the tests that run Apache Kafka (the pinned release, see kafka/pom.xml) beside
samsa. Kafka nodes are JVMs that take seconds to start, so they are shared per test module;
a test that needs a node of its own builds a ``KafkaNode`` itself. Kafka missing fails these
tests (``make test`` resolves it): they are comparisons, not optional."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from samsa.testing.kafka import KafkaNode
from samsa.testing.oracle import (
    USER_PROPERTY,
    Deviation,
    Outcome,
    Rule,
    Side,
    Target,
    run_scenario,
)


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    """One fresh KRaft node (broker + controller) shared by the module's tests."""
    node = KafkaNode(tmp_path_factory.mktemp("kafka")).start()
    yield node
    node.stop()


# --- differential scenarios (samsa.testing.oracle) ---------------------------------------


@pytest.fixture(scope="session")
def differential_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaNode]:
    """The Kafka node of the differential scenarios, one per test process: scenarios name
    their topics, transactional ids and groups after themselves, so they can share it, and a
    node start (tens of seconds on a busy machine) is paid once per worker, not per module."""
    node = KafkaNode(tmp_path_factory.mktemp("kafka-differential")).start()
    yield node
    node.stop()


@pytest.fixture
def differential(request: pytest.FixtureRequest) -> Callable[..., Outcome]:
    """Run a scenario against samsa and Kafka and assert the differences are exactly its
    declared deviations (the summary at the end of the run counts them, see
    tests/conftest.py). The brokers default to the module's ``shared_broker`` and the
    process's ``differential_kafka``; a scenario that restarts them passes its own
    :class:`Target`\\ s."""

    def run(
        scenario: Callable[[Side], None],
        *,
        deviations: Sequence[Deviation] = (),
        rules: Mapping[str, Rule] | None = None,
        samsa: Target | None = None,
        kafka: Target | None = None,
    ) -> Outcome:
        if samsa is None:
            samsa = Target("samsa", request.getfixturevalue("shared_broker").bootstrap)
        if kafka is None:
            kafka = Target("kafka", request.getfixturevalue("differential_kafka").bootstrap)
        outcome = run_scenario(
            request.node.name, scenario, samsa, kafka, deviations=deviations, rules=rules
        )
        request.node.user_properties.append((USER_PROPERTY, outcome.summary()))
        print(outcome.report())
        outcome.check()
        return outcome

    return run
