"""ACLs with real clients over SASL (rule 33): confluent-kafka's AdminClient creates,
describes and deletes ACLs, under which a transactional producer and a consumer group work
and another user is refused; ``samsa acls add|list|remove`` with kafka-acls' flags; ACLs
and users survive SIGKILL and are enforced after the restart."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import KafkaError as CkError
from confluent_kafka import KafkaException
from confluent_kafka import Producer as CkProducer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from _broker import BrokerProcess
from samsa.client import KafkaError, Producer
from samsa.client._connection import BlockingConnection
from samsa.client._security import from_config
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.testing import fetch_request

PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}


def samsa_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "samsa", *args], capture_output=True, text=True, timeout=60
    )


def start(data: Path, users: Path) -> BrokerProcess:
    return BrokerProcess(
        data,
        {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "sasl.plain.users.file": str(users),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin",
            "group.initial.rebalance.delay.ms": "0",
        },
    ).start()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("acls")
    users = root / "plain-users"
    users.write_text("".join(f"{u}={p}\n" for u, p in PASSWORDS.items()))
    proc = start(root / "data", users)
    yield proc
    proc.stop()


def conf(broker: BrokerProcess, user: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": PASSWORDS[user],
    }


def _binding(rtype: Any, name: str, op: Any, pattern: Any = ResourcePatternType.LITERAL) -> Any:
    return AclBinding(rtype, name, pattern, "User:alice", "*", op, AclPermissionType.ALLOW)


# The README's example: a transactional producer and a consumer group for alice.
README_ACLS = [
    _binding(ResourceType.TOPIC, "orders", AclOperation.WRITE),
    _binding(ResourceType.TRANSACTIONAL_ID, "orders-app", AclOperation.WRITE),
    _binding(ResourceType.TOPIC, "orders", AclOperation.READ),
    _binding(ResourceType.GROUP, "orders-", AclOperation.READ, ResourcePatternType.PREFIXED),
]
EVERYTHING = AclBindingFilter(
    ResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


def _consume(c: dict[str, Any], topic: str, group: str, n: int) -> tuple[list[bytes], set[int]]:
    """Up to ``n`` committed values, and the error codes seen (it stops at the first)."""
    consumer = CkConsumer(
        {
            **c,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    errors: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and not errors and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is not None:
                errors.add(msg.error().code())
            elif msg is not None:
                got.append(msg.value())
    finally:
        consumer.close()
    return got, errors


def test_confluent_admin_acls_and_clients_under_them(broker: BrokerProcess) -> None:
    admin = AdminClient(conf(broker, "admin"))
    admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(10)
    for f in admin.create_acls(README_ACLS).values():
        assert f.result(10) is None
    described = admin.describe_acls(EVERYTHING).result(10)
    assert sorted(map(str, described)) == sorted(map(str, README_ACLS))

    # alice's transactional producer and consumer group work under those ACLs.
    producer = CkProducer({**conf(broker, "alice"), "transactional.id": "orders-app"})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(5):
        producer.produce("orders", b"order-%d" % i)
    producer.commit_transaction(10)
    expected = [b"order-%d" % i for i in range(5)]
    assert _consume(conf(broker, "alice"), "orders", "orders-readers", 5) == (expected, set())

    # bob has no ACL: refused with Kafka's codes, as librdkafka reports them.
    errors: list[CkError] = []
    bob = CkProducer({**conf(broker, "bob"), "error_cb": errors.append})
    bob.produce("orders", b"forged", on_delivery=lambda err, msg: errors.append(err))
    bob.flush(10)
    assert any(e is not None and e.code() == CkError.TOPIC_AUTHORIZATION_FAILED for e in errors)
    bob_txn = CkProducer({**conf(broker, "bob"), "transactional.id": "orders-app"})
    with pytest.raises(KafkaException) as refused:
        bob_txn.init_transactions(10)
    assert refused.value.args[0].code() == CkError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert _consume(conf(broker, "admin"), "orders", "admin-check", 5) == (expected, set())

    # Deleting the Read ACLs takes effect at once: alice's next consumer is refused.
    read_filter = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        "User:alice",
        None,
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    (deleted,) = admin.delete_acls([read_filter]).values()
    assert len(deleted.result(10)) == 2
    remaining = admin.describe_acls(EVERYTHING).result(10)
    assert sorted(map(str, remaining)) == sorted(map(str, README_ACLS[:2]))
    got, errors = _consume(conf(broker, "alice"), "orders", "orders-readers2", 1)
    assert got == [] and errors & {
        CkError.GROUP_AUTHORIZATION_FAILED,
        CkError.TOPIC_AUTHORIZATION_FAILED,
    }, errors


def _properties(path: Path, user: str) -> Path:
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        f"sasl.username={user}\nsasl.password={PASSWORDS[user]}\n"
    )
    return path


def _fetch_code(broker: BrokerProcess, user: str, topic: str) -> int:
    security = from_config(conf(broker, user))
    with BlockingConnection("127.0.0.1", broker.port, security=security) as conn:
        resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): 0}))
        return int(resp.responses[0].partitions[0].error_code)


def test_samsa_acls_cli_and_acls_survive_sigkill(broker: BrokerProcess, tmp_path: Path) -> None:
    admin_props = _properties(tmp_path / "admin.properties", "admin")
    bob_props = _properties(tmp_path / "bob.properties", "bob")
    base = ["--bootstrap-server", broker.bootstrap]
    admin = AdminClient(conf(broker, "admin"))
    admin.create_topics([NewTopic("logs-app", 1, 1)])["logs-app"].result(10)
    assert _fetch_code(broker, "bob", "logs-app") == ErrorCode.TOPIC_AUTHORIZATION_FAILED

    add = samsa_cli(
        "acls", "add", *base, "--command-config", str(admin_props),
        "--allow-principal", "User:bob", "--operation", "Read", "--operation", "Describe",
        "--topic", "logs-", "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert add.returncode == 0, add.stderr
    assert add.stdout.count("added ALLOW User:bob") == 2
    assert _fetch_code(broker, "bob", "logs-app") == ErrorCode.NONE  # effective at once

    # Only a principal with Alter on the cluster may change ACLs.
    refused = samsa_cli(
        "acls", "add", *base, "--command-config", str(bob_props),
        "--allow-principal", "User:bob", "--operation", "All", "--cluster",
    )  # fmt: skip
    assert refused.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
    peek = samsa_cli("acls", "list", *base, "--command-config", str(bob_props))
    assert peek.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in peek.stderr

    # A SCRAM user made through the API, with an ACL of its own.
    carol = UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"carol-pw"
    )
    for f in admin.alter_user_scram_credentials([carol]).values():
        assert f.result(10) is None
    granted = samsa_cli(
        "acls", "add", *base, "--command-config", str(admin_props),
        "--allow-principal", "User:carol", "--operation", "Describe", "--topic", "logs-app",
    )  # fmt: skip
    assert granted.returncode == 0, granted.stderr

    broker.kill()  # SIGKILL: the ACLs and the users must already be on disk
    broker.start()
    carol_conf = {
        "bootstrap.servers": broker.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "carol",
        "sasl.password": "carol-pw",
    }
    assert set(AdminClient(carol_conf).list_topics(timeout=10).topics) == {"logs-app"}
    listed = samsa_cli("acls", "list", *base, "--command-config", str(admin_props), "--topic", "logs-app", "--resource-pattern-type", "match")  # fmt: skip  # noqa: E501
    assert listed.returncode == 0, listed.stderr
    rows = sorted(line.split("\t") for line in listed.stdout.splitlines()[1:])
    assert rows == [
        ["TOPIC", "logs-", "PREFIXED", "User:bob", "*", op, "ALLOW"] for op in ("Describe", "Read")
    ] + [["TOPIC", "logs-app", "LITERAL", "User:carol", "*", "Describe", "ALLOW"]]
    assert _fetch_code(broker, "bob", "logs-app") == ErrorCode.NONE

    removed = samsa_cli(
        "acls", "remove", *base, "--command-config", str(admin_props),
        "--allow-principal", "User:bob", "--operation", "Read", "--topic", "logs-",
        "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    assert "1 ACL(s) removed" in removed.stdout
    assert _fetch_code(broker, "bob", "logs-app") == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_samsa_client_under_acls(broker: BrokerProcess) -> None:
    admin = AdminClient(conf(broker, "admin"))
    admin.create_topics([NewTopic("samsa-orders", 1, 1)])["samsa-orders"].result(10)
    write = _binding(ResourceType.TOPIC, "samsa-orders", AclOperation.WRITE)
    for f in admin.create_acls([write]).values():
        assert f.result(10) is None
    with Producer({**conf(broker, "alice"), "delivery.timeout.ms": 10_000}) as producer:
        producer.send("samsa-orders", b"ok")
        producer.flush(10)
    # bob may write nowhere: his idempotent producer cannot even get a producer id.
    with pytest.raises(KafkaError) as refused:
        with Producer({**conf(broker, "bob"), "delivery.timeout.ms": 10_000}) as producer:
            producer.send("samsa-orders", b"forged")
            producer.flush(10)
    assert refused.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    got, errors = _consume(conf(broker, "admin"), "samsa-orders", "samsa-check", 1)
    assert (got, errors) == ([b"ok"], set())
