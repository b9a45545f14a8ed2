"""ShareFetch and ShareAcknowledge through the broker's handlers (KIP-932): two members
sharing one partition never get the same record, acknowledgements move the share-partition
start, released records come back with a higher delivery count, share-session epochs are
checked, and closing a session gives back what its member held."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _handlers import handle
from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.broker.share import share_clock
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch, validate_produce_batch

KF, KA = ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE
ACCEPT, RELEASE = 1, 2


def _open(data_dir: Path, **settings: Any) -> Broker:
    """A broker on ``data_dir``; the first time, with topic "jobs" holding three batches of
    two records (offsets 0-5) and group "sg" reading from the start."""
    b = Broker(BrokerConfig(data_dir=data_dir, **settings))
    b.start()
    if "jobs" in b.topics.topics:
        return b
    b.create_topic("jobs", 1)
    b.group_configs.alter("sg", {"share.auto.offset.reset": "earliest"}, validate_only=False)
    part = b.topics.get_partition("jobs", 0)
    assert part is not None
    for i in range(3):
        batch = build_batch([NewRecord(None, f"r{i}-{j}".encode()) for j in range(2)])
        b.append(part, validate_produce_batch(batch))
    return b


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = _open(tmp_path)
    yield b
    b.close()


def _tid(broker: Broker) -> uuid.UUID:
    return broker.topics.topics["jobs"].topic_id


def _fetch(
    broker: Broker,
    member: str,
    epoch: int,
    acks: list[tuple[int, int, int]] = (),  # type: ignore[assignment]
    max_records: int = 10,
    host: str = "10.0.0.7",
) -> Any:
    batches = tuple(
        make_request(
            KF, 1, "AcknowledgementBatch", first_offset=f, last_offset=last, acknowledge_types=(t,)
        )
        for f, last, t in acks
    )
    part = make_request(KF, 1, "FetchPartition", partition_index=0, acknowledgement_batches=batches)
    req = make_request(
        KF,
        1,
        "ShareFetchRequest",
        group_id="sg",
        member_id=member,
        share_session_epoch=epoch,
        max_wait=0,
        min_bytes=1,
        max_bytes=1 << 20,
        max_records=max_records,
        batch_size=max_records,
        topics=(make_request(KF, 1, "FetchTopic", topic_id=_tid(broker), partitions=(part,)),),
        forgotten_topics_data=(),
    )
    return handle(broker, "User:ANONYMOUS", KF, 1, req, host)


def _acquired(r: Any) -> list[tuple[int, int, int]]:
    assert r.error_code == ErrorCode.NONE
    return [
        (a.first_offset, a.last_offset, a.delivery_count)
        for t in r.responses
        for p in t.partitions
        for a in p.acquired_records
    ]


def _ack(broker: Broker, member: str, epoch: int, f: int, last: int, t: int) -> Any:
    batch = make_request(
        KA, 1, "AcknowledgementBatch", first_offset=f, last_offset=last, acknowledge_types=(t,)
    )
    part = make_request(
        KA, 1, "AcknowledgePartition", partition_index=0, acknowledgement_batches=(batch,)
    )
    topic = make_request(KA, 1, "AcknowledgeTopic", topic_id=_tid(broker), partitions=(part,))
    req = make_request(
        KA,
        1,
        "ShareAcknowledgeRequest",
        group_id="sg",
        member_id=member,
        share_session_epoch=epoch,
        topics=(topic,),
    )
    return handle(broker, "User:ANONYMOUS", KA, 1, req, "10.0.0.7")


def test_two_members_share_a_partition(broker: Broker) -> None:
    a = _fetch(broker, "a", 0, max_records=2)
    assert _acquired(a) == [(0, 1, 1)]
    assert a.responses[0].partitions[0].records  # the batch holding them
    # one range per batch, as Kafka's AcquiredRecords
    assert _acquired(_fetch(broker, "b", 0, max_records=10)) == [(2, 3, 1), (4, 5, 1)]
    assert _acquired(_fetch(broker, "a", 1)) == []  # nothing left to acquire
    # a accepts 0 and releases 1 (ShareAcknowledge); b takes 1 again, delivered twice now
    assert _ack(broker, "a", 2, 0, 0, ACCEPT).responses[0].partitions[0].error_code == 0
    assert _ack(broker, "a", 3, 1, 1, RELEASE).responses[0].partitions[0].error_code == 0
    sp = broker.share_partitions.get(("sg", _tid(broker), 0))
    assert sp is not None and sp.start_offset == 1
    assert _acquired(_fetch(broker, "b", 1)) == [(1, 1, 2)]
    # acknowledgements ride on a ShareFetch too, before it acquires: b accepts 1-3 and
    # releases 4-5, then gets 4-5 back itself
    r = _fetch(broker, "b", 2, acks=[(1, 3, ACCEPT), (4, 5, RELEASE)])
    assert r.responses[0].partitions[0].acknowledge_error_code == ErrorCode.NONE
    assert _acquired(r) == [(4, 5, 2)] and sp.start_offset == 4


def test_acknowledging_what_another_member_holds_is_refused(broker: Broker) -> None:
    _fetch(broker, "a", 0, max_records=2)
    _fetch(broker, "b", 0)
    r = _ack(broker, "b", 1, 0, 1, ACCEPT)
    assert r.responses[0].partitions[0].error_code == ErrorCode.INVALID_RECORD_STATE
    assert _ack(broker, "a", 1, 0, 1, ACCEPT).responses[0].partitions[0].error_code == 0


def test_share_session_epochs(broker: Broker) -> None:
    assert _fetch(broker, "a", 3).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
    assert _ack(broker, "a", 0, 0, 0, ACCEPT).error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH
    _fetch(broker, "a", 0, max_records=2)
    assert _fetch(broker, "a", 2).error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH
    assert _acquired(_fetch(broker, "a", 1)) == [(2, 3, 1), (4, 5, 1)]
    # closing the session gives a's records back: b gets them
    assert _ack(broker, "a", -1, 0, 0, ACCEPT).error_code == ErrorCode.NONE
    assert _acquired(_fetch(broker, "b", 0)) == [(1, 1, 2), (2, 3, 2), (4, 5, 2)]
    assert broker.share_sessions.get("sg", "a") is None


def test_share_state_survives_a_restart(tmp_path: Path) -> None:
    b = _open(tmp_path)
    assert _acquired(_fetch(b, "a", 0)) == [(0, 1, 1), (2, 3, 1), (4, 5, 1)]
    assert _ack(b, "a", 1, 0, 1, ACCEPT).responses[0].partitions[0].error_code == 0
    b.close()  # a still holds 2-5: the lock does not survive, the delivery does
    again = _open(tmp_path)
    try:
        sp = again.share_partitions.get(("sg", _tid(again), 0))
        assert sp is not None and (sp.start_offset, sp.end_offset) == (2, 6)
        assert _acquired(_fetch(again, "b", 0)) == [(2, 3, 2), (4, 5, 2)]
    finally:
        again.close()


def _offsets(broker: Broker, group: str) -> Any:
    k = ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS
    req = make_request(
        k,
        1,
        "DescribeShareGroupOffsetsRequest",
        groups=(
            make_request(
                k, 1, "DescribeShareGroupOffsetsRequestGroup", group_id=group, topics=None
            ),
        ),
    )
    return handle(broker, "User:ANONYMOUS", k, 1, req, "10.0.0.7").groups[0]


def test_share_group_offsets_admin_calls(broker: Broker) -> None:
    nobody = _offsets(broker, "nobody")  # as Kafka: a group without state, not an error
    assert (nobody.error_code, nobody.topics) == (ErrorCode.NONE, ())
    _fetch(broker, "a", 0, max_records=4)
    _ack(broker, "a", 1, 0, 1, ACCEPT)
    _ack(broker, "a", 2, 3, 3, ACCEPT)
    g = _offsets(broker, "sg")
    (p,) = g.topics[0].partitions
    # SPSO 2; six records, 0-1 and 3 done: lag 3 (2, 4, 5)
    assert (g.error_code, g.topics[0].topic_name, p.start_offset, p.lag) == (0, "jobs", 2, 3)
    ka, kd = ApiKey.ALTER_SHARE_GROUP_OFFSETS, ApiKey.DELETE_SHARE_GROUP_OFFSETS

    def alter(offset: int) -> Any:
        part = make_request(
            ka, 0, "AlterShareGroupOffsetsRequestPartition", partition_index=0, start_offset=offset
        )
        topic = make_request(
            ka, 0, "AlterShareGroupOffsetsRequestTopic", topic_name="jobs", partitions=(part,)
        )
        req = make_request(ka, 0, "AlterShareGroupOffsetsRequest", group_id="sg", topics=(topic,))
        return handle(broker, "User:ANONYMOUS", ka, 0, req, "10.0.0.7")

    # a share group with a member is not altered (the member is there: it heartbeated)
    hb = ApiKey.SHARE_GROUP_HEARTBEAT
    join = make_request(
        hb,
        1,
        "ShareGroupHeartbeatRequest",
        group_id="sg",
        member_id="a",
        member_epoch=0,
        rack_id=None,
        subscribed_topic_names=("jobs",),
    )
    epoch = handle(broker, "User:ANONYMOUS", hb, 1, join, "10.0.0.7").member_epoch
    assert alter(5).error_code == ErrorCode.NON_EMPTY_GROUP
    leave = make_request(
        hb,
        1,
        "ShareGroupHeartbeatRequest",
        group_id="sg",
        member_id="a",
        member_epoch=-1,
        rack_id=None,
        subscribed_topic_names=None,
    )
    assert epoch > 0 and handle(broker, "User:ANONYMOUS", hb, 1, leave, "10.0.0.7").error_code == 0
    r = alter(5)
    assert (r.error_code, r.responses[0].partitions[0].error_code) == (0, 0)
    assert alter(99).responses[0].partitions[0].error_code == ErrorCode.INVALID_REQUEST
    assert _offsets(broker, "sg").topics[0].partitions[0].start_offset == 5
    delete = make_request(
        kd,
        0,
        "DeleteShareGroupOffsetsRequest",
        group_id="sg",
        topics=(make_request(kd, 0, "DeleteShareGroupOffsetsRequestTopic", topic_name="jobs"),),
    )
    d = handle(broker, "User:ANONYMOUS", kd, 0, delete, "10.0.0.7")
    assert (d.error_code, d.responses[0].error_code) == (0, 0)
    assert broker.share_partitions.get(("sg", _tid(broker), 0)) is None


def test_locks_run_out_without_a_fetch(broker: Broker) -> None:
    limit = {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "2"}
    broker.group_configs.alter("sg", limit, validate_only=False)
    assert _acquired(_fetch(broker, "a", 0)) == [(0, 1, 1), (2, 3, 1), (4, 5, 1)]
    # the timer fires past a's deadline; no fetch of the partition came meanwhile
    late = share_clock() + 31_000
    assert broker.share_partitions.expire_locks(late) == 6
    # b, fetching before a's deadline by the clock, gets them back: the timer released them
    assert _acquired(_fetch(broker, "b", 0)) == [(0, 1, 2), (2, 3, 2), (4, 5, 2)]
    assert broker.share_partitions.expire_locks(late + 31_000) == 6
    # delivered twice (the limit): archived by the timer, the start moved past them
    (p,) = _offsets(broker, "sg").topics[0].partitions
    assert (p.start_offset, p.lag) == (6, 0)
    assert broker.share_partitions.next_deadline() is None


def test_the_broker_wakes_up_for_lock_deadlines(tmp_path: Path) -> None:
    async def run() -> tuple[int, int]:
        b = _open(tmp_path, group_share_record_lock_duration_ms=1000)
        b.start_background_tasks()
        try:
            _fetch(b, "a", 0)
            sp = b.share_partitions.get(("sg", _tid(b), 0))
            assert sp is not None and sp.acquired_by("a") == [0, 1, 2, 3, 4, 5]
            await asyncio.sleep(1.3)  # past the lock, with no request at all
            return len(sp.acquired_by("a")), sp.next_fetch_offset()
        finally:
            b.close()

    assert asyncio.run(run()) == (0, 0)


ALL_AGAIN = [(0, 1, 2), (2, 3, 2), (4, 5, 2)]  # offsets 0-5 in their batches, delivered twice


def test_a_dropped_connection_closes_its_share_sessions(broker: Broker) -> None:
    assert _acquired(_fetch(broker, "a", 0, host="10.0.0.1")) == [(0, 1, 1), (2, 3, 1), (4, 5, 1)]
    assert _acquired(_fetch(broker, "b", 0, host="10.0.0.2")) == []
    broker.connection_closed("10.0.0.1:40000")  # a's connection: as Kafka, its session goes
    assert broker.share_sessions.get("sg", "a") is None
    assert broker.share_sessions.get("sg", "b") is not None
    assert _acquired(_fetch(broker, "b", 1, host="10.0.0.2")) == ALL_AGAIN
    # a session opened again from another connection is not closed with an old one
    _fetch(broker, "a", 0, host="10.0.0.3")
    broker.connection_closed("10.0.0.1:40000")
    assert broker.share_sessions.get("sg", "a") is not None
    # nor is one opened anew while its old connection is still up, when that one goes
    _fetch(broker, "a", 0, host="10.0.0.4")
    broker.connection_closed("10.0.0.3:40000")
    assert broker.share_sessions.get("sg", "a") is not None
    broker.connection_closed("10.0.0.4:40000")
    assert broker.share_sessions.get("sg", "a") is None


def _heartbeat(broker: Broker, member: str, epoch: int) -> Any:
    hb = ApiKey.SHARE_GROUP_HEARTBEAT
    req = make_request(
        hb,
        1,
        "ShareGroupHeartbeatRequest",
        group_id="sg",
        member_id=member,
        member_epoch=epoch,
        rack_id=None,
        subscribed_topic_names=("jobs",) if epoch == 0 else None,
    )
    return handle(broker, "User:ANONYMOUS", hb, 1, req, "10.0.0.7")


def test_a_member_leaving_or_expired_gives_its_records_back(broker: Broker) -> None:
    _heartbeat(broker, "a", 0)
    _fetch(broker, "a", 0)
    assert _heartbeat(broker, "a", -1).error_code == ErrorCode.NONE  # leaves the group
    assert broker.share_sessions.get("sg", "a") is None
    assert _acquired(_fetch(broker, "b", 0)) == ALL_AGAIN
    # b's group session runs out (the coordinator's timer): the same, with no request from b
    _heartbeat(broker, "b", 0)
    share = broker.groups.coordinator.share
    assert share.fire("sg", {}, 2**62) == ["b"]
    assert broker.share_sessions.get("sg", "b") is None
    assert _acquired(_fetch(broker, "c", 0)) == [(0, 1, 3), (2, 3, 3), (4, 5, 3)]


def test_share_sessions_per_broker_are_bounded(tmp_path: Path) -> None:
    b = _open(tmp_path, group_share_max_share_sessions=2)
    try:
        assert _fetch(b, "a", 0).error_code == ErrorCode.NONE
        assert _fetch(b, "b", 0).error_code == ErrorCode.NONE
        assert _fetch(b, "c", 0).error_code == ErrorCode.SHARE_SESSION_LIMIT_REACHED
        assert len(b.share_sessions) == 2
        assert _fetch(b, "a", -1).error_code == ErrorCode.NONE  # a closes its session
        assert _fetch(b, "c", 0).error_code == ErrorCode.NONE
    finally:
        b.close()


def test_members_per_share_group_are_bounded(tmp_path: Path) -> None:
    b = _open(tmp_path, group_share_max_size=2)
    try:
        assert [_heartbeat(b, m, 0).error_code for m in "abc"] == [
            ErrorCode.NONE,
            ErrorCode.NONE,
            ErrorCode.GROUP_MAX_SIZE_REACHED,
        ]
        assert _heartbeat(b, "a", -1).error_code == ErrorCode.NONE
        assert _heartbeat(b, "c", 0).error_code == ErrorCode.NONE
    finally:
        b.close()


def test_a_fetch_that_only_acknowledges_is_answered(broker: Broker) -> None:
    _fetch(broker, "a", 0)
    # all six are a's: this fetch acquires nothing, its partition is there for the ack alone
    r = _fetch(broker, "a", 1, acks=[(0, 5, ACCEPT)])
    (p,) = r.responses[0].partitions
    assert (p.acknowledge_error_code, p.acquired_records, p.records) == (ErrorCode.NONE, (), b"")


def test_the_lock_duration_answered_is_the_groups(broker: Broker) -> None:
    own = {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "15000"}
    broker.group_configs.alter("sg", own, validate_only=False)
    assert _fetch(broker, "a", 0).acquisition_lock_timeout.total_seconds() == 15
