"""Clients against a virtual 3-broker cluster (samsa.testing.cluster) in front of one broker.

The virtual cluster answers NOT_LEADER_OR_FOLLOWER for partitions a node does not lead and
NOT_COORDINATOR for groups and transactions it does not coordinate, so the clients' cluster
paths run: a connection per leader, metadata refreshes, coordinator lookups, leaders and
coordinators that move mid-stream. Each test checks the counters to show those paths ran.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator

import confluent_kafka as ck
import pyarrow as pa
import pytest

import samsa.testing.cluster as cluster_module
from _broker import BrokerProcess
from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import FETCH_VERSION, fetch_request, produce_request, read_topic
from samsa.testing.cluster import NOT_COORDINATOR, NOT_LEADER, VirtualCluster

T = 20.0
OVERRIDES = {
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("vcluster"), OVERRIDES).start()
    yield b
    b.stop()


@pytest.fixture
def cluster(upstream: BrokerProcess) -> Iterator[VirtualCluster]:
    with VirtualCluster(upstream.bootstrap, nodes=3) as vc:
        yield vc


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"vc-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


def _read_all(
    cluster: VirtualCluster, topic: str, n: int, *, arrow: bool, move_at: int | None = None
) -> list[bytes]:
    """Every value of ``topic`` (6 partitions) with an assigned consumer; after ``move_at``
    values, every partition's leader moves to the next node."""
    cfg = {
        "bootstrap.servers": cluster.bootstrap,
        "auto.offset.reset": "earliest",
        "max.partition.fetch.bytes": 2048,  # many fetches: some come after the move
    }
    got: list[bytes] = []
    moved_when = None
    with Consumer(cfg) as c:
        c.assign([TopicPartition(topic, p) for p in range(6)])
        end = time.monotonic() + T
        while len(got) < n and time.monotonic() < end:
            if move_at is not None and len(got) >= move_at:
                move_at, moved_when = None, cluster.stats.not_leader
                for part in range(6):
                    cluster.move_leader(topic, part, (cluster.leader(topic, part) + 1) % 3)
            if arrow:
                got += c.consume_arrow(200, 0.5).column("value").to_pylist()
            else:
                got += [r.value for r in c.consume(200, 0.5)]
        # Nothing more comes; and the consumer goes on fetching until it has met a moved
        # leader (on a busy machine it may have fetched the rest before the move).
        while True:
            if arrow:
                assert c.consume_arrow(1000, 0.3).num_rows == 0
            else:
                assert c.consume(1000, 0.3) == []
            if moved_when is None or cluster.stats.not_leader > moved_when:
                break
            assert time.monotonic() < end, "the consumer never fetched from a moved leader"
    return got


def test_metadata_names_three_nodes_and_strict_routing(cluster: VirtualCluster) -> None:
    topic = _topic(cluster.bootstrap, 6)
    with Producer({"bootstrap.servers": cluster.address(1)}) as p:
        for i in range(60):
            p.produce(topic, b"m%d" % i, partition=i % 6)
        assert p.flush(T) == 0
    assert cluster.stats.not_leader == 0  # each batch went to its leader from the start
    with Admin({"bootstrap.servers": cluster.address(2)}) as admin:
        brokers = admin.describe_cluster()["brokers"]
        assert [(b["node_id"], b["port"]) for b in brokers] == [
            (i, int(cluster.address(i).rpartition(":")[2])) for i in range(3)
        ]
        (md,) = admin.describe_topics([topic])
        assert {p.partition: (p.leader, p.replicas) for p in md.partitions} == {
            pt: (pt % 3, (pt % 3,)) for pt in range(6)
        }
    assert sorted(_read_all(cluster, topic, 60, arrow=False)) == sorted(
        b"m%d" % i for i in range(60)
    )


