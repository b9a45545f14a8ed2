"""Share-group membership (KIP-932): joining, epochs, the simple assignor, fencing, leaving,
session expiry and the bound on members, on the pure coordinator with a fake clock."""

from __future__ import annotations

import uuid

from samsa.coordinator.consumer_group_coordinator import TopicInfo
from samsa.coordinator.group_coordinator import GroupCoordinator
from samsa.coordinator.share_group import (
    ShareConfig,
    ShareGroups,
    ShareHeartbeat,
    simple_assign,
)
from samsa.protocol.errors import ErrorCode as E

T = TopicInfo("t", uuid.UUID(int=1), 3)
ONE = TopicInfo("one", uuid.UUID(int=2), 1)
TOPICS = {"t": T, "one": ONE}


def hb(
    member: str, epoch: int, topics: tuple[str, ...] | None = ("t",), group: str = "g"
) -> ShareHeartbeat:
    return ShareHeartbeat(group, member, epoch, subscribed_topic_names=topics)


def test_the_simple_assignor_spreads_partitions_then_shares_them() -> None:
    assert simple_assign({"a": ("t",), "b": ("t",)}, TOPICS) == {
        "a": {T.topic_id: frozenset({0, 2})},
        "b": {T.topic_id: frozenset({1})},
    }
    # more members than partitions: each member gets one, partitions are shared
    four = simple_assign({m: ("t",) for m in "abcd"}, TOPICS)
    assert [four[m][T.topic_id] for m in "abcd"] == [{0}, {1}, {2}, {0}]
    assert simple_assign({"a": ("one",), "b": ("one",)}, TOPICS) == {
        "a": {ONE.topic_id: frozenset({0})},
        "b": {ONE.topic_id: frozenset({0})},
    }
    assert simple_assign({"a": ("missing",)}, TOPICS) == {"a": {}}


def test_join_heartbeat_and_a_new_member_bump_the_epoch() -> None:
    s = ShareGroups()
    # As Kafka: the first member's subscription and the topic metadata are two bumps.
    a = s.heartbeat(hb("a", 0), TOPICS, 0)
    assert (a.error, a.member_epoch) == (E.NONE, 2)
    assert a.assignment == {T.topic_id: frozenset({0, 1, 2})}
    again = s.heartbeat(hb("a", 2, None), TOPICS, 10)
    assert (again.member_epoch, again.assignment) == (2, None)  # nothing new
    b = s.heartbeat(hb("b", 0), TOPICS, 20)
    assert b.member_epoch == 3 and b.assignment == {T.topic_id: frozenset({1})}
    a2 = s.heartbeat(hb("a", 2, None), TOPICS, 30)
    assert a2.member_epoch == 3 and a2.assignment == {T.topic_id: frozenset({0, 2})}
    d = s.describe("g")
    assert (d.state, d.group_epoch, d.assignment_epoch, d.assignor) == ("Stable", 3, 3, "simple")
    # a topic growing is a new assignment, at a new epoch
    grown = {**TOPICS, "t": TopicInfo("t", T.topic_id, 4)}
    a3 = s.heartbeat(hb("a", 3, None), grown, 40)
    assert a3.member_epoch == 4 and a3.assignment == {T.topic_id: frozenset({0, 2})}
    assert s.heartbeat(hb("b", 3, None), grown, 40).assignment == {T.topic_id: frozenset({1, 3})}


def test_bad_heartbeats_are_refused() -> None:
    s = ShareGroups()
    assert s.heartbeat(hb("", 0), TOPICS, 0).error is E.INVALID_REQUEST
    assert s.heartbeat(hb("a", 0, None), TOPICS, 0).error is E.INVALID_REQUEST
    assert s.heartbeat(hb("a", 3), TOPICS, 0).error is E.UNKNOWN_MEMBER_ID  # D-SHARE-2
    s.heartbeat(hb("a", 0), TOPICS, 0)
    assert s.heartbeat(hb("x", 1), TOPICS, 0).error is E.UNKNOWN_MEMBER_ID
    assert s.heartbeat(hb("a", 7), TOPICS, 0).error is E.FENCED_MEMBER_EPOCH


