"""Group rows of peers.py: time from members joining to every partition assigned.

N confluent-kafka consumers (librdkafka, one thread of ours polling them all in turn) subscribe
to one topic of ``2 * N`` partitions in a new group; the clock runs from the first
``subscribe`` until every partition is owned by exactly one member and every member owns at
least one, as each member's ``assignment()`` says. Classic groups use librdkafka's default
eager assignors (range, roundrobin), so members joining after the first one force rebalance
rounds: that is the cost being measured. KIP-848 groups (``group.protocol=consumer``) get
their assignment from the broker's heartbeat answers.

Both brokers run with ``group.initial.rebalance.delay.ms=0`` (the Kafka launcher sets it, and
peers.py starts samsa with it), so neither waits out Kafka's 3 s default.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from typing import Any

from _peerlib import create_topic

PROTOCOLS = ("classic", "consumer")


def assignment_seconds(bootstrap: str, topic: str, members: int, protocol: str,
                       timeout: float = 120.0) -> float:  # fmt: skip
    """Seconds from the first subscribe to a complete, disjoint assignment of ``topic``."""
    from confluent_kafka import Consumer

    partitions = 2 * members
    group = f"g-{protocol}-{members}-{uuid.uuid4().hex[:8]}"
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "group.protocol": protocol,
        "log_level": 4,  # not 60 lines of KIP-714 telemetry ids per group
    }
    if protocol == "classic":
        conf["session.timeout.ms"] = 30_000
    consumers = [Consumer(conf) for _ in range(members)]
    try:
        start = time.perf_counter()
        for c in consumers:
            c.subscribe([topic])
        while True:
            owned: list[int] = []
            for c in consumers:
                c.poll(0)  # serves the rebalance: librdkafka assigns in here
                owned.extend(tp.partition for tp in c.assignment())
            if len(owned) == partitions and len(set(owned)) == partitions:
                if all(c.assignment() for c in consumers):
                    return time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                raise TimeoutError(f"{len(set(owned))}/{partitions} partitions after {timeout} s")
            time.sleep(0.001)
    finally:
        for c in consumers:
            c.close()


def group_rows(bootstraps: dict[str, str], sizes: tuple[int, ...], runs: int,
               warm: tuple[str, ...] = PROTOCOLS
               ) -> list[tuple[str, dict[str, float], dict[str, str]]]:  # fmt: skip
    """(label, {broker: median seconds}, {broker: note}) per protocol and group size, after
    one uncounted group of each protocol in ``warm``."""
    out = []
    for bs in bootstraps.values():  # not counted: Kafka creates __consumer_offsets on first use
        for protocol in warm:
            with contextlib.suppress(Exception):
                create_topic(bs, f"grp-warm-{protocol}", 2)
                assignment_seconds(bs, f"grp-warm-{protocol}", 1, protocol, timeout=60)
    for protocol in PROTOCOLS:
        for n in sizes:
            values: dict[str, float] = {}
            notes: dict[str, str] = {}
            for name, bs in bootstraps.items():
                topic = f"grp-{protocol}-{n}"
                samples: list[float] = []
                try:
                    create_topic(bs, topic, 2 * n)
                    samples = [assignment_seconds(bs, topic, n, protocol) for _ in range(runs)]
                    values[name] = statistics.median(samples)
                    notes[name] = "runs: " + ", ".join(f"{s:.2f}" for s in samples) + " s"
                except Exception as e:  # a broker that cannot run a row is said, not hidden
                    notes[name] = f"{type(e).__name__}: {e}"[:200]
            label = f"group assignment, {'KIP-848' if protocol == 'consumer' else 'classic'}"
            out.append((f"{label}, {n} members, {2 * n} partitions", values, notes))
    return out
