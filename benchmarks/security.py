"""Produce throughput over SASL_SSL (SCRAM-SHA-512) and SSL against PLAINTEXT, same broker,
same run.

One samsa broker with three listeners (PLAINTEXT, SASL_SSL, SSL with a client certificate);
confluent-kafka (librdkafka, so the client is not the bottleneck) produces ``--records``
100-byte records, idempotent, acks=all, to a topic of 3 partitions, through each listener in
turn (PLAINTEXT, SASL_SSL, SSL, then SSL, SASL_SSL, PLAINTEXT, ...). Each row is the median of
``--repeat`` runs; the ratio is against PLAINTEXT. Certificates are made with openssl in a
temporary directory; everything listens on 127.0.0.1 and every run is bounded in time.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import HOST, SamsaBroker

VALUE = b"v" * 100
_LISTENER = re.compile(r"listener (\w+) \(\w+\) on 127\.0\.0\.1:(\d+)")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> None:
    _openssl(
        *"req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1".split(),
        "-subj",
        "/CN=bench CA",
        cwd=d,
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ext in (("broker", ["-extfile", "san.ext"]), ("client", [])):
        _openssl(
            *f"req -newkey rsa:2048 -nodes -keyout {name}.key -out {name}.csr".split(),
            "-subj",
            f"/CN={name}",
            cwd=d,
        )
        sign = f"x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1"
        _openssl(*sign.split(), "-out", f"{name}.crt", *ext, cwd=d)
    (d / "broker.pem").write_text((d / "broker.key").read_text() + (d / "broker.crt").read_text())


def produce(conf: dict[str, Any], topic: str, n: int, cap: float) -> dict[str, float]:
    from confluent_kafka import Producer

    p = Producer({**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    t0 = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, VALUE)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(cap)
    dt = time.perf_counter() - t0
    return {"records": n - left, "seconds": dt, "capped": float(left > 0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cap", type=float, default=60.0, help="seconds at most per run")
    ap.add_argument("--quick", action="store_true", help="20,000 records, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.records, args.repeat = 20_000, 1
    from confluent_kafka.admin import AdminClient, NewTopic

    with tempfile.TemporaryDirectory(prefix="samsa-bench-sec-") as tmp:
        d = Path(tmp)
        make_certs(d)
        data = d / "data"
        added = subprocess.run(
            [
                sys.executable,
                "-m",
                "samsa",
                *"users add bench --mechanism SCRAM-SHA-512".split(),
                "--password",
                "bench-pw",
                "--data-dir",
                str(data),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if added.returncode:
            print(added.stderr, file=sys.stderr)
            return 1
        overrides = {
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0,SSL://127.0.0.1:0",
            "ssl.keystore.location": str(d / "broker.pem"),
            "ssl.truststore.location": str(d / "ca.pem"),
            "ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        }
        with SamsaBroker(data, overrides) as broker:
            ports = {}
            deadline = time.monotonic() + 10
            while len(ports) < 3 and time.monotonic() < deadline:
                ports = {m[1]: int(m[2]) for m in map(_LISTENER.search, broker.lines) if m}
                time.sleep(0.05)
            confs: dict[str, dict[str, Any]] = {
                "PLAINTEXT": {"bootstrap.servers": f"{HOST}:{ports['PLAINTEXT']}"},
                "SASL_SSL": {
                    "bootstrap.servers": f"{HOST}:{ports['SASL_SSL']}",
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": "bench",
                    "sasl.password": "bench-pw",
                    "ssl.ca.location": str(d / "ca.pem"),
                },
                "SSL": {
                    "bootstrap.servers": f"{HOST}:{ports['SSL']}",
                    "security.protocol": "SSL",
                    "ssl.ca.location": str(d / "ca.pem"),
                    "ssl.certificate.location": str(d / "client.crt"),
                    "ssl.key.location": str(d / "client.key"),
                },
            }
            admin = AdminClient(confs["PLAINTEXT"])
            admin.create_topics([NewTopic("bench-sec", 3, 1)])["bench-sec"].result(30)
            produce(confs["PLAINTEXT"], "bench-sec", 5_000, args.cap)  # warm-up
            order = list(confs)
            results: dict[str, list[float]] = {name: [] for name in order}
            for r in range(args.repeat):
                for name in order if r % 2 == 0 else reversed(order):
                    res = produce(confs[name], "bench-sec", args.records, args.cap)
                    rate = res["records"] / res["seconds"]
                    results[name].append(rate)
                    capped = " (capped)" if res["capped"] else ""
                    print(f"  run {r + 1} {name:10s} {rate:10,.0f} records/s{capped}")
    base = statistics.median(results["PLAINTEXT"])
    print(f"\nproduce, {args.records:,} x 100 B, idempotent, acks=all, median of {args.repeat}")
    print(f"{'listener':12s} {'records/s':>12s} {'MB/s':>8s} {'vs PLAINTEXT':>14s}")
    for name in order:
        rate = statistics.median(results[name])
        print(f"{name:12s} {rate:12,.0f} {rate * 100 / 1e6:8.1f} {rate / base:13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
