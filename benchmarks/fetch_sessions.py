"""Fetch sessions (KIP-227): the bytes a consumer of 1,000 partitions sends, with and without.

One samsa broker, one topic of ``--partitions`` partitions holding one record each. Each run
starts a samsa consumer assigned every partition from the beginning; while it reads, a
producer writes ``--rate`` records per second for ``--seconds`` seconds, each to a partition
drawn from a seeded sequence (the same in every run), so most partitions have nothing new in
most rounds, as for a consumer of many quiet partitions. The run ends when the consumer has
read every record (checked: each exactly once). Runs alternate between the consumer as it
is (sessions: a full Fetch, then incremental ones naming only partitions whose offset moved)
and the same consumer made sessionless (every Fetch names every partition: what it sent
before sessions, and what librdkafka sends). Counted in the consumer's process: the bytes
of Fetch request frames it wrote and of Fetch response frames it read.

    python benchmarks/fetch_sessions.py               # 1,000 partitions, 2 runs each (~1 min)
    python benchmarks/fetch_sessions.py --quick       # smoke run (< 30 s)

Everything listens on 127.0.0.1 on ports picked at run time; data goes to a temporary
directory removed at the end; the broker is stopped whatever happens.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import SamsaBroker

import samsa.client._aconn as aconn
import samsa.client._consumer as consumer_mod
from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.client._fetch_session import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchPlan,
    FetchSessionHandler,
)
from samsa.protocol.messages import ApiKey


class Sessionless(FetchSessionHandler):
    """Every request full and sessionless (session 0, epoch -1)."""

    def build(self, wanted: Mapping[tuple[str, int], tuple[int, int, int]]) -> FetchPlan:
        self.full_requests += 1
        return FetchPlan(INVALID_SESSION_ID, FINAL_EPOCH, dict(wanted))

    def handle_response(self, error_code: int, session_id: int) -> bool:
        return True

    def handle_error(self) -> None:
        pass


@dataclass
class Counts:
    requests: int = 0
    request_bytes: int = 0
    responses: int = 0
    response_bytes: int = 0


COUNTS = Counts()


def _install_counters() -> None:
    """Count Fetch frames where the consumer's connections frame and dispatch them."""
    frame_request = aconn.frame_request
    dispatch = aconn.AsyncConnection._dispatch

    def counting_frame(api_key: int, *args: Any, **kw: Any) -> bytes:
        data = frame_request(api_key, *args, **kw)
        if api_key == ApiKey.FETCH:
            COUNTS.requests += 1
            COUNTS.request_bytes += len(data)
        return data

    def counting_dispatch(self: Any, frame: bytes) -> None:
        if self._pending and next(iter(self._pending.values()))[0] == ApiKey.FETCH:
            COUNTS.responses += 1
            COUNTS.response_bytes += len(frame) + 4
        dispatch(self, frame)

    aconn.frame_request = counting_frame  # type: ignore[assignment]
    aconn.AsyncConnection._dispatch = counting_dispatch  # type: ignore[method-assign]


def _produce(
    bootstrap: str, topic: str, targets: list[int], rate: float, stop: threading.Event
) -> None:
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": "0"}) as p:
        start = time.monotonic()
        for i, part in enumerate(targets):
            if stop.is_set():
                break
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            p.produce(topic, f"r{i}".encode(), partition=part)
            p.poll(0)
        p.flush(30)


def _topic(bootstrap: str, name: str, partitions: int) -> None:
    """A new topic (each run its own) holding one record in each partition."""
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for part in range(partitions):
            p.produce(name, b"first", partition=part)
        p.flush(60)


def run(bootstrap: str, topic: str, partitions: int, sessions: bool, targets: list[int],
        rate: float, timeout: float) -> dict[str, float]:  # fmt: skip
    consumer_mod.FetchSessionHandler = FetchSessionHandler if sessions else Sessionless  # type: ignore[misc]
    COUNTS.__init__()  # type: ignore[misc]
    want = partitions + len(targets)
    seen: set[tuple[int, int]] = set()
    stop = threading.Event()
    t0 = time.monotonic()
    with Consumer({"bootstrap.servers": bootstrap}) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        c.seek_to_beginning()
        # the records already there, then the producer's
        while len(seen) < partitions and time.monotonic() - t0 < timeout:
            for r in c.poll(0.2):
                seen.add((r.partition, r.offset))
        producer = threading.Thread(target=_produce, args=(bootstrap, topic, targets, rate, stop))
        producer.start()
        try:
            total = 0
            while len(seen) < want and time.monotonic() - t0 < timeout:
                got = c.poll(0.2)
                total += len(got)
                seen.update((r.partition, r.offset) for r in got)
        finally:
            stop.set()
            producer.join(60)
        c.poll(0.5)  # anything more would be a duplicate
    if len(seen) != want:
        raise SystemExit(f"read {len(seen)} distinct records of {want}")
    return {
        "requests": COUNTS.requests,
        "request_bytes": COUNTS.request_bytes,
        "response_bytes": COUNTS.response_bytes,
        "seconds": time.monotonic() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=200.0, help="records per second produced")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long the producer runs")
    ap.add_argument("--runs", type=int, default=2, help="runs of each mode, alternating")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.runs = 2.0, 1
    rng = random.Random(args.seed)
    targets = [rng.randrange(args.partitions) for _ in range(int(args.rate * args.seconds))]
    timeout = 60 + 2 * args.seconds
    _install_counters()
    work = Path(tempfile.mkdtemp(prefix="samsa-bench-sessions-"))
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    try:
        with SamsaBroker(work / "broker") as broker:
            for i in range(args.runs * 2):
                sessions = (i % 2 == 0) == (i // 2 % 2 == 0)  # on, off, off, on, ...
                topic = f"quiet-{i}"
                _topic(broker.bootstrap, topic, args.partitions)
                r = run(broker.bootstrap, topic, args.partitions, sessions, targets, args.rate,
                        timeout)  # fmt: skip
                results[sessions].append(r)
                print(f"run {i + 1}: {'sessions   ' if sessions else 'sessionless'} "
                      f"{r['requests']:5d} fetches, {r['request_bytes']:>10,} B sent, "
                      f"{r['response_bytes']:>11,} B received, {r['seconds']:.1f} s")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(on: bool, key: str) -> float:
        return statistics.median(r[key] for r in results[on])

    def per_req(on: bool, key: str) -> float:
        return statistics.median(r[key] / r["requests"] for r in results[on])

    print(f"\n{args.partitions} partitions, {len(targets)} records produced at "
          f"{args.rate:g}/s to random partitions; medians of {args.runs} run(s) each")  # fmt: skip
    print(f"{'':22}{'sessions':>14}{'sessionless':>14}{'sessionless/sessions':>22}")
    rows = [
        ("Fetch requests", med(True, "requests"), med(False, "requests")),
        ("request bytes", med(True, "request_bytes"), med(False, "request_bytes")),
        ("request bytes/fetch", per_req(True, "request_bytes"), per_req(False, "request_bytes")),
        ("response bytes", med(True, "response_bytes"), med(False, "response_bytes")),
        ("response bytes/fetch", per_req(True, "response_bytes"),
         per_req(False, "response_bytes")),
    ]  # fmt: skip
    for name, on, off in rows:
        print(f"{name:22}{on:>14,.0f}{off:>14,.0f}{off / on:>21.1f}x")


if __name__ == "__main__":
    main()
