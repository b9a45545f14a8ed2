"""samsa's Python client against confluent-kafka (librdkafka), on the same samsa broker, same run.

Rows (100-byte values, 8-byte keys, one topic of 4 partitions on a fresh samsa broker):

- producer, per record: ``produce()`` in a loop, then ``flush()``; both idempotent, acks=all.
  Again with a delivery callback per record (``on_delivery``, served in ``flush()``/``poll()``
  by both clients; it counts the records acknowledged), and again with samsa's ``batch.size``
  at 1,000,000 bytes (librdkafka's default; samsa's is Java's 16 KB).
- producer, columnar: ``Producer.produce_batch`` of Arrow columns (100,000 rows a call; samsa
  only; shown when the client has it), against confluent-kafka's per-record producer; with
  samsa's default ``batch.size`` (16 KB, Java's) and with 1,000,000 bytes (librdkafka's
  default, which the confluent-kafka row runs with).
- consumer: assign all partitions from the beginning, ``consume()`` until every record is read.
- consumer, Arrow: ``Consumer.consume_arrow`` (samsa only; shown when the client has it).
- the consumer rows again against confluent-kafka with ``fetch.queue.backoff.ms=0``: the
  default (1000 ms) makes librdkafka wait that long to fetch again once its prefetch queue
  was full, which caps it on a fast broker; the first rows use librdkafka's defaults.

Each measurement runs in a fresh child process (this script with ``--child``) so peak RSS is
the client's own; the clients alternate (samsa, confluent-kafka, then confluent-kafka, samsa,
...) and each row reports the median of ``--repeat`` runs. Every run is bounded in time
(``--cap`` seconds); a capped run is reported as such and its records/s counts only what was
delivered.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import SamsaBroker

VALUE = b"v" * 100


def _key(i: int) -> bytes:
    return i.to_bytes(8, "big")


# --- children: one measurement each, a JSON line on stdout ---------------------------------


def _produce_samsa(
    bootstrap: str, topic: str, n: int, cap: float, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    from samsa.client import Producer

    p = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", **(extra or {})}
    )
    try:
        t0 = time.perf_counter()
        for i in range(n):
            p.produce(topic, VALUE, _key(i))
        left = p.flush(cap)
        dt = time.perf_counter() - t0
    finally:
        p.close()
    return {"records": n - left, "seconds": dt, "capped": left > 0}


def _produce_big_samsa(bootstrap: str, topic: str, n: int, cap: float) -> dict[str, Any]:
    return _produce_samsa(bootstrap, topic, n, cap, {"batch.size": 1_000_000})


def _produce_cb_samsa(bootstrap: str, topic: str, n: int, cap: float) -> dict[str, Any]:
    from samsa.client import Producer

    acked = 0

    def on_delivery(err: Any, md: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    try:
        t0 = time.perf_counter()
        for i in range(n):
            p.produce(topic, VALUE, _key(i), on_delivery=on_delivery)
        p.flush(cap)
        dt = time.perf_counter() - t0
    finally:
        p.close()
    return {"records": acked, "seconds": dt, "capped": acked < n}


def _produce_batch_samsa(
    bootstrap: str, topic: str, n: int, cap: float, batch_size: int | None = None
) -> dict[str, Any]:

    from samsa.client import Producer

    if not hasattr(Producer, "produce_batch"):
        return {"missing": "Producer.produce_batch"}
    # The columnar user holds Arrow columns; they (and the imports, as confluent_kafka's
    # import for its row) are made before the clock starts.
    from samsa.protocol import columnar  # noqa: F401

    chunk = 100_000
    # From buffers: pa.array on Python objects would import pandas into this process (the
    # row's peak RSS is meant to be the client's).
    values = _binary_column([VALUE] * chunk)
    keys = _binary_column([_key(i) for i in range(chunk)])
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
    }
    if batch_size is not None:
        config["batch.size"] = batch_size
    p = Producer(config)
    try:
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            p.produce_batch(topic, values[:m], keys[:m])
        left = p.flush(cap)
        dt = time.perf_counter() - t0
    finally:
        p.close()
    return {"records": n - left, "seconds": dt, "capped": left > 0}


def _binary_column(rows: list[bytes]) -> Any:
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(rows) + 1, np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    return pa.Array.from_buffers(
        pa.binary(), len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(rows))]
    )


def _produce_batch_big_samsa(bootstrap: str, topic: str, n: int, cap: float) -> dict[str, Any]:
    return _produce_batch_samsa(bootstrap, topic, n, cap, batch_size=1_000_000)


def _produce_ck(bootstrap: str, topic: str, n: int, cap: float) -> dict[str, Any]:
    import confluent_kafka

    p = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, VALUE, _key(i))
                break
            except BufferError:  # librdkafka's queue is full: serve callbacks, then retry
                p.poll(0.01)
    left = p.flush(cap)
    dt = time.perf_counter() - t0
    return {"records": n - left, "seconds": dt, "capped": left > 0}


def _produce_cb_ck(bootstrap: str, topic: str, n: int, cap: float) -> dict[str, Any]:
    import confluent_kafka

    acked = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal acked
        if err is None:
            acked += 1

    p = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, VALUE, _key(i), on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(cap)
    dt = time.perf_counter() - t0
    return {"records": acked, "seconds": dt, "capped": acked < n}


def _consume_samsa(bootstrap: str, topic: str, n: int, cap: float) -> dict[str, Any]:
    from samsa.client import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    try:
        parts = [TopicPartition(topic, p) for p in range(_partitions(topic))]
        c.assign(parts)
        c.seek_to_beginning(*parts)
        got = 0
        t0 = time.perf_counter()
        while got < n and time.perf_counter() - t0 < cap:
            got += len(c.consume(10_000, 1.0))
        dt = time.perf_counter() - t0
    finally:
        c.close()
    return {"records": got, "seconds": dt, "capped": got < n}


def _consume_arrow_samsa(bootstrap: str, topic: str, n: int, cap: float) -> dict[str, Any]:
    from samsa.client import Consumer, TopicPartition

    if not hasattr(Consumer, "consume_arrow"):
        return {"missing": "Consumer.consume_arrow"}
    c = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    try:
        parts = [TopicPartition(topic, p) for p in range(_partitions(topic))]
        c.assign(parts)
        c.seek_to_beginning(*parts)
        got = 0
        t0 = time.perf_counter()
        while got < n and time.perf_counter() - t0 < cap:
            got += c.consume_arrow(100_000, 1.0).num_rows
        dt = time.perf_counter() - t0
    finally:
        c.close()
    return {"records": got, "seconds": dt, "capped": got < n}


def _consume_ck(bootstrap: str, topic: str, n: int, cap: float, **extra: Any) -> dict[str, Any]:
    import confluent_kafka

    c = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False, **extra}
    )
    try:
        c.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(_partitions(topic))
            ]
        )
        got = 0
        t0 = time.perf_counter()
        while got < n and time.perf_counter() - t0 < cap:
            msgs = c.consume(10_000, 1.0)
            for m in msgs:
                if m.error() is not None:
                    raise RuntimeError(str(m.error()))
            got += len(msgs)
        dt = time.perf_counter() - t0
    finally:
        c.close()
    return {"records": got, "seconds": dt, "capped": got < n}


def _consume_ck_nobackoff(bootstrap: str, topic: str, n: int, cap: float) -> dict[str, Any]:
    # librdkafka's fetch.queue.backoff.ms (default 1 s) stalls fetching once its prefetch
    # queue is full; 0 lets it fetch again as soon as the application takes messages.
    return _consume_ck(bootstrap, topic, n, cap, **{"fetch.queue.backoff.ms": 0})


PARTITIONS = 4
BASE = "@base"  # a samsa role run with --base-src's package


def _partitions(_topic: str) -> int:
    return PARTITIONS


CHILDREN = {
    "produce-samsa": _produce_samsa,
    "produce-cb-samsa": _produce_cb_samsa,
    "produce-cb-ck": _produce_cb_ck,
    "produce-big-samsa": _produce_big_samsa,
    "produce-batch-samsa": _produce_batch_samsa,
    "produce-batch-big-samsa": _produce_batch_big_samsa,
    "produce-ck": _produce_ck,
    "consume-samsa": _consume_samsa,
    "consume-arrow-samsa": _consume_arrow_samsa,
    "consume-ck": _consume_ck,
    "consume-ck-nobackoff": _consume_ck_nobackoff,
}


def child(role: str, bootstrap: str, topic: str, n: int, cap: float) -> None:
    out = CHILDREN[role](bootstrap, topic, n, cap)
    out["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(out), flush=True)


def _peak_rss_mb() -> float:
    """This process's peak RSS. Linux's VmHWM belongs to the address space, so it starts
    afresh at exec; ru_maxrss does not (a child forked from a large parent reports at least
    the parent's size), hence only the fallback."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# A fresh interpreter: import the client, make a producer (connected) and close it.
STARTUP = {
    "samsa": (
        "from samsa.client import Producer\np = Producer({'bootstrap.servers': BS})\np.close()\n"
    ),
    "confluent-kafka": (
        "import confluent_kafka\n"
        "p = confluent_kafka.Producer({'bootstrap.servers': BS})\n"
        "p.list_topics(timeout=10)\n"
        "p.flush(10)\n"
    ),
}
_STARTUP_RUN = """
import json, sys, time
t0 = time.perf_counter()
BS = sys.argv[1]
exec(sys.argv[2])
dt = time.perf_counter() - t0
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")]
print(json.dumps({"seconds": dt, "peak_rss_mb": hwm[0] / 1024,
                  "pandas": "pandas" in sys.modules, "pyarrow": "pyarrow" in sys.modules}))
"""


def startup(client: str, bootstrap: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _STARTUP_RUN, bootstrap, STARTUP[client]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"start-up of {client} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --- parent ---------------------------------------------------------------------------------


def run_child(
    role: str, bootstrap: str, topic: str, n: int, cap: float, src: str | None = None
) -> dict[str, Any]:
    """One measurement in a fresh process; ``src``: import samsa from that source tree."""
    cmd = [sys.executable, __file__, "--child", role, "--bootstrap", bootstrap, "--topic", topic,
           "--records", str(n), "--cap", str(cap)]  # fmt: skip
    env = None
    if src is not None:
        env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cap + 120, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{role} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def create_topic(bootstrap: str, topic: str) -> None:
    from samsa.client import Admin

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, PARTITIONS)


def fmt_rate(r: float) -> str:
    return f"{r / 1e6:.2f}M" if r >= 1e6 else f"{r / 1e3:.0f}k"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cap", type=float, default=60.0, help="seconds at most per run")
    ap.add_argument(
        "--only", choices=("producer", "consumer"), help="run only these rows (both clients)"
    )
    ap.add_argument("--match", help="run only the rows whose name contains this text")
    ap.add_argument(
        "--base-src",
        help="also run samsa's rows with the samsa package of this source tree (the src/ of "
        "another checkout, e.g. main's), alternated with the others: before/after in one run",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.bootstrap, args.topic, args.records, args.cap)
        return 0

    n = args.records
    rows = [
        # (row, samsa role, confluent-kafka role, what the samsa role reads or writes)
        ("producer, per record", "produce-samsa", "produce-ck"),
        ("producer, per record, on_delivery", "produce-cb-samsa", "produce-cb-ck"),
        ("producer, per record, batch.size 1 MB", "produce-big-samsa", "produce-ck"),
        ("producer, columnar (produce_batch)", "produce-batch-samsa", "produce-ck"),
        ("producer, columnar, batch.size 1 MB", "produce-batch-big-samsa", "produce-ck"),
        ("consumer, consume()", "consume-samsa", "consume-ck"),
        ("consumer, consume_arrow()", "consume-arrow-samsa", "consume-ck"),
        (
            "consumer, consume() [ck: fetch.queue.backoff.ms=0]",
            "consume-samsa",
            "consume-ck-nobackoff",
        ),
        (
            "consumer, consume_arrow() [ck: fetch.queue.backoff.ms=0]",
            "consume-arrow-samsa",
            "consume-ck-nobackoff",
        ),
    ]
    if args.only:
        rows = [r for r in rows if r[0].startswith(args.only)]
    if args.match:
        rows = [r for r in rows if args.match in r[0]]
    results: dict[str, list[dict[str, Any]]] = {}
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="samsa-bench-client-") as tmp:
        with SamsaBroker(Path(tmp) / "data") as broker:
            bs = broker.bootstrap
            # Both consumers read one topic, filled once by confluent-kafka: the same bytes.
            read_topic = "read"
            if any(sr.startswith("consume") for _row, sr, _cr in rows):
                create_topic(bs, read_topic)
                fill = run_child("produce-ck", bs, read_topic, n, args.cap)
                if fill["capped"]:
                    raise RuntimeError("could not fill the read topic")
            starts: dict[str, list[dict[str, Any]]] = {}
            for _ in range(args.repeat):
                for client in STARTUP:
                    starts.setdefault(client, []).append(startup(client, bs))
            seq = 0
            for rep in range(args.repeat):
                for _row, sr, cr in rows:
                    order = [sr, cr] if args.base_src is None else [sr, sr + BASE, cr]
                    if rep % 2:
                        order.reverse()
                    for key in order:
                        role = key.removesuffix(BASE)
                        if role.startswith("produce"):
                            seq += 1
                            topic = f"w{seq}"
                            create_topic(bs, topic)
                        else:
                            topic = read_topic
                        if role.startswith("consume") and len(results.get(key, [])) > rep:
                            continue  # a reader in two rows runs once per repeat
                        if key in results and results[key] and results[key][0].get("missing"):
                            continue
                        src = args.base_src if key.endswith(BASE) else None
                        run = run_child(role, bs, topic, n, args.cap, src)
                        results.setdefault(key, []).append(run)
    total = time.perf_counter() - t_start

    def summary(role: str) -> tuple[float, float, bool] | str:
        runs = results.get(role, [])
        if runs and runs[0].get("missing"):
            return f"n/a ({runs[0]['missing']} not built yet)"
        rates = [r["records"] / r["seconds"] for r in runs]
        return (statistics.median(rates), max(r["peak_rss_mb"] for r in runs),
                any(r["capped"] for r in runs))  # fmt: skip

    print(
        f"\nsamsa client vs confluent-kafka {_ck_version()}, one samsa broker, {n:,} "
        f"records of 100 B (8 B keys), 4 partitions, median of {args.repeat}; "
        f"{os.cpu_count()} cores, load average {load_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end\n"
    )
    print("| path | samsa rec/s | samsa MB/s | samsa peak RSS | confluent-kafka rec/s "
          "| ck peak RSS | samsa / ck |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row, sr, cr in rows:
        s, c = summary(sr), summary(cr)
        assert not isinstance(c, str)
        if isinstance(s, str):
            print(f"| {row} | {s} | | | {fmt_rate(c[0])} | {c[1]:.0f} MB | |")
            continue
        capped = " (capped)" if s[2] or c[2] else ""
        print(f"| {row} | {fmt_rate(s[0])} | {s[0] * 100 / 1e6:.1f} | {s[1]:.0f} MB "
              f"| {fmt_rate(c[0])} | {c[1]:.0f} MB | {s[0] / c[0]:.2f}{capped} |")  # fmt: skip
    if args.base_src is not None:
        print(f"\nsamsa from {args.base_src} (base), same broker, alternated with the above:\n")
        print("| path | samsa rec/s | base rec/s | samsa / base | samsa / ck | base / ck "
              "| samsa peak RSS | base peak RSS |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        for row, sr, cr in rows:
            s, b, c = summary(sr), summary(sr + BASE), summary(cr)
            if isinstance(s, str) or isinstance(b, str) or isinstance(c, str):
                continue
            print(f"| {row} | {fmt_rate(s[0])} | {fmt_rate(b[0])} | {s[0] / b[0]:.2f} "
                  f"| {s[0] / c[0]:.2f} | {b[0] / c[0]:.2f} | {s[1]:.0f} MB "
                  f"| {b[1]:.0f} MB |")  # fmt: skip
    print(f"\n(total {total:.0f} s; each run in its own process; MB/s counts record values)")
    print("\nStart-up, a fresh interpreter: import, a producer connected, closed (median):")
    for client, runs in starts.items():
        sec = statistics.median(r["seconds"] for r in runs)
        rss = statistics.median(r["peak_rss_mb"] for r in runs)
        loaded = [m for m in ("pyarrow", "pandas") if runs[-1].get(m)]
        print(f"- {client}: {sec:.2f} s, peak RSS {rss:.0f} MB"
              f"{' (loads ' + ', '.join(loaded) + ')' if loaded else ''}")  # fmt: skip
    return 0


def _ck_version() -> str:
    import confluent_kafka

    return f"{confluent_kafka.version()} (librdkafka {confluent_kafka.libversion()[0]})"


if __name__ == "__main__":
    sys.exit(main())
