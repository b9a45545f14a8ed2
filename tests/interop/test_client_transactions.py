"""samsa's transactional producer against samsa and Tansu, cross-checked with confluent-kafka.

* commit makes records visible to read_committed consumers (samsa's and confluent-kafka's),
  abort hides them (asserted on samsa only: Tansu returns aborted data to read_committed);
* send_offsets_to_transaction: the offsets are visible to committed() only after the commit;
* zombie fencing: a second producer with the same transactional.id fences the first;
* prepare_transaction / resume_transaction: another producer object ends the transaction;
* consume-transform-produce with samsa's client copies a topic exactly once, through an
  abandoned transaction and a fenced copier;
* interop both ways: samsa's transactional writes read by confluent-kafka read_committed,
  confluent-kafka's transactional writes read by samsa's read_committed consumer;
* admin list/describe transactions (samsa; Tansu has neither API).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import Producer as CkProducer
from confluent_kafka import TopicPartition as CkTP

from _broker import BrokerProcess
from samsa.client import (
    AbortableTransactionError,
    Admin,
    Consumer,
    ConsumerRecord,
    KafkaError,
    Producer,
    ProducerFencedError,
    TopicPartition,
    TransactionState,
)
from samsa.protocol.errors import ErrorCode

T = 20.0  # bound of every blocking call
OVERRIDES = {
    "transaction.state.log.num.partitions": "4",
    "offsets.topic.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
}


@pytest.fixture(scope="module")
def samsa_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    b = BrokerProcess(tmp_path_factory.mktemp("txn-client"), OVERRIDES).start()
    yield b.bootstrap
    b.stop()


@pytest.fixture(params=["samsa", "tansu"])
def broker(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """(bootstrap, whether read_committed hides aborted data there)."""
    if request.param == "samsa":
        return str(request.getfixturevalue("samsa_broker")), True
    return str(request.getfixturevalue("tansu")), False


def _topic(bootstrap: str, partitions: int = 2) -> str:
    name = f"txc-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


def _txn_producer(bootstrap: str, txn_id: str | None = None) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id or f"tx-{uuid.uuid4().hex[:8]}",
            "linger.ms": 2,
            "max.block.ms": 20_000,
        }
    )
    p.init_transactions(T)
    return p


def read_samsa(
    bootstrap: str,
    topic: str,
    partitions: int,
    expect: int,
    *,
    committed: bool = True,
) -> list[ConsumerRecord]:
    """Everything readable: until ``expect`` records, then one more short poll for extras."""
    config = {
        "bootstrap.servers": bootstrap,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed" if committed else "read_uncommitted",
    }
    out: list[ConsumerRecord] = []
    with Consumer(config) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + T
        while len(out) < expect and time.monotonic() < deadline:
            out += c.poll(0.3)
        out += c.poll(0.3)
    return sorted(out, key=lambda r: (r.partition, r.offset))


def read_ck(bootstrap: str, topic: str, partitions: int, expect: int) -> list[bytes]:
    c = CkConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ck-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    out: list[bytes] = []
    try:
        c.assign([CkTP(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + T
        extra = 0
        while time.monotonic() < deadline and extra < 3:
            m = c.poll(0.3)
            if m is None:
                if len(out) >= expect:
                    extra += 1
                continue
            if m.error() is None:
                out.append(m.value())
    finally:
        c.close()
    return sorted(out)


def _values(records: list[ConsumerRecord]) -> list[bytes]:
    return sorted(r.value for r in records if r.value is not None)


def test_commit_visible_abort_hidden(broker: tuple[str, bool]) -> None:
    bootstrap, filters = broker
    topic = _topic(bootstrap)
    p = _txn_producer(bootstrap)
    try:
        p.begin_transaction()
        committed = [p.send(topic, b"c%02d" % i, b"k%d" % i) for i in range(20)]
        p.commit_transaction(T)
        assert all(f.result(T).offset >= 0 for f in committed)
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, b"a%02d" % i, b"k%d" % i)
        p.flush(T)  # written, then aborted
        p.abort_transaction(T)
        with p.transaction():
            p.produce(topic, b"z", b"k1")
        assert p.transaction_state is TransactionState.READY
    finally:
        p.close()
    want = sorted([b"c%02d" % i for i in range(20)] + [b"z"])
    every = _values(read_samsa(bootstrap, topic, 2, 31, committed=False))
    assert every == sorted(want + [b"a%02d" % i for i in range(10)])
    if filters:
        assert _values(read_samsa(bootstrap, topic, 2, len(want))) == want
        assert read_ck(bootstrap, topic, 2, len(want)) == want
    else:  # Tansu does not filter aborted data: the committed data is all there, once each
        got = _values(read_samsa(bootstrap, topic, 2, 31))
        assert [v for v in got if v in want] == want


def test_send_offsets_commit_atomically(broker: tuple[str, bool]) -> None:
    bootstrap, _ = broker
    topic = _topic(bootstrap, 1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition(topic, 0)
    p = _txn_producer(bootstrap)

    def committed() -> int | None:
        with Consumer({"bootstrap.servers": bootstrap, "group.id": group}) as c:
            try:
                return c.committed([tp])[tp]
            except KafkaError as exc:  # require_stable: pending transactional offsets
                assert exc.code == ErrorCode.UNSTABLE_OFFSET_COMMIT
                return None

    try:
        p.begin_transaction()
        p.produce(topic, b"x")
        p.send_offsets_to_transaction({tp: 42}, group, T)
        assert committed() is None  # staged, not visible before the commit
        p.commit_transaction(T)
        assert committed() == 42
        p.begin_transaction()
        p.send_offsets_to_transaction({tp: 99}, group, T)
        p.abort_transaction(T)
        assert committed() == 42  # the aborted offsets are dropped
    finally:
        p.close()


def test_zombie_is_fenced(broker: tuple[str, bool]) -> None:
    bootstrap, filters = broker
    topic = _topic(bootstrap)
    txn_id = f"zombie-{uuid.uuid4().hex[:6]}"
    zombie = _txn_producer(bootstrap, txn_id)
    successor: Producer | None = None
    try:
        zombie.begin_transaction()
        zombie.produce(topic, b"zombie-1", b"k")
        assert zombie.flush(T) == 0
        successor = _txn_producer(bootstrap, txn_id)  # fences, aborts the open transaction
        assert successor.epoch > zombie.epoch or successor.producer_id != zombie.producer_id
        late = zombie.send(topic, b"zombie-2", b"k")
        with pytest.raises(ProducerFencedError):
            late.result(T)
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction(T)
        assert zombie.transaction_state is TransactionState.FATAL_ERROR
        with successor.transaction():
            successor.produce(topic, b"successor", b"k")
    finally:
        zombie.close()
        if successor is not None:
            successor.close()
    got = _values(read_samsa(bootstrap, topic, 2, 1 if filters else 2))
    assert b"successor" in got and b"zombie-2" not in got
    if filters:
        assert got == [b"successor"]


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_resume_transaction_from_another_producer(broker: tuple[str, bool], outcome: str) -> None:
    bootstrap, filters = broker
    topic = _topic(bootstrap)
    group = f"driver-{uuid.uuid4().hex[:6]}"
    task = _txn_producer(bootstrap)
    try:
        task.begin_transaction()
        for i in range(10):
            task.produce(topic, b"t%d" % i, b"k%d" % i)
        prepared = task.prepare_transaction(T)
    finally:
        task.close()  # a prepared transaction stays open
    assert prepared.started
    if filters:
        assert read_samsa(bootstrap, topic, 2, 0) == []  # open: nothing stable yet
    with Producer.resume_transaction(
        {"bootstrap.servers": bootstrap},
        prepared.transactional_id,
        prepared.producer_id,
        prepared.epoch,
    ) as txn:
        txn.send_offsets_to_transaction({TopicPartition(topic, 0): 10}, group)
        txn.commit() if outcome == "commit" else txn.abort()
    if outcome == "commit":
        got = _values(read_samsa(bootstrap, topic, 2, 10))
        assert got == sorted(b"t%d" % i for i in range(10))
        with Consumer({"bootstrap.servers": bootstrap, "group.id": group}) as c:
            assert c.committed([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 10}
    elif filters:
        assert read_samsa(bootstrap, topic, 2, 0) == []
        assert len(read_samsa(bootstrap, topic, 2, 10, committed=False)) == 10


def test_resume_is_fenced_after_a_new_init(samsa_broker: str) -> None:
    topic = _topic(samsa_broker)
    task = _txn_producer(samsa_broker)
    task.begin_transaction()
    task.produce(topic, b"lost")
    prepared = task.prepare_transaction(T)
    task.close()
    _txn_producer(samsa_broker, prepared.transactional_id).close()  # a restarted task
    with Producer.resume_transaction({"bootstrap.servers": samsa_broker}, prepared) as txn:
        with pytest.raises(ProducerFencedError):
            txn.commit()
    assert read_samsa(samsa_broker, topic, 2, 0) == []


def _copy(bootstrap: str, src: str, dst: str, group: str, txn_id: str, stop_after: int) -> int:
    """One copier incarnation: read_committed, uppercase, write and commit the input
    offsets in one transaction. After ``stop_after`` transactions it leaves its current
    one open (a crash) and returns; returns -1 once the input is drained."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    producer = _txn_producer(bootstrap, txn_id)
    done = 0
    try:
        consumer.subscribe([src])
        idle = 0
        deadline = time.monotonic() + T
        while time.monotonic() < deadline:
            records = consumer.poll(0.5, max_records=37)
            if not records:
                idle += 1
                if idle >= 4 and consumer.assignment():
                    return -1
                continue
            idle = 0
            producer.begin_transaction()
            for r in records:
                producer.produce(dst, (r.value or b"").upper(), r.key, partition=r.partition)
            ends: dict[TopicPartition, int] = {}
            for r in records:
                ends[TopicPartition(r.topic, r.partition)] = r.offset + 1
            producer.send_offsets_to_transaction(ends, consumer.group_metadata(), T)
            if done == stop_after:
                # A crash: the transaction stays open (a prepared one is not aborted on
                # close); the next incarnation's init_transactions fences this producer
                # and the coordinator aborts what it left.
                producer.prepare_transaction(T)
                return done
            producer.commit_transaction(T)
            done += 1
        raise AssertionError("copier did not drain the input in time")
    finally:
        producer.close()
        consumer.close()


