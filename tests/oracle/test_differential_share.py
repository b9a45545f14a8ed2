"""Differential scenarios of share groups (KIP-932): ShareGroupHeartbeat epochs and errors,
ShareGroupDescribe, and the share-session errors of ShareFetch / ShareAcknowledge, answered
by samsa as by Apache Kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from samsa.protocol.messages import ApiKey, make_request
from samsa.testing.oracle import TRANSIENT, Deviation, Outcome, Rule, Side

Run = Callable[..., Outcome]
RULES = {"member_id": Rule.NODE, "topic_id": Rule.TOPIC_ID}
ASSIGNED = {"topic_partitions": [{"topic_id": "topic#0", "partitions": [0]}]}


def _d3(path: str, samsa: object, kafka: object) -> Deviation:
    return Deviation(path, samsa, kafka, "D-SHARE-3")


# D-SHARE-3: Kafka assigns a partition to a share group only once the share coordinator has
# initialized its state, and computes the target at most every assignment interval: in a quick
# scenario its members stay at epoch 2 with nothing assigned, where samsa assigns at once.
DEFERRED = [
    _d3("a-joins.assignment.topic_partitions.len", 1, 0),
    _d3("describe-a.groups[0].members[0].assignment.topic_partitions.len", 1, 0),
    _d3("b-joins.member_epoch", 3, 2),
    _d3("b-joins.assignment.topic_partitions.len", 1, 0),
    _d3("a-steady.member_epoch", 3, 2),
    _d3("a-steady.assignment", ASSIGNED, None),
    _d3("a-steady-again.member_epoch", 3, 2),
    _d3("describe-ab.groups[0].assignment_epoch", 3, 2),
    *(_d3(f"describe-ab.groups[0].members[{i}].member_epoch", 3, 2) for i in (0, 1)),
    *(
        _d3(f"describe-ab.groups[0].members[{i}].assignment.topic_partitions.len", 1, 0)
        for i in (0, 1)
    ),
    _d3("describe-b.groups[0].assignment_epoch", 4, 2),
    _d3("describe-b.groups[0].members[0].member_epoch", 3, 2),
    _d3("describe-b.groups[0].members[0].assignment.topic_partitions.len", 1, 0),
]


def _retry(resp: Any) -> bool:
    return int(getattr(resp, "error_code", 0)) in TRANSIENT


def _heartbeat(
    s: Side, label: str, group: str, member: str, epoch: int, topics: tuple[str, ...] | None
) -> Any:
    k, v = ApiKey.SHARE_GROUP_HEARTBEAT, 1
    req = make_request(k, v, "ShareGroupHeartbeatRequest", group_id=group, member_id=member,
                       member_epoch=epoch, rack_id=None, subscribed_topic_names=topics)  # fmt: skip
    return s.call(label, k, v, req, retry=_retry)


def _describe(s: Side, label: str, group: str) -> Any:
    k, v = ApiKey.SHARE_GROUP_DESCRIBE, 1
    req = make_request(k, v, "ShareGroupDescribeRequest", group_ids=(group,),
                       include_authorized_operations=False)  # fmt: skip
    return s.call(label, k, v, req, retry=lambda r: any(_retry(g) for g in r.groups))


def _share_fetch(s: Side, label: str, group: str, member: str, epoch: int) -> Any:
    k, v = ApiKey.SHARE_FETCH, 1
    req = make_request(k, v, "ShareFetchRequest", group_id=group, member_id=member,
                       share_session_epoch=epoch, max_wait=0, min_bytes=1, max_bytes=1 << 20,
                       max_records=10, batch_size=10, topics=(),
                       forgotten_topics_data=())  # fmt: skip
    return s.call(label, k, v, req)


def _share_acknowledge(s: Side, label: str, group: str, member: str, epoch: int) -> Any:
    k, v = ApiKey.SHARE_ACKNOWLEDGE, 1
    req = make_request(k, v, "ShareAcknowledgeRequest", group_id=group, member_id=member,
                       share_session_epoch=epoch, topics=())  # fmt: skip
    return s.call(label, k, v, req)


def test_share_group_epochs_and_errors(differential: Run) -> None:
    """Two members join a share group on a one-partition topic (both are assigned it: share
    groups share partitions), heartbeat at their epochs, are refused ahead of them or unknown,
    and leave; the group is described throughout."""

    def scenario(s: Side) -> None:
        group, topic = s.unique("sg"), s.unique("t")
        s.create_topic(topic, 1)
        s.find_coordinator("coordinator", group, key_type=0)
        # Kafka's share consumers name themselves with a UUID: at most 36 characters.
        a, b = "member-a-0000", "member-b-0000"
        _heartbeat(s, "member-id-too-long", group, "m" * 37, 0, (topic,))
        first = _heartbeat(s, "a-joins", group, a, 0, (topic,))
        _describe(s, "describe-a", group)
        second = _heartbeat(s, "b-joins", group, b, 0, (topic,))
        again = _heartbeat(s, "a-steady", group, a, first.member_epoch, None)
        _heartbeat(s, "a-steady-again", group, a, again.member_epoch, None)
        _describe(s, "describe-ab", group)
        _heartbeat(s, "b-epoch-ahead", group, b, second.member_epoch + 5, None)
        _heartbeat(s, "unknown-member", group, "nobody", 1, None)
        _heartbeat(s, "join-without-topics", group, "member-c", 0, None)
        _heartbeat(s, "a-leaves", group, a, -1, None)
        _describe(s, "describe-b", group)
        _describe(s, "describe-unknown", s.unique("no-such-group"))
        _share_fetch(s, "fetch-no-session", group, b, 3)
        _share_acknowledge(s, "ack-initial-epoch", group, b, 0)
        _share_acknowledge(s, "ack-no-session", group, b, 2)
        _share_fetch(s, "fetch-member-id-too-long", group, "m" * 37, 0)

    differential(scenario, rules=RULES, deviations=DEFERRED)


def _describe_offsets(s: Side, label: str, group: str, topic: str | None) -> Any:
    k, v = ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1
    topics = None
    if topic is not None:
        topics = (make_request(k, v, "DescribeShareGroupOffsetsRequestTopic", topic_name=topic,
                               partitions=(0,)),)  # fmt: skip
    group_req = make_request(k, v, "DescribeShareGroupOffsetsRequestGroup", group_id=group,
                             topics=topics)  # fmt: skip
    req = make_request(k, v, "DescribeShareGroupOffsetsRequest", groups=(group_req,))
    return s.call(label, k, v, req, retry=lambda r: any(_retry(g) for g in r.groups))


def _alter_offsets(s: Side, label: str, group: str, topic: str, offset: int) -> Any:
    k, v = ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0
    part = make_request(k, v, "AlterShareGroupOffsetsRequestPartition", partition_index=0,
                        start_offset=offset)  # fmt: skip
    t = make_request(k, v, "AlterShareGroupOffsetsRequestTopic", topic_name=topic,
                     partitions=(part,))  # fmt: skip
    req = make_request(k, v, "AlterShareGroupOffsetsRequest", group_id=group, topics=(t,))
    return s.call(label, k, v, req, retry=_retry)


def test_share_group_offsets_admin(differential: Run) -> None:
    """The offsets admin calls on an unknown group and on a group with a member (refused:
    not empty)."""

    def scenario(s: Side) -> None:
        group, topic = s.unique("sg"), s.unique("t")
        s.create_topic(topic, 1)
        s.find_coordinator("coordinator", group, key_type=0)
        _describe_offsets(s, "describe-unknown-group", s.unique("nobody"), None)
        _alter_offsets(s, "alter-unknown-group", s.unique("nobody"), topic, 0)
        _heartbeat(s, "a-joins", group, "member-a-0000", 0, (topic,))
        _alter_offsets(s, "alter-non-empty", group, topic, 0)

    differential(
        scenario, rules=RULES, deviations=[_d3("a-joins.assignment.topic_partitions.len", 1, 0)]
    )


def _list_groups(s: Side, label: str, group: str, types: tuple[str, ...] = (),
                 states: tuple[str, ...] = ()) -> None:  # fmt: skip
    """ListGroups, recording only ``group``'s entry: the node holds other scenarios' groups."""
    k, v = ApiKey.LIST_GROUPS, 5
    req = make_request(k, v, "ListGroupsRequest", states_filter=states, types_filter=types)
    resp = s.conn.request(k, v, req)
    s.note(label, {"error_code": resp.error_code,
                   "groups": [g for g in resp.groups if g.group_id == group]})  # fmt: skip


def _other_group_apis(s: Side, tag: str, group: str, topic: str) -> None:
    """Every API of the classic and consumer protocols given a share group's id."""
    k = ApiKey.DESCRIBE_GROUPS
    req = make_request(k, 5, "DescribeGroupsRequest", groups=(group,),
                       include_authorized_operations=False)  # fmt: skip
    s.call(f"{tag}-describe-groups", k, 5, req, retry=lambda r: any(_retry(g) for g in r.groups))
    k = ApiKey.CONSUMER_GROUP_DESCRIBE
    req = make_request(k, 0, "ConsumerGroupDescribeRequest", group_ids=(group,),
                       include_authorized_operations=False)  # fmt: skip
    s.call(f"{tag}-consumer-group-describe", k, 0, req)
    k = ApiKey.OFFSET_FETCH
    req = make_request(k, 7, "OffsetFetchRequest", group_id=group, require_stable=False,
                       topics=(make_request(k, 7, "OffsetFetchRequestTopic", name=topic,
                                            partition_indexes=(0,)),))  # fmt: skip
    s.call(f"{tag}-offset-fetch", k, 7, req, retry=_retry)
    k = ApiKey.JOIN_GROUP
    protocol = make_request(k, 5, "JoinGroupRequestProtocol", name="range", metadata=b"m")
    req = make_request(k, 5, "JoinGroupRequest", group_id=group, session_timeout=10_000,
                       rebalance_timeout=10_000, member_id="", group_instance_id=None,
                       protocol_type="consumer", protocols=(protocol,))  # fmt: skip
    s.call(f"{tag}-join-group", k, 5, req, retry=_retry)
    _consumer_heartbeat(s, f"{tag}-consumer-heartbeat", group, "member-c-0000", topic)


