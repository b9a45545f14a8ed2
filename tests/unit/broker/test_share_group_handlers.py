"""ShareGroupHeartbeat and ShareGroupDescribe through the broker's handlers (KIP-932): a share
consumer's join, the assignment by topic id, describe with topic names, leave, the
authorizer's Read on the group, and ApiVersions advertising both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _handlers import handle
from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

K_HB, K_DESC = ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_GROUP_DESCRIBE


def _call(broker: Broker, key: int, cls: str, **fields: Any) -> Any:
    return handle(broker, "User:ANONYMOUS", key, 1, make_request(key, 1, cls, **fields), "10.0.0.7")


def _hb(broker: Broker, member: str, epoch: int, topics: tuple[str, ...] | None) -> Any:
    return _call(
        broker,
        K_HB,
        "ShareGroupHeartbeatRequest",
        group_id="sg",
        member_id=member,
        member_epoch=epoch,
        rack_id=None,
        subscribed_topic_names=topics,
    )


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig(data_dir=tmp_path))
    b.start()
    b.create_topic("jobs", 2)
    yield b
    b.close()


def test_join_describe_leave(broker: Broker) -> None:
    tid = broker.topics.topics["jobs"].topic_id
    a = _hb(broker, "member-a", 0, ("jobs",))
    assert (a.error_code, a.member_id, a.member_epoch) == (ErrorCode.NONE, "member-a", 2)
    assert [(tp.topic_id, tp.partitions) for tp in a.assignment.topic_partitions] == [(tid, (0, 1))]
    b = _hb(broker, "member-b", 0, ("jobs",))
    assert b.member_epoch == 3 and b.assignment.topic_partitions[0].partitions == (1,)
    d = _call(
        broker,
        K_DESC,
        "ShareGroupDescribeRequest",
        group_ids=("sg", "absent"),
        include_authorized_operations=False,
    )
    sg, absent = d.groups
    assert (sg.error_code, sg.group_state, sg.group_epoch, sg.assignor_name) == (
        ErrorCode.NONE,
        "Stable",
        3,
        "simple",
    )
    assert sorted(m.member_id for m in sg.members) == ["member-a", "member-b"]
    assert {m.assignment.topic_partitions[0].topic_name for m in sg.members} == {"jobs"}
    assert absent.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    gone = _hb(broker, "member-a", -1, None)
    assert (gone.error_code, gone.member_epoch) == (ErrorCode.NONE, -1)
    fenced = _hb(broker, "member-b", 7, None)
    assert (fenced.error_code, fenced.member_id) == (ErrorCode.FENCED_MEMBER_EPOCH, None)


def test_api_versions_advertises_share_group_apis(broker: Broker) -> None:
    r = _call(
        broker,
        ApiKey.API_VERSIONS,
        "ApiVersionsRequest",
        client_software_name="t",
        client_software_version="1",
    )
    keys = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert keys[K_HB] == (1, 1) and keys[K_DESC] == (1, 1)
