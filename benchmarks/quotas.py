"""Client quotas under load: does a throttled producer hold its quota, and does an
unthrottled producer on the same broker keep its latency? Against samsa and Apache Kafka in
one run.

For each broker: ``producer_byte_rate`` of client id ``throttled`` is set to ``--rate``
(AlterClientQuotas, through the samsa Admin on both); then

1. baseline: the ``free`` probe alone sends one 100-byte record at a time (acks=all, waiting
   for each), for ``--seconds``; its latency p50 / p99;
2. loaded: the same probe while the ``throttled`` producer (confluent-kafka, as fast as it
   may: 1 KiB records, batches of 64 KiB) sends for ``--seconds``.

It prints the throttled producer's rate as the quota measures it: bytes acknowledged in each
11-second window (``quota.window.num`` x ``quota.window.size.seconds``, Kafka's defaults),
sliding by 0.5 s over the run; the mean of those as a ratio of the quota (held: 0.90-1.10)
and the largest. Kafka's sampled rate lets a client spend a whole span's quota at once (a
new client, and again each time its old samples expire), so per-second rates swing on both
brokers; per span they hold. Then the probe's p50 / p99 loaded over baseline, and the
machine it ran on.

    .venv/bin/python benchmarks/quotas.py                 # samsa and Kafka, ~3 min
    .venv/bin/python benchmarks/quotas.py --only samsa --seconds 20
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import SamsaBroker
from confluent_kafka import Producer

from samsa.client import Admin, ClientQuotaEntity
from samsa.testing.kafka import KafkaNode

TOPIC = "quota-bench"
SPAN_S = 11.0  # what Kafka's rate spans by default: 11 windows of 1 s


def _probe(bootstrap: str, seconds: float) -> list[float]:
    """Latencies (ms) of one record at a time from an unthrottled client."""
    p = Producer(
        {"bootstrap.servers": bootstrap, "client.id": "free", "linger.ms": 0, "acks": "all"}
    )
    out: list[float] = []
    failed: list[object] = []
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        started = time.perf_counter()
        p.produce(TOPIC, b"p" * 100, on_delivery=lambda err, _m: err and failed.append(err))
        p.flush(10)
        out.append((time.perf_counter() - started) * 1000)
    if failed:
        raise RuntimeError(f"the probe's records failed: {failed[:3]}")
    return out


def _flood(bootstrap: str, seconds: float, acked: list[tuple[float, int]]) -> None:
    """The throttled client: sends as fast as it may; (time, bytes) of each delivery."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "throttled",
            "linger.ms": 5,
            "batch.size": 65536,
            "queue.buffering.max.kbytes": 4096,
        }
    )
    value = b"t" * 1024

    def delivered(err: object, msg: object) -> None:
        if err is None:
            acked.append((time.monotonic(), 1024))

    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        try:
            p.produce(TOPIC, value, on_delivery=delivered)
        except BufferError:
            p.poll(0.01)
        p.poll(0)
    p.flush(30)


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def run(name: str, bootstrap: str, rate: int, seconds: float) -> dict[str, float]:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(TOPIC)
        entity = ClientQuotaEntity.of({"client-id": "throttled"})
        errors = admin.alter_client_quotas({entity: {"producer_byte_rate": float(rate)}})
        assert errors[entity] is None, errors
    time.sleep(1.0)  # Kafka applies it through its metadata log
    base = _probe(bootstrap, seconds)
    acked: list[tuple[float, int]] = []
    flood = threading.Thread(target=_flood, args=(bootstrap, seconds + 1, acked))
    started = time.monotonic()
    flood.start()
    time.sleep(0.5)
    loaded = _probe(bootstrap, seconds - 0.5)
    flood.join()
    span_rates = []
    times = [t - started for t, _n in acked]
    t0 = 0.0
    while t0 + SPAN_S <= seconds + 1:
        inside = sum(1 for t in times if t0 <= t < t0 + SPAN_S)
        span_rates.append(inside * 1024 / SPAN_S)
        t0 += 0.5
    achieved = statistics.mean(span_rates) if span_rates else 0.0
    buckets = [0] * (int(seconds) // 3 + 1)
    for t, n in acked:
        i = int((t - started) // 3)
        if 0 <= i < len(buckets):
            buckets[i] += n
    print(f"{name:6} MB/s per 3 s: " + " ".join(f"{b / 3e6:.2f}" for b in buckets), flush=True)
    row = {
        "achieved_Bps": achieved,
        "max_span_ratio": max(span_rates, default=0.0) / rate,
        "quota_ratio": achieved / rate,
        "base_p50": _percentile(base, 50),
        "base_p99": _percentile(base, 99),
        "load_p50": _percentile(loaded, 50),
        "load_p99": _percentile(loaded, 99),
    }
    print(
        f"{name:6} per 11 s: {achieved / 1e6:6.3f} MB/s = {row['quota_ratio']:.3f} x quota "
        f"(max {row['max_span_ratio']:.3f}) | "
        f"probe p50 {row['base_p50']:.2f} -> {row['load_p50']:.2f} ms "
        f"({row['load_p50'] / row['base_p50']:.2f}x), p99 {row['base_p99']:.2f} -> "
        f"{row['load_p99']:.2f} ms ({row['load_p99'] / row['base_p99']:.2f}x)",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=int, default=1_000_000, help="producer_byte_rate (bytes/s)")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--only", choices=("samsa", "kafka"))
    args = ap.parse_args()
    print(
        f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}; quota {args.rate} B/s, {args.seconds:.0f} s"
    )
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "samsa"):
            with SamsaBroker(Path(tmp) / "samsa") as b:
                rows["samsa"] = run("samsa", f"127.0.0.1:{b.port}", args.rate, args.seconds)
        if args.only in (None, "kafka"):
            with KafkaNode(Path(tmp) / "kafka") as k:
                rows["kafka"] = run("kafka", k.bootstrap, args.rate, args.seconds)
    for name, row in rows.items():
        held = 0.9 <= row["quota_ratio"] <= 1.1
        print(f"{name}: quota {'held' if held else 'NOT held'} within 10%")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
