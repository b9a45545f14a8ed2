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
    python benchmarks/abuse.py --records          # the record attacks below instead (~1 min)

Record attacks (issue 27, ``--records``): one attacker connection sends the same Produce (or
ListOffsets) again and again, waiting for each answer, while the well-behaved producer
measures; the broker's RSS is sampled every 20 ms. One row per attack: a 972 KB gzip batch
whose one record inflates to 1 GB (to a compacted topic, then to a topic whose
compression.type makes the broker re-encode it), a ~5 KB zstd batch of 8 million tiny records,
random bytes labelled gzip, a batch claiming 1,000,000 records holding one, garbage records, and
ListOffsets by timestamp over the topic the tiny records were sent to.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cramjam
import crc32c
from _brokers import HOST, SamsaBroker
from confluent_kafka import Producer

from samsa.client._connection import BlockingConnection
from samsa.protocol.framing import frame_request, split_response, uvarint
from samsa.protocol.messages import ApiKey, encode_request, make_request
from samsa.testing import create_topic, produce_request

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
    parser.add_argument("--records", action="store_true", help="the record attacks instead")
    args = parser.parse_args()
    if args.src:
        os.environ["PYTHONPATH"] = str(Path(args.src).resolve() / "src")
    if args.records:
        record_attacks(args.seconds)
        return
    with (
        tempfile.TemporaryDirectory(prefix="samsa-abuse-") as tmp,
        SamsaBroker(Path(tmp) / "data") as broker,
    ):
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


# --- record attacks (issue 27 part 1) ------------------------------------------------------


def _record_batch(body: bytes, count: int, codec: int, *, zero_deltas: bool = False) -> bytes:
    """A v2 batch with a valid header and CRC around ``body`` (records already in ``codec``)."""
    now = int(time.time() * 1000)
    after = struct.pack(">hiqqqhii", codec, count - 1, now, now, -1, -1, -1, count) + body
    return struct.pack(">qiibI", 0, len(after) + 9, 0, 2, crc32c.crc32c(after)) + after


def _gzip_bomb(inflated: int) -> bytes:
    """One record (key b"k") whose value is ``inflated`` zero bytes, gzip'd."""
    value_len = inflated
    head = b"\x00\x00\x00\x02k" + _zigzag(value_len)
    record_len = len(head) + value_len + 1
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(_zigzag(record_len) + head)]
    zeros = bytes(1 << 20)
    for _ in range(value_len >> 20):
        out.append(z.compress(zeros))
    out.append(z.compress(bytes(value_len & ((1 << 20) - 1)) + b"\x00"))  # + header count
    out.append(z.flush())
    return _record_batch(b"".join(out), 1, 1)


def _tiny_records_bomb(count: int) -> bytes:
    """``count`` identical 7-byte records (every offset delta 0, as the issue's batch), zstd."""
    rec = _zigzag(6) + b"\x00\x00\x00\x01\x01\x00"
    raw = rec * count
    return _record_batch(bytes(cramjam.zstd.compress(raw, level=19)), count, 4)


def _zigzag(v: int) -> bytes:
    return uvarint((v << 1) ^ (v >> 63))


def _attack_frames(port: int) -> list[tuple[str, bytes]]:
    """(row, request frame) of each record attack."""
    bomb = _gzip_bomb(1 << 30)
    tiny = _tiny_records_bomb(8_000_000)
    rng = random.Random(27)
    one = _zigzag(6) + b"\x00\x00\x00\x01\x01\x00"
    rows = [
        (f"gzip {len(bomb) // 1024} KB -> 1 GB, compacted", "rec-compacted", bomb),
        (f"gzip {len(bomb) // 1024} KB -> 1 GB, re-encoded", "rec-lz4", bomb),
        (f"zstd {len(tiny) / 1024:.1f} KB, 8M tiny records", "rec-tiny", tiny),
        ("random bytes labelled gzip", "rec-plain", _record_batch(rng.randbytes(1000), 1, 1)),
        ("claims 1,000,000 records, holds 1", "rec-plain", _record_batch(one, 1_000_000, 0)),
        ("garbage records", "rec-plain", _record_batch(rng.randbytes(1000), 1000, 0)),
    ]
    out = []
    with BlockingConnection(HOST, port) as c:
        for i, (name, topic, batch) in enumerate(rows):
            req = produce_request({(topic, 0): batch}, acks=1, timeout_ms=120_000)
            out.append((name, c.encode(ApiKey.PRODUCE, 9, req, i + 1)))
        part = make_request(
            ApiKey.LIST_OFFSETS, 7, "ListOffsetsPartition", partition_index=0, timestamp=0
        )
        t = make_request(ApiKey.LIST_OFFSETS, 7, "ListOffsetsTopic", name="rec-tiny",
                         partitions=(part,))  # fmt: skip
        lo = make_request(ApiKey.LIST_OFFSETS, 7, "ListOffsetsRequest", replica_id=-1,
                          isolation_level=0, topics=(t,))  # fmt: skip
        out.append(("ListOffsets by timestamp, tiny", c.encode(ApiKey.LIST_OFFSETS, 7, lo, 99)))
    return out