def test_idempotent_produce_and_batches_with_a_leader_moved_mid_stream(
    cluster: VirtualCluster,
) -> None:
    topic = _topic(cluster.bootstrap, 6)
    n = 3000
    cfg = {"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5}
    with Producer(cfg) as p:
        for i in range(n // 2):
            p.produce(topic, b"a%05d" % i, partition=i % 6)
            if i == n // 4:  # the producer knows the leaders (and has sent) before the move
                assert p.flush(T) == 0
                cluster.move_leader(topic, 0, 1)
                cluster.move_leader(topic, 4, 2)
        assert p.flush(T) == 0
        moved = cluster.stats.not_leader
        for part in range(6):  # unkeyed rows are sticky: whichever partitions they take
            cluster.move_leader(topic, part, (cluster.leader(topic, part) + 1) % 3)
        fut = p.produce_batch(topic, pa.array([b"b%05d" % i for i in range(n // 2)]))
        fut.result(T)
        assert p.flush(T) == 0
    assert moved > 0 and cluster.stats.not_leader > moved
    want = sorted([b"a%05d" % i for i in range(n // 2)] + [b"b%05d" % i for i in range(n // 2)])
    for arrow in (False, True):  # consumers follow a leader moved mid-stream too
        before, sessions = cluster.stats.not_leader, cluster.stats.incremental_fetches
        assert sorted(_read_all(cluster, topic, n, arrow=arrow, move_at=n // 3)) == want
        assert cluster.stats.not_leader > before
        assert cluster.stats.incremental_fetches > sessions  # with fetch sessions


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_group_of_two_with_the_coordinator_moved_mid_run(
    cluster: VirtualCluster, protocol: str
) -> None:
    topic = _topic(cluster.bootstrap, 6)
    group = f"vcg-{uuid.uuid4().hex[:6]}"
    n = 600

    def produce(first: int, end: int) -> None:
        with Producer({"bootstrap.servers": cluster.bootstrap}) as p:
            for i in range(first, end):
                p.produce(topic, b"%05d" % i, partition=i % 6)
            assert p.flush(T) == 0

    produce(0, n // 2)
    cfg = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "group.protocol": protocol,
        "heartbeat.interval.ms": 100,
        "session.timeout.ms": 6000,
        "max.partition.fetch.bytes": 1024,
    }
    lock = threading.Lock()
    seen: dict[bytes, int] = {}
    committed: dict[int, int] = {}  # partition -> highest offset a commit covered
    redelivered: list[tuple[int, int]] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def member() -> None:
        try:
            with Consumer(cfg) as c:
                c.subscribe([topic])
                while not done.is_set():
                    records = c.consume(100, 0.2)
                    with lock:
                        for r in records:
                            if r.offset < committed.get(r.partition, 0):
                                redelivered.append((r.partition, r.offset))
                            seen[r.value] = seen.get(r.value, 0) + 1
                    if not records:
                        continue
                    ends: dict[int, int] = {}
                    for r in records:
                        ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
                    try:
                        c.commit({TopicPartition(topic, p): o for p, o in ends.items()})
                    except Exception:  # a rebalance took the partitions: not committed
                        continue
                    with lock:
                        for p, o in ends.items():
                            committed[p] = max(committed.get(p, 0), o)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=member) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        end = time.monotonic() + T
        while len(seen) < n // 2 and time.monotonic() < end:
            time.sleep(0.05)
        coordinator = cluster.coordinator(group)
        cluster.move_coordinator(group, (coordinator + 1) % 3)
        produce(n // 2, n)
        while len(seen) < n and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        done.set()
        for t in threads:
            t.join(T)
    assert not errors
    assert sorted(seen) == [b"%05d" % i for i in range(n)]
    assert redelivered == []
    assert cluster.stats.not_coordinator > 0
    with Consumer(cfg) as c:  # the commits landed on the group's (new) coordinator
        got = c.committed([TopicPartition(topic, p) for p in range(6)])
        assert sum(v or 0 for v in got.values()) == n


def test_transactions_with_coordinator_and_leader_moves(cluster: VirtualCluster) -> None:
    topic = _topic(cluster.bootstrap, 6)
    txn_id = f"vct-{uuid.uuid4().hex[:6]}"
    cfg = {"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id, "linger.ms": 2}
    want: list[bytes] = []

    def send(p: Producer, tag: bytes, count: int) -> list[bytes]:
        values = [b"%s%04d" % (tag, i) for i in range(count)]
        for i, v in enumerate(values):
            p.produce(topic, v, partition=i % 6)
        return values

    with Producer(cfg) as p:
        p.init_transactions(T)
        p.begin_transaction()
        want += send(p, b"c", 120)
        p.commit_transaction(T)
        cluster.move_coordinator(txn_id, (cluster.coordinator(txn_id) + 1) % 3)
        p.begin_transaction()
        send(p, b"a", 120)
        p.abort_transaction(T)
        coordinator_errors = cluster.stats.not_coordinator
        cluster.move_coordinator(txn_id, (cluster.coordinator(txn_id) + 1) % 3)
        p.begin_transaction()
        want += send(p, b"d", 60)
        assert p.flush(T) == 0
        for part in (1, 5):  # inside the transaction, between its sends
            cluster.move_leader(topic, part, (cluster.leader(topic, part) + 1) % 3)
        want += send(p, b"e", 60)
        inside = cluster.stats.not_coordinator
        cluster.move_coordinator(txn_id, (cluster.coordinator(txn_id) + 1) % 3)
        p.commit_transaction(T)  # EndTxn finds the new coordinator
        assert cluster.stats.not_coordinator > inside
    assert coordinator_errors > 0 and cluster.stats.not_coordinator > coordinator_errors
    assert cluster.stats.not_leader > 0
    got: list[bytes] = []
    rc = {
        "bootstrap.servers": cluster.bootstrap,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    }
    with Consumer(rc) as c:
        c.assign([TopicPartition(topic, p) for p in range(6)])
        end = time.monotonic() + T
        while len(got) < len(want) and time.monotonic() < end:
            got += c.consume_arrow(500, 0.5).column("value").to_pylist()
        assert c.consume_arrow(500, 0.3).num_rows == 0
    assert sorted(got) == sorted(want)


def test_confluent_kafka_clients_work_against_the_virtual_cluster(
    cluster: VirtualCluster,
) -> None:
    """The control: librdkafka, a real cluster client, goes to each partition's leader and
    each key's coordinator at once, and follows leaders moved under its producer and its
    group consumer."""
    topic = _topic(cluster.bootstrap, 6)
    group = f"vcck-{uuid.uuid4().hex[:6]}"
    txn_id = f"vcckt-{uuid.uuid4().hex[:6]}"
    base = {"bootstrap.servers": cluster.bootstrap}

    def move_all() -> None:
        for part in range(6):
            cluster.move_leader(topic, part, (cluster.leader(topic, part) + 1) % 3)

    p = ck.Producer({**base, "enable.idempotence": True, "linger.ms": 5})
    for i in range(300):
        p.produce(topic, b"p%04d" % i, partition=i % 6)
    assert p.flush(T) == 0
    tp = ck.Producer({**base, "transactional.id": txn_id})
    tp.init_transactions(T)
    tp.begin_transaction()
    for i in range(60):
        tp.produce(topic, b"t%04d" % i, partition=i % 6)
    tp.commit_transaction(T)
    tp.begin_transaction()
    for i in range(30):
        tp.produce(topic, b"x%04d" % i, partition=i % 6)
    tp.abort_transaction(T)
    assert cluster.stats.not_leader == 0 and cluster.stats.not_coordinator == 0
    move_all()
    for i in range(300):
        p.produce(topic, b"q%04d" % i, partition=i % 6)
    assert p.flush(T) == 0
    after_produce = cluster.stats.not_leader
    del p, tp  # librdkafka closes its connections when its handle goes
    assert after_produce > 0
    c = ck.Consumer(
        {
            **base,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 1024,
        }
    )
    got: list[bytes] = []
    moved = False
    try:
        c.subscribe([topic])
        end = time.monotonic() + T
        while len(got) < 660 and time.monotonic() < end:
            for m in c.consume(50, 0.5):
                assert m.error() is None, m.error()
                got.append(m.value())
            if not moved and len(got) >= 200:
                moved = True
                move_all()
        c.commit(asynchronous=False)
        committed = c.committed([ck.TopicPartition(topic, i) for i in range(6)], T)
    finally:
        c.close()
    want = [b"%s%04d" % (t, i) for t, k in ((b"p", 300), (b"t", 60), (b"q", 300)) for i in range(k)]
    assert sorted(got) == sorted(want)
    assert sum(t.offset for t in committed) > 660  # commit markers take offsets too
    assert cluster.stats.not_leader > after_produce


def test_consume_transform_produce_with_both_coordinators_moved(cluster: VirtualCluster) -> None:
    """Offsets committed in the transaction (TxnOffsetCommit to the group's coordinator)
    while the group's and the transaction's coordinators move between transactions."""
    src, out = _topic(cluster.bootstrap, 6), _topic(cluster.bootstrap, 6)
    group, txn_id = f"vccg-{uuid.uuid4().hex[:6]}", f"vcct-{uuid.uuid4().hex[:6]}"
    n = 600
    with Producer({"bootstrap.servers": cluster.bootstrap}) as p:
        for i in range(n):
            p.produce(src, b"%d" % i, partition=i % 6)
        assert p.flush(T) == 0
    ccfg = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "max.partition.fetch.bytes": 1024,
    }
    pcfg = {"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id}
    copied = 0
    transactions = 0
    with Consumer(ccfg) as c, Producer(pcfg) as p:
        p.init_transactions(T)
        c.subscribe([src])
        end = time.monotonic() + T
        while copied < n and time.monotonic() < end:
            records = c.consume(150, 0.5)
            if not records:
                continue
            p.begin_transaction()
            for r in records:
                p.produce(out, b"%d" % (int(r.value) * 10), partition=r.partition)
            positions = {TopicPartition(src, r.partition): r.offset + 1 for r in records}
            p.send_offsets_to_transaction(positions, c.group_metadata(), T)
            p.commit_transaction(T)
            copied += len(records)
            transactions += 1
            if transactions in (1, 3):
                cluster.move_coordinator(group, (cluster.coordinator(group) + 1) % 3)
                cluster.move_coordinator(txn_id, (cluster.coordinator(txn_id) + 1) % 3)
        committed = c.committed([TopicPartition(src, i) for i in range(6)])
    assert copied == n and transactions > 3
    assert sum(v or 0 for v in committed.values()) == n
    refused = cluster.stats.refused
    assert any(refused[k] for k in (ApiKey.HEARTBEAT, ApiKey.TXN_OFFSET_COMMIT, ApiKey.JOIN_GROUP))
    txn_apis = (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN)
    assert any(refused[k] for k in txn_apis)
    got = read_topic(cluster.bootstrap, out, committed=True, timeout=10.0)
    assert sorted(r.value for r in got) == sorted(b"%d" % (i * 10) for i in range(n))


def test_leaders_moving_under_a_busy_idempotent_producer_keep_order(
    cluster: VirtualCluster,
) -> None:
    """Leaders move every 20 ms while batches are in flight (up to 5 per connection): each
    partition still holds its records once, in produce order."""
    topic = _topic(cluster.bootstrap, 6)
    n = 12000
    stop = threading.Event()

    def mover() -> None:
        part = 0
        while not stop.wait(0.02):
            cluster.move_leader(topic, part, (cluster.leader(topic, part) + 1) % 3)
            part = (part + 1) % 6

    cfg = {
        "bootstrap.servers": cluster.bootstrap,
        "enable.idempotence": True,
        "max.in.flight.requests.per.connection": 5,
        "batch.size": 1024,
        "linger.ms": 1,
    }
    t = threading.Thread(target=mover)
    t.start()
    try:
        with Producer(cfg) as p:
            for i in range(n):
                p.produce(topic, b"%05d" % i, partition=i % 6)
            assert p.flush(T) == 0
    finally:
        stop.set()
        t.join(T)
    assert cluster.stats.not_leader > 0
    by_part: dict[int, list[int]] = {}
    for r in read_topic(cluster.bootstrap, topic, timeout=10.0):
        by_part.setdefault(r.partition, []).append(int(r.value))
    assert by_part == {p: list(range(p, n, 6)) for p in range(6)}


def _conn(cluster: VirtualCluster, node: int) -> BlockingConnection:
    host, _, port = cluster.address(node).rpartition(":")
    return BlockingConnection(host, int(port), timeout=T)


def test_raw_answers_of_the_virtual_nodes(cluster: VirtualCluster) -> None:
    """Wire-level: coordinator lookups name the mapped node (v3 and batched v4); requests at
    the wrong node are refused per partition (or group) without reaching the broker; a
    Produce mixing partitions is split and its answers merged."""
    topic = _topic(cluster.bootstrap, 2)
    group, txn = f"vcr-{uuid.uuid4().hex[:6]}", f"vcrt-{uuid.uuid4().hex[:6]}"
    cluster.move_coordinator(group, 2)
    cluster.move_coordinator(txn, 1)
    with _conn(cluster, 0) as c:
        resp = c.request(
            ApiKey.FIND_COORDINATOR,
            4,
            make_request(
                ApiKey.FIND_COORDINATOR,
                4,
                "FindCoordinatorRequest",
                key_type=0,
                coordinator_keys=(group, txn),
            ),
        )
        assert [(x.key, x.node_id, x.port) for x in resp.coordinators] == [
            (group, 2, int(cluster.address(2).rpartition(":")[2])),
            (txn, 1, int(cluster.address(1).rpartition(":")[2])),
        ]
        resp = c.request(
            ApiKey.FIND_COORDINATOR,
            3,
            make_request(ApiKey.FIND_COORDINATOR, 3, "FindCoordinatorRequest", key=txn, key_type=1),
        )
        assert (resp.error_code, resp.node_id) == (0, 1)
        # OffsetCommit at node 0, not the group's coordinator: refused, nothing committed
        commit = make_request(
            ApiKey.OFFSET_COMMIT,
            2,
            "OffsetCommitRequest",
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            retention_time=-1,
            topics=(
                make_request(
                    ApiKey.OFFSET_COMMIT,
                    2,
                    "OffsetCommitRequestTopic",
                    name=topic,
                    partitions=tuple(
                        make_request(
                            ApiKey.OFFSET_COMMIT,
                            2,
                            "OffsetCommitRequestPartition",
                            partition_index=i,
                            committed_offset=5,
                            committed_metadata=None,
                        )
                        for i in (0, 1)
                    ),
                ),
            ),
        )
        resp = c.request(ApiKey.OFFSET_COMMIT, 2, commit)
        assert [
            (t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in resp.topics
        ] == [(topic, [(0, NOT_COORDINATOR), (1, NOT_COORDINATOR)])]
        fetch = make_request(
            ApiKey.OFFSET_FETCH,
            8,
            "OffsetFetchRequest",
            require_stable=False,
            groups=(
                make_request(
                    ApiKey.OFFSET_FETCH, 8, "OffsetFetchRequestGroup", group_id=group, topics=None
                ),
            ),
        )
        resp = c.request(ApiKey.OFFSET_FETCH, 8, fetch)
        assert [(g.group_id, g.error_code) for g in resp.groups] == [(group, NOT_COORDINATOR)]
        add = make_request(
            ApiKey.ADD_PARTITIONS_TO_TXN,
            3,
            "AddPartitionsToTxnRequest",
            v3_and_below_transactional_id=txn,
            v3_and_below_producer_id=1,
            v3_and_below_producer_epoch=0,
            v3_and_below_topics=(
                make_request(
                    ApiKey.ADD_PARTITIONS_TO_TXN,
                    3,
                    "AddPartitionsToTxnTopic",
                    name=topic,
                    partitions=(0, 1),
                ),
            ),
        )
        resp = c.request(ApiKey.ADD_PARTITIONS_TO_TXN, 3, add)
        assert [
            (t.name, [(p.partition_index, p.partition_error_code) for p in t.results_by_partition])
            for t in resp.results_by_topic_v3_and_below
        ] == [(topic, [(0, NOT_COORDINATOR), (1, NOT_COORDINATOR)])]
        # Produce at node 0 for partition 0 (its own) and 1 (node 1's)
        batch = build_batch([NewRecord(value=b"x", timestamp=0)])
        resp = c.request(ApiKey.PRODUCE, 9, produce_request({(topic, 0): batch, (topic, 1): batch}))
        assert [
            (t.name, sorted((p.index, p.error_code, p.base_offset) for p in t.partition_responses))
            for t in resp.responses
        ] == [(topic, [(0, 0, 0), (1, NOT_LEADER, -1)])]
        # DeleteRecords at node 0 for partition 1 (node 1's): refused, nothing deleted
        k = ApiKey.DELETE_RECORDS
        part = make_request(k, 2, "DeleteRecordsPartition", partition_index=1, offset=1)
        delete = make_request(
            k,
            2,
            "DeleteRecordsRequest",
            timeout=5000,
            topics=(make_request(k, 2, "DeleteRecordsTopic", name=topic, partitions=(part,)),),
        )
        resp = c.request(k, 2, delete)
        assert [
            (p.partition_index, p.error_code, p.low_watermark)
            for t in resp.topics
            for p in t.partitions
        ] == [(1, NOT_LEADER, -1)]
    with _conn(cluster, 2) as c:  # the coordinator: the refused commit never happened
        resp = c.request(ApiKey.OFFSET_FETCH, 8, fetch)
        assert [(g.error_code, g.topics) for g in resp.groups] == [(0, ())]
    assert cluster.stats.refused == {
        ApiKey.OFFSET_COMMIT: 1,
        ApiKey.OFFSET_FETCH: 1,
        ApiKey.ADD_PARTITIONS_TO_TXN: 1,
        ApiKey.PRODUCE: 1,
        ApiKey.DELETE_RECORDS: 1,
    }
    assert cluster.stats.split_requests == 1
    assert read_topic(cluster.bootstrap, topic, timeout=10.0)[0].partition == 0


def test_fetch_session_partitions_moved_away_are_refused_unnamed(cluster: VirtualCluster) -> None:
    """A partition in a node's fetch session that moves to another node is answered
    NOT_LEADER_OR_FOLLOWER (its data dropped) even when an incremental Fetch does not name
    it, as a real broker answers; the session itself stays open."""
    topic = _topic(cluster.bootstrap, 2)
    cluster.move_leader(topic, 1, 0)  # node 0 leads both
    with Producer({"bootstrap.servers": cluster.bootstrap}) as p:
        for i in range(4):
            p.produce(topic, b"%d" % i, partition=i % 2)
        assert p.flush(T) == 0
    with _conn(cluster, 0) as c:
        full = dataclasses.replace(
            fetch_request({(topic, 0): 0, (topic, 1): 0}), session_id=0, session_epoch=0
        )
        resp = c.request(ApiKey.FETCH, FETCH_VERSION, full)
        assert resp.error_code == 0 and resp.session_id != 0
        assert sorted(
            (p.partition_index, p.error_code) for t in resp.responses for p in t.partitions
        ) == [(0, 0), (1, 0)]
        cluster.move_leader(topic, 1, 1)
        incremental = dataclasses.replace(
            fetch_request({}), session_id=resp.session_id, session_epoch=1
        )
        resp2 = c.request(ApiKey.FETCH, FETCH_VERSION, incremental)
        assert resp2.error_code == 0 and resp2.session_id == resp.session_id
        got = {
            p.partition_index: (p.error_code, p.records)
            for t in resp2.responses
            for p in t.partitions
        }
        # partition 0 is read again from the session's offset 0; partition 1 is refused
        assert got[0][0] == 0 and got[0][1]
        assert got[1] == (NOT_LEADER, b"")
    assert cluster.stats.incremental_fetches == 1


def test_admin_follows_coordinators_and_leaders(cluster: VirtualCluster) -> None:
    """The admin client's group, transaction and record calls reach the coordinator or the
    leader after they moved; each node lists only the groups and transactions it
    coordinates, so the listings hold each once."""
    topic = _topic(cluster.bootstrap, 3)
    group, txn = f"vca-{uuid.uuid4().hex[:6]}", f"vcat-{uuid.uuid4().hex[:6]}"
    with Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn}) as p:
        p.init_transactions(T)
        p.begin_transaction()
        for i in range(30):
            p.produce(topic, b"%d" % i, partition=i % 3)
        p.commit_transaction(T)
    tps = [TopicPartition(topic, i) for i in range(3)]
    cfg = {"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False}
    with Consumer(cfg) as c:
        c.commit({tp: 5 for tp in tps})
    with Admin({"bootstrap.servers": cluster.bootstrap}) as admin:

        def check() -> None:
            assert [g.group_id for g in admin.list_groups()].count(group) == 1
            (desc,) = admin.describe_groups([group])
            assert (desc.group_id, desc.state, desc.error) == (group, "Empty", 0)
            assert admin.list_group_offsets(group) == {tp: 5 for tp in tps}
            assert [t.transactional_id for t in admin.list_transactions()].count(txn) == 1
            assert admin.describe_transactions([txn])[txn].state == "CompleteCommit"

        check()  # the admin client now knows the coordinators and leaders
        assert admin.delete_records({tps[0]: 1})[tps[0]].low_watermark == 1
        cluster.move_coordinator(group, (cluster.coordinator(group) + 1) % 3)
        cluster.move_coordinator(txn, (cluster.coordinator(txn) + 1) % 3)
        cluster.move_leader(topic, 0, (cluster.leader(topic, 0) + 1) % 3)
        check()
        # DeleteRecords at node that no longer leads would be refused: it went to the new one
        assert admin.delete_records({tps[0]: 2})[tps[0]].low_watermark == 2
    refused = cluster.stats.refused
    assert refused[ApiKey.CONSUMER_GROUP_DESCRIBE] and refused[ApiKey.DESCRIBE_TRANSACTIONS]


def test_coordinator_keys_remembered_are_bounded(
    cluster: VirtualCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_module, "_MAX_KEYS", 3)
    keys = tuple(f"vck-{i}" for i in range(5))
    with _conn(cluster, 0) as c:
        req = make_request(
            ApiKey.FIND_COORDINATOR, 4, "FindCoordinatorRequest", key_type=0, coordinator_keys=keys
        )
        resp = c.request(ApiKey.FIND_COORDINATOR, 4, req)
    assert [x.key for x in resp.coordinators] == list(keys)
    assert cluster.coordinator_keys == list(keys[2:])  # the newest three


def test_fetch_sessions_tracked_per_connection_are_bounded(
    cluster: VirtualCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the newest sessions of a connection are tracked: with room for one, a moved
    partition is refused in the newest session and no longer known in the older one."""
    monkeypatch.setattr(cluster_module, "_MAX_SESSIONS", 1)
    topic = _topic(cluster.bootstrap, 2)
    cluster.move_leader(topic, 1, 0)
    with _conn(cluster, 0) as c:
        ids = []
        for _ in range(2):
            full = dataclasses.replace(
                fetch_request({(topic, 0): 0, (topic, 1): 0}), session_id=0, session_epoch=0
            )
            resp = c.request(ApiKey.FETCH, FETCH_VERSION, full)
            assert resp.error_code == 0 and resp.session_id != 0
            ids.append(resp.session_id)
        cluster.move_leader(topic, 1, 1)
        refused = []
        for sid in reversed(ids):  # the newest first: answering the other one tracks it
            req = dataclasses.replace(fetch_request({}), session_id=sid, session_epoch=1)
            resp = c.request(ApiKey.FETCH, FETCH_VERSION, req)
            refused.append([p.partition_index for t in resp.responses for p in t.partitions])
    assert refused == [[1], []]
