"""A restarted broker serves while its coordinators replay their topics, as Kafka does (issue
23): Metadata, Produce and Fetch are answered at once, FindCoordinator too, while the group and
transaction APIs of a partition still loading answer COORDINATOR_LOAD_IN_PROGRESS; real
clients (librdkafka's consumer and samsa's) retry and then resume from the offsets committed
before the restart, and commit again; samsa's admin lists and describes, and its transactional
producer initialises, retrying the same way.

The replay is made slow by the test setting ``test.coordinator.load.batch.delay.ms`` (a sleep
after each batch replayed), so "while loading" lasts seconds, whatever the machine."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from typing import Any

import confluent_kafka

from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.coordinator.offsets_records import partition_for
from samsa.protocol.errors import ErrorCode as E
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import (
    create_topic,
    fetch_request,
    init_producer_id,
    produce_one,
    produce_request,
)

LOADING = int(E.COORDINATOR_LOAD_IN_PROGRESS)
DELAY_MS = 150  # per batch replayed: the two groups' 24 commits are 3.6 s of loading
RECORDS = 20


def _commit(conn: BlockingConnection, group: str, topic: str, offset: int) -> int:
    v = 8
    part = make_request(ApiKey.OFFSET_COMMIT, v, "OffsetCommitRequestPartition",
                        partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                        committed_metadata="")  # fmt: skip
    req = make_request(ApiKey.OFFSET_COMMIT, v, "OffsetCommitRequest", group_id=group,
                       generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                       topics=(make_request(ApiKey.OFFSET_COMMIT, v, "OffsetCommitRequestTopic",
                                            name=topic, partitions=(part,)),))  # fmt: skip
    (t,) = conn.request(ApiKey.OFFSET_COMMIT, v, req).topics
    return int(t.partitions[0].error_code)


def _fetch_offset(conn: BlockingConnection, group: str) -> tuple[int, int]:
    """OffsetFetch v8 of the group's committed offsets: (group error, offset of partition 0)."""
    v = 8
    g = make_request(ApiKey.OFFSET_FETCH, v, "OffsetFetchRequestGroup", group_id=group,
                     topics=None)  # fmt: skip
    req = make_request(ApiKey.OFFSET_FETCH, v, "OffsetFetchRequest", require_stable=False,
                       groups=(g,))  # fmt: skip
    (got,) = conn.request(ApiKey.OFFSET_FETCH, v, req).groups
    offsets = [q.committed_offset for t in got.topics for q in t.partitions]
    return int(got.error_code), offsets[0] if offsets else -1


def _simple(conn: BlockingConnection, api: ApiKey, v: int, cls: str, **fields: Any) -> Any:
    return conn.request(api, v, make_request(api, v, cls, **fields))


