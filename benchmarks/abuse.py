"""A well-behaved producer's latency while the broker is under abuse (issue 10 §3).

One samsa broker, one run. A confluent-kafka producer (acks=all, linger.ms=0, one record at a
time: produce, then wait for its delivery) measures its produce latency twice:

- **normal**: nothing else runs;
- **attacked**: meanwhile one connection has pipelined 100,000 Metadata requests (every topic,
  and a 100-partition topic makes each answer a few KB) without reading a response, and 20
  connections have each sent half of a 99 MB request (just under socket.request.max.bytes)
  and stalled.

Each phase lasts ``--seconds``; the attack starts 0.3 s before its phase and pushes bytes for
up to 15 s, from a process of its own. It prints p50 and p99 of both, their ratios (attacked /
normal), the broker's resident memory before and during the attack, and what the attackers got
to send. Before the limits, the half-frames held ~1 GB of the broker and the flood stalled
other clients for seconds; the target is a ratio within 2x at bounded memory.

    python benchmarks/abuse.py                    # ~30 s
    python benchmarks/abuse.py --seconds 3        # quicker
    python benchmarks/abuse.py --src DIR          # the broker from another source tree
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import HOST, SamsaBroker
from confluent_kafka import Producer

from samsa.client._connection import BlockingConnection
from samsa.protocol.framing import frame_request
from samsa.protocol.messages import ApiKey, encode_request, make_request
from samsa.testing import create_topic

TOPIC = "abuse"
HALF_FRAMES = 20
FRAME_SIZE = 99 * 1024 * 1024
FLOOD_REQUESTS = 100_000
SEND_CAP_S = 15.0  # attackers stop pushing bytes after this (they stay connected)
ATTACK_LEAD_S = 0.3


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def measure(bootstrap: str, seconds: float) -> list[float]:
    """Latency (ms) of each produce, one at a time, acks=all, for ``seconds``."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "socket.nagle.disable": True,
        }
    )
    done: list[float] = []
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))
        done.append(time.perf_counter())

    try:
        for _ in range(20):  # warm-up: metadata, connection, producer id
            producer.produce(TOPIC, b"w" * 100, on_delivery=on_delivery)
            producer.flush(10)
        latencies = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            producer.produce(TOPIC, b"v" * 100, on_delivery=on_delivery)
            if producer.flush(30) != 0:
                raise RuntimeError("a produce was not delivered within 30 s")
            latencies.append((done[-1] - start) * 1000)
    finally:
        producer.flush(10)
    if errors:
        raise RuntimeError(f"delivery errors: {errors[:3]}")
    return latencies


def _push(port: int, data: bytes, stop: threading.Event) -> int:
    """Send ``data`` as far as the broker takes it (never reading); bytes sent."""
    sock = socket.create_connection((HOST, port))
    sock.setblocking(False)
    view = memoryview(data)
    sent = 0
    deadline = time.monotonic() + SEND_CAP_S
    try:
        while sent < len(view) and not stop.is_set() and time.monotonic() < deadline:
            try:
                sent += sock.send(view[sent : sent + (1 << 20)])
            except BlockingIOError:
                time.sleep(0.05)
            except OSError:
                break  # closed by the broker
        stop.wait()  # stay connected, stalled, until the end
    finally:
        sock.close()
    return sent


def _attack(port: int, stop: Any, results: Any) -> None:
    """The attacker process: the flood and the half-frames, a thread each."""
    request = encode_request(
        ApiKey.METADATA, 1, make_request(ApiKey.METADATA, 1, "MetadataRequest", topics=None)
    )
    flood = frame_request(ApiKey.METADATA, 1, 1, "flood", request, False)
    half = (FRAME_SIZE - 4).to_bytes(4, "big") + bytes(FRAME_SIZE // 2)
    jobs = [("flood", flood * FLOOD_REQUESTS)] + [(f"half-{i}", half) for i in range(HALF_FRAMES)]
    done = threading.Event()
    sent: dict[str, int] = {}

    def run(name: str, data: bytes) -> None:
        sent[name] = _push(port, data, done)

    threads = [threading.Thread(target=run, args=job, daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    stop.wait()
    done.set()
    for thread in threads:
        thread.join(SEND_CAP_S + 5)
    results.put((sent, len(flood)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--src", help="run the broker from this source tree's src/")
    args = parser.parse_args()
    if args.src:
        os.environ["PYTHONPATH"] = str(Path(args.src).resolve() / "src")
    with tempfile.TemporaryDirectory(prefix="samsa-abuse-") as tmp, SamsaBroker(
        Path(tmp) / "data"
    ) as broker:
        assert broker.pid is not None
        with BlockingConnection(HOST, broker.port) as c:
            assert create_topic(c, TOPIC, 1) == 0
            assert create_topic(c, "wide", 100) == 0
        normal = measure(broker.bootstrap, args.seconds)
        rss_before = rss_mb(broker.pid)
        # The attackers run in a process of their own: their threads must not take the
        # measuring client's CPU or GIL.
        ctx = multiprocessing.get_context("spawn")
        stop, results = ctx.Event(), ctx.Queue()
        attacker = ctx.Process(target=_attack, args=(broker.port, stop, results))
        attacker.start()
        try:
            time.sleep(ATTACK_LEAD_S)  # the attack is under way when measuring starts
            rss_attack = rss_mb(broker.pid)
            attacked = measure(broker.bootstrap, args.seconds)
            rss_after = rss_mb(broker.pid)
        finally:
            stop.set()
            sent, flood_frame = results.get(timeout=SEND_CAP_S + 30)
            attacker.join(30)
        alive = broker.alive()
    flood_sent = sent.get("flood", 0)
    half_sent = [v for k, v in sent.items() if k.startswith("half")]
    print(
        f"well-behaved producer: confluent-kafka, acks=all, one record at a time for "
        f"{args.seconds:.0f} s per phase ({len(normal):,} and {len(attacked):,} records)"
    )
    print(f"{'':>10} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'max ms':>8}")
    for name, values in (("normal", normal), ("attacked", attacked)):
        print(
            f"{name:>10} {percentile(values, 50):8.2f} {percentile(values, 99):8.2f} "
            f"{statistics.fmean(values):8.2f} {max(values):8.1f}"
        )
    print(
        f"{'ratio':>10} {percentile(attacked, 50) / percentile(normal, 50):7.2f}x "
        f"{percentile(attacked, 99) / percentile(normal, 99):7.2f}x "
        f"{statistics.fmean(attacked) / statistics.fmean(normal):7.2f}x "
        f"{max(attacked) / max(normal):7.2f}x"
    )
    print(
        f"broker RSS: {rss_before:.0f} MB before the attack, {rss_attack:.0f} MB "
        f"{ATTACK_LEAD_S:.1f} s into it, {rss_after:.0f} MB at its end; broker alive: {alive}"
    )
    print(
        f"attack: flood sent {flood_sent // flood_frame:,} of {FLOOD_REQUESTS:,} Metadata "
        f"requests; {HALF_FRAMES} half-frames sent {sum(half_sent) / 2**20:,.0f} MB in all "
        f"(max {max(half_sent, default=0) / 2**20:.0f} MB on one, of "
        f"{FRAME_SIZE // 2 / 2**20:.1f} MB each)"
    )


if __name__ == "__main__":
    main()
