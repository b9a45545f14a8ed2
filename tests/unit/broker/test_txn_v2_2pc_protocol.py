"""Raw-protocol tests of transactions v2 (KIP-890 part 2, rule 36) and two-phase commit
(KIP-939, rule 37): the transaction.version feature, Produce v12 and TxnOffsetCommit v5 adding
partitions implicitly, EndTxn v5's epoch bump, TV1 unchanged, InitProducerId v6, the
ListTransactions duration filter and AddPartitionsToTxn's batched form. Rules:
docs/semantics.md."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode as E
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import add_partitions_to_txn, create_topic

NO_TIMEOUT_MS = 2_147_483_647
T = 10.0


@pytest.fixture(scope="module")
def broker_2pc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("tv2"),
        {
            "transaction.two.phase.commit.enable": "true",
            "transaction.state.log.num.partitions": "2",
            "offsets.topic.num.partitions": "2",
        },
    ).start()
    yield b
    b.stop()


@pytest.fixture
def conn(broker_2pc: BrokerProcess) -> Iterator[BlockingConnection]:
    with BlockingConnection("127.0.0.1", broker_2pc.port, timeout=10.0) as c:
        yield c


_names = iter(range(10_000))


@pytest.fixture
def topic(conn: BlockingConnection) -> str:
    name = f"tv2-{next(_names)}"
    assert create_topic(conn, name, 2) == 0
    return name


def init(
    conn: BlockingConnection,
    tid: str,
    *,
    v: int = 5,
    enable_2pc: bool = False,
    keep: bool = False,
    expect: E = E.NONE,
) -> Any:
    fields: dict[str, Any] = {"enable2_pc": enable_2pc, "keep_prepared_txn": keep} if v >= 6 else {}
    req = make_request(
        ApiKey.INIT_PRODUCER_ID,
        v,
        "InitProducerIdRequest",
        transactional_id=tid,
        transaction_timeout=60_000,
        producer_id=-1,
        producer_epoch=-1,
        **fields,
    )
    deadline = time.monotonic() + T
    while True:
        resp = conn.request(ApiKey.INIT_PRODUCER_ID, v, req)
        if resp.error_code != E.CONCURRENT_TRANSACTIONS or time.monotonic() > deadline:
            assert resp.error_code == expect, resp
            return resp
        time.sleep(0.05)


def produce(
    conn: BlockingConnection,
    tid: str,
    pid: int,
    epoch: int,
    topic: str,
    partition: int,
    seq: int,
    *,
    v: int = 12,
    retry: bool = True,
) -> int:
    """One transactional batch; its error code (retrying what a client retries)."""
    batch = build_batch(
        [NewRecord(value=b"v%d" % seq, timestamp=int(time.time() * 1000))],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=True,
    )
    part = make_request(ApiKey.PRODUCE, v, "PartitionProduceData", index=partition, records=batch)
    req = make_request(
        ApiKey.PRODUCE,
        v,
        "ProduceRequest",
        transactional_id=tid,
        acks=-1,
        timeout=10_000,
        topic_data=(
            make_request(ApiKey.PRODUCE, v, "TopicProduceData", name=topic, partition_data=(part,)),
        ),
    )
    deadline = time.monotonic() + T
    while True:
        code = int(
            conn.request(ApiKey.PRODUCE, v, req).responses[0].partition_responses[0].error_code
        )
        if not retry or code != E.NOT_ENOUGH_REPLICAS or time.monotonic() > deadline:
            return code
        time.sleep(0.05)


def end_txn(
    conn: BlockingConnection, tid: str, pid: int, epoch: int, commit: bool, *, v: int = 5
) -> Any:
    req = make_request(
        ApiKey.END_TXN,
        v,
        "EndTxnRequest",
        transactional_id=tid,
        producer_id=pid,
        producer_epoch=epoch,
        committed=commit,
    )
    return conn.request(ApiKey.END_TXN, v, req)


def describe(conn: BlockingConnection, tid: str) -> Any:
    req = make_request(
        ApiKey.DESCRIBE_TRANSACTIONS, 0, "DescribeTransactionsRequest", transactional_ids=(tid,)
    )
    [state] = conn.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, req).transaction_states
    return state


def wait_state(conn: BlockingConnection, tid: str, state: str) -> Any:
    deadline = time.monotonic() + T
    while (d := describe(conn, tid)).transaction_state != state:
        assert time.monotonic() < deadline, d
        time.sleep(0.05)
    return d


def partitions_of(d: Any) -> set[tuple[str, int]]:
    return {(t.topic, p) for t in d.topics for p in t.partitions}


def features(conn: BlockingConnection, v: int) -> Any:
    return conn.request(
        ApiKey.API_VERSIONS,
        v,
        make_request(
            ApiKey.API_VERSIONS,
            v,
            "ApiVersionsRequest",
            client_software_name="t",
            client_software_version="1",
        ),
    )


# -- tests ------------------------------------------------------------------------------------


def test_api_versions_offers_transaction_version_2(conn: BlockingConnection) -> None:
    resp = features(conn, 4)
    assert [(f.name, f.min_version, f.max_version) for f in resp.supported_features] == [
        ("group.version", 0, 1),  # rule 45
        ("transaction.version", 0, 2),
    ]
    assert resp.finalized_features_epoch >= 0
    assert [
        (f.name, f.min_version_level, f.max_version_level) for f in resp.finalized_features
    ] == [("group.version", 1, 1), ("transaction.version", 2, 2)]
    assert features(conn, 3).supported_features == ()  # v3 omits features whose minimum is 0
    versions = {int(k.api_key): int(k.max_version) for k in resp.api_keys}
    assert versions[ApiKey.PRODUCE] >= 12 and versions[ApiKey.END_TXN] >= 5


def test_produce_v12_adds_the_partition_and_end_txn_v5_bumps_the_epoch(
    conn: BlockingConnection, topic: str
) -> None:
    r = init(conn, "tv2-a")
    pid, epoch = int(r.producer_id), int(r.producer_epoch)
    # No AddPartitionsToTxn: Produce v12 adds each partition itself.
    assert produce(conn, "tv2-a", pid, epoch, topic, 0, 0) == E.NONE
    assert produce(conn, "tv2-a", pid, epoch, topic, 1, 0) == E.NONE
    assert partitions_of(describe(conn, "tv2-a")) == {(topic, 0), (topic, 1)}
    ended = end_txn(conn, "tv2-a", pid, epoch, True)
    assert (ended.error_code, ended.producer_id, ended.producer_epoch) == (E.NONE, pid, epoch + 1)
    d = wait_state(conn, "tv2-a", "CompleteCommit")
    assert int(d.producer_epoch) == epoch + 1
    # The old epoch is fenced, at the coordinator and on the partitions (the markers).
    assert produce(conn, "tv2-a", pid, epoch, topic, 0, 1) == E.INVALID_PRODUCER_EPOCH
    # At the old epoch an abort reads as a retry of the other decision, as in Kafka.
    assert end_txn(conn, "tv2-a", pid, epoch, False).error_code == E.INVALID_TXN_STATE
    assert end_txn(conn, "tv2-a", pid, epoch + 5, True).error_code == E.PRODUCER_FENCED
    # A retry of the commit whose answer was lost carries the old epoch: recognised.
    retry = end_txn(conn, "tv2-a", pid, epoch, True)
    assert (retry.error_code, retry.producer_epoch) == (E.NONE, epoch + 1)
    # The next transaction runs at the new epoch; its sequences start again at 0.
    assert produce(conn, "tv2-a", pid, epoch + 1, topic, 0, 0) == E.NONE
    assert end_txn(conn, "tv2-a", pid, epoch + 1, False).producer_epoch == epoch + 2


def test_tv1_clients_keep_their_epoch(conn: BlockingConnection, topic: str) -> None:
    r = init(conn, "tv1-a", v=4)
    pid, epoch = int(r.producer_id), int(r.producer_epoch)
    # Produce v11 does not add the partition: rule 19 still refuses it (as Kafka, with the
    # error v11 clients know; v10 and older get INVALID_TXN_STATE).
    assert produce(conn, "tv1-a", pid, epoch, topic, 0, 0, v=11) == E.TRANSACTION_ABORTABLE
    assert add_partitions_to_txn(conn, "tv1-a", pid, epoch, topic, (0,)) == {0: E.NONE}
    assert produce(conn, "tv1-a", pid, epoch, topic, 0, 0, v=11) == E.NONE
    assert end_txn(conn, "tv1-a", pid, epoch, True, v=4).error_code == E.NONE
    assert int(wait_state(conn, "tv1-a", "CompleteCommit").producer_epoch) == epoch
    assert add_partitions_to_txn(conn, "tv1-a", pid, epoch, topic, (1,)) == {1: E.NONE}


def test_txn_offset_commit_v5_adds_the_offsets_partition(
    conn: BlockingConnection, topic: str
) -> None:
    r = init(conn, "tv2-offsets")
    pid, epoch = int(r.producer_id), int(r.producer_epoch)
    v = 5
    req = make_request(
        ApiKey.TXN_OFFSET_COMMIT,
        v,
        "TxnOffsetCommitRequest",
        transactional_id="tv2-offsets",
        group_id="tv2-group",
        producer_id=pid,
        producer_epoch=epoch,
        topics=(
            make_request(
                ApiKey.TXN_OFFSET_COMMIT,
                v,
                "TxnOffsetCommitRequestTopic",
                name=topic,
                partitions=(
                    make_request(
                        ApiKey.TXN_OFFSET_COMMIT,
                        v,
                        "TxnOffsetCommitRequestPartition",
                        partition_index=0,
                        committed_offset=5,
                        committed_metadata="",
                    ),
                ),
            ),
        ),
    )
    resp = conn.request(ApiKey.TXN_OFFSET_COMMIT, v, req)
    assert [p.error_code for t in resp.topics for p in t.partitions] == [E.NONE]
    assert {t for t, _ in partitions_of(describe(conn, "tv2-offsets"))} == {"__consumer_offsets"}
    assert end_txn(conn, "tv2-offsets", pid, epoch, True).error_code == E.NONE


def test_2pc_init_keep_prepared_and_no_timeout(conn: BlockingConnection, topic: str) -> None:
    r = init(conn, "tpc-a", v=6, enable_2pc=True)
    pid, epoch = int(r.producer_id), int(r.producer_epoch)
    assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (-1, -1)
    assert produce(conn, "tpc-a", pid, epoch, topic, 0, 0) == E.NONE
    d = describe(conn, "tpc-a")
    assert d.transaction_state == "Ongoing"
    assert d.transaction_timeout.total_seconds() * 1000 == NO_TIMEOUT_MS  # never timed out
    # A new instance takes the prepared transaction over instead of aborting it.
    kept = init(conn, "tpc-a", v=6, enable_2pc=True, keep=True)
    assert (kept.producer_id, kept.producer_epoch) == (pid, epoch + 1)
    assert (kept.ongoing_txn_producer_id, kept.ongoing_txn_producer_epoch) == (pid, epoch)
    assert describe(conn, "tpc-a").transaction_state == "Ongoing"
    assert produce(conn, "tpc-a", pid, epoch, topic, 0, 1, retry=False) == E.INVALID_PRODUCER_EPOCH
    assert end_txn(conn, "tpc-a", pid, epoch + 1, True).error_code == E.NONE
    wait_state(conn, "tpc-a", "CompleteCommit")
    # keep_prepared_txn without enable_2pc is not a request Kafka accepts.
    init(conn, "tpc-a", v=6, keep=True, expect=E.INVALID_REQUEST)


def test_list_transactions_duration_filter(conn: BlockingConnection, topic: str) -> None:
    r = init(conn, "dur-a")
    assert produce(conn, "dur-a", int(r.producer_id), int(r.producer_epoch), topic, 0, 0) == 0
    init(conn, "dur-idle")  # Empty: never running, whatever the filter

    def listed(duration: int) -> set[str]:
        v = 1
        req = make_request(
            ApiKey.LIST_TRANSACTIONS, v, "ListTransactionsRequest", duration_filter=duration
        )
        resp = conn.request(ApiKey.LIST_TRANSACTIONS, v, req)
        return {str(t.transactional_id) for t in resp.transaction_states} & {"dur-a", "dur-idle"}

    assert listed(-1) == {"dur-a", "dur-idle"}
    assert listed(3_600_000) == set()  # not running for an hour
    time.sleep(0.05)
    assert listed(10) == {"dur-a"}
    end_txn(conn, "dur-a", int(r.producer_id), int(r.producer_epoch), False)


def test_add_partitions_to_txn_v4_batched_form(conn: BlockingConnection, topic: str) -> None:
    r = init(conn, "batched-a")
    pid, epoch = int(r.producer_id), int(r.producer_epoch)
    v = 4

    def call(verify_only: bool, partitions: tuple[int, ...]) -> dict[int, int]:
        txn = make_request(
            ApiKey.ADD_PARTITIONS_TO_TXN,
            v,
            "AddPartitionsToTxnTransaction",
            transactional_id="batched-a",
            producer_id=pid,
            producer_epoch=epoch,
            verify_only=verify_only,
            topics=(
                make_request(
                    ApiKey.ADD_PARTITIONS_TO_TXN,
                    v,
                    "AddPartitionsToTxnTopic",
                    name=topic,
                    partitions=partitions,
                ),
            ),
        )
        req = make_request(
            ApiKey.ADD_PARTITIONS_TO_TXN, v, "AddPartitionsToTxnRequest", transactions=(txn,)
        )
        resp = conn.request(ApiKey.ADD_PARTITIONS_TO_TXN, v, req)
        assert resp.error_code == E.NONE
        [res] = resp.results_by_transaction
        return {
            int(p.partition_index): int(p.partition_error_code)
            for t in res.topic_results
            for p in t.results_by_partition
        }

    assert call(True, (0,)) == {0: E.TRANSACTION_ABORTABLE}  # not in the transaction yet
    assert call(False, (0,)) == {0: E.NONE}
    assert call(True, (0, 1)) == {0: E.NONE, 1: E.TRANSACTION_ABORTABLE}
    end_txn(conn, "batched-a", pid, epoch, False, v=4)


def test_settings_turn_tv2_and_2pc_down(broker_factory: type[BrokerProcess]) -> None:
    b = broker_factory(overrides={"transaction.version": "1"}).start()
    with BlockingConnection("127.0.0.1", b.port, timeout=10.0) as c:
        finalized = features(c, 4).finalized_features
        assert [(f.name, f.max_version_level) for f in finalized] == [
            ("group.version", 1),
            ("transaction.version", 1),
        ]
        # transaction.two.phase.commit.enable is false by default: Kafka's answer.
        init(c, "tpc-off", v=6, enable_2pc=True, expect=E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        assert int(init(c, "tpc-off", v=6).producer_epoch) == 0  # a plain producer still may
