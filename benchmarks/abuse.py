"""A well-behaved producer's latency while the broker is under abuse (issue 10 §3, issue 27).

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

Then, on a broker with a SASL_PLAINTEXT listener (issue 27 part 2: nothing unauthenticated
holds the broker), each attack from a fresh broker:

- **pre-auth frames**: 16 connections declare 13 MB frames before any handshake and push them;
  a confluent-kafka producer authenticated with SASL/PLAIN measures its latency meanwhile, and
  a new authenticated connection times its Metadata;
- **100 MB frame**: one connection sends a 100 MB frame before any handshake: the broker's
  peak RSS, and how long until it closes the connection;
- **silent sockets**: up to 2,000 connections opened and left silent: how many the broker
  took, and how many it still holds 8 s later;
- **wrong passwords**: 4 threads try PLAIN logins with a wrong password for 3 s: attempts/s;
- **unknown SCRAM user**: broker CPU per SCRAM exchange for a known and an unknown user, and
  whether the unknown user's salt is the same on two attempts;
- **100 MB user name**: broker log bytes written for one SCRAM attempt with that name.

    python benchmarks/abuse.py                    # ~2 min
    python benchmarks/abuse.py --seconds 3        # quicker
    python benchmarks/abuse.py --src DIR          # the broker from another source tree
    python benchmarks/abuse.py --before DIR       # and every row from DIR's broker too
    python benchmarks/abuse.py --records          # the record attacks below instead (~1 min)

Record attacks (issue 27, ``--records``): one attacker connection sends the same Produce (or
ListOffsets) again and again, waiting for each answer, while the well-behaved producer
measures; the broker's RSS is sampled every 20 ms. One row per attack: a 972 KB gzip batch
whose one record inflates to 1 GB (to a compacted topic, then to a topic whose
compression.type makes the broker re-encode it), a ~5 KB zstd batch of 8 million tiny records,
random bytes labelled gzip, a batch claiming 1,000,000 records holding one, garbage records, a
valid 0.9 MB uncompressed batch of 100,000 records of changing sizes, and ListOffsets by
timestamp over the topic the tiny records were sent to, and over a stored zstd batch of
200,000 records that inflates to ~60 MB (accepted: under message.max.inflated.bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cramjam
import crc32c
from _brokers import HOST, SamsaBroker
from confluent_kafka import Producer

from samsa.client._connection import BlockingConnection
from samsa.client._security import from_config
from samsa.protocol.framing import frame_request, split_response, uvarint
from samsa.protocol.messages import ApiKey, decode_response, encode_request, make_request
from samsa.protocol.records import Compression, NewRecord, build_batch
from samsa.testing import create_topic, produce_request, read_frame

TOPIC = "abuse"
HALF_FRAMES = 20
FRAME_SIZE = 99 * 1024 * 1024
FLOOD_REQUESTS = 100_000
SEND_CAP_S = 15.0  # attackers stop pushing bytes after this (they stay connected)
ATTACK_LEAD_S = 0.3
SASL_CLIENT = {
    "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "bob",
    "sasl.password": "pw",
}
LISTENER = re.compile(r"listener (\w+) \(\w+\) on 127\.0\.0\.1:(\d+)")
PREAUTH_SOCKETS = 16
PREAUTH_FRAME = 13 * 1024 * 1024
BIG_FRAME = 100 * 1024 * 1024 - 64  # just under socket.request.max.bytes
SILENT_MAX = 2000


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def measure(bootstrap: str, seconds: float, sasl: bool = False) -> list[float]:
    """Latency (ms) of each produce, one at a time, acks=all, for ``seconds``."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "socket.nagle.disable": True,
            **(SASL_CLIENT if sasl else {}),
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


def pcts(values: list[float]) -> str:
    return "/".join(f"{percentile(values, p):.2f}" for p in (50, 90, 99))


def flood_scenario(broker: SamsaBroker, seconds: float) -> dict[str, Any]:
    """The well-behaved producer, then the same during the flood and the stalled half-frames."""
    assert broker.pid is not None
    with BlockingConnection(HOST, broker.port) as c:
        assert create_topic(c, TOPIC, 1) == 0
        assert create_topic(c, "wide", 100) == 0
    normal = measure(broker.bootstrap, seconds)
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
        attacked = measure(broker.bootstrap, seconds)
        rss_after = rss_mb(broker.pid)
    finally:
        stop.set()
        sent, flood_frame = results.get(timeout=SEND_CAP_S + 30)
        attacker.join(30)
    half_sent = [v for k, v in sent.items() if k.startswith("half")]
    return {
        "normal": normal,
        "attacked": attacked,
        "rss": (rss_before, rss_attack, rss_after),
        "alive": broker.alive(),
        "flood_sent": sent.get("flood", 0) // flood_frame,
        "half_sent": half_sent,
    }


