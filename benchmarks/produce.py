"""Produce and fetch throughput of samsa against Tansu (Rust), same workloads, one run.

Workloads (see benchmarks/README.md for more):

(a) raw idempotent load generator. InitProducerId, then every Produce request (v9,
    acks=-1) is encoded *before* the clock starts. Each request carries one batch for each
    of the topic's 3 partitions (3 batches per request), with consecutive sequences per
    partition; records have 100-byte values, no key, no compression. Up to 5 requests are
    in flight on one connection; every partition's error code is checked. Variants: 4
    connections (4 processes, each its own producer id), and samsa with
    ``log.flush.interval.messages=1`` (fsync before each ack, fsyncs grouped).
(b) confluent-kafka idempotent producer (acks=all, linger.ms=5): produce + flush.
(c) fetch throughput: read the topic written by (a) with 100-record batches back with raw
    Fetch requests, then with a confluent-kafka consumer in assign mode.

records/s counts records acknowledged (or read) per second of wall time; MB/s counts the
record values (100 B each), not protocol overhead.

    python benchmarks/produce.py                 # everything, both brokers (< ~3 min)
    python benchmarks/produce.py --quick         # small counts, smoke run (< 30 s)
    python benchmarks/produce.py --only samsa    # one broker
    python benchmarks/produce.py --profile       # (a)/100 against a profiled samsa broker
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import crc32c
from _brokers import (
    HOST,
    BrokerProcess,
    PySpy,
    SamsaBroker,
    TansuBroker,
    find_py_spy,
)

from samsa.client._config import CODECS
from samsa.client._connection import BlockingConnection
from samsa.protocol.framing import read_uvarint, skip_tagged_fields, split_response
from samsa.protocol.messages import ApiKey, decode_response
from samsa.protocol.records import Compression, NewRecord, build_batch, iter_batches
from samsa.testing import (
    create_topic,
    fetch_request,
    init_producer_id,
    produce_request,
)

PRODUCE_V = 9
FETCH_V = 12
PARTITIONS = 3
VALUE_SIZE = 100
PIPELINE = 5
ERROR_NAMES = {
    46: "DUPLICATE_SEQUENCE_NUMBER",
    45: "OUT_OF_ORDER_SEQUENCE_NUMBER",
    47: "INVALID_PRODUCER_EPOCH",
    59: "UNKNOWN_PRODUCER_ID",
    7: "REQUEST_TIMED_OUT",
    3: "UNKNOWN_TOPIC_OR_PARTITION",
    2: "CORRUPT_MESSAGE",
}


@dataclass
class Scale:
    batches_1: int  # (a) 1 record per batch: batches in all (3 per request)
    records_100: int  # (a) 100 records per batch: records in all
    records_1000: int
    records_conc: int  # (a) 4 connections, 100-record batches: records per connection
    records_fsync: int  # samsa fsync-per-ack rows
    records_confluent: int  # (b)
    max_seconds: float  # each (a) run stops sending new requests after this
    connections: int = 4


FULL = Scale(45_000, 3_006_000, 3_006_000, 250_200, 1_000_800, 600_000, 20.0)
QUICK = Scale(3_000, 60_000, 60_000, 15_000, 30_000, 20_000, 3.0)
REPEATS = 3  # most rows: the median of 3 runs (each of a third of the records)


@dataclass
class Result:
    records: int = 0
    seconds: float = 0.0
    errors: Counter[int] = field(default_factory=Counter)
    note: str = ""
    client_cpu: float = 0.0  # CPU seconds the load generator itself used
    total_records: int = 0  # over all repeats, when the result is a median of several
    broker_cpu: float = 0.0  # CPU seconds the broker process used during the run

    @property
    def broker_load(self) -> float:
        return self.broker_cpu / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_load(self) -> float:
        """Load-generator CPU per wall second (1.0 = one core busy)."""
        return self.client_cpu / self.seconds if self.seconds > 0 else 0.0

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_s(self) -> float:
        return self.rate * VALUE_SIZE / 1e6

    def merge(self, other: Result) -> None:
        self.records += other.records
        self.client_cpu += other.client_cpu
        self.errors.update(other.errors)
        if other.note and other.note not in self.note:
            self.note = f"{self.note}; {other.note}" if self.note else other.note


# --- (a) the raw load generator ---------------------------------------------------------


def batch_template(
    records: int, producer_id: int, epoch: int, compression: int = Compression.NONE
) -> bytearray:
    """One idempotent v2 batch of ``records`` 100-byte values in ``compression``'s codec; its
    sequence is patched."""
    ts = time.time_ns() // 1_000_000
    values = [(b"%08d" % i).ljust(VALUE_SIZE, b"v") for i in range(records)]
    return bytearray(
        build_batch(
            [NewRecord(value=v, timestamp=ts) for v in values],
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=0,
            compression=compression,
        )
    )


_SEQ = struct.Struct(">i")
_CRC = struct.Struct(">I")


def with_sequence(template: bytearray, base_sequence: int) -> bytes:
    """The template with another base sequence and its CRC-32C recomputed (header + 53)."""
    _SEQ.pack_into(template, 53, base_sequence)
    _CRC.pack_into(template, 17, crc32c.crc32c(memoryview(template)[21:]))
    return bytes(template)


def build_frames(
    conn: BlockingConnection,
    topic: str,
    producer_id: int,
    epoch: int,
    per_batch: int,
    n_requests: int,
    compression: int = Compression.NONE,
) -> list[bytes]:
    """Encoded Produce frames, correlation ids 1..n, one batch per partition in each."""
    template = batch_template(per_batch, producer_id, epoch, compression)
    frames = []
    for i in range(n_requests):
        batch = with_sequence(template, i * per_batch)
        req = produce_request({(topic, p): batch for p in range(PARTITIONS)}, acks=-1)
        frames.append(conn.encode(ApiKey.PRODUCE, PRODUCE_V, req, i + 1))
    return frames


_PART = struct.Struct(">ihqqq")  # index, error, base offset, log append time, log start


def produce_errors(frame: bytes) -> tuple[int, list[int]]:
    """Correlation id and each partition's error code of a ProduceResponse v9 frame.

    Parsed by hand (a few struct calls) so the load generator stays cheap next to the
    broker; :func:`check_parser` compares it with kio on real responses.
    """
    cid, pos = split_response(frame, True)
    codes: list[int] = []
    n_topics, pos = read_uvarint(frame, pos)
    for _ in range(n_topics - 1):
        name_len, pos = read_uvarint(frame, pos)
        pos += name_len - 1
        n_parts, pos = read_uvarint(frame, pos)
        for _ in range(n_parts - 1):
            _index, error, _base, _append, _start = _PART.unpack_from(frame, pos)
            pos += _PART.size
            codes.append(error)
            n_rec_errors, pos = read_uvarint(frame, pos)
            for _ in range(n_rec_errors - 1):
                pos += 4  # batch index
                msg_len, pos = read_uvarint(frame, pos)
                pos += max(msg_len - 1, 0)
                pos = skip_tagged_fields(frame, pos)
            msg_len, pos = read_uvarint(frame, pos)
            pos += max(msg_len - 1, 0)
            pos = skip_tagged_fields(frame, pos)
        pos = skip_tagged_fields(frame, pos)
    return cid, codes


def check_parser(frame: bytes) -> None:
    _cid, codes = produce_errors(frame)
    _, body = split_response(frame, True)
    resp = decode_response(ApiKey.PRODUCE, PRODUCE_V, frame, body)
    kio_codes = [int(p.error_code) for t in resp.responses for p in t.partition_responses]
    if codes != kio_codes:
        raise AssertionError(f"produce response parser disagrees with kio: {codes} {kio_codes}")


def pipelined_produce(
    conn: BlockingConnection,
    frames: list[bytes],
    records_per_batch: int,
    max_seconds: float,
    depth: int = PIPELINE,
) -> Result:
    """Send prebuilt frames with up to ``depth`` in flight; stop sending at the deadline."""
    sock = conn.sock
    result = Result()
    inflight: deque[int] = deque()
    n = len(frames)
    sent = 0
    acked_ok = 0
    start = time.perf_counter()
    deadline = start + max_seconds
    stopped_early = False
    cpu0 = time.process_time()
    while True:
        room = depth - len(inflight)
        if room > 0 and sent < n:
            if time.perf_counter() > deadline:
                stopped_early = True
                n = sent
            else:
                k = min(room, n - sent)
                sock.sendall(b"".join(frames[sent : sent + k]) if k > 1 else frames[sent])
                inflight.extend(range(sent + 1, sent + k + 1))
                sent += k
        if not inflight:
            break
        frame = conn.receive_frame()
        expected = inflight.popleft()
        if expected == 1:
            check_parser(frame)
        cid, codes = produce_errors(frame)
        if cid != expected:
            raise RuntimeError(f"response for correlation id {cid}, expected {expected}")
        bad = [c for c in codes if c != 0]
        if bad:
            result.errors.update(bad)
        acked_ok += records_per_batch * (len(codes) - len(bad))
    result.seconds = time.perf_counter() - start
    result.client_cpu = time.process_time() - cpu0
    result.records = acked_ok
    if stopped_early:
        result.note = f"time cap {max_seconds:.0f}s hit after {sent}/{len(frames)} requests"
    return result


def new_producer(port: int) -> tuple[BlockingConnection, int, int]:
    conn = BlockingConnection(HOST, port, client_id="samsa-bench")
    code, pid, epoch = init_producer_id(conn)
    if code != 0:
        conn.close()
        raise RuntimeError(f"InitProducerId failed with error {code}")
    return conn, pid, epoch


def ensure_topic(port: int, topic: str) -> None:
    with BlockingConnection(HOST, port) as conn:
        code = create_topic(conn, topic, PARTITIONS)
    if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
        raise RuntimeError(f"CreateTopics {topic} failed with error {code}")


def raw_produce(
    port: int,
    topic: str,
    per_batch: int,
    records: int,
    max_seconds: float,
    compression: int = Compression.NONE,
) -> Result:
    n_requests = max(1, records // (per_batch * PARTITIONS))
    conn, pid, epoch = new_producer(port)
    try:
        frames = build_frames(conn, topic, pid, epoch, per_batch, n_requests, compression)
        return pipelined_produce(conn, frames, per_batch, max_seconds)
    finally:
        conn.close()


def _worker(
    port: int,
    topic: str,
    per_batch: int,
    records: int,
    max_seconds: float,
    ready: Any,
    go: Any,
    out: Any,
) -> None:
    """One load-generator process of the concurrent variant."""
    try:
        n_requests = max(1, records // (per_batch * PARTITIONS))
        conn, pid, epoch = new_producer(port)
        try:
            frames = build_frames(conn, topic, pid, epoch, per_batch, n_requests)
            ready.wait()
            go.wait()
            start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
            r = pipelined_produce(conn, frames, per_batch, max_seconds)
            out.put(
                (start, start + r.seconds, r.records, dict(r.errors), r.note, r.client_cpu, None)
            )
        finally:
            conn.close()
    except BaseException as exc:  # reported to the parent, which raises it
        out.put((0.0, 0.0, 0, {}, "", 0.0, repr(exc)))
        try:
            ready.wait(1)
        except Exception:
            pass


def concurrent_produce(
    port: int,
    topic: str,
    per_batch: int,
    records_each: int,
    connections: int,
    max_seconds: float,
) -> Result:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(connections + 1)
    go = ctx.Event()
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(port, topic, per_batch, records_each, max_seconds, ready, go, out),
            daemon=True,
        )
        for _ in range(connections)
    ]
    try:
        for p in procs:
            p.start()
        try:
            ready.wait(120)
        except threading.BrokenBarrierError:
            failures = []
            while not out.empty():
                failures.append(out.get_nowait()[6])
            raise RuntimeError(f"load generators did not start: {failures}") from None
        go.set()
        rows = [out.get(timeout=max_seconds + 120) for _ in procs]
    finally:
        ready.abort()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
                p.join(5)
    failures = [r[6] for r in rows if r[6]]
    if failures:
        raise RuntimeError("load generator failed: " + "; ".join(failures))
    result = Result()
    for _start, _end, recs, errs, note, cpu, _ in rows:
        result.merge(Result(recs, 0.0, Counter(errs), note, cpu))
    result.seconds = max(r[1] for r in rows) - min(r[0] for r in rows)
    return result


# --- (b) confluent-kafka producer ---------------------------------------------------------


def confluent_produce(port: int, topic: str, records: int, max_seconds: float) -> Result:
    from confluent_kafka import KafkaException, Producer

    errors: Counter[int] = Counter()
    delivered = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1
        else:
            errors[int(err.code())] += 1

    producer = Producer(
        {
            "bootstrap.servers": f"{HOST}:{port}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "none",
            "message.timeout.ms": int(max_seconds * 1000) + 30_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    value = b"v" * VALUE_SIZE
    # Warm up: metadata and the producer id, outside the clock.
    producer.produce(topic, value, partition=0, on_delivery=on_delivery)
    if producer.flush(30) != 0:
        raise RuntimeError("confluent-kafka producer could not deliver its first record")
    delivered = 0
    errors.clear()
    start = time.perf_counter()
    cpu0 = time.process_time()
    deadline = start + max_seconds
    note = ""
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
            if time.perf_counter() > deadline:
                note = f"time cap hit after {i} records"
                break
    left = producer.flush(max(1.0, deadline + 30 - time.perf_counter()))
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    if left:
        note = f"{left} records undelivered at the end"
    try:
        producer.purge()
    except KafkaException:
        pass
    return Result(delivered, seconds, errors, note, cpu)


# --- (c) fetch --------------------------------------------------------------------------


def high_watermarks(port: int, topic: str) -> dict[int, int]:
    """Each partition's end offset (a Fetch that asks for as little data as it can)."""
    req = fetch_request(
        {(topic, p): 0 for p in range(PARTITIONS)},
        max_wait_ms=100,
        max_bytes=1,
        partition_max_bytes=1,
    )
    with BlockingConnection(HOST, port, client_id="samsa-bench") as conn:
        resp = conn.request(ApiKey.FETCH, FETCH_V, req)
    ends = {
        int(part.partition_index): int(part.high_watermark)
        for t in resp.responses
        for part in t.partitions
        if int(part.error_code) == 0
    }
    if sorted(ends) != list(range(PARTITIONS)):
        raise RuntimeError(f"{topic}: no end offset for every partition ({ends})")
    return ends


