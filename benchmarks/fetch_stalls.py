"""Is the fetch row of peers.py a broker difference or a client race? samsa beside Kafka.

peers.py's "fetch, confluent consumer, fetch.queue.backoff.ms=0" row is one read per broker.
librdkafka's consumer with no fetch backoff sometimes leaves one partition out of its Fetches
until the others are at their end; the broker then long-polls ``fetch.wait.max.ms`` (500 ms)
on a Fetch of partitions at their end, and the read has one ~450 ms stall (benchmarks/fetch.py
explains it). This script reads the same topic many times from each broker, alternating, and
prints every read's rate and longest gap between two consume() batches, how many reads
stalled (a gap of 300 ms or more) and the median rates: if both brokers stall at similar
rates, one read per broker says nothing about which is faster.

    python benchmarks/fetch_stalls.py                 # 600k records, 8 reads per broker
    python benchmarks/fetch_stalls.py --records 1200000 --reads 12
    python benchmarks/fetch_stalls.py --before DIR    # and a samsa from another source tree

The last line gives a two-sided Fisher exact test of samsa's stall count against Kafka's: with
a few reads per broker, counts such as 12 of 19 against 8 of 19 (p = 0.33) are chance.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _brokers import KafkaBroker, SamsaBroker
from _peerlib import PARTITIONS, create_topic, machine

STALL_S = 0.3


def fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    create_topic(bootstrap, topic)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                  "enable.idempotence": True})  # fmt: skip
    value = b"x" * 100
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(120) != 0:
        raise RuntimeError(f"records left unsent to {bootstrap}")


def read(bootstrap: str, topic: str, records: int) -> tuple[float, float]:
    """(records/s from the first message, longest gap between two batches in s)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "stalls",
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 0})  # fmt: skip
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got, start, last, gap = 0, 0.0, 0.0, 0.0
    deadline = time.monotonic() + 300
    try:
        while got < records and time.monotonic() < deadline:
            batch = [m for m in c.consume(10_000, 0.5) if m.error() is None]
            now = time.perf_counter()
            if batch:
                if got:
                    gap = max(gap, now - last)
                else:
                    start = now
                last = now
                got += len(batch)
    finally:
        c.close()
    if got < records:
        raise RuntimeError(f"read {got} of {records} records from {bootstrap}")
    return records / (time.perf_counter() - start), gap


def fisher_exact(a: int, n: int, b: int, m: int) -> float:
    """Two-sided Fisher exact p-value of a of n against b of m (stalled reads)."""
    k, total = a + b, n + m

    def p(x: int) -> float:
        return math.comb(n, x) * math.comb(m, k - x) / math.comb(total, k)

    seen = p(a)
    return min(
        1.0, sum(p(x) for x in range(max(0, k - m), min(n, k) + 1) if p(x) <= seen * (1 + 1e-9))
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=600_000)
    ap.add_argument("--reads", type=int, default=8, help="reads per broker")
    ap.add_argument("--before", type=Path, help="also a samsa broker run from this source tree")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="samsa-stalls-") as d:
        brokers = {"samsa": SamsaBroker(Path(d) / "samsa"), "kafka": KafkaBroker(Path(d) / "k")}
        if args.before:
            brokers["samsa-before"] = SamsaBroker(Path(d) / "before", src=args.before)
        try:
            for b in brokers.values():
                b.start()
                fill(b.bootstrap, "t", args.records)
            reads: dict[str, list[tuple[float, float]]] = {name: [] for name in brokers}
            for i in range(args.reads):
                names = list(brokers)
                order = names[i % len(names) :] + names[: i % len(names)]  # each leads in turn
                for name in order:
                    rate, gap = read(brokers[name].bootstrap, "t", args.records)
                    reads[name].append((rate, gap))
                    gap_ms = gap * 1000
                    print(f"read {i + 1} {name}: {rate:,.0f} rec/s, longest gap {gap_ms:.0f} ms")
        finally:
            for b in brokers.values():
                b.stop()
    medians = {name: statistics.median(r for r, _ in rs) for name, rs in reads.items()}
    print("\n| broker | reads | stalled (gap >= 300 ms) | median rec/s |")
    print("|---|---:|---:|---:|")
    for name, rs in reads.items():
        stalled = sum(g >= STALL_S for _, g in rs)
        print(f"| {name} | {len(rs)} | {stalled} | {medians[name]:,.0f} |")
    stalls = {name: sum(g >= STALL_S for _, g in rs) for name, rs in reads.items()}
    for name in brokers:
        if name != "kafka":
            p = fisher_exact(stalls[name], len(reads[name]), stalls["kafka"], len(reads["kafka"]))
            print(f"\n{name}/Kafka, median: {medians[name] / medians['kafka']:.2f}; stalls"
                  f" {stalls[name]} against {stalls['kafka']}: Fisher p = {p:.2f}")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
