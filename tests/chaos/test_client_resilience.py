"""Every client role rides out network faults and broker crashes like Kafka's Java client.

Each role talks to the broker through :class:`samsa.testing.FaultProxy` resetting 10% of
requests before the broker sees them and losing 5% of responses after it acted on them
(several seeds); where it is natural the broker is also SIGKILLed and restarted twice
mid-run. Afterwards every record was seen exactly once and in order per partition, group
offsets never moved backwards, and the proxy's counters show the faults really happened.
A corrupt batch on disk is delivered up to the batch, then reported clearly (not a stall).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.client import (
    AbortableTransactionError,
    Admin,
    Consumer,
    ConsumerRecord,
    CorruptRecordError,
    KafkaError,
    KafkaTimeoutError,
    NewTopic,
    Producer,
    TopicPartition,
    partition_for_key,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import iter_batches
from samsa.testing import FaultProxy, Faults

OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "2",
}
RESETS = 0.10
LOST = 0.05
PARTITIONS = 3
# Fast retries so that a run takes seconds; the semantics do not depend on them.
CLIENT = {
    "request.timeout.ms": 4000,
    "retry.backoff.ms": 20,
    "retry.backoff.max.ms": 200,
    "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 200,
    "default.api.timeout.ms": 30_000,
}
PRODUCER = {k: v for k, v in CLIENT.items() if k != "default.api.timeout.ms"}
DEADLINE = 60.0


@pytest.fixture
def broker(broker_factory: type[BrokerProcess]) -> BrokerProcess:
    return broker_factory(overrides=OVERRIDES).start()


@pytest.fixture(scope="module")
def steady_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the runs that only inject network faults."""
    b = BrokerProcess(tmp_path_factory.mktemp("resilience"), OVERRIDES).start()
    yield b
    b.stop()


def faulty_proxy(broker: BrokerProcess, seed: int) -> FaultProxy:
    faults = Faults(reset_rate=RESETS, drop_response_rate=LOST)
    return FaultProxy(("127.0.0.1", broker.port), faults=faults, seed=seed).start()


def new_topic(broker: BrokerProcess, partitions: int = PARTITIONS) -> str:
    name = f"res-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


def fill(broker: BrokerProcess, topic: str, n: int) -> dict[int, list[bytes]]:
    """``n`` keyed records written directly (no faults); the expected list per partition."""
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1}) as p:
        futures = [
            p.send(topic, b"v-%05d" % i, b"k-%d" % (i % 13), partition=i % PARTITIONS)
            for i in range(n)
        ]
        assert p.flush(30) == 0
    for i, f in enumerate(futures):
        expected[f.result().partition].append(b"v-%05d" % i)
    return expected


