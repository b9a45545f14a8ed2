"""Transactions with real clients: confluent-kafka's transactional producer against samsa,
read back by read_committed consumers of confluent-kafka and kafka-python.

1. committed transactions over several partitions are seen exactly once, aborted ones and
   the still-open one never (until it commits); read_uncommitted sees everything;
2. send_offsets_to_transaction: the group's offsets are pending (OffsetFetch with
   require_stable answers UNSTABLE_OFFSET_COMMIT) until the commit, dropped by an abort;
3. zombie fencing: a second producer with the same transactional.id fences the first, whose
   open transaction is aborted and whose next produce/commit fails fatally;
4. a consume-transform-produce copier, SIGKILLed twice and restarted, copies a topic exactly
   once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

COPIER = Path(__file__).with_name("_txn_copier.py")
OVERRIDES = {
    "transaction.state.log.num.partitions": "4",
    "offsets.topic.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
}
T = 20.0  # bound of every client call


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    b = BrokerProcess(tmp_path_factory.mktemp("txn"), OVERRIDES).start()
    yield b
    b.stop()


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(T)


def _producer(bootstrap: str, txn_id: str, **extra: object) -> Producer:
    conf = {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 1}
    conf.update(extra)
    p = Producer(conf)
    p.init_transactions(T)
    return p


def _read_confluent(
    bootstrap: str, topic: str, partitions: int, expect: int, committed: bool = True
) -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reader-unused",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[bytes] = []
    deadline = time.monotonic() + T
    idle_until = None
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None:
            if len(out) >= expect:
                # Enough: keep polling briefly to catch anything that should not be there.
                idle_until = idle_until or time.monotonic() + 0.6
                if time.monotonic() > idle_until:
                    break
            continue
        assert m.error() is None, m.error()
        out.append(m.value())
    c.close()
    return out


def _read_kafka_python(bootstrap: str, topic: str, partitions: int, expect: int) -> list[bytes]:
    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=10_000,
    )
    tps = [KpTopicPartition(topic, p) for p in range(partitions)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    out: list[bytes] = []
    deadline = time.monotonic() + T
    idle = 0
    while time.monotonic() < deadline and idle < 3:
        batch = c.poll(timeout_ms=300)
        got = [r.value for recs in batch.values() for r in recs]
        out += got
        idle = idle + 1 if not got and len(out) >= expect else 0
    c.close()
    return out


def test_committed_once_aborted_and_open_never(txn_broker: BrokerProcess) -> None:
    bs, topic = txn_broker.bootstrap, "txn-data"
    _create(bs, topic, 3)
    p = _producer(bs, "writer-1")
    committed: list[bytes] = []
    for n in range(6):
        p.begin_transaction()
        values = [b"t%d-%d" % (n, i) for i in range(30)]
        for i, v in enumerate(values):
            p.produce(topic, value=v, partition=i % 3)
        if n % 2 == 0:
            p.commit_transaction(T)
            committed += values
        else:
            p.flush(T)
            p.abort_transaction(T)
    # A transaction left open: nothing of it (or after it) is visible to read_committed.
    p.begin_transaction()
    for i in range(6):
        p.produce(topic, value=b"open-%d" % i, partition=i % 3)
    p.flush(T)
    other = _producer(bs, "writer-2")  # a committed transaction after the open one
    other.begin_transaction()
    other.produce(topic, value=b"late", partition=0)
    other.commit_transaction(T)

    for got in (
        _read_confluent(bs, topic, 3, len(committed)),
        _read_kafka_python(bs, topic, 3, len(committed)),
    ):
        # Partition 0's "late" commit sits above the open transaction's first offset: held.
        assert Counter(got) == Counter(committed)
    everything = _read_confluent(bs, topic, 3, 6 * 30 + 7, committed=False)
    assert len(everything) == 6 * 30 + 7

    p.commit_transaction(T)
    final = committed + [b"open-%d" % i for i in range(6)] + [b"late"]
    assert Counter(_read_confluent(bs, topic, 3, len(final))) == Counter(final)
    assert Counter(_read_kafka_python(bs, topic, 3, len(final))) == Counter(final)


def _offset_fetch(port: int, group: str, topic: str, stable: bool) -> tuple[int, int]:
    v = 7
    req = make_request(
        ApiKey.OFFSET_FETCH,
        v,
        "OffsetFetchRequest",
        group_id=group,
        topics=(
            make_request(
                ApiKey.OFFSET_FETCH,
                v,
                "OffsetFetchRequestTopic",
                name=topic,
                partition_indexes=(0,),
            ),
        ),
        require_stable=stable,
    )
    with BlockingConnection("127.0.0.1", port, timeout=10) as conn:
        resp = conn.request(ApiKey.OFFSET_FETCH, v, req)
    part = resp.topics[0].partitions[0]
    return int(part.error_code), int(part.committed_offset)


def test_send_offsets_to_transaction(txn_broker: BrokerProcess) -> None:
    bs, topic, group = txn_broker.bootstrap, "txn-offsets", "txn-group"
    _create(bs, topic, 1)
    consumer = Consumer({"bootstrap.servers": bs, "group.id": group})
    meta = consumer.consumer_group_metadata()
    p = _producer(bs, "offsets-writer")

    p.begin_transaction()
    p.produce(topic, value=b"x", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 42)], meta, T)
    p.flush(T)
    # Pending: a stable fetch is told to retry, a plain one sees no offset yet.
    assert _offset_fetch(txn_broker.port, group, topic, True) == (
        ErrorCode.UNSTABLE_OFFSET_COMMIT,
        -1,
    )
    assert _offset_fetch(txn_broker.port, group, topic, False) == (0, -1)
    p.commit_transaction(T)
    deadline = time.monotonic() + T
    while _offset_fetch(txn_broker.port, group, topic, True) != (0, 42):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    [tp] = consumer.committed([TopicPartition(topic, 0)], T)
    assert tp.offset == 42

    p.begin_transaction()
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 99)], meta, T)
    p.abort_transaction(T)
    deadline = time.monotonic() + T
    while _offset_fetch(txn_broker.port, group, topic, True) != (0, 42):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    consumer.close()


def test_zombie_is_fenced(txn_broker: BrokerProcess) -> None:
    bs, topic = txn_broker.bootstrap, "txn-zombie"
    _create(bs, topic, 2)
    zombie = _producer(bs, "fenced-id")
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie-1", partition=0)
    zombie.flush(T)
    successor = _producer(bs, "fenced-id")  # fences the zombie, aborts its transaction
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", partition=1)
    successor.commit_transaction(T)

    # Its produce is refused (INVALID_PRODUCER_EPOCH): librdkafka raises a fatal "fenced".
    with pytest.raises(KafkaException) as info:
        zombie.produce(topic, value=b"zombie-2", partition=0)
        zombie.flush(T)
    assert info.value.args[0].fatal()
    assert "fenced" in str(info.value.args[0]).lower()
    with pytest.raises(KafkaException) as info:
        zombie.commit_transaction(T)
    assert info.value.args[0].fatal()
    got = _read_confluent(bs, topic, 2, 1)
    assert got == [b"successor"]


def _start_copier(bs: str, src: str, dst: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(COPIER), bs, src, dst, "copier-group", "copier-txn"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def test_copier_killed_and_restarted_copies_exactly_once(
    txn_broker: BrokerProcess, tmp_path: Path
) -> None:
    bs, src, dst, n = txn_broker.bootstrap, "copy-in", "copy-out", 3000
    _create(bs, src, 2)
    _create(bs, dst, 2)
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        p.produce(src, value=b"rec-%05d" % i, partition=i % 2)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(T) == 0

    log = tmp_path / "copier.log"
    procs = []
    try:
        for commits in (5, 12):
            # Kill it mid-copy: after some transactions, likely inside the next one.
            before = log.read_text().count("committed") if log.exists() else 0
            proc = _start_copier(bs, src, dst, log)
            procs.append(proc)
            deadline = time.monotonic() + T
            while log.read_text().count("committed") < before + commits:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
                time.sleep(0.01)
            time.sleep(0.015)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        copied = log.read_text().count("committed")
        assert copied * 50 < n  # the kills landed mid-stream
        proc = _start_copier(bs, src, dst, log)
        procs.append(proc)
        expected = Counter(b"REC-%05d" % i for i in range(n))
        deadline = time.monotonic() + 60
        got: list[bytes] = []
        while time.monotonic() < deadline:
            got = _read_confluent(bs, dst, 2, n)
            if len(got) >= n:
                break
            assert proc.poll() is None, log.read_text()[-3000:]
        assert Counter(got) == expected, (len(got), log.read_text()[-2000:])
        assert Counter(_read_kafka_python(bs, dst, 2, n)) == expected
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
