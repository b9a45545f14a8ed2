"""Crash the broker (SIGKILL) under idempotent producers; nothing acknowledged is lost or doubled.

Two producers write while the broker is killed and restarted on the same port and data dir:

* confluent-kafka with ``enable.idempotence`` and a long ``message.timeout.ms``: librdkafka
  retries through the outages with the same sequences;
* a raw-protocol producer (``samsa.testing``) that resends each batch, byte for byte, after
  any connection error until it gets an answer.

Afterwards every acknowledged record is in the log exactly once, in production order, at the
offset its acknowledgement reported; and after one more restart the broker still recognises the
raw producer's last 5 batches as duplicates (rules 6 and 13 of docs/semantics.md): original
offsets, nothing written.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import NewRecord, build_batch, decode_records, iter_batches
from samsa.testing import create_topic, fetch_request, init_producer_id, produce_one

RAW_TOPIC = "crash-raw"
CK_TOPIC = "crash-ck"
CK_PARTITIONS = 2
RESEND_DEADLINE = 45.0


def _connect(port: int) -> BlockingConnection:
    return BlockingConnection("127.0.0.1", port, timeout=5.0)


def _read_partition(port: int, topic: str, partition: int) -> tuple[int, list]:  # type: ignore[type-arg]
    """(high watermark, batch views) of a whole partition by raw Fetch."""
    batches = []
    offset = 0
    with _connect(port) as conn:
        while True:
            resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, partition): offset}))
            part = resp.responses[0].partitions[0]
            assert part.error_code == ErrorCode.NONE, part.error_code
            hw = int(part.high_watermark)
            new = list(iter_batches(part.records or b""))
            batches.extend(new)
            if new:
                offset = new[-1].next_offset
            if offset >= hw:
                return hw, batches
            assert new, f"fetch at {offset} below high watermark {hw} returned nothing"


def _values_by_offset(batches: list) -> dict[int, bytes]:  # type: ignore[type-arg]
    out: dict[int, bytes] = {}
    for b in batches:
        for r in decode_records(b):
            assert r.offset not in out, f"offset {r.offset} appears twice in the log"
            assert r.value is not None
            out[r.offset] = r.value
    return out


@dataclass
class RawAck:
    sequence: int
    batch: bytes
    values: list[bytes]
    base_offset: int


@dataclass
class RawProducer:
    """One idempotent producer on one partition, speaking raw protocol, never giving up."""

    port: int
    topic: str
    partition: int = 0
    pid: int = -1
    epoch: int = 0
    acked: list[RawAck] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reconnects: int = 0
    _conn: BlockingConnection | None = None

    def _call(self, fn):  # type: ignore[no-untyped-def]
        """Run ``fn(conn)``; on a connection error reconnect and run it again, same bytes."""
        deadline = time.monotonic() + RESEND_DEADLINE
        while True:
            try:
                if self._conn is None:
                    self._conn = _connect(self.port)
                return fn(self._conn)
            except (OSError, ConnectionClosed):
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                self.reconnects += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def init(self) -> None:
        code, self.pid, self.epoch = self._call(init_producer_id)
        assert code == 0 and self.pid >= 0

    @property
    def next_sequence(self) -> int:
        if not self.acked:
            return 0
        last = self.acked[-1]
        return last.sequence + len(last.values)

    def send_next(self, index: int) -> bool:
        count = 1 + index % 4
        values = [b"raw-%d-%d" % (index, j) for j in range(count)]
        seq = self.next_sequence
        # Current timestamps: producer expiry is measured from them (rule 12), and a producer
        # whose last batch looks older than producer.id.expiration.ms is dropped on load.
        now_ms = time.time_ns() // 1_000_000
        batch = build_batch(
            [NewRecord(value=v, timestamp=now_ms) for v in values],
            producer_id=self.pid,
            producer_epoch=self.epoch,
            base_sequence=seq,
        )
        code, base = self._call(lambda conn: produce_one(conn, self.topic, self.partition, batch))
        if code != ErrorCode.NONE:
            self.errors.append(f"batch {index} seq {seq}: error {code}")
            return False
        self.acked.append(RawAck(seq, batch, values, base))
        return True

    def run_until(self, stop: threading.Event) -> None:
        try:
            index = 0
            while not stop.is_set():
                if not self.send_next(index):
                    return
                index += 1
                time.sleep(0.002)
        except Exception as exc:  # reported by the test
            self.errors.append(repr(exc))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass
class CkRun:
    values: list[bytes] = field(default_factory=list)
    acks: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (partition, offset)
    errors: list[str] = field(default_factory=list)


def _confluent_producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "message.timeout.ms": 300_000,
            "linger.ms": 2,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 300,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 300,
            "socket.timeout.ms": 10_000,
            # connection-refused noise goes to pytest's log capture, not to stderr
            "logger": logging.getLogger("test_crash.librdkafka"),
        }
    )


def _run_confluent(producer: Producer, stop: threading.Event, out: CkRun) -> None:
    def report(i: int):  # type: ignore[no-untyped-def]
        def on_delivery(err, msg) -> None:  # type: ignore[no-untyped-def]
            if err is not None:
                out.errors.append(f"record {i}: {err}")
            else:
                out.acks[i] = (msg.partition(), msg.offset())

        return on_delivery

    try:
        i = 0
        while not stop.is_set():
            for _ in range(20):
                value = b"ck-%d" % i
                out.values.append(value)
                producer.produce(
                    CK_TOPIC, value=value, partition=i % CK_PARTITIONS, on_delivery=report(i)
                )
                i += 1
            producer.poll(0.01)
    except Exception as exc:
        out.errors.append(repr(exc))


def _check_raw(port: int, raw: RawProducer) -> None:
    """Every acknowledged batch is at its acknowledged offset, once, in order; nothing else."""
    assert raw.errors == []
    assert raw.acked, "the raw producer got no acknowledgement"
    hw, batches = _read_partition(port, RAW_TOPIC, 0)
    log = _values_by_offset(batches)
    expected: dict[int, bytes] = {}
    previous_end = 0
    for ack in raw.acked:
        assert ack.base_offset == previous_end, "acks must be dense and in production order"
        for j, v in enumerate(ack.values):
            expected[ack.base_offset + j] = v
        previous_end = ack.base_offset + len(ack.values)
    # The raw producer retries every batch until it is acknowledged, so the log holds exactly
    # the acknowledged batches.
    assert hw == previous_end
    assert log == expected
    # and the batch headers are the ones that were sent
    assert [(b.base_offset, b.producer_id, b.base_sequence) for b in batches] == [
        (a.base_offset, raw.pid, a.sequence) for a in raw.acked
    ]


def _check_confluent(port: int, run: CkRun) -> None:
    assert run.errors == []
    assert len(run.acks) == len(run.values), "not every record was delivered"
    logs = {}
    for p in range(CK_PARTITIONS):
        _, batches = _read_partition(port, CK_TOPIC, p)
        logs[p] = _values_by_offset(batches)
    counts = Counter(v for log in logs.values() for v in log.values())
    doubled = [v for v, n in counts.items() if n > 1]
    assert doubled == [], f"records written more than once: {doubled[:10]}"
    last: dict[int, int] = {}
    for i, value in enumerate(run.values):
        partition, offset = run.acks[i]
        assert partition == i % CK_PARTITIONS
        assert logs[partition].get(offset) == value, f"record {i} not at its acked offset"
        assert offset > last.get(partition, -1), "acked offsets out of production order"
        last[partition] = offset
    assert sum(len(log) for log in logs.values()) == len(run.values)


def _check_dedup_window(port: int, raw: RawProducer) -> None:
    """Resending the last 5 acknowledged batches: success, original offsets, nothing written."""
    hw_before, _ = _read_partition(port, RAW_TOPIC, 0)
    with _connect(port) as conn:
        for ack in raw.acked[-5:]:
            assert produce_one(conn, RAW_TOPIC, 0, ack.batch) == (ErrorCode.NONE, ack.base_offset)
    hw_after, _ = _read_partition(port, RAW_TOPIC, 0)
    assert hw_after == hw_before
    _check_raw(port, raw)


def _check_state_continues(port: int, raw: RawProducer) -> None:
    """An older duplicate is out of order (45); the next sequence is appended at the end."""
    hw, _ = _read_partition(port, RAW_TOPIC, 0)
    if len(raw.acked) > 5:
        with _connect(port) as conn:
            code, _ = produce_one(conn, RAW_TOPIC, 0, raw.acked[-6].batch)
        assert code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert raw.send_next(10_000_000)
    assert raw.acked[-1].base_offset == hw
    _check_raw(port, raw)


@pytest.mark.timeout(60)
def test_sigkill_loses_and_doubles_nothing_acknowledged(broker_factory) -> None:  # type: ignore[no-untyped-def]
    # (SIGKILL keeps the page cache: flush settings make no difference here; losing what was
    # not fsynced is test_power_loss_keeps_what_flush_messages_1_acknowledged's.)
    broker = broker_factory().start()
    with _connect(broker.port) as conn:
        assert create_topic(conn, RAW_TOPIC, 1) == 0
        assert create_topic(conn, CK_TOPIC, CK_PARTITIONS) == 0

    raw = RawProducer(broker.port, RAW_TOPIC)
    raw.init()
    producer = _confluent_producer(broker.bootstrap)
    ck = CkRun()
    stop = threading.Event()
    threads = [
        threading.Thread(target=raw.run_until, args=(stop,), daemon=True),
        threading.Thread(target=_run_confluent, args=(producer, stop, ck), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        for _ in range(3):
            broker.kill()
            time.sleep(0.2)
            broker.start()
            time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(RESEND_DEADLINE + 5)
    assert not any(t.is_alive() for t in threads)
    assert producer.flush(45) == 0, "confluent-kafka could not deliver everything"
    raw.close()

    assert raw.reconnects >= 3, "the kills did not interrupt the raw producer"
    assert len(raw.acked) > 20 and len(ck.acks) > 100
    _check_raw(broker.port, raw)
    _check_confluent(broker.port, ck)

    # One more crash with nothing in flight: the producer state must be rebuilt from disk.
    broker.kill()
    broker.start()
    _check_raw(broker.port, raw)
    _check_confluent(broker.port, ck)
    _check_dedup_window(broker.port, raw)
    _check_state_continues(broker.port, raw)
    raw.close()


@pytest.mark.timeout(60)
def test_clean_shutdown_snapshot_keeps_dedup_window(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory().start()
    with _connect(broker.port) as conn:
        assert create_topic(conn, RAW_TOPIC, 1) == 0
    raw = RawProducer(broker.port, RAW_TOPIC)
    raw.init()
    for i in range(20):
        assert raw.send_next(i)
    raw.close()

    assert broker.stop() == 0
    snapshots = sorted((broker.data_dir / f"{RAW_TOPIC}-0").glob("*.snapshot"))
    assert snapshots, "no producer-state snapshot written on clean shutdown"
    end = raw.acked[-1].base_offset + len(raw.acked[-1].values)
    assert int(snapshots[-1].stem) == end, "the newest snapshot must cover the whole log"

    broker.start()
    _check_raw(broker.port, raw)
    _check_dedup_window(broker.port, raw)
    _check_state_continues(broker.port, raw)
    raw.close()

    # A crash now: the state is the snapshot plus the log written after it.
    broker.kill()
    broker.start()
    _check_dedup_window(broker.port, raw)
    raw.close()


# A power loss keeps only what was fsynced. The broker runs under this shim, which notes each
# regular file's size just before each fsync/fdatasync of it (all of it is then on disk) in a
# journal; after SIGKILL the test cuts every segment file back to its last noted size (nothing,
# if never synced), as the disk would hold it.
SYNC_JOURNAL_SHIM = """
import os, stat, sys
journal = open(sys.argv.pop(1), "a", buffering=1)

