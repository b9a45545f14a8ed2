"""End-to-end latency under a saturating producer, samsa source trees side by side.

peers.py's latency row (a confluent-kafka producer and consumer in one process, acks=all, no
linger, 1,000 messages/s, send to receipt) while another process's producer saturates the
same broker, on a fresh broker per sample, with samples alternated between the trees given
(``--base-src`` another checkout, e.g. a worktree of main; this checkout is the other) and,
with ``--kafka``, a fresh Kafka node too::

    .venv/bin/python benchmarks/latency_ab.py --base-src ../main-wt [--rounds 4] [--kafka]

Prints p50 / p99 / p99.9 ms per sample and their medians per tree. A fresh Kafka JVM has not
warmed its JIT, so its figures here are worse than in peers.py, where the latency rows run
after the load rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import peers
from _brokers import ROOT, KafkaBroker, SamsaBroker
from _peerlib import create_topic, machine


def sample(make: Callable[[Path], AbstractContextManager[Any]], rate: int, seconds: float
           ) -> tuple[float, float, float]:  # fmt: skip
    with tempfile.TemporaryDirectory() as d, make(Path(d)) as b:
        create_topic(b.bootstrap, "sat", 3)
        create_topic(b.bootstrap, "lat", 1)
        workers = peers.Workers(1)
        try:
            workers.saturate(b.bootstrap, "sat", seconds + 15)
            time.sleep(3)  # the saturating producer at full speed
            return peers.latency(b.bootstrap, "lat", rate, seconds)
        finally:
            workers.stop.set()
            workers.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-src", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--kafka", action="store_true")
    a = ap.parse_args()
    print(machine(), flush=True)
    makers: dict[str, Callable[[Path], AbstractContextManager[Any]]] = {
        "base": lambda d: SamsaBroker(d, peers.SAME_AS_KAFKA, src=a.base_src),
        "this": lambda d: SamsaBroker(d, peers.SAME_AS_KAFKA, src=ROOT),
    }
    if a.kafka:
        makers["kafka"] = lambda d: KafkaBroker(d)
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in makers}
    for i in range(a.rounds):
        names = list(makers) if i % 2 == 0 else list(makers)[::-1]
        for name in names:
            res = sample(makers[name], a.rate, a.seconds)
            got[name].append(res)
            load = os.getloadavg()[0]
            print(f"{name:5s} p50/p99/p99.9 {' / '.join(f'{x:.2f}' for x in res)} ms, "
                  f"load {load:.1f}", flush=True)  # fmt: skip
    for name, rows in got.items():
        medians = [statistics.median(r[k] for r in rows) for k in range(3)]
        print(f"median {name:5s} {' / '.join(f'{m:.2f}' for m in medians)} ms")


if __name__ == "__main__":
    main()
