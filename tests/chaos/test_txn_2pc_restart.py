"""Two-phase commit across a coordinator crash (KIP-939, rule 37): a 2PC producer writes and
prepares (its data is durable, the transaction Ongoing); the broker is SIGKILLed; after the
restart the replayed transaction is still Ongoing and is not aborted for its age; a new
instance takes it over with keep_prepared_txn, learns the identity it was prepared under, and
commits it with EndTxn v5, after which read_committed consumers see every record."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode as E
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch, decode_records, iter_batches
from samsa.testing import create_topic, fetch_request

TOPIC = "tpc-crash"
TID = "tpc-crash-txn"
CONTROL = "tpc-crash-control"  # an ordinary transaction of the same timeout, opened alongside
OVERRIDES = {
    "transaction.two.phase.commit.enable": "true",
    "transaction.state.log.num.partitions": "2",
    # The timeout check runs often: a 2PC transaction must survive it anyway.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100",
    "log.flush.interval.messages": "1",
}
T = 15.0


def _init(conn: BlockingConnection, keep: bool, tid: str = TID) -> Any:
    v = 6
    req = make_request(
        ApiKey.INIT_PRODUCER_ID,
        v,
        "InitProducerIdRequest",
        transactional_id=tid,
        transaction_timeout=1_000,  # ignored for 2PC: no timeout
        producer_id=-1,
        producer_epoch=-1,
        enable2_pc=tid == TID,
        keep_prepared_txn=keep,
    )
    resp = conn.request(ApiKey.INIT_PRODUCER_ID, v, req)
    assert resp.error_code == E.NONE, resp
    return resp


def _produce(
    conn: BlockingConnection, pid: int, epoch: int, partition: int, tid: str = TID
) -> None:
    v = 12  # transactions v2: the partition joins the transaction with the batch
    batch = build_batch(
        [
            NewRecord(value=b"p%d-%d" % (partition, i), timestamp=int(time.time() * 1000))
            for i in range(3)
        ],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
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
            make_request(ApiKey.PRODUCE, v, "TopicProduceData", name=TOPIC, partition_data=(part,)),
        ),
    )
    [p] = conn.request(ApiKey.PRODUCE, v, req).responses[0].partition_responses
    assert p.error_code == E.NONE, p


def _describe(conn: BlockingConnection, tid: str = TID) -> Any:
    req = make_request(
        ApiKey.DESCRIBE_TRANSACTIONS, 0, "DescribeTransactionsRequest", transactional_ids=(tid,)
    )
    [s] = conn.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, req).transaction_states
    return s


def _state(conn: BlockingConnection, tid: str = TID) -> str:
    return str(_describe(conn, tid).transaction_state)


def _committed_values(conn: BlockingConnection) -> list[bytes]:
    req = fetch_request({(TOPIC, p): 0 for p in range(2)}, isolation_level=1)
    resp = conn.request(ApiKey.FETCH, 12, req)
    out = []
    for part in resp.responses[0].partitions:
        aborted = {int(a.producer_id) for a in part.aborted_transactions or ()}
        for batch in iter_batches(part.records or b""):
            if batch.producer_id in aborted:  # (each producer here has one transaction)
                continue
            if batch.base_offset < part.last_stable_offset and not batch.is_control:
                out += [r.value for r in decode_records(batch)]
    return sorted(out)


def test_2pc_transaction_survives_a_coordinator_crash_and_commits(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", OVERRIDES).start()
    try:
        with BlockingConnection("127.0.0.1", b.port, timeout=10.0) as conn:
            assert create_topic(conn, TOPIC, 2) == 0
            control = _init(conn, keep=False, tid=CONTROL)
            _produce(conn, int(control.producer_id), int(control.producer_epoch), 0, CONTROL)
            first = _init(conn, keep=False)
            pid, epoch = int(first.producer_id), int(first.producer_epoch)
            for p in range(2):
                _produce(conn, pid, epoch, p)
            assert _state(conn) == "Ongoing"  # prepared: the external decision is pending
        b.kill()
        b.start()
        with BlockingConnection("127.0.0.1", b.port, timeout=10.0) as conn:
            # Past the 1 s timeout (and three checks more): the ordinary transaction is
            # aborted for its age, so the check ran; the 2PC one, exempt, is still Ongoing.
            old_enough = _describe(conn).transaction_start_time.timestamp() * 1000 + 1_000 + 300
            deadline = time.monotonic() + T
            while _state(conn, CONTROL) == "Ongoing" or time.time() * 1000 < old_enough:
                assert time.monotonic() < deadline, "the timeout check never ran"
                time.sleep(0.05)
            assert _state(conn, CONTROL) in ("PrepareAbort", "CompleteAbort")
            assert _state(conn) == "Ongoing"
            assert _committed_values(conn) == []  # the open transaction holds the LSO back
            kept = _init(conn, keep=True)
            assert (kept.ongoing_txn_producer_id, kept.ongoing_txn_producer_epoch) == (pid, epoch)
            v = 5
            end = make_request(
                ApiKey.END_TXN,
                v,
                "EndTxnRequest",
                transactional_id=TID,
                producer_id=kept.producer_id,
                producer_epoch=kept.producer_epoch,
                committed=True,
            )
            assert conn.request(ApiKey.END_TXN, v, end).error_code == E.NONE
            want = sorted(b"p%d-%d" % (p, i) for p in range(2) for i in range(3))
            deadline = time.monotonic() + T
            while (got := _committed_values(conn)) != want:
                assert time.monotonic() < deadline, got
                time.sleep(0.05)
    finally:
        b.stop()
