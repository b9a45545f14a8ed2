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

Run alone, it studies one row's spread: fresh samsa and Kafka, samples alternated between them,
each sample's outcome counted (a classic sample ends at once, after librdkafka's 1 s rejoin
interval, or after a member's 3 s heartbeat), optionally librdkafka's ``debug=cgrp,protocol``
trace of every sample written to a directory::

    .venv/bin/python benchmarks/peer_groups.py --members 3 --samples 21 [--warm-members]
        [--protocol classic|consumer] [--trace DIR] [--initial-delay-ms 3000]

``--warm-members`` has each member read the topic's metadata before the clock starts, so its
JoinGroup goes out at ``subscribe`` (cold, librdkafka first waits for a connection to the
broker the metadata names, ~50 ms, unless its coordinator connection happens to serve the
topic's metadata first: the race that decides the classic 3-member row).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _peerlib import create_topic, machine

PROTOCOLS = ("classic", "consumer")


def assignment_seconds(bootstrap: str, topic: str, members: int, protocol: str,
                       timeout: float = 120.0, *, warm_members: bool = False,
                       debug: bool = False) -> float:  # fmt: skip
    """Seconds from the first subscribe to a complete, disjoint assignment of ``topic``;
    ``warm_members``: each member has read ``topic``'s metadata before the clock starts;
    ``debug``: librdkafka logs its group and protocol steps (to stderr)."""
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
    if debug:
        conf.update(debug="cgrp,protocol", log_level=7)
    consumers = [Consumer(conf) for _ in range(members)]
    try:
        if warm_members:
            for c in consumers:
                c.list_topics(topic, timeout=30)
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
               warm: tuple[str, ...] = PROTOCOLS, classic_runs: int | None = None
               ) -> list[tuple[str, dict[str, float], dict[str, str]]]:  # fmt: skip
    """(label, {broker: median seconds}, {broker: note}) per protocol, group size and, for
    classic groups, cold and warm members (see the module's docstring), after one uncounted
    group of each protocol in ``warm``. Samples alternate between the brokers, so a change
    of load falls on both; classic rows take ``classic_runs`` samples (default ``runs``)."""
    out = []
    for bs in bootstraps.values():  # not counted: Kafka creates __consumer_offsets on first use
        for protocol in warm:
            with contextlib.suppress(Exception):
                create_topic(bs, f"grp-warm-{protocol}", 2)
                assignment_seconds(bs, f"grp-warm-{protocol}", 1, protocol, timeout=60)
    for protocol in PROTOCOLS:
        # Warm members only for classic groups: KIP-848 assignments come in heartbeats (5 s),
        # whatever the order of the members' first ones.
        variants = (False, True) if protocol == "classic" else (False,)
        n_runs = (classic_runs or runs) if protocol == "classic" else runs
        for n in sizes:
            topic = f"grp-{protocol}-{n}"
            for warm_members in variants:
                samples: dict[str, list[float]] = {name: [] for name in bootstraps}
                failed: dict[str, str] = {}
                for i in range(n_runs):
                    names = list(bootstraps) if i % 2 == 0 else list(bootstraps)[::-1]
                    for name in names:
                        if name in failed:
                            continue
                        bs = bootstraps[name]
                        try:  # a broker that cannot run a row is said, not hidden
                            if i == 0 and not warm_members:
                                create_topic(bs, topic, 2 * n)
                            samples[name].append(
                                assignment_seconds(
                                    bs, topic, n, protocol, warm_members=warm_members
                                )
                            )
                        except Exception as e:
                            failed[name] = f"{type(e).__name__}: {e}"[:200]
                values = {
                    k: statistics.median(v) for k, v in samples.items() if v and k not in failed
                }
                notes = {k: failed.get(k) or _runs_note(v) for k, v in samples.items()}
                label = f"group assignment, {'KIP-848' if protocol == 'consumer' else 'classic'}"
                label += f", {n} members, {2 * n} partitions"
                if warm_members:
                    label += ", members' metadata warm"
                out.append((label, values, notes))
    return out


def _runs_note(samples: list[float]) -> str:
    return (
        f"runs: {', '.join(f'{s:.2f}' for s in samples)} s; mean {statistics.fmean(samples):.2f} s"
    )


def outcome(protocol: str, seconds: float, initial_delay_ms: int = 0) -> str:
    """What bounded a sample: the classic protocol's waits are librdkafka's 1 s rejoin interval
    (a SyncGroup answered REBALANCE_IN_PROGRESS) and a member's 3 s heartbeat (it was Stable
    before the others joined); KIP-848's are its 5 s heartbeat interval. With an initial
    rebalance delay the waits add up, and are not told apart."""
    if initial_delay_ms:
        return f"{round(seconds)} s"
    if protocol == "consumer":
        return f"{round(seconds / 5) * 5} s heartbeats" if seconds >= 2.5 else "at once"
    if seconds >= 2.5:
        return "heartbeat (3 s)"
    return "rejoin interval (1 s)" if seconds >= 0.8 else "at once"


