"""Crash the broker (SIGKILL, or the runtime's fault hook exiting at once) in each phase of a
transaction; after a restart every transaction ends as decided and is never half-visible.

A raw-protocol transactional producer writes to 3 partitions, so the test controls exactly
where the broker dies:

* ongoing: killed with the transaction open and a later transaction committed behind it. After
  the restart it is still Ongoing (replayed from ``__transaction_state``), the rebuilt last
  stable offset still holds the committed one back, and the coordinator's timeout aborts it:
  its data never appears, the later transaction's does;
* after PrepareCommit, before any marker (step ``after-prepare``): the commit was decided; the
  restarted coordinator writes the markers and the data appears on every partition;
* between markers (step ``after-first-marker``): one partition has its COMMIT marker, two do
  not; after the restart all three do.

The two steps are otherwise never apart: the broker is started through ``CRASH_AT_STEP``, which
builds it with a transaction runtime hook (``txn_on_step``) that exits at the step of a commit.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import add_partitions_to_txn, create_topic, fetch_request

TOPIC = "txn-crash"
PARTITIONS = 3
OVERRIDES = {
    "transaction.state.log.num.partitions": "2",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
}
T = 15.0

# python -c CRASH_AT_STEP <step> broker ...: the broker, exiting (137, as a SIGKILL) at <step>
# of the first commit.
CRASH_AT_STEP = """
import functools, os, sys
import samsa.broker.server as server
step = sys.argv.pop(1)

def crash(at, job):
    if at == step and job.commit:
        print(f"crashing at {at} of {job.transactional_id}", file=sys.stderr, flush=True)
        os._exit(137)

server.Broker = functools.partial(server.Broker, txn_on_step=crash)
from samsa.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _conn(port: int) -> BlockingConnection:
    return BlockingConnection("127.0.0.1", port, timeout=5.0)


def _init(conn: BlockingConnection, txn_id: str, timeout_ms: int = 60_000) -> tuple[int, int]:
    v = 4
    deadline = time.monotonic() + T
    while True:
        resp = conn.request(
            ApiKey.INIT_PRODUCER_ID,
            v,
            make_request(
                ApiKey.INIT_PRODUCER_ID,
                v,
                "InitProducerIdRequest",
                transactional_id=txn_id,
                transaction_timeout=timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
            ),
        )
        if resp.error_code != ErrorCode.CONCURRENT_TRANSACTIONS:
            assert resp.error_code == ErrorCode.NONE
            return int(resp.producer_id), int(resp.producer_epoch)
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _add_partitions(conn: BlockingConnection, txn_id: str, pid: int, epoch: int) -> None:
    codes = add_partitions_to_txn(conn, txn_id, pid, epoch, TOPIC, tuple(range(PARTITIONS)))
    assert codes == dict.fromkeys(range(PARTITIONS), ErrorCode.NONE)


def _produce(
    conn: BlockingConnection, txn_id: str, pid: int, epoch: int, seq: int, tag: bytes
) -> None:
    v = 9
    parts = tuple(
        make_request(
            ApiKey.PRODUCE,
            v,
            "PartitionProduceData",
            index=p,
            records=build_batch(
                [
                    NewRecord(value=b"%s-%d-%d" % (tag, p, i), timestamp=int(time.time() * 1000))
                    for i in range(3)
                ],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
                transactional=True,
            ),
        )
        for p in range(PARTITIONS)
    )
    req = make_request(
        ApiKey.PRODUCE,
        v,
        "ProduceRequest",
        transactional_id=txn_id,
        acks=-1,
        timeout=10_000,
        topic_data=(
            make_request(ApiKey.PRODUCE, v, "TopicProduceData", name=TOPIC, partition_data=parts),
        ),
    )
    resp = conn.request(ApiKey.PRODUCE, v, req)
    for p in resp.responses[0].partition_responses:
        assert p.error_code == ErrorCode.NONE, p


def _end(conn: BlockingConnection, txn_id: str, pid: int, epoch: int, commit: bool) -> int:
    v = 3
    req = make_request(
        ApiKey.END_TXN,
        v,
        "EndTxnRequest",
        transactional_id=txn_id,
        producer_id=pid,
        producer_epoch=epoch,
        committed=commit,
    )
    return int(conn.request(ApiKey.END_TXN, v, req).error_code)


def _describe(port: int, txn_id: str) -> tuple[str, int]:
    v = 0
    req = make_request(
        ApiKey.DESCRIBE_TRANSACTIONS, v, "DescribeTransactionsRequest", transactional_ids=(txn_id,)
    )
    deadline = time.monotonic() + T
    with _conn(port) as conn:
        # A restarted broker answers COORDINATOR_LOAD_IN_PROGRESS until the id's partition
        # is replayed (as Kafka): a client retries.
        while True:
            [state] = conn.request(ApiKey.DESCRIBE_TRANSACTIONS, v, req).transaction_states
            if (
                state.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                or time.monotonic() > deadline
            ):
                break
            time.sleep(0.01)
    return str(state.transaction_state), int(state.producer_epoch)


def _read_committed(bootstrap: str, expect: int) -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    out: list[bytes] = []
    deadline = time.monotonic() + T
    quiet_until = None
    while time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is None:
            if len(out) >= expect:
                quiet_until = quiet_until or time.monotonic() + 0.5
                if time.monotonic() > quiet_until:
                    break
            continue
        assert m.error() is None, m.error()
        out.append(m.value())
    c.close()
    return out


def _values(tag: bytes) -> list[bytes]:
    return sorted(b"%s-%d-%d" % (tag, p, i) for p in range(PARTITIONS) for i in range(3))