def _consumer_heartbeat(s: Side, label: str, group: str, member: str, topic: str) -> Any:
    k = ApiKey.CONSUMER_GROUP_HEARTBEAT
    req = make_request(k, 0, "ConsumerGroupHeartbeatRequest", group_id=group, member_id=member,
                       member_epoch=0, instance_id=None, rack_id=None, rebalance_timeout=30_000,
                       subscribed_topic_names=(topic,), server_assignor=None,
                       topic_partitions=())  # fmt: skip
    return s.call(label, k, 0, req, retry=_retry)


def _delete_groups(s: Side, label: str, group: str) -> Any:
    k = ApiKey.DELETE_GROUPS
    req = make_request(k, 2, "DeleteGroupsRequest", groups_names=(group,))
    return s.call(label, k, 2, req, retry=lambda r: any(_retry(g) for g in r.results))


def test_share_group_ids_in_the_other_group_apis(differential: Run) -> None:
    """A share group's id given to ListGroups (type and state filters), DescribeGroups,
    ConsumerGroupDescribe, OffsetFetch, JoinGroup, ConsumerGroupHeartbeat and DeleteGroups
    (with a member, then empty), and a consumer group's id given to ShareGroupHeartbeat."""

    def scenario(s: Side) -> None:
        group, topic = s.unique("sg"), s.unique("t")
        s.create_topic(topic, 1)
        s.find_coordinator("coordinator", group, key_type=0)
        _heartbeat(s, "a-joins", group, "member-a-0000", 0, (topic,))
        _list_groups(s, "list-all", group)
        _list_groups(s, "list-share", group, types=("share",))
        _list_groups(s, "list-consumer", group, types=("consumer",))
        _list_groups(s, "list-classic", group, types=("classic",))
        _list_groups(s, "list-stable", group, states=("Stable",))
        _list_groups(s, "list-empty", group, states=("Empty",))
        _other_group_apis(s, "member", group, topic)
        _delete_groups(s, "delete-non-empty", group)
        _heartbeat(s, "a-leaves", group, "member-a-0000", -1, None)
        _list_groups(s, "list-after-leave", group, types=("share",))
        _other_group_apis(s, "empty", group, topic)
        _delete_groups(s, "delete-empty", group)
        _describe(s, "describe-deleted", group)
        _list_groups(s, "list-deleted", group)
        # and the other way: a consumer group's id in ShareGroupHeartbeat
        cg = s.unique("cg")
        s.find_coordinator("cg-coordinator", cg, key_type=0)
        _consumer_heartbeat(s, "cg-joins", cg, "member-d-0000", topic)
        _heartbeat(s, "share-heartbeat-on-consumer-group", cg, "member-e-0000", 0, (topic,))
        _describe(s, "share-describe-consumer-group", cg)

    differential(
        scenario, rules=RULES, deviations=[_d3("a-joins.assignment.topic_partitions.len", 1, 0)]
    )