def raw_fetch(port: int, topic: str, ends: dict[int, int], max_seconds: float) -> Result:
    """Read offsets [0, ends[p]) of every partition with sequential Fetch v12 requests (all
    partitions in each); records past ``ends`` are not counted."""
    offsets = dict.fromkeys(range(PARTITIONS), 0)
    expected = sum(ends.values())
    records = 0
    requests = 0
    errors: Counter[int] = Counter()
    with BlockingConnection(HOST, port, client_id="samsa-bench") as conn:
        start = time.perf_counter()
        cpu0 = time.process_time()
        deadline = start + max_seconds
        while records < expected and time.perf_counter() < deadline:
            # max_wait 100 ms, not 0: Tansu answers max_wait=0 with no partitions at all.
            req = fetch_request(
                {(topic, p): o for p, o in offsets.items() if o < ends[p]},
                max_wait_ms=100,
                max_bytes=64 * 1024 * 1024,
                partition_max_bytes=32 * 1024 * 1024,
            )
            resp = conn.request(ApiKey.FETCH, FETCH_V, req)
            requests += 1
            for t in resp.responses:
                for part in t.partitions:
                    p = part.partition_index
                    if int(part.error_code) != 0:
                        errors[int(part.error_code)] += 1
                        continue
                    for b in iter_batches(part.records or b""):
                        first, end = max(b.base_offset, offsets[p]), min(b.next_offset, ends[p])
                        if end > first:
                            records += end - first
                            offsets[p] = end
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu0
    note = f"{requests} fetch request" + ("s" if requests != 1 else "")
    if records != expected:
        note += f"; read {records} of {expected}"
    return Result(records, seconds, errors, note, cpu)