def _repeat_request(port: int, frame: bytes, ready: Any, stop: Any, results: Any) -> None:
    """The attacker: ``frame`` again and again, one at a time; (requests, last error)."""
    sent, error = 0, "none"
    with BlockingConnection(HOST, port) as conn:
        conn.sock.settimeout(300)
        ready.set()
        while not stop.is_set():
            conn.sock.sendall(frame)
            reply = conn.receive_frame()
            sent += 1
            if frame[4:6] == b"\x00\x00":  # Produce v9: first partition's error code
                _cid, pos = split_response(reply, True)
                pos += 1 + reply[pos + 1] - 1 + 1 + 1 + 4  # topics, name, partitions, index
                error = str(struct.unpack_from(">h", reply, pos)[0])
            else:
                error = "answered"
    results.put((sent, error))


def _peak_rss(pid: int, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        out.append(rss_mb(pid))
        time.sleep(0.02)


def record_attacks(seconds: float) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="samsa-abuse-") as tmp,
        SamsaBroker(Path(tmp) / "data") as broker,
    ):
        assert broker.pid is not None
        with BlockingConnection(HOST, broker.port) as c:
            assert create_topic(c, TOPIC, 1) == 0
            for name in ("rec-plain", "rec-tiny", "rec-compacted", "rec-lz4"):
                assert create_topic(c, name, 1) == 0
            for name, key, value in (("rec-compacted", "cleanup.policy", "compact"),
                                     ("rec-lz4", "compression.type", "lz4")):  # fmt: skip
                _set_topic_config(c, name, key, value)
        frames = _attack_frames(broker.port)
        normal = measure(broker.bootstrap, seconds)
        rows = [("none", normal, rss_mb(broker.pid), rss_mb(broker.pid), 0, "-")]
        ctx = multiprocessing.get_context("spawn")
        for name, frame in frames:
            base = rss_mb(broker.pid)
            ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
            attacker = ctx.Process(
                target=_repeat_request, args=(broker.port, frame, ready, stop, results)
            )
            samples: list[float] = []
            sampling = threading.Event()
            sampler = threading.Thread(target=_peak_rss, args=(broker.pid, sampling, samples))
            attacker.start()
            sampler.start()
            try:
                ready.wait(60)  # a spawned process takes a while to start on a busy machine
                time.sleep(ATTACK_LEAD_S)
                try:
                    latencies = measure(broker.bootstrap, seconds)
                except RuntimeError:  # a produce undelivered in 30 s: the broker stalled
                    latencies = [30_000.0]
            finally:
                stop.set()
                sent, error = results.get(timeout=600)
                attacker.join(30)
                sampling.set()
                sampler.join()
            rows.append((name, latencies, base, max(samples, default=base), sent, error))
        alive = broker.alive()
    print(f"well-behaved producer: confluent-kafka, acks=all, one record at a time, {seconds:.0f} s"
          " per row; the attacker repeats its request, waiting for each answer")  # fmt: skip
    print(f"{'attack':>34} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>8} {'RSS MB':>7} "
          f"{'peak':>6} {'sent':>5} {'error':>8}")  # fmt: skip
    for name, lat, base, peak, sent, error in rows:
        print(f"{name:>34} {percentile(lat, 50):7.2f} {percentile(lat, 99):7.2f} "
              f"{max(lat):8.1f} {base:7.0f} {peak:6.0f} {sent:5} {error:>8}")  # fmt: skip
    print(f"broker alive at the end: {alive}")


def _set_topic_config(conn: BlockingConnection, topic: str, key: str, value: str) -> None:
    v = 1
    cfg = make_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, "AlterableConfig", name=key,
                       config_operation=0, value=value)  # fmt: skip
    res = make_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, "AlterConfigsResource",
                       resource_type=2, resource_name=topic, configs=(cfg,))  # fmt: skip
    req = make_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, "IncrementalAlterConfigsRequest",
                       resources=(res,), validate_only=False)  # fmt: skip
    resp = conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, v, req)
    assert resp.responses[0].error_code == 0, resp


if __name__ == "__main__":
    main()