def test_consume_transform_produce_exactly_once(samsa_broker: str) -> None:
    bootstrap = samsa_broker
    src, dst = _topic(bootstrap, 2), _topic(bootstrap, 2)
    n = 400
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 2}) as p:
        for i in range(n):
            p.produce(src, b"rec-%04d" % i, b"k%d" % (i % 7))
        assert p.flush(T) == 0
    group, txn_id = f"copy-{uuid.uuid4().hex[:6]}", f"copier-{uuid.uuid4().hex[:6]}"
    assert _copy(bootstrap, src, dst, group, txn_id, stop_after=2) == 2
    assert _copy(bootstrap, src, dst, group, txn_id, stop_after=10**6) == -1
    out = read_samsa(bootstrap, dst, 2, n)
    assert _values(out) == sorted(b"REC-%04d" % i for i in range(n))
    # the abandoned transaction's records are in the log, aborted
    assert len(read_samsa(bootstrap, dst, 2, n + 1, committed=False)) > n
    # each output partition keeps its input partition's order
    src_recs = read_samsa(bootstrap, src, 2, n)
    for part in (0, 1):
        assert [r.value for r in out if r.partition == part] == [
            (r.value or b"").upper() for r in src_recs if r.partition == part
        ]


def test_samsa_transactions_read_by_confluent_and_back(samsa_broker: str) -> None:
    bootstrap = samsa_broker
    topic = _topic(bootstrap, 3)
    # confluent-kafka writes transactionally: one committed, one aborted transaction
    ck = CkProducer({"bootstrap.servers": bootstrap, "transactional.id": f"ck-{topic}"})
    ck.init_transactions(T)
    ck.begin_transaction()
    for i in range(30):
        ck.produce(topic, b"ck-c%02d" % i, b"k%d" % i)
    ck.commit_transaction(T)
    ck.begin_transaction()
    for i in range(30):
        ck.produce(topic, b"ck-a%02d" % i, b"k%d" % i)
    ck.flush(T)
    ck.abort_transaction(T)
    # samsa writes transactionally after it: one aborted, one committed
    p = _txn_producer(bootstrap)
    try:
        p.begin_transaction()
        for i in range(30):
            p.produce(topic, b"s-a%02d" % i, b"k%d" % i)
        p.flush(T)
        p.abort_transaction(T)
        p.begin_transaction()
        for i in range(30):
            p.produce(topic, b"s-c%02d" % i, b"k%d" % i)
        p.commit_transaction(T)
    finally:
        p.close()
    want = sorted([b"ck-c%02d" % i for i in range(30)] + [b"s-c%02d" % i for i in range(30)])
    assert _values(read_samsa(bootstrap, topic, 3, 60)) == want
    assert read_ck(bootstrap, topic, 3, 60) == want


