"""KIP-848 regex subscriptions under ACLs, as Kafka 4.0 fixed them: a regex resolves only to
topics the member may Describe, and ConsumerGroupDescribe shows no topic its caller may not
Describe (the whole group is answered TOPIC_AUTHORIZATION_FAILED instead, as KafkaApis does).
Before, a member with Read on its group alone subscribing ``.*`` was assigned partitions of
topics it may not see, and describe returned their names and ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _handlers import handle
from samsa.broker.authorizer import AclBinding, Operation, PatternType, Permission, ResourceType
from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

ADMIN, ALICE = "User:admin", "User:alice"
K_HB, K_DESC = ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE


def _call(broker: Broker, principal: str, key: int, v: int, cls: str, **fields: Any) -> Any:
    return handle(broker, principal, key, v, make_request(key, v, cls, **fields), "10.0.0.7")


def _join(broker: Broker, principal: str, group: str, member: str, regex: str) -> Any:
    return _call(
        broker,
        principal,
        K_HB,
        1,
        "ConsumerGroupHeartbeatRequest",
        group_id=group,
        member_id=member,
        member_epoch=0,
        rebalance_timeout=30_000,
        subscribed_topic_names=None,
        subscribed_topic_regex=regex,
        server_assignor=None,
        topic_partitions=(),
    )


def _describe(broker: Broker, principal: str, group: str) -> Any:
    r = _call(
        broker,
        principal,
        K_DESC,
        1,
        "ConsumerGroupDescribeRequest",
        group_ids=(group,),
        include_authorized_operations=False,
    )
    return r.groups[0]


def _allow(rtype: ResourceType, name: str, op: Operation) -> AclBinding:
    return AclBinding(rtype, name, PatternType.LITERAL, ALICE, "*", op, Permission.ALLOW)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(
        BrokerConfig(
            data_dir=tmp_path,
            authorizer_class_name="org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            super_users=ADMIN,
            group_initial_rebalance_delay_ms=0,
        )
    )
    b.start()
    for name in ("open", "secret-1", "secret-2"):
        b.create_topic(name, 2)
    assert b.authorizer is not None
    grants = [_allow(ResourceType.GROUP, g, Operation.READ) for g in ("g", "shared")]
    grants.append(_allow(ResourceType.TOPIC, "open", Operation.DESCRIBE))
    assert b.authorizer.create(grants) == [None] * 3
    yield b
    b.close()


def test_a_regex_resolves_only_to_topics_the_member_may_describe(broker: Broker) -> None:
    ids = {t.topic_id: name for name, t in broker.topics.topics.items()}
    r = _join(broker, ALICE, "g", "m-alice", ".*")
    assert r.error_code == ErrorCode.NONE
    assigned = {ids[tp.topic_id] for tp in r.assignment.topic_partitions}
    assert assigned == {"open"}
    described = _describe(broker, ALICE, "g")
    assert described.error_code == ErrorCode.NONE
    names = {tp.topic_name for m in described.members for tp in m.assignment.topic_partitions}
    names |= {
        tp.topic_name for m in described.members for tp in m.target_assignment.topic_partitions
    }
    assert names == {"open"}
    # a principal that may Describe everything gets everything from the same regex
    r = _join(broker, ADMIN, "g-admin", "m-admin", ".*")
    assert {ids[tp.topic_id] for tp in r.assignment.topic_partitions} == set(ids.values())


def test_describe_hides_a_group_holding_topics_the_caller_may_not_describe(
    broker: Broker,
) -> None:
    assert _join(broker, ADMIN, "shared", "m-admin", "secret-.*").error_code == ErrorCode.NONE
    hidden = _describe(broker, ALICE, "shared")  # Read on the group implies Describe
    assert hidden.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert hidden.error_message == (
        "The group has described topic(s) that the client is not authorized to describe."
    )
    assert list(hidden.members) == []
    shown = _describe(broker, ADMIN, "shared")
    assert shown.error_code == ErrorCode.NONE and len(shown.members) == 1
