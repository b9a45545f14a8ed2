"""Spark on samsa: records/s of a batch read, of an exactly-once write, and of a plain
at-least-once write of the same rows (the ratio is the price of exactly once).

A samsa broker (subprocess, temporary directory, 127.0.0.1) and a local SparkSession
(``local[2]`` by default). Records have 100-byte values and 8-byte keys. Each figure is the
best of ``--repeat`` runs after one warm-up run (Python workers, JIT):

* read: ``spark.read.format("samsa")`` of the whole topic (read_committed), every column
  materialised (``count`` of a projection of key, value, offset); its peers, in the same
  run and process: ``Consumer.consume_arrow`` alone (the decoding the source uses, without
  Spark) and confluent-kafka's consumer (``fetch.queue.backoff.ms=0``), printed as ratios;
* exactly-once write: ``df.write.format("samsa")`` (per-task transactions, committed by
  the driver);
* at-least-once write: the same with ``exactlyOnce=false`` (idempotent producer per task,
  no transaction).
* confluent-kafka foreachPartition: what a PySpark user writes today without the JVM
  connector, ``df.foreachPartition`` with a confluent-kafka producer per partition
  (``produce()`` per row, then ``flush()``; librdkafka's defaults, acks=all, not
  idempotent: at-least-once), into the same kind of topic.

Both samsa writes feed each task's Arrow batches to ``Producer.produce_batch``.

    python benchmarks/spark.py                  # 200k records (~2 min)
    python benchmarks/spark.py --records 20000  # smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from samsa.client import Admin, Producer
from samsa.demo import embedded_broker


def timed(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _ck_partition_writer(bootstrap: str, topic: str) -> Callable[[Any], None]:
    """The foreachPartition function of the confluent-kafka baseline (runs in the workers)."""

    def write(rows: Any) -> None:
        import confluent_kafka

        p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        errors: list[Any] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        for r in rows:
            while True:
                try:
                    p.produce(topic, r.value, r.key, on_delivery=delivered)
                    break
                except BufferError:  # librdkafka's queue is full: serve callbacks, retry
                    p.poll(0.01)
        if p.flush(60) or errors:
            raise RuntimeError(f"confluent-kafka baseline: {len(errors)} delivery errors")

    return write


def read_peers(
    bootstrap: str, topic: str, partitions: int, n: int
) -> dict[str, Callable[[], None]]:
    """Reads of the whole topic outside Spark, in this process: the peers of the Spark read
    (the same column decoding without Spark; confluent-kafka's consumer, its prefetch backoff
    off: with the default ``fetch.queue.backoff.ms`` of 1 s it stalls after each prefetch)."""
    from samsa.client import Consumer, TopicPartition

    def arrow() -> None:
        with Consumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed"}) as c:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            c.assign(tps)
            c.seek_to_beginning(*tps)
            got, end = 0, time.monotonic() + 120
            while got < n and time.monotonic() < end:
                got += c.consume_arrow(100_000, 1.0).num_rows
            assert got == n, got

    def ck() -> None:
        import confluent_kafka

        c = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
            "isolation.level": "read_committed", "fetch.queue.backoff.ms": 0,
        })  # fmt: skip
        try:
            c.assign([
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(partitions)
            ])  # fmt: skip
            got, end = 0, time.monotonic() + 120
            while got < n and time.monotonic() < end:
                got += len(c.consume(10_000, 1.0))
            assert got == n, got
        finally:
            c.close()

    return {"consume_arrow, no Spark": arrow, "confluent-kafka consume()": ck}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args(argv)

    import samsa.spark

    with tempfile.TemporaryDirectory(prefix="samsa-bench-") as tmp:
        with embedded_broker(Path(tmp) / "broker") as bootstrap:
            with Admin({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topic("bench-in", a.partitions)
                admin.create_topic("bench-out", a.partitions)
                admin.create_topic("bench-ck", a.partitions)
            value = b"x" * 100
            t = time.perf_counter()
            with Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                           "batch.size": 256 * 1024}) as p:  # fmt: skip
                for i in range(a.records):
                    p.produce("bench-in", value, b"%08d" % i)
                p.flush()
            fill = time.perf_counter() - t
            print(f"filled bench-in with {a.records} records in {fill:.1f} s", flush=True)

            spark = samsa.spark.local_session(a.master, "samsa-bench")
            try:
                src = (
                    spark.read.format("samsa")
                    .option("kafka.bootstrap.servers", bootstrap)
                    .option("subscribe", "bench-in")
                    .load()
                )

                def read() -> None:
                    n = src.selectExpr("key", "value", "offset").count()
                    assert n == a.records, n

                rows = (
                    spark.range(0, a.records, numPartitions=a.partitions)
                    .selectExpr(
                        "lpad(CAST(id AS STRING), 8, '0') AS key", "repeat('x', 100) AS value"
                    )
                    .cache()
                )
                rows.count()

                def write(exactly_once: bool) -> Callable[[], None]:
                    def run() -> None:
                        (
                            rows.write.format("samsa")
                            .option("kafka.bootstrap.servers", bootstrap)
                            .option("topic", "bench-out")
                            .option("exactlyOnce", str(exactly_once).lower())
                            .mode("append")
                            .save()
                        )

                    return run

                def ck_foreach() -> None:
                    rows.foreachPartition(_ck_partition_writer(bootstrap, "bench-ck"))

                peers = read_peers(bootstrap, "bench-in", a.partitions, a.records)
                read_results = [(k, timed(f, a.repeat)) for k, f in peers.items()]
                results = [
                    ("read (read_committed)", timed(read, a.repeat)),
                    ("exactly-once write", timed(write(True), a.repeat)),
                    ("at-least-once write", timed(write(False), a.repeat)),
                    ("ck foreachPartition", timed(ck_foreach, a.repeat)),
                ]
            finally:
                spark.stop()

    print(f"\n{a.records} records of 100 B, {a.partitions} partitions, Spark {a.master}, "
          f"best of {a.repeat}")  # fmt: skip
    print(f"| {'workload':<24} | {'seconds':>8} | {'records/s':>10} |")
    print(f"|{'-' * 26}|{'-' * 10}|{'-' * 12}|")
    for name, secs in results:
        print(f"| {name:<24} | {secs:>8.2f} | {a.records / secs:>10,.0f} |")
    for name, secs in read_results:
        print(f"| read peer: {name:<24} | {secs:>8.2f} | {a.records / secs:>10,.0f} "
              f"| Spark read / this: {secs / results[0][1]:.2f} |")  # fmt: skip
    eo, alo, ck = results[1][1], results[2][1], results[3][1]
    print(f"\nexactly-once / at-least-once write throughput: {alo / eo:.2f}")
    print(f"exactly-once write / confluent-kafka foreachPartition throughput: {ck / eo:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