class LoggedBroker(SamsaBroker):
    """A samsa broker that counts the bytes of its log."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_bytes = 0

    def _on_line(self, line: str) -> None:
        self.log_bytes += len(line) + 1
        super()._on_line(line[:2000])

    def listener_port(self, name: str) -> int:
        for line in self.lines:
            m = LISTENER.search(line)
            if m and m[1] == name:
                return int(m[2])
        raise RuntimeError(f"no {name} listener in the log")


@contextlib.contextmanager
def sasl_broker(tmp: Path, src: str | None) -> Iterator[LoggedBroker]:
    """A broker with a PLAINTEXT and a SASL_PLAINTEXT listener: PLAIN user bob/pw, SCRAM-SHA-256
    user alice (added before its start, with ``samsa users``)."""
    data = tmp / "data"
    users = tmp / "plain-users"
    users.write_text("bob=pw\n")
    env = {**os.environ, **({"PYTHONPATH": str(Path(src).resolve() / "src")} if src else {})}
    subprocess.run(
        [sys.executable, "-m", "samsa", "users", "add", "alice", "--password", "pw",
         "--mechanism", "SCRAM-SHA-256", "--data-dir", str(data)],
        check=True, capture_output=True, env=env, timeout=60,
    )  # fmt: skip
    broker = LoggedBroker(
        data,
        {
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "sasl.plain.users.file": str(users),
        },
        src=Path(src) if src else None,
    )
    with broker:
        yield broker


def _call(sock: socket.socket, api_key: int, version: int, entity: Any) -> Any:
    body = encode_request(api_key, version, entity)
    sock.sendall(frame_request(api_key, version, 1, "abuse", body, True))
    frame = read_frame(sock)
    _cid, offset = split_response(frame, True)
    return decode_response(api_key, version, frame, offset)


def _sasl(sock: socket.socket, mechanism: str, token: bytes) -> Any:
    hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism=mechanism)
    body = encode_request(ApiKey.SASL_HANDSHAKE, 1, hs)
    sock.sendall(frame_request(ApiKey.SASL_HANDSHAKE, 1, 1, "abuse", body, False))
    read_frame(sock)
    auth = make_request(ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=token)
    return _call(sock, ApiKey.SASL_AUTHENTICATE, 2, auth)


def admin_metadata_ms(port: int) -> float:
    """A new authenticated connection: SASL/PLAIN, then Metadata; ms for it all."""
    start = time.perf_counter()
    with BlockingConnection(HOST, port, security=from_config(SASL_CLIENT), timeout=60) as c:
        meta = make_request(ApiKey.METADATA, 1, "MetadataRequest", topics=None)
        c.request(ApiKey.METADATA, 1, meta)
    return (time.perf_counter() - start) * 1000


def _closed_within(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def preauth_scenario(tmp: Path, src: str | None, seconds: float) -> dict[str, Any]:
    with sasl_broker(tmp, src) as broker:
        assert broker.pid is not None
        sasl_port = broker.listener_port("SASL_PLAINTEXT")
        with BlockingConnection(HOST, broker.port) as c:
            assert create_topic(c, TOPIC, 1) == 0
        bootstrap = f"{HOST}:{sasl_port}"
        normal = measure(bootstrap, seconds, sasl=True)
        rss_before = rss_mb(broker.pid)
        stop = threading.Event()
        frame = PREAUTH_FRAME.to_bytes(4, "big") + bytes(PREAUTH_FRAME)
        threads = [
            threading.Thread(target=_push, args=(sasl_port, frame, stop), daemon=True)
            for _ in range(PREAUTH_SOCKETS)
        ]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            admin_ms = admin_metadata_ms(sasl_port)
            attacked = measure(bootstrap, seconds, sasl=True)
            rss_attack = rss_mb(broker.pid)
        finally:
            stop.set()
            for t in threads:
                t.join(SEND_CAP_S + 5)
    return {
        "normal": normal,
        "attacked": attacked,
        "admin_ms": admin_ms,
        "rss": (rss_before, rss_attack),
    }


def big_frame_scenario(tmp: Path, src: str | None) -> dict[str, Any]:
    with sasl_broker(tmp, src) as broker:
        assert broker.pid is not None
        pid = broker.pid
        port = broker.listener_port("SASL_PLAINTEXT")
        peak = rss_mb(pid)
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.05):
                peak = max(peak, rss_mb(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        data = memoryview(BIG_FRAME.to_bytes(4, "big") + bytes(BIG_FRAME))
        start = time.monotonic()
        closed_s = None
        with socket.create_connection((HOST, port)) as sock:
            sock.settimeout(1)
            sent = 0
            try:
                while sent < len(data) and time.monotonic() - start < SEND_CAP_S:
                    with contextlib.suppress(TimeoutError):
                        sent += sock.send(data[sent : sent + (1 << 20)])
            except OSError:
                pass
            if _closed_within(sock, 10):
                closed_s = time.monotonic() - start
        time.sleep(0.5)
        done.set()
        sampler.join()
    return {"peak_rss": peak, "sent_mb": sent / 2**20, "closed_s": closed_s}


def silent_scenario(tmp: Path, src: str | None) -> dict[str, Any]:
    with sasl_broker(tmp, src) as broker:
        port = broker.listener_port("SASL_PLAINTEXT")
        socks: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 10
            while len(socks) < SILENT_MAX and time.monotonic() < deadline:
                socks.append(socket.create_connection((HOST, port), timeout=5))
            time.sleep(1.0)
            taken = sum(not _closed_within(s, 0.001) for s in socks)
            time.sleep(7.0)
            held = sum(not _closed_within(s, 0.001) for s in socks)
        finally:
            for s in socks:
                s.close()
    return {"opened": len(socks), "taken": taken, "held_after_8s": held}


def password_scenario(tmp: Path, src: str | None, seconds: float = 3.0) -> dict[str, Any]:
    with sasl_broker(tmp, src) as broker:
        port = broker.listener_port("SASL_PLAINTEXT")
        counts = [0] * 4
        end = time.monotonic() + seconds

        def guess(i: int) -> None:
            while time.monotonic() < end:
                with socket.create_connection((HOST, port), timeout=10) as sock:
                    if _sasl(sock, "PLAIN", b"\0bob\0guess").error_code:
                        counts[i] += 1

        threads = [threading.Thread(target=guess, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 30)
    return {"per_s": sum(counts) / seconds}


def scram_scenario(tmp: Path, src: str | None, attempts: int = 200) -> dict[str, Any]:
    with sasl_broker(tmp, src) as broker:
        port = broker.listener_port("SASL_PLAINTEXT")

        def attempt(user: str) -> str:
            with socket.create_connection((HOST, port), timeout=10) as sock:
                first = _sasl(sock, "SCRAM-SHA-256", f"n,,n={user},r=abc".encode())
                reply = first.auth_bytes.decode()
                attrs = dict(p.split("=", 1) for p in reply.split(","))
                final = f"c=biws,r={attrs['r']},p=AAAA".encode()
                auth = make_request(
                    ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=final
                )
                _call(sock, ApiKey.SASL_AUTHENTICATE, 2, auth)
                return attrs["s"]

        # The broker's own background work is taken out: failed attempts now wait out a delay,
        # so the same attempts take longer and an idle broker's CPU would count against them.
        idle_cpu, idle_wall = broker.cpu_seconds(), time.monotonic()
        time.sleep(3.0)
        idle_rate = (broker.cpu_seconds() - idle_cpu) / (time.monotonic() - idle_wall)
        cpu: dict[str, float] = {}
        salts: list[str] = []
        for user in ("alice", "mallory"):
            before, wall = broker.cpu_seconds(), time.monotonic()
            for _ in range(attempts):
                salt = attempt(user)
                if user == "mallory" and len(salts) < 2:
                    salts.append(salt)
            used = broker.cpu_seconds() - before - idle_rate * (time.monotonic() - wall)
            cpu[user] = used * 1000 / attempts
    return {"known_ms": cpu["alice"], "unknown_ms": cpu["mallory"], "stable": salts[0] == salts[1]}


def log_scenario(tmp: Path, src: str | None) -> dict[str, Any]:
    with sasl_broker(tmp, src) as broker:
        port = broker.listener_port("SASL_PLAINTEXT")
        before = broker.log_bytes
        name = "m" * (BIG_FRAME - 200)
        with socket.create_connection((HOST, port), timeout=60) as sock:
            with contextlib.suppress(OSError, KeyError, ValueError):
                attrs = dict(
                    p.split("=", 1)
                    for p in _sasl(sock, "SCRAM-SHA-256", f"n,,n={name},r=abc".encode())
                    .auth_bytes.decode()
                    .split(",")
                )
                final = f"c=biws,r={attrs['r']},p=AAAA".encode()
                auth = make_request(
                    ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=final
                )
                _call(sock, ApiKey.SASL_AUTHENTICATE, 2, auth)
            _closed_within(sock, 10)
        time.sleep(1.0)
        return {"log_bytes": broker.log_bytes - before}


def run_all(src: str | None, seconds: float, only: set[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    scenarios: dict[str, Callable[[Path], dict[str, Any]]] = {
        "flood": lambda tmp: _flood(tmp, src, seconds),
        "preauth": lambda tmp: preauth_scenario(tmp, src, seconds),
        "bigframe": lambda tmp: big_frame_scenario(tmp, src),
        "silent": lambda tmp: silent_scenario(tmp, src),
        "passwords": lambda tmp: password_scenario(tmp, src),
        "scram": lambda tmp: scram_scenario(tmp, src),
        "log": lambda tmp: log_scenario(tmp, src),
    }
    for name, run in scenarios.items():
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"samsa-abuse-{name}-") as tmp:
            out[name] = run(Path(tmp))
        print(f"  ({src or 'this tree'}: {name} done)", file=sys.stderr)
    return out


def _flood(tmp: Path, src: str | None, seconds: float) -> dict[str, Any]:
    with SamsaBroker(tmp / "data", src=Path(src) if src else None) as broker:
        return flood_scenario(broker, seconds)


def report(label: str, r: dict[str, Any], seconds: float) -> None:
    print(f"== {label}")
    if "flood" in r:
        f = r["flood"]
        n, a = f["normal"], f["attacked"]
        print(
            f"flood + {HALF_FRAMES} stalled 99 MB half-frames: producer p50/p90/p99 ms "
            f"normal {pcts(n)}, attacked {pcts(a)}; ratio p90 "
            f"{percentile(a, 90) / percentile(n, 90):.2f}x, p99 "
            f"{percentile(a, 99) / percentile(n, 99):.2f}x; max {max(n):.1f} / {max(a):.1f} ms; "
            f"RSS {f['rss'][0]:.0f} / {f['rss'][1]:.0f} / {f['rss'][2]:.0f} MB "
            f"(before / {ATTACK_LEAD_S:.1f} s in / end); flood sent {f['flood_sent']:,} "
            f"requests, half-frames {sum(f['half_sent']) / 2**20:,.0f} MB; "
            f"alive {f['alive']}"
        )
    if "preauth" in r:
        p = r["preauth"]
        n, a = p["normal"], p["attacked"]
        print(
            f"{PREAUTH_SOCKETS} unauthenticated 13 MB frames: SASL producer p50/p90/p99 ms normal "
            f"{pcts(n)}, attacked {pcts(a)}; new admin's SASL login + Metadata "
            f"{p['admin_ms']:.0f} ms; RSS {p['rss'][0]:.0f} / {p['rss'][1]:.0f} MB"
        )
    if "bigframe" in r:
        b = r["bigframe"]
        closed = "not closed" if b["closed_s"] is None else f"closed after {b['closed_s']:.2f} s"
        print(
            f"100 MB frame before authentication: peak RSS {b['peak_rss']:.0f} MB, "
            f"{b['sent_mb']:.0f} MB sent, {closed}"
        )
    if "silent" in r:
        s = r["silent"]
        print(
            f"silent sockets: {s['opened']:,} opened, {s['taken']:,} taken by the broker, "
            f"{s['held_after_8s']:,} still held 8 s later"
        )
    if "passwords" in r:
        print(f"wrong passwords (4 threads): {r['passwords']['per_s']:.0f} attempts/s")
    if "scram" in r:
        c = r["scram"]
        print(
            f"SCRAM exchange, broker CPU: known user {c['known_ms']:.2f} ms, unknown user "
            f"{c['unknown_ms']:.2f} ms; unknown user's salt stable: {c['stable']}"
        )
    if "log" in r:
        print(f"one SCRAM attempt with a 100 MB user name: {r['log']['log_bytes']:,} log bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--src", help="run the broker from this source tree's src/")
    parser.add_argument("--before", help="also run every scenario on this tree's broker")
    parser.add_argument("--only", help="comma-separated scenarios: flood,preauth,bigframe,"
                        "silent,passwords,scram,log")  # fmt: skip
    parser.add_argument("--records", action="store_true", help="the record attacks instead")
    args = parser.parse_args()
    if args.records:
        if args.src:
            os.environ["PYTHONPATH"] = str(Path(args.src).resolve() / "src")
        record_attacks(args.seconds)
        return
    only = set(args.only.split(",")) if args.only else None
    results = []
    if args.before:
        results.append((f"before ({args.before})", run_all(args.before, args.seconds, only)))
    results.append((f"after ({args.src or 'this tree'})", run_all(args.src, args.seconds, only)))
    print(f"well-behaved producer: confluent-kafka, acks=all, one record at a time, "
          f"{args.seconds:.0f} s per phase")  # fmt: skip
    for label, r in results:
        report(label, r, args.seconds)


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


def _varied(rng: random.Random) -> bytes:
    """A valid uncompressed batch under max.message.bytes whose records keep changing size
    (values of 0-2 bytes): read one by one, past what the event loop reads (then a worker)."""
    records = [NewRecord(value=rng.randbytes(rng.randrange(3))) for _ in range(100_000)]
    return build_batch(records, now_ms=int(time.time() * 1000))


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
        ("uncompressed 0.9 MB, 100,000 records of changing sizes", "rec-plain", _varied(rng)),
    ]
    out = []
    with BlockingConnection(HOST, port) as c:
        for i, (name, topic, batch) in enumerate(rows):
            req = produce_request({(topic, 0): batch}, acks=1, timeout_ms=120_000)
            out.append((name, c.encode(ApiKey.PRODUCE, 9, req, i + 1)))
        out.append(("ListOffsets by timestamp, tiny", _list_offsets(c, "rec-tiny", 0, 99)))
        # A batch that was accepted (within message.max.inflated.bytes) and is searched whole:
        # its last record is the first at or after the timestamp asked for.
        size, stored, last_ts = _store_inflating_batch(c, "rec-stored")
        out.append((f"ListOffsets by time, zstd {size // 1024} KB -> {stored >> 20} MB",
                    _list_offsets(c, "rec-stored", last_ts, 100)))  # fmt: skip
    return out


def _list_offsets(c: BlockingConnection, topic: str, timestamp: int, cid: int) -> bytes:
    part = make_request(
        ApiKey.LIST_OFFSETS, 7, "ListOffsetsPartition", partition_index=0, timestamp=timestamp
    )
    t = make_request(ApiKey.LIST_OFFSETS, 7, "ListOffsetsTopic", name=topic,
                     partitions=(part,))  # fmt: skip
    lo = make_request(ApiKey.LIST_OFFSETS, 7, "ListOffsetsRequest", replica_id=-1,
                      isolation_level=0, topics=(t,))  # fmt: skip
    return c.encode(ApiKey.LIST_OFFSETS, 7, lo, cid)


def _store_inflating_batch(c: BlockingConnection, topic: str) -> tuple[int, int, int]:
    """Produce one zstd batch of 200,000 records of 300 zero bytes (~60 MB inflated, under
    the 64 MiB bound) with timestamps 1 ms apart; (its size, inflated bytes, last timestamp)."""
    n = 200_000
    first = int(time.time() * 1000) - n
    records = [NewRecord(value=bytes(300), timestamp=first + i) for i in range(n)]
    batch = build_batch(records, compression=Compression.ZSTD, now_ms=first)
    req = produce_request({(topic, 0): batch}, acks=1, timeout_ms=60_000)
    resp = c.request(ApiKey.PRODUCE, 9, req)
    assert resp.responses[0].partition_responses[0].error_code == 0, resp
    return len(batch), n * 306, first + n - 1


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
            for name in ("rec-plain", "rec-tiny", "rec-compacted", "rec-lz4", "rec-stored"):
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
