"""Kafka's own system-test tools as judges of a broker: samsa, or a Kafka node for reference.

``VerifiableProducer``, ``VerifiableConsumer`` and ``TransactionalMessageCopier`` are the tools
Apache Kafka's system tests drive; each prints one JSON event per line on stdout. This module
runs them (:class:`JsonTool`), drives the runs the oracle tests and benchmarks share
(:func:`produce_consume_run`, :func:`copier_run`) while the broker is SIGKILLed and restarted
through a callable, and judges the events (:func:`check_delivery`, :func:`check_copy`).

The judgement is about the broker, not the tools: an acknowledged record must be consumed, no
record may be written twice (the producer is idempotent), and a consumer may read a record
again only after its position was reset to an offset the broker had acknowledged as committed
(committed offsets never move back). Redeliveries within that rule are counted, not failed:
a commit cut off by a kill is at-least-once by design, in Kafka too.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from samsa.testing.kafka import tool_args

__all__ = [
    "CopyReport",
    "DeliveryReport",
    "Event",
    "JsonTool",
    "check_copy",
    "check_delivery",
    "copier_run",
    "produce_consume_run",
    "read_committed",
    "seed",
]

Event = dict[str, Any]

# What Kafka's system tests give the VerifiableProducer, which otherwise forces retries=0.
IDEMPOTENT_PRODUCER = {
    "enable.idempotence": "true",
    "retries": "2147483647",
    "max.in.flight.requests.per.connection": "5",
    "acks": "all",
}


class JsonTool:
    """A Kafka tool process whose stdout lines are JSON events, parsed as they arrive."""

    def __init__(self, tool: str, *args: str, stderr: Path, heap: str = "256m") -> None:
        self.cmd = tool_args(tool, *args, heap=heap)
        self.stderr_path = stderr
        self.events: list[Event] = []
        self.other: list[str] = []  # stdout lines that are not JSON (deprecation notes)
        self.proc: subprocess.Popen[str] | None = None
        self._cond = threading.Condition()

    def start(self) -> JsonTool:
        with open(self.stderr_path, "a") as err:
            self.proc = subprocess.Popen(
                self.cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True
            )
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                self.other.append(line.rstrip("\n"))
                continue
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def named(self, name: str) -> list[Event]:
        with self._cond:
            return [e for e in self.events if e.get("name") == name]

    def wait_for(self, done: Callable[[list[Event]], bool], timeout: float, what: str) -> None:
        """Wait until ``done(events)``; TimeoutError (with the tool's stderr) otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not done(self.events):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what} within {timeout} s\n{self.stderr_tail()}")
                self._cond.wait(min(left, 0.2))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(30)

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM: the tools' shutdown hooks close their clients and print shutdown events."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def stderr_tail(self, lines: int = 20) -> str:
        try:
            text = self.stderr_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _producer(
    bootstrap: str, topic: str, count: int, workdir: Path, name: str, throughput: int = -1
) -> JsonTool:
    """An idempotent VerifiableProducer of ``count`` records; their values are unique and their
    keys cycle through 100, so that every partition gets records."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = _properties(workdir / f"{name}.properties", IDEMPOTENT_PRODUCER)
    return JsonTool(
        "kafka-verifiable-producer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--max-messages", str(count), "--throughput", str(throughput),
        "--repeating-keys", "100", "--command-config", str(config),
        stderr=workdir / f"{name}.err",
    )  # fmt: skip


def _consumer(
    bootstrap: str,
    topic: str,
    group: str,
    workdir: Path,
    protocol: str,
    config: dict[str, str] | None = None,
) -> JsonTool:
    """A VerifiableConsumer printing every record, committing synchronously after each poll."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = _properties(workdir / f"{group}.properties", config or {})
    return JsonTool(
        "kafka-verifiable-consumer", "--bootstrap-server", bootstrap, "--topic", topic,
        "--group-id", group, "--group-protocol", protocol, "--verbose",
        "--reset-policy", "earliest", "--command-config", str(path),
        stderr=workdir / f"{group}.err",
    )  # fmt: skip


def _properties(path: Path, props: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


@dataclass
class DeliveryReport:
    """One consumer's judgement of a produce/consume run."""

    group: str
    acked: int = 0
    send_errors: int = 0
    consumed: int = 0  # records handed to the application, redeliveries included
    redelivered: int = 0  # of those, records handed over before (after a position reset)
    failed_commits: int = 0
    last_commits: dict[int, int] = field(default_factory=dict)  # partition -> offset
    problems: list[str] = field(default_factory=list)


def check_delivery(
    produced: Sequence[Event], consumed: Sequence[Event], group: str = ""
) -> DeliveryReport:
    """Judge a VerifiableConsumer's events against a VerifiableProducer's.

    Every acknowledged record is consumed with its value at its offset; no value sits at two
    offsets (a duplicate write); a partition's position moves back only to an offset at or past
    the last commit the broker acknowledged, and acknowledged commits never decrease.
    """
    report = DeliveryReport(group)
    acked: dict[tuple[int, int], str] = {}
    for e in produced:
        if e.get("name") == "producer_send_success":
            acked[(e["partition"], e["offset"])] = e["value"]
        elif e.get("name") == "producer_send_error":
            report.send_errors += 1
    report.acked = len(acked)

    seen: dict[tuple[int, int], str] = {}
    where: dict[str, set[tuple[int, int]]] = {}
    position: dict[int, int] = {}  # next offset expected per partition; a fresh group starts at 0
    committed: dict[int, int] = {}  # last acknowledged commit per partition
    tried: dict[int, int] = {}  # highest commit attempted, acknowledged or not
    for e in consumed:
        name = e.get("name")
        if name == "record_data":
            p, o, v = e["partition"], e["offset"], e["value"]
            report.consumed += 1
            expected = position.get(p, 0)
            if o < expected:  # the position was reset: only to a commit the broker may hold
                low, high = committed.get(p, 0), max(tried.get(p, 0), committed.get(p, 0))
                if not low <= o <= high:
                    report.problems.append(
                        f"partition {p}: position reset to {o} after reading to {expected},"
                        f" but the last acknowledged commit was {low} (attempted {high})"
                    )
            elif o > expected:
                report.problems.append(f"partition {p}: skipped offsets {expected}..{o - 1}")
            if (p, o) in seen:
                report.redelivered += 1
                if seen[(p, o)] != v:
                    report.problems.append(f"offset {p}/{o} read as {seen[(p, o)]!r} then {v!r}")
            seen[(p, o)] = v
            where.setdefault(v, set()).add((p, o))
            position[p] = o + 1
        elif name == "offsets_committed":
            for c in e["offsets"]:
                p, o = c["partition"], c["offset"]
                tried[p] = max(tried.get(p, 0), o)
                if not e["success"]:
                    continue
                if o < committed.get(p, 0):
                    report.problems.append(
                        f"partition {p}: acknowledged commit moved back {committed[p]} -> {o}"
                    )
                committed[p] = o
            report.failed_commits += not e["success"]

    missing = [k for k in acked if k not in seen]
    if missing:
        report.problems.append(f"{len(missing)} acknowledged records never consumed: {missing[:5]}")
    wrong = [k for k, v in acked.items() if k in seen and seen[k] != v]
    if wrong:
        report.problems.append(f"{len(wrong)} records read with another value: {wrong[:5]}")
    twice = {v: sorted(w) for v, w in where.items() if len(w) > 1}
    if twice:
        report.problems.append(f"{len(twice)} values written twice: {list(twice.items())[:5]}")
    for p, pos in position.items():
        if committed.get(p) != pos:
            report.problems.append(f"partition {p}: read to {pos}, last commit {committed.get(p)}")
    report.last_commits = committed
    return report


def produce_consume_run(
    bootstrap: str,
    topic: str,
    workdir: Path,
    *,
    bounce: Callable[[], None],
    bounces: int = 2,
    messages: int = 3000,
    throughput: int = 600,
    protocols: Sequence[str] = ("classic", "consumer"),
    timeout: float = 60.0,
) -> tuple[list[Event], dict[str, list[Event]]]:
    """An idempotent VerifiableProducer and one VerifiableConsumer per group protocol (each
    its own group, committing after every poll) on ``topic``, which must exist; ``bounce``
    kills and restarts the broker ``bounces`` times, evenly over the acknowledged records.

    Returns the producer's events and each group's consumer events (keyed by group id)."""
    workdir.mkdir(parents=True, exist_ok=True)
    consumers = {
        f"judge-{proto}": _consumer(bootstrap, topic, f"judge-{proto}", workdir, proto)
        for proto in protocols
    }
    producer = _producer(bootstrap, topic, messages, workdir, "producer", throughput)
    deadline = time.monotonic() + timeout
    tools = [*consumers.values(), producer]
    try:
        for c in consumers.values():
            c.start()
        for c in consumers.values():
            c.wait_for(
                lambda ev: any(e["name"] == "partitions_assigned" and e["partitions"] for e in ev),
                deadline - time.monotonic(), "the consumer was assigned partitions",
            )  # fmt: skip
        producer.start()
        for i in range(1, bounces + 1):
            mark = messages * i // (bounces + 1)
            producer.wait_for(
                lambda ev, mark=mark: _count(ev, "producer_send_success") >= mark,
                deadline - time.monotonic(), f"{mark} records acknowledged",
            )  # fmt: skip
            bounce()
        producer.wait_for(
            lambda ev: _count(ev, "tool_data") > 0, deadline - time.monotonic(),
            "the producer finished",
        )  # fmt: skip
        acked = {(e["partition"], e["offset"]) for e in producer.named("producer_send_success")}
        for c in consumers.values():
            c.wait_for(
                lambda ev: acked <= {(e["partition"], e["offset"]) for e in ev
                                     if e["name"] == "record_data"},
                max(deadline - time.monotonic(), 1.0), "every acknowledged record consumed",
            )  # fmt: skip
            # The commit follows the poll that read the last record.
            c.wait_for(lambda ev: ev[-1]["name"] == "offsets_committed", 10, "the last commit")
    finally:
        for t in tools:
            t.terminate()
    return producer.events, {g: c.events for g, c in consumers.items()}


def read_committed(
    bootstrap: str, topic: str, count: int, workdir: Path, timeout: float
) -> list[str]:
    """The values of ``topic`` as Kafka's own consumer reads them with read_committed: at least
    ``count`` of them, plus whatever else arrives in the second after."""
    reader = _consumer(
        bootstrap, topic, "judge-reader", workdir, "classic", {"isolation.level": "read_committed"}
    ).start()
    try:
        reader.wait_for(
            lambda ev: _count(ev, "record_data") >= count, timeout, f"{count} records read"
        )
        time.sleep(1.0)
    finally:
        reader.terminate()
    return [e["value"] for e in reader.named("record_data")]


def _count(events: list[Event], name: str) -> int:
    return sum(1 for e in events if e.get("name") == name)


def seed(bootstrap: str, topic: str, count: int, workdir: Path, timeout: float) -> list[str]:
    """Write ``count`` keyed records with an idempotent VerifiableProducer; their values."""
    producer = _producer(bootstrap, topic, count, workdir, "seed").start()
    try:
        producer.wait_for(lambda ev: _count(ev, "tool_data") > 0, timeout, "the seed written")
    finally:
        producer.terminate()
    return [e["value"] for e in producer.named("producer_send_success")]


@dataclass
class CopyReport:
    inputs: int = 0
    outputs: int = 0
    missing: int = 0
    duplicated: int = 0  # output records beyond the first copy of their input
    unexpected: int = 0  # output records no input produced
    problems: list[str] = field(default_factory=list)


def check_copy(inputs: Sequence[str], outputs: Sequence[str]) -> CopyReport:
    """The output (read_committed) must hold every input value exactly once."""
    want, got = Counter(inputs), Counter(outputs)
    report = CopyReport(inputs=len(inputs), outputs=len(outputs))
    report.missing = sum((want - got).values())
    report.duplicated = sum(n - 1 for v, n in got.items() if v in want and n > 1)
    report.unexpected = sum(n for v, n in got.items() if v not in want)
    if report.missing:
        report.problems.append(f"{report.missing} input records missing from the output")
    if report.duplicated:
        report.problems.append(f"{report.duplicated} output records are duplicates")
    if report.unexpected:
        report.problems.append(f"{report.unexpected} output records match no input")
    return report


@dataclass
class CopierStats:
    copier_kills: int = 0
    copier_exits: int = 0  # non-zero exits (a copier giving up on an error), then restarted
    broker_kills: int = 0
    starts: int = 0


def _remaining(copier: JsonTool) -> int | None:
    """What the copier has left to copy, by its last progress line (None before the first)."""
    events = copier.events[-1:]
    return int(events[0]["remaining"]) if events and "remaining" in events[0] else None


def copier_run(
    bootstrap: str,
    input_topic: str,
    output_topic: str,
    partitions: int,
    workdir: Path,
    *,
    bounce: Callable[[], None],
    copier_kills: int = 2,
    broker_kills: int = 1,
    transaction_size: int = 50,
    transaction_timeout_ms: int = 10_000,
    group_mode: bool = False,
    timeout: float = 60.0,
) -> CopierStats:
    """One TransactionalMessageCopier per input partition (read_committed input, output plus
    offsets in one transaction, random aborts). While they copy, copiers are SIGKILLed and
    restarted (``copier_kills`` in all) and the broker bounced ``broker_kills`` times; a copier
    that exits on an error is restarted too. Returns once every copier finished cleanly.

    ``group_mode``: the copiers share the input topic through one consumer group and commit
    with its metadata (KIP-447), as Kafka's transactions system test also runs them.

    ``transaction_timeout_ms``: a restarted copier asks its input position (a read_committed
    OffsetFetch) before its ``initTransactions`` fences the killed one, so it waits, on any
    broker, until the killed copier's open transaction times out (and the broker's abort
    check runs): the tool's default of a minute made each copier kill cost one."""
    workdir.mkdir(parents=True, exist_ok=True)
    stats = CopierStats()

    def copier(p: int) -> JsonTool:
        stats.starts += 1
        return JsonTool(
            "kafka-transactional-message-copier", "--broker-list", bootstrap,
            "--input-topic", input_topic, "--input-partition", str(p),
            "--output-topic", output_topic, "--transactional-id", f"copier-{p}",
            "--consumer-group", "copiers", "--transaction-size", str(transaction_size),
            "--transaction-timeout", str(transaction_timeout_ms),
            "--enable-random-aborts",
            *(("--group-mode", "--use-group-metadata") if group_mode else ()),
            stderr=workdir / f"copier-{p}.err",
        ).start()  # fmt: skip

    running = {p: copier(p) for p in range(partitions)}
    done: set[int] = set()
    # Alternate the kinds (copier, broker, copier, ...), spread evenly over the copy: fault i of
    # n strikes once the copiers report less than (n + 1 - i) / (n + 1) of the work left.
    faults: list[str] = []
    for i in range(max(copier_kills, broker_kills)):
        faults += ["copier"] * (i < copier_kills) + ["broker"] * (i < broker_kills)
    planned = len(faults)
    left: dict[int, int | None] = {}  # per partition, by the last progress line of its copier
    total = 0
    deadline = time.monotonic() + timeout
    try:
        while len(done) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"copiers of partitions {sorted(set(running) - done)} did not finish in "
                    f"{timeout} s\n" + "\n".join(running[p].stderr_tail() for p in running)
                )
            for p, tool in running.items():
                if p in done or tool.alive():
                    continue
                if tool.wait(5) == 0:
                    done.add(p)
                else:
                    stats.copier_exits += 1
                    running[p] = copier(p)
            for p, tool in running.items():
                n = 0 if p in done else _remaining(tool)
                left[p] = left.get(p, n) if n is None else n
            if not total and None not in left.values():
                total = sum(v or 0 for v in left.values())
            due = total * len(faults) // (planned + 1)
            live = [p for p in running if p not in done and running[p].alive() and left.get(p)]
            if faults and total and live and sum(v or 0 for v in left.values()) <= due:
                if faults.pop(0) == "broker":
                    bounce()
                    stats.broker_kills += 1
                else:
                    p = max(live, key=lambda p: left[p] or 0)
                    running[p].kill()
                    stats.copier_kills += 1
                    running[p] = copier(p)
            time.sleep(0.1)
    finally:
        for tool in running.values():
            tool.kill()
    return stats
