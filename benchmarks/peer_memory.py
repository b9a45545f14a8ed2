"""Memory with many partitions, for peers.py: the RSS of an idle broker holding 10,000
partitions (issue 23, item 6), samsa beside Kafka and Tansu.

Each broker is started fresh (one node each, nothing else on it), its RSS taken once it has
settled, then ``partitions`` partitions are created (topics of 1,000, no records: the cost of
a partition as such, not of its data) and waited for until every one has a leader. After
``settle`` seconds of idleness its RSS is taken again, and its CPU over those idle seconds
(what its timers cost with that many partitions).

Kafka runs with the heap peers.py gives it (``-Xms1g -Xmx1g``, G1): its RSS is the JVM
process's, which holds only the heap pages it has touched, not the whole 1 GiB.
"""

from __future__ import annotations

import time
from pathlib import Path

from _brokers import BrokerProcess
from _peerlib import Row, Starter, create_topic, rss_mb

PER_TOPIC = 1_000


def fill_partitions(b: BrokerProcess, partitions: int, prefix: str = "mem") -> float:
    """Create ``partitions`` empty partitions on ``b``, all led; the seconds it took."""
    t0 = time.perf_counter()
    per_topic = min(PER_TOPIC, partitions)
    for i in range(partitions // per_topic):
        create_topic(b.bootstrap, f"{prefix}{i}", per_topic)
    return time.perf_counter() - t0


def partition_memory_rows(partitions: int, starters: dict[str, Starter], work: Path,
                          settle: float = 10.0) -> list[Row]:  # fmt: skip
    """RSS fresh, RSS with ``partitions`` idle partitions, and KB per partition; one fresh
    broker per entry of ``starters`` (name: a function of a data dir that makes it)."""
    with_parts = Row(f"RSS idle with {partitions:,} partitions", "MB", higher_is_better=False)
    per = Row(f"RSS growth per partition ({partitions:,} created)", "KB", higher_is_better=False)
    for name, make in starters.items():
        try:
            with make(work / f"partitions-rss-{name}") as b:
                time.sleep(settle / 2)
                fresh = rss_mb(b.pid)
                took = fill_partitions(b, partitions)
                time.sleep(settle)
                c0 = b.cpu_seconds()
                time.sleep(settle)
                idle_cpu = (b.cpu_seconds() - c0) / settle
                with_parts.values[name] = rss_mb(b.pid)
                per.values[name] = (with_parts.values[name] - fresh) * 1024 / partitions
                with_parts.notes[name] = (
                    f"fresh {fresh:.0f} MB; created in {took:.1f} s; idle CPU with them "
                    f"{idle_cpu * 100:.1f}% of a core"
                )
        except Exception as e:  # a broker that cannot run a row is said, not hidden
            with_parts.notes[name] = f"{type(e).__name__}: {e}"[:200]
    return [with_parts, per]