def test_abortable_error_then_recovery(samsa_broker: str) -> None:
    """A record the broker refuses makes the transaction abortable; after the abort the
    producer goes on (with a bumped epoch) and nothing of the failed transaction shows."""
    topic = _topic(samsa_broker, 1)
    p = _txn_producer(samsa_broker)
    try:
        epoch = p.epoch
        p.begin_transaction()
        ok = p.send(topic, b"ok")
        ok.result(T)
        too_big = p.send(topic, b"x" * (2 * 1024 * 1024))  # over message.max.bytes
        with pytest.raises(KafkaError):
            too_big.result(T)
        with pytest.raises(AbortableTransactionError):
            p.commit_transaction(T)
        p.abort_transaction(T)
        assert p.epoch == epoch + 1  # KIP-360 bump after a failed batch
        with p.transaction():
            p.produce(topic, b"after")
    finally:
        p.close()
    assert _values(read_samsa(samsa_broker, topic, 1, 1)) == [b"after"]


def test_record_lost_before_sending_makes_the_transaction_abortable(samsa_broker: str) -> None:
    """As Java's producer: a record that fails in send (no such partition) fails the
    transaction too; commit and prepare refuse, abort works."""
    topic = _topic(samsa_broker, 1)
    p = _txn_producer(samsa_broker)
    try:
        p.begin_transaction()
        p.send(topic, b"kept?").result(T)
        lost = p.send(topic, b"lost", partition=5)
        with pytest.raises(KafkaError):
            lost.result(T)
        with pytest.raises(AbortableTransactionError):
            p.commit_transaction(T)
        p.abort_transaction(T)
    finally:
        p.close()
    assert _values(read_samsa(samsa_broker, topic, 1, 0)) == []


def test_admin_lists_and_describes_transactions(samsa_broker: str) -> None:
    topic = _topic(samsa_broker)
    p = _txn_producer(samsa_broker)
    tid = p._core.transactional_id
    assert tid is not None
    try:
        p.begin_transaction()
        p.produce(topic, b"v", partition=1)
        p.flush(T)
        with Admin({"bootstrap.servers": samsa_broker}) as admin:
            listed = {t.transactional_id: t for t in admin.list_transactions()}
            assert listed[tid].state == "Ongoing"
            assert listed[tid].producer_id == p.producer_id
            assert tid in {t.transactional_id for t in admin.list_transactions(states=["Ongoing"])}
            d = admin.describe_transactions([tid, "no-such-id"])
            assert d[tid].state == "Ongoing"
            assert (d[tid].producer_id, d[tid].epoch) == (p.producer_id, p.epoch)
            assert d[tid].partitions == (TopicPartition(topic, 1),)
            assert d["no-such-id"].error == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            p.commit_transaction(T)
            assert admin.describe_transactions([tid])[tid].state == "CompleteCommit"
    finally:
        p.close()