def noting(sync):
    def synced(fd):
        n = fd if isinstance(fd, int) else fd.fileno()
        st = os.fstat(n)
        if stat.S_ISREG(st.st_mode):
            journal.write(f"{st.st_size} {os.readlink(f'/proc/self/fd/{n}')}\\n")
        sync(fd)
    return synced

os.fsync, os.fdatasync = noting(os.fsync), noting(os.fdatasync)
from samsa.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _lose_what_was_not_fsynced(data_dir: Path, journal: Path) -> int:
    """Cut each segment file to its last fsynced size; the bytes lost."""
    synced: dict[str, int] = {}
    for line in journal.read_text().splitlines():
        size, path = line.split(" ", 1)
        synced[path] = int(size)
    lost = 0
    for segment in data_dir.glob("*/*.log"):
        keep = synced.get(str(segment), 0)
        lost += max(0, segment.stat().st_size - keep)
        os.truncate(segment, min(keep, segment.stat().st_size))
    return lost


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flush_messages", [None, 1], ids=["flush-default", "flush-every-message"])
def test_power_loss_keeps_what_flush_messages_1_acknowledged(
    tmp_path: Path, flush_messages: int | None
) -> None:
    """With log.flush.interval.messages=1 every acknowledged batch was fsynced before its
    acknowledgement, so losing everything not fsynced loses none of them; with the default
    (no flush until a segment rolls or the broker stops) acknowledged records are lost."""
    overrides = {} if flush_messages is None else {"log.flush.interval.messages": "1"}
    journal = tmp_path / "fsyncs"
    broker = BrokerProcess(tmp_path / "data", overrides)
    broker.launcher = ["-c", SYNC_JOURNAL_SHIM, str(journal)]
    broker.start()
    try:
        with _connect(broker.port) as conn:
            assert create_topic(conn, RAW_TOPIC, 1) == 0
            pid = init_producer_id(conn)[1]
            acked = []
            for seq in range(20):
                batch = build_batch(
                    [NewRecord(b"v%d" % seq, timestamp=int(time.time() * 1000))],
                    producer_id=pid,
                    producer_epoch=0,
                    base_sequence=seq,
                )
                assert produce_one(conn, RAW_TOPIC, 0, batch) == (0, seq)
                acked.append(b"v%d" % seq)
        broker.kill()
        lost = _lose_what_was_not_fsynced(tmp_path / "data", journal)
        broker.start()
        hw, batches = _read_partition(broker.port, RAW_TOPIC, 0)
        kept = [v for _o, v in sorted(_values_by_offset(batches).items())]
    finally:
        broker.kill()
    if flush_messages == 1:
        assert (hw, kept, lost) == (20, acked, 0)
    else:
        assert lost > 0 and len(kept) < len(acked) and kept == acked[: len(kept)], (hw, lost)
