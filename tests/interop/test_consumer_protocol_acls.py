"""ACLs on the KIP-848 APIs (docs/semantics.md, rule 33), as Kafka's KafkaApis checks them:
ConsumerGroupHeartbeat needs Read on the group and Describe on every topic subscribed to,
ConsumerGroupDescribe needs Describe on the group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka.admin import AclOperation, AdminClient, NewTopic, ResourceType
from test_acls import PASSWORDS, _binding, conf, start

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.client._security import from_config
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

K_HB = ApiKey.CONSUMER_GROUP_HEARTBEAT
K_DESC = ApiKey.CONSUMER_GROUP_DESCRIBE


def _heartbeat(conn: BlockingConnection, group: str, topics: tuple[str, ...]) -> Any:
    req = make_request(
        K_HB,
        1,
        "ConsumerGroupHeartbeatRequest",
        group_id=group,
        member_id="m-" + group,
        member_epoch=0,
        rebalance_timeout=30_000,
        subscribed_topic_names=topics,
        subscribed_topic_regex=None,
        server_assignor=None,
        topic_partitions=(),
    )
    return conn.request(K_HB, 1, req)


def _describe(conn: BlockingConnection, group: str) -> int:
    req = make_request(
        K_DESC,
        1,
        "ConsumerGroupDescribeRequest",
        group_ids=(group,),
        include_authorized_operations=False,
    )
    return int(conn.request(K_DESC, 1, req).groups[0].error_code)


def test_consumer_group_apis_are_authorized(tmp_path: Path) -> None:
    users = tmp_path / "plain-users"
    users.write_text("".join(f"{u}={p}\n" for u, p in PASSWORDS.items()))
    broker: BrokerProcess = start(tmp_path / "data", users)
    try:
        admin = AdminClient(conf(broker, "admin"))
        for f in admin.create_topics([NewTopic(t, 2, 1) for t in ("open", "secret")]).values():
            f.result(20)
        acls = [
            _binding(ResourceType.GROUP, "g-alice", AclOperation.READ),
            _binding(ResourceType.TOPIC, "open", AclOperation.DESCRIBE),
        ]
        for f in admin.create_acls(acls).values():
            f.result(20)

        def connect(user: str) -> BlockingConnection:
            security = from_config(conf(broker, user))
            return BlockingConnection("127.0.0.1", broker.port, security=security)

        with connect("bob") as bob:
            r = _heartbeat(bob, "g-alice", ("open",))
            assert int(r.error_code) == ErrorCode.GROUP_AUTHORIZATION_FAILED
            assert _describe(bob, "g-alice") == ErrorCode.GROUP_AUTHORIZATION_FAILED
        with connect("alice") as alice:
            r = _heartbeat(alice, "g-alice", ("open", "secret"))
            assert int(r.error_code) == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            r = _heartbeat(alice, "g-alice", ("open",))
            # Kafka 4.4's first epoch with a subscription: a new group is at 1, the join bumps.
            assert int(r.error_code) == ErrorCode.NONE and r.member_epoch == 2
            assert len(r.assignment.topic_partitions[0].partitions) == 2
            # Read on the group implies Describe, as in Kafka.
            assert _describe(alice, "g-alice") == ErrorCode.NONE
        with connect("admin") as root:
            assert _describe(root, "g-alice") == ErrorCode.NONE
    finally:
        broker.stop()
