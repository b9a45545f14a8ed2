"""``samsa acls``: which (resource, operation) pairs kafka-acls' flags ask for; the requests
themselves are exercised against a broker in tests/interop/test_acls.py."""

from __future__ import annotations

import pytest

from samsa.broker.authorizer import CLUSTER_NAME, Operation, ResourceType
from samsa.cli import build_parser
from samsa.cli.acls import _resources, _targets


def targets(*argv: str) -> set[tuple[ResourceType, str | None, Operation]]:
    args = build_parser().parse_args(["acls", *argv])
    ops = args.operation or [Operation.ANY]
    return set(_targets(args, _resources(args), ops))


T, G, X, C = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.TRANSACTIONAL_ID,
    ResourceType.CLUSTER,
)


def test_operations_times_resources() -> None:
    assert targets(
        "add",
        "--allow-principal",
        "User:a",
        "--operation",
        "read",
        "--operation",
        "Describe",
        "--topic",
        "t1",
        "--topic",
        "t2",
        "--cluster",
    ) == {
        (r, n, op)
        for r, n in ((T, "t1"), (T, "t2"), (C, CLUSTER_NAME))
        for op in (Operation.READ, Operation.DESCRIBE)
    }


def test_producer_and_consumer_shortcuts() -> None:
    assert targets(
        "add",
        "--allow-principal",
        "User:a",
        "--producer",
        "--idempotent",
        "--topic",
        "t",
        "--transactional-id",
        "tx",
    ) == {
        (T, "t", Operation.WRITE),
        (T, "t", Operation.DESCRIBE),
        (T, "t", Operation.CREATE),
        (X, "tx", Operation.WRITE),
        (X, "tx", Operation.DESCRIBE),
        (C, CLUSTER_NAME, Operation.IDEMPOTENT_WRITE),
    }
    assert targets(
        "add", "--allow-principal", "User:a", "--consumer", "--topic", "t", "--group", "g"
    ) == {(T, "t", Operation.READ), (T, "t", Operation.DESCRIBE), (G, "g", Operation.READ)}


def test_unknown_operation_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["acls", "add", "--operation", "Fly", "--topic", "t"])
    assert "unknown operation 'Fly'" in capsys.readouterr().err


def test_two_phase_commit_operation() -> None:
    # KIP-939's operation, by kafka-acls' name, on a transactional id.
    assert targets(
        "add",
        "--allow-principal",
        "User:a",
        "--operation",
        "TwoPhaseCommit",
        "--transactional-id",
        "tx",
    ) == {(X, "tx", Operation.TWO_PHASE_COMMIT)}
    assert Operation.TWO_PHASE_COMMIT == 15  # Kafka's AclOperation code
