"""samsa's transactional producer speaks transactions v2 (KIP-890 part 2, rule 36) when the
broker offers it, TV1 when not, and hands a prepared transaction over through two-phase
commit (KIP-939, rule 37), also across a broker crash between prepare and commit."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.client import (
    Admin,
    Consumer,
    ConsumerRecord,
    Producer,
    ProducerFencedError,
    TopicPartition,
)

T = 20.0
OVERRIDES = {
    "transaction.state.log.num.partitions": "2",
    "offsets.topic.num.partitions": "2",
    "transaction.two.phase.commit.enable": "true",
    "log.flush.interval.messages": "1",  # the crash test's data must survive SIGKILL
}


def _topic(bootstrap: str) -> str:
    name = f"tv2c-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, 2)
    return name


def _producer(bootstrap: str, tid: str, **extra: Any) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": tid,
            "linger.ms": 2,
            "max.block.ms": 20_000,
            **extra,
        }
    )
    p.init_transactions(T)
    return p


def _read(bootstrap: str, topic: str, expect: int) -> list[bytes]:
    config = {
        "bootstrap.servers": bootstrap,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    out: list[ConsumerRecord] = []
    with Consumer(config) as c:
        c.assign([TopicPartition(topic, p) for p in range(2)])
        deadline = time.monotonic() + T
        while len(out) < expect and time.monotonic() < deadline:
            out += c.poll(0.2)
        out += c.poll(0.2)
    return sorted(r.value for r in out if r.value is not None)


def _commit_twice(bootstrap: str) -> tuple[int, int, int]:
    """(epoch after init, after one commit, after a second); the records must be visible."""
    topic = _topic(bootstrap)
    p = _producer(bootstrap, f"tv2c-{uuid.uuid4().hex[:6]}")
    try:
        epochs = [p.epoch]
        for n in range(2):
            p.begin_transaction()
            for i in range(5):
                p.produce(topic, b"r%d-%d" % (n, i), b"k%d" % i)
            p.send_offsets_to_transaction({TopicPartition(topic, 0): n + 1}, "tv2c-group")
            p.commit_transaction(T)
            epochs.append(p.epoch)
    finally:
        p.close()
    assert _read(bootstrap, topic, 10) == sorted(
        b"r%d-%d" % (n, i) for n in range(2) for i in range(5)
    )
    return epochs[0], epochs[1], epochs[2]


def test_the_client_uses_tv2_when_offered_and_tv1_when_not(
    broker_factory: type[BrokerProcess],
) -> None:
    tv2 = broker_factory(overrides=OVERRIDES).start()
    first, one, two = _commit_twice(tv2.bootstrap)
    assert (one, two) == (first + 1, first + 2)  # EndTxn v5: a new epoch at every commit
    tv1 = broker_factory(overrides={**OVERRIDES, "transaction.version": "1"}).start()
    first, one, two = _commit_twice(tv1.bootstrap)
    assert (one, two) == (first, first)  # TV1: the epoch stays


def test_2pc_hand_off_across_a_broker_crash(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", OVERRIDES).start()
    config = {"bootstrap.servers": b.bootstrap, "transaction.two.phase.commit.enable": True}
    try:
        topic = _topic(b.bootstrap)
        task = _producer(b.bootstrap, "tpc-task-1", **{"transaction.two.phase.commit.enable": True})
        try:
            task.begin_transaction()
            for i in range(6):
                task.produce(topic, b"t%d" % i, b"k%d" % i)
            prepared = task.prepare_transaction(T)
        finally:
            task.close()  # a prepared transaction stays open
        b.kill()  # the coordinator dies between prepare and commit
        b.start()
        # Still open: Ongoing at its (restarted) coordinator, each partition's last stable
        # offset held at the transaction's first offset, below what the log holds.
        tps = [TopicPartition(topic, p) for p in range(2)]
        with Admin({"bootstrap.servers": b.bootstrap}) as admin:
            desc = admin.describe_transactions(["tpc-task-1"])["tpc-task-1"]
            ends = admin.list_offsets(tps)
        assert desc.state == "Ongoing" and set(desc.partitions) == set(tps), desc
        assert sum(ends.values()) == 6 and all(ends.values()), ends
        committed = {"bootstrap.servers": b.bootstrap, "isolation.level": "read_committed"}
        with Consumer(committed) as c:
            assert c.list_offsets(tps, -1) == {tp: 0 for tp in tps}
        assert _read(b.bootstrap, topic, 0) == []  # nothing stable
        with Producer.resume_transaction(config, prepared) as txn:
            txn.send_offsets_to_transaction({TopicPartition(topic, 0): 6}, "tpc-group")
            txn.commit()
        assert _read(b.bootstrap, topic, 6) == sorted(b"t%d" % i for i in range(6))
        with Consumer({"bootstrap.servers": b.bootstrap, "group.id": "tpc-group"}) as c:
            assert c.committed([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 6}
        # A second take-over finds nothing open: committing again is refused, not repeated.
        with Producer.resume_transaction(config, prepared) as again:
            with pytest.raises(ProducerFencedError):
                again.commit()
    finally:
        b.stop()