def confluent_fetch(
    port: int,
    topic: str,
    ends: dict[int, int],
    max_seconds: float,
    extra: dict[str, Any] | None = None,
) -> Result:
    """Read offsets [0, ends[p]) of every partition; records past ``ends`` are not counted.
    ``extra``: more consumer settings (benchmarks/fetch.py sets fetch.queue.backoff.ms)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": f"{HOST}:{port}",
            "group.id": "samsa-bench",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 32 * 1024 * 1024,
            "fetch.wait.max.ms": 100,
            "queued.max.messages.kbytes": 1_048_576,
            **(extra or {}),
        }
    )
    expected = sum(ends.values())
    errors: Counter[int] = Counter()
    records = 0
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS) if ends[p]])
        # The clock starts at the first message: connecting and metadata are not counted.
        start = cpu0 = 0.0
        deadline = time.perf_counter() + 30.0  # for the first message
        while records < expected and time.perf_counter() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                err = msg.error()
                if err is None:
                    if not records:
                        start, cpu0 = time.perf_counter(), time.process_time()
                        deadline = start + max_seconds
                    if msg.offset() < ends[msg.partition()]:
                        records += 1
                elif err.code() != KafkaError._PARTITION_EOF:
                    errors[int(err.code())] += 1
        seconds = time.perf_counter() - start if records else 0.0
        cpu = time.process_time() - cpu0 if records else 0.0
    finally:
        consumer.close()
    note = "" if records == expected else f"read {records} of {expected}"
    return Result(records, seconds, errors, note, cpu)


# --- running it all ---------------------------------------------------------------------


@dataclass
class Target:
    """A broker under test: ``samsa``, ``tansu`` or ``samsa-fsync``."""

    name: str
    broker: BrokerProcess
    # topic -> partition -> end offset to read up to: the same on every broker, so that the
    # fetch rows compare reads of the same records
    read_to: dict[str, dict[int, int]] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.broker.port

    @property
    def column(self) -> str:
        return "samsa" if self.name.startswith("samsa") else self.name


@dataclass
class Workload:
    key: str
    label: str
    topic: str
    run: Callable[[Target], Result]
    repeats: int
    targets: tuple[str, ...] = ("samsa", "tansu")
    produces: bool = True


def workloads(scale: Scale) -> list[Workload]:
    t = scale.max_seconds
    c = scale.connections
    r = REPEATS

    def raw(per_batch: int, records: int, topic: str) -> Callable[[Target], Result]:
        return lambda tg: raw_produce(tg.port, topic, per_batch, records, t / r)

    def conc(records_each: int, topic: str) -> Callable[[Target], Result]:
        return lambda tg: concurrent_produce(tg.port, topic, 100, records_each, c, t)

    fetched = "bench-a100"
    return [
        Workload(
            "a1",
            "(a) raw, 1 rec/batch, 1 conn",
            "bench-a1",
            raw(1, scale.batches_1 // r, "bench-a1"),
            r,
        ),
        Workload(
            "a100",
            "(a) raw, 100 rec/batch, 1 conn",
            fetched,
            raw(100, scale.records_100 // r, fetched),
            r,
        ),
        Workload(
            "a1000",
            "(a) raw, 1000 rec/batch, 1 conn",
            "bench-a1000",
            raw(1000, scale.records_1000 // r, "bench-a1000"),
            r,
        ),
        Workload(
            f"a100x{c}",
            f"(a) raw, 100 rec/batch, {c} conns",
            f"bench-a100x{c}",
            conc(scale.records_conc, f"bench-a100x{c}"),
            r,
        ),
        Workload(
            "f100",
            "(a) raw, 100 rec/batch, 1 conn, fsync",
            "bench-f100",
            lambda tg: raw_produce(tg.port, "bench-f100", 100, scale.records_fsync, t),
            1,
            ("samsa-fsync",),
        ),
        Workload(
            f"f100x{c}",
            f"(a) raw, 100 rec/batch, {c} conns, fsync",
            f"bench-f100x{c}",
            conc(scale.records_fsync // c, f"bench-f100x{c}"),
            1,
            ("samsa-fsync",),
        ),
        Workload(
            "b",
            "(b) confluent-kafka producer",
            "bench-b",
            lambda tg: confluent_produce(tg.port, "bench-b", scale.records_confluent // r, t),
            r,
        ),
        Workload(
            "c-raw",
            "(c) fetch, raw Fetch v12",
            fetched,
            lambda tg: raw_fetch(tg.port, fetched, tg.read_to[fetched], 30.0),
            r,
            produces=False,
        ),
        Workload(
            "c-confluent",
            "(c) fetch, confluent consumer",
            fetched,
            lambda tg: confluent_fetch(tg.port, fetched, tg.read_to[fetched], 30.0),
            1,
            produces=False,
        ),
    ]


@dataclass
class Row:
    key: str
    label: str
    results: dict[str, Result] = field(default_factory=dict)


def run_all(scale: Scale, targets: dict[str, Target]) -> dict[str, Row]:
    """Every workload on every target; repeats alternate between brokers (ABAB, then BABA)
    so that a slow spell of this shared machine hits both, and the median is kept."""
    rows: dict[str, Row] = {}
    for w in workloads(scale):
        here = [targets[n] for n in w.targets if n in targets]
        if not here:
            continue
        for tg in here:
            ensure_topic(tg.port, w.topic)
        if not w.produces:
            # A broker whose produce hit its time cap holds fewer records: every broker reads
            # the records all of them have, no more.
            ends = [high_watermarks(tg.port, w.topic) for tg in here]
            common = {p: min(e[p] for e in ends) for p in range(PARTITIONS)}
            for tg, e in zip(here, ends, strict=True):
                tg.read_to[w.topic] = common
                if e != common:
                    print(
                        f"  {tg.name:<11} {w.topic}: reading {sum(common.values())} of its "
                        f"{sum(e.values())} records, as many as every broker has",
                        flush=True,
                    )
        runs: dict[str, list[Result]] = {tg.name: [] for tg in here}
        for i in range(w.repeats):
            for tg in here if i % 2 == 0 else here[::-1]:
                r = _timed(tg, lambda tg=tg, w=w: w.run(tg))
                runs[tg.name].append(r)
                run_no = f" #{i + 1}" if w.repeats > 1 else ""
                _print_run(tg.name, w.label + run_no, r)
        row = rows.setdefault(w.key, Row(w.key, w.label))
        for tg in here:
            row.results[tg.column] = median(runs[tg.name])
    return rows


def _timed(tg: Target, fn: Callable[[], Result]) -> Result:
    """Run ``fn`` and record the broker process's CPU time over it."""
    cpu0 = tg.broker.cpu_seconds()
    r = fn()
    r.broker_cpu = tg.broker.cpu_seconds() - cpu0
    return r