def _trace_summary(path: Path) -> str:
    """From one sample's librdkafka trace: when each member sent its first JoinGroup (ms after
    the first), and how many members' FindCoordinator answers librdkafka dropped because it
    tore down its bootstrap connection first (those members wait for the connection to the
    broker the metadata named, ~50 ms, and so join together)."""
    first: dict[str, float] = {}
    dropped = 0
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split("|")
        if len(parts) < 5:
            continue
        if "FindCoordinator response error: _DESTROY_BROKER" in parts[4]:
            dropped += 1
        if "Sent JoinGroupRequest" in parts[4]:
            first.setdefault(parts[3], float(parts[1]))
    joins = sorted(first.values())
    at = ", ".join(f"{(t - joins[0]) * 1000:.0f}" for t in joins) if joins else "-"
    return f"first JoinGroups at +{at} ms; FindCoordinator answers dropped: {dropped}"


@contextlib.contextmanager
def _stderr_to(path: Path | None) -> Iterator[None]:
    """librdkafka logs to the process's fd 2 from its own threads: redirect the fd itself."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def study(members: int, protocol: str, samples: int, warm_members: bool,
          trace: Path | None, initial_delay_ms: int = 0) -> None:  # fmt: skip
    from _brokers import KafkaBroker, SamsaBroker
    from peers import SAME_AS_KAFKA

    print(machine(), flush=True)
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        work = Path(d)
        delay = {"group.initial.rebalance.delay.ms": str(initial_delay_ms)}
        brokers = {
            "samsa": stack.enter_context(SamsaBroker(work / "samsa", {**SAME_AS_KAFKA, **delay})),
            "kafka": stack.enter_context(KafkaBroker(work / "kafka", delay)),
        }
        topic = f"grp-{protocol}-{members}"
        for b in brokers.values():
            create_topic(b.bootstrap, "grp-warm", 2)
            assignment_seconds(b.bootstrap, "grp-warm", 1, protocol, timeout=60)
            create_topic(b.bootstrap, topic, 2 * members)
        if trace is not None:
            trace.mkdir(parents=True, exist_ok=True)
        got: dict[str, list[float]] = {name: [] for name in brokers}
        for i in range(samples):
            order = list(brokers.items()) if i % 2 == 0 else list(brokers.items())[::-1]
            for name, b in order:
                log = trace / f"{name}-{i:02d}.log" if trace is not None else None
                with _stderr_to(log):
                    s = assignment_seconds(
                        b.bootstrap,
                        topic,
                        members,
                        protocol,
                        warm_members=warm_members,
                        debug=log is not None,
                    )
                got[name].append(s)
                kind = outcome(protocol, s, initial_delay_ms)
                seen = f"  ({_trace_summary(log)})" if log is not None else ""
                print(f"sample {i:2d} {name:5s} {s:6.3f} s  {kind}{seen}", flush=True)
        load = os.getloadavg()[0]
        print(f"\n{protocol}, {members} members, {2 * members} partitions, "
              f"{'warm' if warm_members else 'cold'} members, {samples} samples each, "
              f"group.initial.rebalance.delay.ms={initial_delay_ms} "
              f"(alternated), load average at the end {load:.2f}")  # fmt: skip
        for name, values in got.items():
            counts: dict[str, int] = {}
            for v in values:
                kind = outcome(protocol, v, initial_delay_ms)
                counts[kind] = counts.get(kind, 0) + 1
            print(f"{name:5s} median {statistics.median(values):.3f} s, mean "
                  f"{statistics.fmean(values):.3f} s; "
                  + ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())))  # fmt: skip
        ratio = statistics.median(got["samsa"]) / statistics.median(got["kafka"])
        mean_ratio = statistics.fmean(got["samsa"]) / statistics.fmean(got["kafka"])
        print(f"samsa/Kafka: median {ratio:.2f}x, mean {mean_ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--protocol", choices=PROTOCOLS, default="classic")
    ap.add_argument("--samples", type=int, default=21, help="per broker, alternated")
    ap.add_argument("--warm-members", action="store_true")
    ap.add_argument("--trace", type=Path, help="a directory for one librdkafka trace per sample")
    ap.add_argument(
        "--initial-delay-ms", type=int, default=0, help="group.initial.rebalance.delay.ms, both"
    )
    a = ap.parse_args()
    study(a.members, a.protocol, a.samples, a.warm_members, a.trace, a.initial_delay_ms)


if __name__ == "__main__":
    main()