def test_leaving_and_session_expiry_reassign() -> None:
    s = ShareGroups(ShareConfig(session_timeout_ms=100))
    first = s.heartbeat(hb("a", 0), TOPICS, 0)
    s.heartbeat(hb("b", 0), TOPICS, 50)
    left = s.heartbeat(hb("a", first.member_epoch, None), TOPICS, 60)
    assert s.heartbeat(hb("a", left.member_epoch, None), TOPICS, 60).error is E.NONE
    assert s.heartbeat(hb("a", -1, None), TOPICS, 70).member_epoch == -1
    assert s.next_deadline("g") == 150
    assert s.fire("g", TOPICS, 149) == []
    assert s.fire("g", TOPICS, 150) == ["b"]
    assert s.describe("g").state == "Empty"
    assert s.describe("nope").error is E.GROUP_ID_NOT_FOUND


def test_members_and_groups_are_bounded() -> None:
    s = ShareGroups(ShareConfig(max_size=2, max_groups=1))
    s.heartbeat(hb("a", 0), TOPICS, 0)
    s.heartbeat(hb("b", 0), TOPICS, 0)
    assert s.heartbeat(hb("c", 0), TOPICS, 0).error is E.GROUP_MAX_SIZE_REACHED
    assert s.heartbeat(hb("a", 0, group="h"), TOPICS, 0).error is E.GROUP_MAX_SIZE_REACHED
    assert len(s.describe("g").members) == 2 and s.describe("h").error is E.GROUP_ID_NOT_FOUND


def test_an_id_of_another_kind_of_group_is_not_a_share_group() -> None:
    c = GroupCoordinator(topics=lambda: TOPICS)
    c.registry.offsets_only("simple")  # a group storing offsets: a classic group
    out = c.share_heartbeat(hb("a", 0, group="simple"), TOPICS, 0)
    assert out.response.error is E.GROUP_ID_NOT_FOUND and out.records == []
    assert c.describe_share_group("simple").error is E.GROUP_ID_NOT_FOUND
    assert c.share_heartbeat(hb("a", 0), TOPICS, 0).response.error is E.NONE
    # its session deadline is on the coordinator's timer
    assert c.next_deadline() is not None
    c.tick(c.share.config.session_timeout_ms)
    assert c.describe_share_group("g").members == ()


def test_list_leave_listeners_and_delete() -> None:
    s = ShareGroups()
    left: list[tuple[str, str]] = []
    deleted: list[str] = []
    s.on_leave.append(lambda g, m: left.append((g, m)))
    s.on_delete.append(deleted.append)
    s.heartbeat(hb("a", 0), TOPICS, 0)
    s.heartbeat(hb("b", 0, group="h"), TOPICS, 0)
    assert s.list(["stable"]) == [("g", "Stable"), ("h", "Stable")]
    assert s.delete("g") is E.NON_EMPTY_GROUP
    s.heartbeat(hb("a", -1, None), TOPICS, 1)
    assert s.list(["Empty"]) == [("g", "Empty")]
    assert s.fire("h", TOPICS, 10**9) == ["b"]  # its session ran out
    assert left == [("g", "a"), ("h", "b")]
    assert (s.delete("g"), s.delete("g"), deleted) == (E.NONE, E.GROUP_ID_NOT_FOUND, ["g"])
    assert s.list() == [("h", "Empty")]


def test_classic_and_consumer_apis_refuse_a_share_group_id() -> None:
    c = GroupCoordinator(topics=lambda: TOPICS)
    c.share_heartbeat(hb("a", 0), TOPICS, 0)
    assert c.describe_consumer_group("g").error is E.GROUP_ID_NOT_FOUND
    assert c.list_share_groups() == [("g", "Stable")]
    assert c.delete_groups(["g"], 0).response == {"g": E.NON_EMPTY_GROUP}