def _stable(port: int) -> list[tuple[int, int, list[int]]]:
    """(high watermark, last stable offset, aborted producer ids) of each partition, from a
    read_committed Fetch: conditions to wait on, where a consumer would need a read window."""
    req = fetch_request({(TOPIC, p): 0 for p in range(PARTITIONS)}, isolation_level=1)
    with _conn(port) as conn:
        resp = conn.request(ApiKey.FETCH, 12, req)
    parts = sorted(resp.responses[0].partitions, key=lambda p: p.partition_index)
    return [
        (
            int(p.high_watermark),
            int(p.last_stable_offset),
            [int(a.producer_id) for a in p.aborted_transactions or ()],
        )
        for p in parts
    ]


def _wait_state(port: int, txn_id: str, state: str) -> None:
    deadline = time.monotonic() + T
    while _describe(port, txn_id)[0] != state:
        assert time.monotonic() < deadline, _describe(port, txn_id)
        time.sleep(0.05)


def _wait_stable(port: int) -> list[tuple[int, int, list[int]]]:
    """Wait until no transaction is open on any partition (markers written everywhere)."""
    deadline = time.monotonic() + T
    while True:
        got = _stable(port)
        if all(hw == lso for hw, lso, _ in got):
            return got
        assert time.monotonic() < deadline, got
        time.sleep(0.05)


def test_killed_while_ongoing_then_timed_out(broker_factory: type[BrokerProcess]) -> None:
    b = broker_factory(overrides=OVERRIDES).start()
    with _conn(b.port) as conn:
        assert create_topic(conn, TOPIC, PARTITIONS) == 0
        # The timeout must outlast what follows up to the restart and checks: 0.4 s on a quiet
        # machine, but a loaded one ran out of 3 s (the restart waits for the replay too).
        pid, epoch = _init(conn, "crash-ongoing", timeout_ms=6000)
        _add_partitions(conn, "crash-ongoing", pid, epoch)
        _produce(conn, "crash-ongoing", pid, epoch, 0, b"open")  # offsets 0-2
        # Another transaction commits behind the open one (3-5, marker 6).
        pid2, epoch2 = _init(conn, "crash-after")
        _add_partitions(conn, "crash-after", pid2, epoch2)
        _produce(conn, "crash-after", pid2, epoch2, 0, b"after")
        assert _end(conn, "crash-after", pid2, epoch2, True) == 0
    assert _stable(b.port) == [(7, 0, [])] * PARTITIONS
    b.kill()
    b.start()
    # Replayed from the logs: still open, and still holding the committed one back.
    assert _describe(b.port, "crash-ongoing") == ("Ongoing", epoch)
    assert _stable(b.port) == [(7, 0, [])] * PARTITIONS
    # The timeout fences and aborts it (epoch + 1, ABORT marker at 7); then the committed one
    # shows, and the open one is listed as aborted.
    _wait_state(b.port, "crash-ongoing", "CompleteAbort")
    assert _describe(b.port, "crash-ongoing")[1] == epoch + 1
    assert _wait_stable(b.port) == [(8, 8, [pid])] * PARTITIONS
    assert sorted(_read_committed(b.bootstrap, 9)) == _values(b"after")
    b.kill()
    b.start()
    assert _stable(b.port) == [(8, 8, [pid])] * PARTITIONS
    assert sorted(_read_committed(b.bootstrap, 9)) == _values(b"after")


@pytest.mark.parametrize("fault", ["after-prepare", "after-first-marker"])
def test_killed_during_commit_completes_after_restart(
    broker_factory: type[BrokerProcess], fault: str
) -> None:
    b = broker_factory(overrides=OVERRIDES)
    b.launcher = ["-c", CRASH_AT_STEP, fault]
    b.start()
    b.launcher = ["-m", "samsa"]  # restarted without the hook
    txn = "crash-" + fault
    with _conn(b.port) as conn:
        assert create_topic(conn, TOPIC, PARTITIONS) == 0
        pid, epoch = _init(conn, txn)
        _add_partitions(conn, txn, pid, epoch)
        _produce(conn, txn, pid, epoch, 0, b"first")
        # after-prepare: the broker exits before answering; after-first-marker: after.
        try:
            assert _end(conn, txn, pid, epoch, True) == 0
        except (ConnectionClosed, OSError):
            assert fault == "after-prepare"
    assert b.proc is not None and b.proc.wait(T) == 137
    assert b.log_contains(f"crashing at {fault} of {txn}")
    b.start()
    _wait_state(b.port, txn, "CompleteCommit")
    # 3 records + COMMIT each; the partition whose marker was written before the crash gets
    # a second one from the restarted coordinator (as in Kafka: markers are resent to all).
    ends = [5, 4, 4] if fault == "after-first-marker" else [4, 4, 4]
    got = _wait_stable(b.port)
    assert sorted(hw for hw, _, _ in got) == sorted(ends) and not any(a for _, _, a in got)
    ends = [hw for hw, _, _ in got]
    assert sorted(_read_committed(b.bootstrap, 9)) == _values(b"first")
    # The producer goes on with the next transaction at the same epoch.
    with _conn(b.port) as conn:
        _add_partitions(conn, txn, pid, epoch)
        _produce(conn, txn, pid, epoch, 3, b"second")
        assert _end(conn, txn, pid, epoch, False) == 0
    _wait_state(b.port, txn, "CompleteAbort")
    assert _wait_stable(b.port) == [(e + 4, e + 4, [pid]) for e in ends]  # 3 records + ABORT
    assert sorted(_read_committed(b.bootstrap, 9)) == _values(b"first")