def by_partition(records: list[ConsumerRecord]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for r in records:
        assert r.value is not None
        out[r.partition].append(r.value)
    return out


def assert_exact(got: dict[int, list[bytes]], expected: dict[int, list[bytes]]) -> None:
    """Per partition: the same records, each once, in order; says where it went wrong."""
    for p, want in expected.items():
        have = got.get(p, [])
        if have == want:
            continue
        dups = sorted({v for v in have if have.count(v) > 1})
        missing = sorted(set(want) - set(have))
        at = next((i for i, (a, b) in enumerate(zip(have, want, strict=False)) if a != b), None)
        raise AssertionError(
            f"partition {p}: {len(have)} records for {len(want)}; duplicates {dups[:10]}, "
            f"missing {missing[:10]}, first difference at index {at}: "
            f"{have[at - 2 : at + 3] if at is not None else have[len(want) :][:5]}"
        )


class Crasher:
    """SIGKILLs the broker and restarts it (same port and data) when ``progress()`` passes
    each threshold; run in a thread beside the client under test. The client calls
    :meth:`gate` as it makes progress, so it cannot finish before the kills happened; it
    goes on as soon as the broker is dead, and finds it down."""

    def __init__(
        self, broker: BrokerProcess, progress: Callable[[], int], thresholds: list[int]
    ) -> None:
        self.broker = broker
        self.progress = progress
        self.thresholds = thresholds
        self.kills = 0
        self.error: BaseException | None = None
        self._killed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def gate(self) -> None:
        with self._killed:
            self._killed.wait_for(
                lambda: (
                    self.kills >= len(self.thresholds)
                    or self.progress() < self.thresholds[self.kills]
                    or self.error is not None
                ),
                30,
            )

    def __enter__(self) -> Crasher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        try:
            for threshold in self.thresholds:
                while self.progress() < threshold:
                    if self._stop.wait(0.01):
                        return
                self.broker.kill()
                with self._killed:
                    self.kills += 1
                    self._killed.notify_all()
                time.sleep(0.3)  # clients see the broker gone, not just a reset
                self.broker.start()
        except BaseException as exc:  # reported by the test
            self.error = exc
            with self._killed:
                self._killed.notify_all()


class OffsetWatcher:
    """Polls a group's committed offsets straight from the broker; records every value seen
    per partition, so a test can check they never moved backwards."""

    def __init__(self, broker: BrokerProcess, group: str, tps: list[TopicPartition]) -> None:
        self.seen: dict[TopicPartition, list[int]] = {tp: [] for tp in tps}
        self._config = {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "default.api.timeout.ms": 1000,
            "request.timeout.ms": 1000,
            "reconnect.backoff.max.ms": 100,
            "enable.auto.commit": False,
        }
        self._tps = tps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OffsetWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with Consumer(self._config) as c:
            while not self._stop.wait(0.05):
                try:
                    committed = c.committed(self._tps)
                except KafkaError:
                    continue  # the broker is down for a moment
                for tp, off in committed.items():
                    if off is not None:
                        self.seen[tp].append(off)

    def assert_monotonic(self) -> None:
        for tp, offs in self.seen.items():
            assert offs == sorted(offs), f"{tp}: committed offset moved backwards: {offs}"


# --- CLI produce and consume -----------------------------------------------------------------


def samsa(*args: str, stdin: bytes | None = None, timeout: float = 90) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "samsa", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.parametrize("seed", [11, 12])
def test_cli_produce_and_consume(steady_broker: BrokerProcess, seed: int) -> None:
    topic = new_topic(steady_broker)
    n = 300
    lines = [(b"k-%d" % (i % 7), b"v-%05d" % i) for i in range(n)]
    with faulty_proxy(steady_broker, seed) as proxy:
        common = ("--bootstrap-server", proxy.address, "--command-timeout-ms", "4000")
        produced = samsa(
            "produce",
            topic,
            *common,
            "--key-separator",
            "\t",
            "-q",
            stdin=b"".join(k + b"\t" + v + b"\n" for k, v in lines),
        )
        assert produced.returncode == 0, produced.stderr.decode()[-2000:]
        consumed = samsa(
            "consume",
            topic,
            *common,
            "--from-beginning",
            "--print-key",
            "--max-messages",
            str(n),
            "--timeout-ms",
            "20000",
        )
        assert consumed.returncode == 0, consumed.stderr.decode()[-2000:]
        assert proxy.stats.faults > 0, proxy.stats
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for k, v in lines:
        expected[partition_for_key(k, PARTITIONS)].append(k + b"\t" + v)
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for line in consumed.stdout.splitlines():
        got[partition_for_key(line.split(b"\t")[0], PARTITIONS)].append(line)
    assert got == expected


# --- assign-mode consumer --------------------------------------------------------------------


@pytest.mark.parametrize("seed", [21, 22])
def test_assign_consumer(broker: BrokerProcess, seed: int) -> None:
    topic = new_topic(broker)
    n = 600
    expected = fill(broker, topic, n)
    got: list[ConsumerRecord] = []
    config = {
        **CLIENT,
        "auto.offset.reset": "earliest",
        "max.poll.records": 20,
        "max.partition.fetch.bytes": 400,  # many small fetches: many requests to hit
    }
    with faulty_proxy(broker, seed) as proxy:
        with Consumer({**config, "bootstrap.servers": proxy.address}) as c:
            c.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
            c.seek_to_beginning()
            with Crasher(broker, lambda: len(got), [n // 3, 2 * n // 3]) as crasher:
                deadline = time.monotonic() + DEADLINE
                while len(got) < n and time.monotonic() < deadline:
                    got += c.poll(0.2)
                    crasher.gate()
            got += c.poll(0.3)  # nothing more may come
        assert crasher.error is None and crasher.kills == 2
        assert proxy.stats.faults > 0, proxy.stats
    assert_exact(by_partition(got), expected)


# --- group consumer, 3 members ---------------------------------------------------------------


@pytest.mark.parametrize("seed", [31, 32])
def test_group_consumer_three_members(broker: BrokerProcess, seed: int) -> None:
    """Members commit what each poll returned before polling again (at-least-once done
    right): across rebalances, lost responses and broker crashes no record is seen twice
    or skipped, and the group's offsets only move forward."""
    topic = new_topic(broker)
    n = 600
    expected = fill(broker, topic, n)
    group = f"g-{uuid.uuid4().hex[:6]}"
    lock = threading.Lock()
    events: list[ConsumerRecord] = []  # in the order the members handed them out
    done = threading.Event()
    errors: list[BaseException] = []

    crasher = Crasher(broker, lambda: len(events), [n // 3, 2 * n // 3])

    def member(index: int, bootstrap: str) -> None:
        config = {
            **CLIENT,
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": f"member-{index}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 300,
            "max.poll.records": 10,
            "max.partition.fetch.bytes": 400,
        }
        try:
            with Consumer(config) as c:
                c.subscribe([topic])
                while not done.is_set():
                    batch = c.poll(0.2)
                    if not batch:
                        continue
                    with lock:
                        events.extend(batch)
                        if len(events) >= n:
                            done.set()
                    offsets: dict[TopicPartition, int] = {}
                    for r in batch:
                        offsets[TopicPartition(r.topic, r.partition)] = r.offset + 1
                    c.commit(offsets)
                    crasher.gate()
        except BaseException as exc:
            errors.append(exc)
            done.set()

    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with faulty_proxy(broker, seed) as proxy, OffsetWatcher(broker, group, tps) as watcher:
        threads = [
            threading.Thread(target=member, args=(i, proxy.address), daemon=True) for i in range(3)
        ]
        with crasher:
            for i, t in enumerate(threads):
                t.start()
                if i < 2:
                    time.sleep(0.3)  # staggered joins: rebalances while consuming
            done.wait(DEADLINE)
            done.set()
            for t in threads:
                t.join(30)
        assert not errors, errors
        assert crasher.error is None and crasher.kills == 2
        assert proxy.stats.faults > 0, proxy.stats
    assert_exact(by_partition(events), expected)
    watcher.assert_monotonic()
    assert any(offs for offs in watcher.seen.values())


# --- transactional copier --------------------------------------------------------------------


@pytest.mark.parametrize("seed", [41, 42])
def test_transactional_copier(broker: BrokerProcess, seed: int) -> None:
    """Consume-transform-produce in transactions: the output holds every input record
    exactly once, in order, whatever was lost or retried (EndTxn answers included)."""
    src = new_topic(broker)
    dst = new_topic(broker)
    n = 300
    expected = fill(broker, src, n)
    group = f"copier-{uuid.uuid4().hex[:6]}"
    copied = [0]
    tps = [TopicPartition(src, p) for p in range(PARTITIONS)]
    with faulty_proxy(broker, seed) as proxy, OffsetWatcher(broker, group, tps) as watcher:
        consumer_config = {
            **CLIENT,
            "bootstrap.servers": proxy.address,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "max.poll.records": 25,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 300,
        }
        producer_config = {
            **PRODUCER,
            "bootstrap.servers": proxy.address,
            "transactional.id": f"tx-{uuid.uuid4().hex[:6]}",
            "linger.ms": 2,
            "transaction.timeout.ms": 30_000,
            "max.block.ms": 30_000,
        }
        with (
            Consumer(consumer_config) as consumer,
            Producer(producer_config) as producer,
            Crasher(broker, lambda: copied[0], [n // 3, 2 * n // 3]) as crasher,
        ):
            producer.init_transactions()
            consumer.subscribe([src])
            deadline = time.monotonic() + DEADLINE
            aborts = 0
            while copied[0] < n and time.monotonic() < deadline:
                records = consumer.poll(0.2)
                if not records:
                    continue
                producer.begin_transaction()
                for r in records:
                    producer.produce(dst, (r.value or b"").upper(), r.key, partition=r.partition)
                positions = {
                    tp: consumer.position(tp) for tp in {(r.topic, r.partition) for r in records}
                }
                try:
                    producer.send_offsets_to_transaction(positions, consumer.group_metadata())
                    while True:
                        try:
                            producer.commit_transaction(20)
                            break
                        except KafkaTimeoutError:
                            continue  # still running: calling again waits for the same commit
                    copied[0] += len(records)
                    crasher.gate()
                except AbortableTransactionError:
                    producer.abort_transaction(20)
                    aborts += 1
                    committed = consumer.committed(list(positions))
                    for tp, off in committed.items():
                        consumer.seek(tp, off if off is not None else 0)
        assert crasher.error is None and crasher.kills == 2
        assert proxy.stats.faults > 0, proxy.stats
    assert copied[0] == n, f"copied {copied[0]} of {n} ({aborts} aborts)"
    out = read_all(broker, dst, n)
    assert_exact(by_partition(out), {p: [v.upper() for v in vs] for p, vs in expected.items()})
    watcher.assert_monotonic()
    with Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group}) as c:
        assert c.committed(tps) == {TopicPartition(src, p): len(vs) for p, vs in expected.items()}


def read_all(
    broker: BrokerProcess, topic: str, n: int, partitions: int = PARTITIONS
) -> list[ConsumerRecord]:
    """Every committed record of ``topic``, directly from the broker."""
    config = {
        "bootstrap.servers": broker.bootstrap,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    }
    got: list[ConsumerRecord] = []
    with Consumer(config) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += c.poll(0.2)
        got += c.poll(0.3)
    return got


# --- lost EndTxn answers ---------------------------------------------------------------------


def test_lost_end_txn_answers_keep_each_outcome(steady_broker: BrokerProcess) -> None:
    """Half of the EndTxn answers are lost: the resent EndTxn gets the same outcome, so
    committed transactions are visible and aborted ones never are."""
    topic = new_topic(steady_broker, 1)
    faults = Faults(drop_response_rate=0.5, apis=frozenset({ApiKey.END_TXN}))
    with FaultProxy(("127.0.0.1", steady_broker.port), faults=faults, seed=5) as proxy:
        proxy.start()
        config = {
            **PRODUCER,
            "bootstrap.servers": proxy.address,
            "transactional.id": f"end-{uuid.uuid4().hex[:6]}",
            "linger.ms": 0,
        }
        with Producer(config) as p:
            p.init_transactions()
            for i in range(12):
                p.begin_transaction()
                p.produce(topic, b"t%d" % i, partition=0)
                if i % 3 == 2:
                    p.abort_transaction()
                else:
                    p.commit_transaction()
        assert proxy.stats.dropped_responses >= 3, proxy.stats
    got = [r.value for r in read_all(steady_broker, topic, 8, 1)]
    assert got == [b"t%d" % i for i in range(12) if i % 3 != 2]


# --- admin -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [51, 52, 53])
def test_admin_calls(steady_broker: BrokerProcess, seed: int) -> None:
    names = [f"adm-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
    with faulty_proxy(steady_broker, seed) as proxy:
        with Admin({**CLIENT, "bootstrap.servers": proxy.address}) as admin:
            created = admin.create_topics([NewTopic(n, i + 1) for i, n in enumerate(names)])
            for err in created.values():
                # only a retry after a lost answer may find the topic already there
                assert err is None or (
                    err.code == ErrorCode.TOPIC_ALREADY_EXISTS and "lost" in str(err)
                ), err
            for _ in range(3):
                described = {t.name: len(t.partitions) for t in admin.describe_topics(names)}
                assert described == {n: i + 1 for i, n in enumerate(names)}
                assert set(names) <= set(admin.list_topics())
                cluster = admin.describe_cluster()
                assert [b["node_id"] for b in cluster["brokers"]] == [0]
                producers = admin.describe_producers([(names[0], 0)])
                assert producers == {TopicPartition(names[0], 0): []}
                admin.list_groups()
                (desc,) = admin.describe_groups(["no-such-group"])
                assert desc.state == "Dead" and not desc.members
                admin.list_transactions()
                (txn,) = admin.describe_transactions(["no-such-txn"]).values()
                assert txn.error == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
            deleted = admin.delete_topics(names[:2])
            for err in deleted.values():
                assert err is None or (
                    err.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and "lost" in str(err)
                ), err
            remaining = set(admin.list_topics())
            assert not set(names[:2]) & remaining and set(names[2:]) <= remaining
        assert proxy.stats.faults > 0, proxy.stats


def test_lost_create_and_delete_answers_are_reported_as_such(
    steady_broker: BrokerProcess,
) -> None:
    """CreateTopics / DeleteTopics are not idempotent: when the answer was lost the resent
    request finds the work done, and the error says it may have been this client's."""
    faults = Faults(
        drop_response_rate=0.5, apis=frozenset({ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS})
    )
    names = [f"lost-{uuid.uuid4().hex[:6]}-{i}" for i in range(6)]
    with FaultProxy(("127.0.0.1", steady_broker.port), faults=faults, seed=3) as proxy:
        proxy.start()
        with Admin({**CLIENT, "bootstrap.servers": proxy.address}) as admin:
            created = {n: admin.create_topics([NewTopic(n, 1)])[n] for n in names}
            assert set(names) <= set(admin.list_topics())
            deleted = {n: admin.delete_topics([n])[n] for n in names}
            assert not set(names) & set(admin.list_topics())
        assert proxy.stats.dropped_responses > 0, proxy.stats
    for results, code in [
        (created, ErrorCode.TOPIC_ALREADY_EXISTS),
        (deleted, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]:
        errors = [e for e in results.values() if e is not None]
        assert errors, results  # the seed loses some answers of each
        for e in errors:
            assert e.code == code and "answer was lost" in str(e), e


# --- a corrupt batch on disk -----------------------------------------------------------------


@pytest.mark.parametrize(("damage", "start"), [("record", 0), ("magic", 0), ("magic", 4)])
def test_corrupt_batch_is_reported_after_the_good_records(
    broker_factory: type[BrokerProcess], tmp_path: Path, damage: str, start: int
) -> None:
    """A batch damaged at rest in a closed segment (a clean start only re-checks the active
    one). A flipped record byte fails the client's CRC check, a flipped magic byte the
    client's format check; a fetch starting at the damaged batch fails the broker's read
    (CORRUPT_MESSAGE for the partition). Each time the consumer hands out the records
    before the batch, then raises CorruptRecordError at its offset on every poll until a
    seek; never a silent stall."""
    b = broker_factory(tmp_path / "crc", {"log.segment.bytes": str(1 << 20)}).start()
    topic = new_topic(b, 1)
    # a long linger: each flush() sends its records as one batch
    with Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 10_000}) as p:
        for i in range(2):  # offsets 0-3 and 4-7
            for j in range(4):
                p.produce(topic, b"value-%d-%d" % (i, j), partition=0)
            assert p.flush(10) == 0
        for j in range(12):  # offsets 8-19, 100 kB each: the segment rolls
            p.produce(topic, b"filler-%02d-" % j + bytes(100_000), partition=0)
            assert p.flush(10) == 0
    b.stop()
    first, second = sorted((tmp_path / "crc" / f"{topic}-0").glob("*.log"))
    assert second.name == f"{18:020d}.log"
    data = bytearray(first.read_bytes())
    batches = list(iter_batches(bytes(data)))
    assert [x.base_offset for x in batches[:3]] == [0, 4, 8]
    if damage == "record":
        data[batches[0].size + batches[1].size - 1] ^= 0x01  # batch 2's last value byte
    else:
        data[batches[0].size + 16] ^= 0x7F  # batch 2's magic byte (not under the CRC)
    first.write_bytes(bytes(data))
    b.start()
    tp = TopicPartition(topic, 0)
    with Consumer({"bootstrap.servers": b.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([tp])
        c.seek(tp, start)
        got: list[ConsumerRecord] = []
        deadline = time.monotonic() + 10
        with pytest.raises(CorruptRecordError) as info:
            while time.monotonic() < deadline:
                got += c.poll(0.2)
        err = info.value
        assert (err.topic, err.partition) == (topic, 0) and f"{topic}-0" in str(err)
        assert err.offset == 4
        assert ("CRC" if damage == "record" else "magic" if start == 0 else "broker") in str(err)
        assert [r.offset for r in got] == list(range(start, 4))
        assert c.position(tp) == 4
        with pytest.raises(CorruptRecordError):  # again, until the application seeks
            c.poll(0.2)
        # Past the damage (into the next segment: the broker's own walk from an index
        # entry before a damaged header would meet it again).
        c.seek(tp, 18)
        rest: list[ConsumerRecord] = []
        while len(rest) < 2 and time.monotonic() < deadline:
            rest += c.poll(0.2)
        assert [r.offset for r in rest] == [18, 19]
        assert (rest[0].value or b"").startswith(b"filler-10-")