def median(runs: list[Result]) -> Result:
    """The run with the median rate; errors of all runs; the spread in its note."""
    ordered = sorted(runs, key=lambda r: r.rate)
    mid = ordered[len(ordered) // 2]
    out = Result(
        mid.records,
        mid.seconds,
        sum((r.errors for r in runs), Counter()),
        mid.note,
        mid.client_cpu,
        sum(r.records for r in runs),
        mid.broker_cpu,
    )
    if len(runs) > 1:
        spread = f"median of {len(runs)}: {ordered[0].rate:,.0f}..{ordered[-1].rate:,.0f}"
        out.note = f"{spread}; {out.note}" if out.note else spread
    return out


def _print_run(broker: str, label: str, r: Result) -> None:
    errs = _format_errors(r.errors)
    note = f"  ({r.note})" if r.note else ""
    print(
        f"  {broker:<11} {label:<42}{r.records:>8} rec {r.seconds:6.2f} s "
        f"{r.rate:>10,.0f} rec/s {r.mb_s:6.1f} MB/s  cpu: broker {r.broker_load:4.0%} "
        f"client {r.client_load:4.0%}  errors: {errs}{note}",
        flush=True,
    )


def _format_errors(errors: Counter[int]) -> str:
    if not errors:
        return "0"
    return ", ".join(
        f"{n}x{code} {ERROR_NAMES.get(code, '')}".rstrip() for code, n in errors.most_common()
    )


def warm_up(tg: Target) -> None:
    """A few seconds of produce outside the table: both brokers start from the same state
    (connections accepted, code paths hot, first allocations made)."""
    ensure_topic(tg.port, "bench-warmup")
    raw_produce(tg.port, "bench-warmup", 1, 900, 5.0)
    raw_produce(tg.port, "bench-warmup", 100, 30_000, 5.0)


def print_table(rows: dict[str, Row], columns: list[str]) -> None:
    header = f"{'workload':<42}"
    for b in columns:
        header += f"{b + ' rec/s':>14}{'MB/s':>7}"
    if len(columns) == 2:
        header += f"{'samsa/tansu':>13}"
    header += "  errors"
    print()
    print(header)
    print("-" * (len(header) + 20))
    for row in rows.values():
        line = f"{row.label:<42}"
        for b in columns:
            r = row.results.get(b)
            line += f"{r.rate:>14,.0f}{r.mb_s:>7.1f}" if r else f"{'-':>14}{'-':>7}"
        if len(columns) == 2:
            s, t = row.results.get("samsa"), row.results.get("tansu")
            line += f"{s.rate / t.rate:>12.2f}x" if s and t and t.rate else f"{'-':>13}"
        line += "  " + ", ".join(f"{b} {_format_errors(r.errors)}" for b, r in row.results.items())
        print(line)
    notes = [
        (row.label, b, r.note) for row in rows.values() for b, r in row.results.items() if r.note
    ]
    if notes:
        print()
        for label, b, note in notes:
            print(f"  {label} [{b}]: {note}")


# --- profiling --------------------------------------------------------------------------


def profile_samsa(
    scale: Scale,
    work: Path,
    out_dir: Path,
    per_batch: int,
    profiler: str = "auto",
    codec: str = "none",
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tool = profiler
    if tool == "auto":
        tool = "py-spy" if find_py_spy() else "pyinstrument"
    out = out_dir / (
        "samsa-broker.collapsed.txt" if tool == "py-spy" else "samsa-broker.pyisession"
    )
    records = {1: scale.batches_1, 100: scale.records_100, 1000: scale.records_1000}[per_batch]
    records //= REPEATS
    label = f"(a) raw, {per_batch} rec/batch, {codec}, profiled"
    compression = CODECS[codec]
    with SamsaBroker(
        work / "samsa-profile", profile=None if tool == "py-spy" else tool, profile_out=out
    ) as b:
        print(f"samsa broker on port {b.port}, profiled with {tool}")
        tg = Target("samsa", b)
        topic = f"bench-profile-{per_batch}"
        ensure_topic(b.port, topic)
        warm_up(tg)
        # py-spy samples the measured runs only; pyinstrument the whole broker process.
        spy = PySpy(b.pid or 0, out) if tool == "py-spy" else contextlib.nullcontext()
        with spy:
            for i in range(REPEATS):
                r = _timed(
                    tg,
                    lambda: raw_produce(
                        b.port, topic, per_batch, records, scale.max_seconds, compression
                    ),
                )
                _print_run("samsa", f"{label} #{i + 1}", r)
    if not out.exists():
        print(f"no profile written to {out}")
        return
    print(f"profile saved: {out}")
    if tool == "pyinstrument":
        _pyinstrument_report(out, out_dir)
    else:
        _collapsed_report(out)


def _print_hotspots(
    self_time: Counter[str], inclusive: Counter[str], total: float, top: int
) -> None:
    print(f"{'self %':>7} {'incl %':>7}  function")
    for name, t in self_time.most_common(top):
        print(f"{t / total:>7.1%} {inclusive[name] / total:>7.1%}  {name}")
    print("\nlargest inclusive (samsa code):")
    shown = 0
    for name, t in inclusive.most_common():
        if "samsa/" in name and shown < top // 2:
            print(f"{'':>7} {t / total:>7.1%}  {name}")
            shown += 1


def _collapsed_report(path: Path, top: int = 30) -> None:
    """Self and inclusive shares of functions from py-spy's collapsed stacks (idle time is
    not sampled by py-spy unless --idle, so shares are of the time the broker was busy)."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";")]
        total += n
        self_time[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    if not total:
        print("the profile has no samples")
        return
    print(f"\nbroker: {total} busy samples (py-spy leaves idle waits out)")
    _print_hotspots(self_time, inclusive, total, top)


def _short(frame: str) -> str:
    """'fn (/long/path/site-packages/pkg/mod.py:12)' -> 'fn (pkg/mod.py)': one entry per
    function, whichever line a sample was on."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/src/", "/lib/python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{name} ({where})"


def _find_frame(frame: Any, qualname: str) -> Any:
    qual = f"{frame.class_name}.{frame.function}" if frame.class_name else frame.function
    if qual == qualname:
        return frame
    for child in frame.children:
        found = _find_frame(child, qualname)
        if found is not None:
            return found
    return None


def _pyinstrument_report(session_path: Path, out_dir: Path, top: int = 30) -> None:
    from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer
    from pyinstrument.session import Session

    session = Session.load(session_path)
    html = out_dir / "samsa-broker.html"
    html.write_text(HTMLRenderer().render(session))
    text = out_dir / "samsa-broker.txt"
    text.write_text(ConsoleRenderer(unicode=False, color=False).render(session))
    print(f"profile rendered: {html} and {text}")
    root = session.root_frame(trim_stem=False)
    if root is None:
        return
    # The event loop's subtree, leaving out start-up (imports) and shutdown.
    loop_root = _find_frame(root, "Runner.run")
    if loop_root is not None:
        root = loop_root
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()

    def walk(frame: Any, stack: frozenset[str]) -> None:
        qual = f"{frame.class_name}.{frame.function}" if frame.class_name else frame.function
        name = f"{qual} ({frame.file_path_short}:{frame.line_no})"
        # Time not spent in a real child is this function's own ("[self]" frames included).
        own = frame.time - sum(c.time for c in frame.children if not c.is_synthetic)
        self_time[name] += max(own, 0.0)
        if name not in stack:
            inclusive[name] += frame.time
        for child in frame.children:
            if not child.is_synthetic:
                walk(child, stack | {name})

    walk(root, frozenset())
    for name in [n for n in self_time if n.startswith(("wrapper (", "serve ("))]:
        self_time.pop(name)  # start-up/shutdown coroutine, not the load
    loop = sum(t for n, t in self_time.items() if n.startswith("Runner.run ("))
    print(
        f"\nbroker main thread: {root.time:.2f} s sampled; {loop:.2f} s ({loop / root.time:.0%})"
        " in the event loop's own C code (waiting in epoll, and uvloop's socket reads and "
        "writes, which pyinstrument cannot see into); shares below are of all samples"
    )
    _print_hotspots(self_time, inclusive, root.time, top)


# --- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts, a smoke run")
    parser.add_argument("--only", choices=("samsa", "tansu"), help="run one broker only")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only run (a) against a samsa broker under py-spy or pyinstrument",
    )
    parser.add_argument(
        "--profile-batch",
        type=int,
        choices=(1, 100, 1000),
        default=100,
        help="records per batch of the profiled run (default 100)",
    )
    parser.add_argument(
        "--profiler",
        choices=("auto", "py-spy", "pyinstrument"),
        default="auto",
        help="auto: py-spy if installed, else pyinstrument",
    )
    parser.add_argument(
        "--profile-codec",
        choices=tuple(CODECS),
        default="none",
        help="the profiled run's batches in this codec (default none)",
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        help="where to save the profile (default: a new directory in $TMPDIR)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="parent directory for broker data (default $TMPDIR); removed after",
    )
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    log_py = Path(__file__).resolve().parent.parent / "src" / "samsa" / "log" / "log.py"
    if args.only != "tansu" and not log_py.exists():
        print(f"{log_py} does not exist yet: the samsa broker cannot start", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="samsa-bench-", dir=args.work_dir))
    try:
        if args.profile:
            out_dir = args.profile_dir or Path(tempfile.mkdtemp(prefix="samsa-profile-"))
            profile_samsa(
                scale, work, out_dir, args.profile_batch, args.profiler, args.profile_codec
            )
            return 0
        t0 = time.perf_counter()
        columns = ["samsa", "tansu"] if args.only is None else [args.only]
        with contextlib.ExitStack() as stack:
            targets: dict[str, Target] = {}
            if "samsa" in columns:
                targets["samsa"] = Target("samsa", stack.enter_context(SamsaBroker(work / "samsa")))
                targets["samsa-fsync"] = Target(
                    "samsa-fsync",
                    stack.enter_context(
                        SamsaBroker(work / "samsa-fsync", {"log.flush.interval.messages": "1"})
                    ),
                )
            if "tansu" in columns:
                targets["tansu"] = Target("tansu", stack.enter_context(TansuBroker()))
            print(
                f"{'quick' if args.quick else 'full'} run on {os.cpu_count()} CPUs: "
                f"{PARTITIONS} partitions, {VALUE_SIZE} B values, {PIPELINE} requests in "
                f"flight, acks=-1"
            )
            for tg in targets.values():
                where = (
                    f", data dir {tg.broker.data_dir}"
                    if isinstance(tg.broker, SamsaBroker)
                    else ", memory storage"
                )
                print(f"  {tg.name} on 127.0.0.1:{tg.port}{where}")
            for tg in targets.values():
                warm_up(tg)
            rows = run_all(scale, targets)
        print_table(rows, columns)
        print(
            f"\n(total {time.perf_counter() - t0:.0f} s; records/s = records acknowledged "
            f"or read per wall-clock second, median of the repeats; MB/s = record values, "
            f"{VALUE_SIZE} B each; fsync rows: samsa with log.flush.interval.messages=1)"
        )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
