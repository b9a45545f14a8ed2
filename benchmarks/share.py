"""Share groups (KIP-932): records/s consumed by 1, 3 and 10 share consumers on one partition,
samsa against Apache Kafka in the same run.

Both brokers are started fresh by this script on 127.0.0.1 (Kafka: the pinned release, one
KRaft node, through samsa.testing.kafka) and stopped at the end. On each, one topic of one
partition gets ``--records`` records of 100 bytes (confluent-kafka producer, acks=all). Each
row is a new share group reading the topic from the start (group config
``share.auto.offset.reset=earliest``) with N of samsa's ``AsyncShareConsumer`` in one
process, in implicit acknowledgement mode: each poll accepts the batch the previous poll
returned (the acknowledgements ride on the next ShareFetch), and close accepts the last one.
The figure is records/s from the first record received to the last distinct offset; the
join (subscription to the first record) is printed on its own: Kafka initialises the share
partition and assigns at most every ``group.share.assignment.interval.ms``, samsa at once
(D-SHARE-3), which would otherwise dominate a short run. With the default 2,000 record locks
per share partition, 50,000 records take at least 25 acquire/acknowledge rounds on either
broker. A row stops after ``--timeout`` seconds whatever it got (then marked). Redeliveries
are counted: a record delivered twice means a lock expired or a session closed before its
acknowledgement.

Each row is run with two clients, each against both brokers: samsa's Python consumers, and
Kafka's Java ``KafkaShareConsumer`` (benchmarks/java/ShareConsumerBench.java, one thread per
consumer, implicit acknowledgement, run on the pinned Kafka's classpath). The same client
drives both brokers, so each ratio compares brokers, not clients; with ten consumers in one
Python process the client takes its share of the two cores too. The brokers' order
alternates from row to row.

    python benchmarks/share.py              # 50,000 records, rows 1, 3, 10 (~2 min with JVM)
    python benchmarks/share.py --quick      # 2,000 records (smoke run)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import BrokerProcess, KafkaBroker, SamsaBroker
from confluent_kafka import Producer
from confluent_kafka import admin as ck

from samsa.client._share_consumer import AsyncShareConsumer
from samsa.testing.kafka import classpath

CONSUMERS = (1, 3, 10)
CLIENTS = ("python", "java")
JAVA = Path(__file__).resolve().parent / "java" / "ShareConsumerBench.java"
VALUE = b"x" * 100


@dataclass
class Row:
    consumers: int
    broker: str
    client: str = "python"
    records: int = 0
    seconds: float = 0.0
    join: float = 0.0  # subscription to the first record
    redelivered: int = 0
    timed_out: bool = False

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), "")
    return (
        f"{platform.node()}: {os.cpu_count()} cores ({model}), {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def load_topic(bootstrap: str, records: int) -> str:
    topic = f"share-bench-{uuid.uuid4().hex[:8]}"
    admin = ck.AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([ck.NewTopic(topic, 1, 1)]).values():
        f.result(timeout=60)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for _ in range(records):
        while True:
            try:
                p.produce(topic, value=VALUE)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120) != 0:
        raise RuntimeError("the producer could not deliver every record")
    return topic


def share_group(bootstrap: str) -> str:
    group = f"share-bench-{uuid.uuid4().hex[:8]}"
    entry = ck.ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=ck.AlterConfigOpType.SET
    )
    resource = ck.ConfigResource(ck.ResourceType.GROUP, group, incremental_configs=[entry])
    admin = ck.AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(timeout=60)
    return group


def consume_java(bootstrap: str, topic: str, n: int, total: int, timeout: float) -> Row:
    group = share_group(bootstrap)
    cmd = ["java", "-Xmx512m", "-cp", classpath(), str(JAVA), bootstrap, topic, group,
           str(total), str(n), str(int(timeout))]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 120)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"ShareConsumerBench failed:\n{done.stderr[-3000:]}")
    got = json.loads(lines[-1])
    return Row(n, "", "java", got["records"], got["seconds"], got["join"],
               got["redelivered"], got["records"] < total)  # fmt: skip


async def consume(bootstrap: str, topic: str, n: int, total: int, timeout: float) -> Row:
    group = share_group(bootstrap)
    consumers = [AsyncShareConsumer(bootstrap, group) for _ in range(n)]
    seen: set[int] = set()
    row = Row(n, "")
    first = last = 0.0
    start = time.monotonic()
    deadline = start + timeout

    async def run(c: AsyncShareConsumer) -> None:
        nonlocal first, last
        while len(seen) < total and time.monotonic() < deadline:
            for r in await c.poll(0.2):
                now = time.monotonic()
                first = first or now
                if r.offset in seen:
                    row.redelivered += 1
                else:
                    seen.add(r.offset)
                    last = now

    try:
        for c in consumers:
            await c.subscribe([topic])
        await asyncio.gather(*(run(c) for c in consumers))
    finally:
        await asyncio.gather(*(c.close() for c in consumers), return_exceptions=True)
    row.records, row.seconds, row.join = len(seen), last - first, first - start
    row.timed_out = len(seen) < total
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per row, at most")
    parser.add_argument("--quick", action="store_true", help="2,000 records")
    args = parser.parse_args()
    records = 2_000 if args.quick else args.records
    print(machine())
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="share-bench-") as tmp:
        brokers: dict[str, BrokerProcess] = {
            "samsa": SamsaBroker(Path(tmp) / "samsa"),
            "kafka": KafkaBroker(Path(tmp) / "kafka"),
        }
        with contextlib.ExitStack() as stack:
            topics: dict[str, str] = {}
            for name, broker in brokers.items():
                stack.enter_context(broker)
                topics[name] = load_topic(broker.bootstrap, records)
            for i, (n, client) in enumerate((n, c) for n in CONSUMERS for c in CLIENTS):
                order = list(brokers) if i % 2 == 0 else list(reversed(brokers))
                for name in order:
                    bootstrap = brokers[name].bootstrap
                    if client == "java":
                        row = consume_java(bootstrap, topics[name], n, records, args.timeout)
                    else:
                        row = asyncio.run(
                            consume(bootstrap, topics[name], n, records, args.timeout)
                        )
                    row.broker = name
                    rows.append(row)
                    print(
                        f"  {client:6} {name:5} {n:2} consumer(s): {row.rate:9,.0f} records/s "
                        f"({row.records:,} in {row.seconds:.2f} s, first after {row.join:.2f} s, "
                        f"{row.redelivered} redelivered"
                        f"{', TIMED OUT' if row.timed_out else ''})",
                        flush=True,
                    )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(f"\n{records:,} records of 100 B, one partition, implicit acknowledgement")
    print(
        "| client | share consumers | samsa records/s | Kafka records/s | samsa / Kafka "
        "| join s (samsa, Kafka) |"
    )
    print("|---|---|---|---|---|---|")
    for client in CLIENTS:
        for n in CONSUMERS:
            mine = [r for r in rows if r.consumers == n and r.client == client]
            s = next(r for r in mine if r.broker == "samsa")
            k = next(r for r in mine if r.broker == "kafka")
            ratio = s.rate / k.rate if k.rate else float("nan")
            print(
                f"| {client} | {n} | {s.rate:,.0f} | {k.rate:,.0f} | {ratio:.2f} "
                f"| {s.join:.1f}, {k.join:.1f} |"
            )


if __name__ == "__main__":
    main()