def test_restart_serves_while_coordinators_load_and_clients_resume(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(
        overrides={
            "test.coordinator.load.batch.delay.ms": str(DELAY_MS),
            "group.initial.rebalance.delay.ms": "0",
        }
    )
    broker.start()
    topic = f"load-{uuid.uuid4().hex[:6]}"
    ck_group, txn_id = "g-librdkafka", "tx-load"
    # Both groups on one partition of __consumer_offsets: it replays for 24 x DELAY_MS, and
    # every check below falls inside that, whichever partition comes first.
    samsa_group = next(
        g
        for i in range(1000)
        if partition_for(g := f"g-samsa-{i}", 50) == partition_for(ck_group, 50)
    )
    with BlockingConnection("127.0.0.1", broker.port, timeout=10) as c:
        assert create_topic(c, topic) == 0
        for i in range(RECORDS):
            batch = build_batch([NewRecord(value=b"v%d" % i, timestamp=int(time.time() * 1000))])
            assert produce_one(c, topic, 0, batch)[0] == 0
        # One batch per commit: the last ones are 7 and 4, what the clients resume from.
        for i in range(12):
            assert _commit(c, ck_group, topic, i if i < 11 else 7) == 0
            assert _commit(c, samsa_group, topic, i if i < 11 else 4) == 0
        for _ in range(12):  # 12 batches of __transaction_state: 1.8 s of its replay
            error, pid, epoch = init_producer_id(c, txn_id)
            assert error == 0
    broker.stop()
    port = broker.port
    broker.start(loaded=False)  # returns once the port is open: the replay has just begun
    assert broker.port == port
    with BlockingConnection("127.0.0.1", port, timeout=10) as c:
        # (b) the coordinators' APIs of a loading partition: COORDINATOR_LOAD_IN_PROGRESS
        assert _fetch_offset(c, ck_group)[0] == LOADING
        assert _commit(c, samsa_group, topic, 99) == LOADING
        # A transactional Produce (v12: it adds its partition itself) that the loading
        # transaction coordinator cannot verify: as Kafka, NOT_ENOUGH_REPLICAS, which every
        # producer retries without a metadata refresh.
        txn_batch = build_batch(
            [NewRecord(value=b"t", timestamp=int(time.time() * 1000))],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            transactional=True,
        )
        produce = replace(
            produce_request({(topic, 0): txn_batch}, version=12), transactional_id=txn_id
        )
        answer = c.request(ApiKey.PRODUCE, 12, produce).responses[0].partition_responses[0]
        assert answer.error_code == E.NOT_ENOUGH_REPLICAS
        assert init_producer_id(c, txn_id)[0] == LOADING
        listed = _simple(c, ApiKey.LIST_GROUPS, 4, "ListGroupsRequest", states_filter=())
        assert listed.error_code == LOADING
        described = _simple(c, ApiKey.DESCRIBE_GROUPS, 5, "DescribeGroupsRequest",
                            groups=(ck_group,), include_authorized_operations=False)  # fmt: skip
        assert described.groups[0].error_code == LOADING
        found = _simple(c, ApiKey.FIND_COORDINATOR, 4, "FindCoordinatorRequest", key_type=0,
                        coordinator_keys=(ck_group,))  # fmt: skip
        assert found.coordinators[0].error_code == 0  # as Kafka: found while loading
        # (a) Metadata, Produce and Fetch are served meanwhile
        meta = _simple(c, ApiKey.METADATA, 12, "MetadataRequest", topics=None,
                       allow_auto_topic_creation=False,
                       include_topic_authorized_operations=False)  # fmt: skip
        (t,) = [t for t in meta.topics if t.name == topic]
        assert t.error_code == 0 and t.partitions[0].leader_id == meta.brokers[0].node_id
        batch = build_batch([NewRecord(value=b"during", timestamp=int(time.time() * 1000))])
        assert produce_one(c, topic, 0, batch) == (0, RECORDS)
        fetched = c.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): RECORDS}))
        part = fetched.responses[0].partitions[0]
        assert part.error_code == 0 and part.high_watermark == RECORDS + 1
        assert _fetch_offset(c, ck_group)[0] == LOADING  # all of it answered while loading

    # (c) real clients retry, then resume from what was committed before the restart.
    first: dict[str, int] = {}

    def librdkafka() -> None:
        cons = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap,
                                         "group.id": ck_group, "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest"})  # fmt: skip
        try:
            cons.subscribe([topic])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "librdkafka" not in first:
                msg = cons.poll(0.2)
                if msg is not None and msg.error() is None:
                    first["librdkafka"] = msg.offset()
            tp = confluent_kafka.TopicPartition(topic, 0, 12)
            cons.commit(offsets=[tp], asynchronous=False)
        finally:
            cons.close()

    def samsa() -> None:
        config = {"bootstrap.servers": broker.bootstrap, "group.id": samsa_group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"}  # fmt: skip
        with Consumer(config) as cons:
            cons.subscribe([topic])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "samsa" not in first:
                records = cons.poll(0.2)
                if records:
                    first["samsa"] = records[0].offset
            cons.commit({TopicPartition(topic, 0): 15})

    def samsa_admin_and_producer() -> None:
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            listed = {g.group_id for g in admin.list_groups()}
            assert {ck_group, samsa_group} <= listed
            assert admin.describe_transactions([txn_id])[txn_id].error == 0
            assert txn_id in {t.transactional_id for t in admin.list_transactions()}
        with Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id}) as p:
            p.init_transactions()
        first["samsa admin and producer"] = 0

    threads = [threading.Thread(target=f) for f in (librdkafka, samsa, samsa_admin_and_producer)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert first == {"librdkafka": 7, "samsa": 4, "samsa admin and producer": 0}
    with BlockingConnection("127.0.0.1", port, timeout=10) as c:
        assert _fetch_offset(c, ck_group) == (0, 12)
        assert _fetch_offset(c, samsa_group) == (0, 15)
        assert init_producer_id(c, txn_id)[0] == 0
    assert broker.log_contains("coordinators loaded in")
