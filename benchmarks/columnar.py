"""The columnar record-batch codec against the per-record paths, and against confluent-kafka.

Micro-benchmarks (no I/O, same process, same data; 100-byte values, 8-byte keys):

* encode: ``encode_batches`` over Arrow columns (and over Python lists) vs ``build_batch``
  over prebuilt ``NewRecord`` objects, one batch of 16,384 records; uncompressed and LZ4
  (default level, as ``build_batch``, and level 1);
* partition: ``partitions_for_keys`` vs ``partition_for_key`` per key;
* decode: ``decode_fetched`` (to an Arrow batch) vs the reference ``parse_fetched`` (tests/) (a
  ``ConsumerRecord`` per record) and vs ``parse_fetched`` + the Spark source's ``to_arrow``,
  on one fetch of 65,536 records in 16,384-record batches and in 100-record batches.

End to end, against one samsa broker on 127.0.0.1 (started and stopped here):

* confluent-kafka's producer (``enable.idempotence``, acks=all, linger.ms=5; ``produce()``
  per record + ``flush()``), the issue's peer;
* the columnar path as it stands: ``encode_batches`` into ~1 MiB idempotent batches sent
  with raw Produce requests (acks=-1, one request in flight);
* confluent-kafka's consumer (assign mode, tuned for throughput, ``consume()`` of 10,000;
  timed from its first record) reading the topic back, vs raw Fetch requests (one in
  flight, not pipelined) decoded with ``decode_fetched``.

Micro-benchmark figures are the best of ``--repeat`` runs, end-to-end ones the median;
ratios are against the peer in the same run. The machine is shared: compare ratios, not
absolute figures, across runs. The values are random bytes (incompressible): the
compressed rows measure the codec's cost, not its ratio.

    .venv/bin/python benchmarks/columnar.py            # ~1 minute
    .venv/bin/python benchmarks/columnar.py --quick    # smaller, a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the reference decoder

from _brokers import HOST, SamsaBroker

from _fetch_reference import parse_fetched
from samsa.client import Admin, TopicPartition, partition_for_key
from samsa.client._connection import BlockingConnection
from samsa.protocol.columnar import (
    decode_fetched,
    encode_batches,
    partitions_for_keys,
)
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import (
    Compression,
    NewRecord,
    RecordBatchView,
    build_batch,
    set_base_offset,
)
from samsa.spark._read import to_arrow
from samsa.testing import (
    FETCH_VERSION,
    fetch_request,
    init_producer_id,
    produce_one,
)

VALUE_SIZE = 100
KEY_SIZE = 8
BATCH = 16_384


def best_rate(count: int, fn: Callable[[], Any], repeat: int) -> float:
    """Records per second of ``fn`` (which handles ``count`` records), best of ``repeat``
    runs: on a shared machine other processes only ever add time (as ``timeit`` does)."""
    fn()  # warm-up (imports, allocator)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return count / best


def row(name: str, rate: float, peer: float | None = None) -> None:
    ratio = f"{rate / peer:8.1f}x" if peer else " " * 9
    print(f"  {name:<58} {rate:>14,.0f} rec/s {ratio}")


def fetch_log(batches: list[bytes]) -> bytes:
    out = bytearray()
    offset = 0
    for b in batches:
        data = bytearray(b)
        set_base_offset(data, 0, offset)
        offset += RecordBatchView(b).record_count
        out += data
    return bytes(out)


def micro(repeat: int, n: int) -> None:
    values = [os.urandom(VALUE_SIZE) for _ in range(n)]
    keys = [os.urandom(KEY_SIZE) for _ in range(n)]
    now = int(time.time() * 1000)
    varr, karr = pa.array(values, pa.binary()), pa.array(keys, pa.binary())
    records = [NewRecord(v, k, now) for v, k in zip(values, keys, strict=True)]
    big = 64 << 20  # one batch for the whole column

    print(f"encode: one batch of {n:,} records ({VALUE_SIZE} B values, {KEY_SIZE} B keys)")
    for codec, label in ((Compression.NONE, "none"), (Compression.LZ4, "lz4")):
        peer = best_rate(n, lambda c=codec: build_batch(records, compression=c), repeat)
        row(f"build_batch per record [{label}] (peer)", peer)
        rate = best_rate(
            n,
            lambda c=codec: encode_batches(
                varr, karr, timestamps=now, compression=c, max_batch_bytes=big
            ),
            repeat,
        )
        row(f"encode_batches, Arrow columns [{label}]", rate, peer)
        if codec == Compression.LZ4:
            rate = best_rate(
                n,
                lambda: encode_batches(
                    varr,
                    karr,
                    timestamps=now,
                    compression=Compression.LZ4,
                    compression_level=1,
                    max_batch_bytes=big,
                ),
                repeat,
            )
            row("encode_batches, Arrow columns [lz4, compression_level=1]", rate, peer)
        if codec == Compression.NONE:
            rate = best_rate(
                n,
                lambda: encode_batches(values, keys, timestamps=now, max_batch_bytes=big),
                repeat,
            )
            row("encode_batches, Python lists [none]", rate, peer)

    print(f"partition: {n:,} keys over 12 partitions")
    peer = best_rate(n, lambda: [partition_for_key(k, 12) for k in keys], repeat)
    row("partition_for_key per key (peer)", peer)
    row("partitions_for_keys", best_rate(n, lambda: partitions_for_keys(karr, 12), repeat), peer)

    tp = TopicPartition("t", 0)
    for per_batch in (BATCH, 100):
        total = 4 * BATCH
        batches = [
            e.data
            for e in encode_batches(
                pa.array(values * (total // n)),
                pa.array(keys * (total // n)),
                timestamps=now,
                max_batch_bytes=per_batch * (VALUE_SIZE + KEY_SIZE + 12) + 61,
            )
        ]
        data = fetch_log(batches)
        assert sum(RecordBatchView(b).record_count for b in batches) == total
        print(f"decode: one fetch of {total:,} records in {len(batches)} batches")
        peer = best_rate(total, lambda d=data: parse_fetched(tp, d, 0), repeat)
        row("parse_fetched: a ConsumerRecord per record (peer)", peer)
        recs, _ = parse_fetched(tp, data, 0)
        spark = best_rate(total, lambda d=data: to_arrow(parse_fetched(tp, d, 0)[0], False), repeat)
        row("parse_fetched + to_arrow (the Spark source's path)", spark, peer)
        rate = best_rate(total, lambda d=data: decode_fetched(d, "t", 0, 0), repeat)
        row("decode_fetched to Arrow", rate, peer)
        got = decode_fetched(data, "t", 0, 0).batch
        assert got.equals(to_arrow(recs, False))


def confluent_produce(bootstrap: str, topic: str, values: list[bytes], keys: list[bytes]) -> float:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    producer.produce(topic, b"warm-up", partition=0)
    if producer.flush(30):
        raise RuntimeError("confluent-kafka could not deliver its first record")
    start = time.perf_counter()
    for v, k in zip(values, keys, strict=True):
        while True:
            try:
                producer.produce(topic, v, k, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(60):
        raise RuntimeError("confluent-kafka left records undelivered")
    return len(values) / (time.perf_counter() - start)


def columnar_produce(port: int, topic: str, values: pa.Array, keys: pa.Array) -> float:
    with BlockingConnection(HOST, port) as conn:
        code, pid, epoch = init_producer_id(conn)
        assert code == 0
        start = time.perf_counter()
        batches = encode_batches(
            values,
            keys,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            max_batch_bytes=1 << 20,
        )
        for b in batches:
            code, _ = produce_one(conn, topic, 0, b.data)
            if code:
                raise RuntimeError(f"produce failed with error {code}")
        return len(values) / (time.perf_counter() - start)


def confluent_consume(bootstrap: str, topic: str, count: int) -> float:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CkTP

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 8 << 20,  # as the raw fetch below
            # tuned for throughput: with its defaults librdkafka stops fetching for
            # fetch.queue.backoff.ms (1 s) once 100,000 records are queued, ~10x slower here
            "fetch.queue.backoff.ms": 0,
            "queued.min.messages": 1_000_000,
            "queued.max.messages.kbytes": 1 << 20,
        }
    )
    try:
        c.assign([CkTP(topic, 0, 0)])
        got = 0
        start = 0.0
        deadline = time.monotonic() + 120
        while got < count and time.monotonic() < deadline:
            msgs = c.consume(10_000, 0.5)
            if msgs and not start:
                start = time.perf_counter()  # from the first record, as produce.py does
            got += sum(1 for m in msgs if m.error() is None)
        if got < count:
            raise RuntimeError(f"confluent-kafka read {got} of {count}")
        return count / (time.perf_counter() - start)
    finally:
        c.close()


def columnar_consume(port: int, topic: str, count: int) -> float:
    got, position = 0, 0
    with BlockingConnection(HOST, port) as conn:
        start = time.perf_counter()
        while got < count:
            req = fetch_request(
                {(topic, 0): position}, max_wait_ms=100, partition_max_bytes=8 << 20
            )
            resp = conn.request(ApiKey.FETCH, FETCH_VERSION, req)
            part = resp.responses[0].partitions[0]
            decoded = decode_fetched(part.records, topic, 0, position)
            got += decoded.batch.num_rows
            position = decoded.next_offset
        return count / (time.perf_counter() - start)


def end_to_end(repeat: int, n: int) -> None:
    values = [os.urandom(VALUE_SIZE) for _ in range(n)]
    keys = [os.urandom(KEY_SIZE) for _ in range(n)]
    varr, karr = pa.array(values, pa.binary()), pa.array(keys, pa.binary())
    with tempfile.TemporaryDirectory(prefix="samsa-columnar-") as tmp:
        with SamsaBroker(Path(tmp) / "data") as broker:
            bootstrap = f"{HOST}:{broker.port}"
            peer, ours, cpeer, cours = [], [], [], []
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                for i in range(repeat):  # alternate, so a slow spell hits both
                    admin.create_topic(f"ck-{i}", 1)
                    admin.create_topic(f"col-{i}", 1)
                    peer.append(confluent_produce(bootstrap, f"ck-{i}", values, keys))
                    ours.append(columnar_produce(broker.port, f"col-{i}", varr, karr))
                    cpeer.append(confluent_consume(bootstrap, f"col-{i}", n))
                    cours.append(columnar_consume(broker.port, f"col-{i}", n))
    print(f"end to end against a samsa broker: {n:,} records, one partition, {repeat} runs")
    p = statistics.median(peer)
    row("confluent-kafka Producer, produce() per record (peer)", p)
    row("encode_batches + raw Produce, 1 MiB batches, 1 in flight", statistics.median(ours), p)
    c = statistics.median(cpeer)
    row("confluent-kafka Consumer, consume() (peer)", c)
    row("raw Fetch (1 in flight) + decode_fetched to Arrow", statistics.median(cours), c)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and records")
    parser.add_argument("--repeat", type=int, help="runs per figure (default 7, quick 3)")
    parser.add_argument("--records", type=int, help="end-to-end records (default 300,000)")
    parser.add_argument("--no-broker", action="store_true", help="micro-benchmarks only")
    args = parser.parse_args(argv)
    repeat = args.repeat or (3 if args.quick else 7)
    micro(repeat, BATCH)
    if not args.no_broker:
        end_to_end(max(1, repeat // 2), args.records or (50_000 if args.quick else 300_000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
