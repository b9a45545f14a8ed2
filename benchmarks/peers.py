"""samsa side by side with Apache Kafka (first peer) and Tansu (second), in one run.

Every row runs the same workload, with the same clients, against the three brokers, all
started fresh by this script on 127.0.0.1 and stopped at the end; the order of the brokers
rotates from row to row so a slow spell of the (shared) machine does not always hit the same
one. Each figure is printed with its ratio to Kafka's and Tansu's in the same run, and the
machine is named at the top.

Rows (``--quick``: small counts and the shortcuts its Scale names, a smoke run of every
section in about 3 minutes; each section's and row's wall time is printed):

- start-up: exec to the first answered ApiVersions (empty data dir), and SIGTERM to exit
  (clean stop), median of 3;
- RSS: resident memory idle (fresh) and after the load rows;
- produce: confluent-kafka idempotent producer (acks=all, linger 5 ms), 1 producer with
  100-byte and 1 KB values, and 4 producer processes with 100-byte values (timed from one
  start line to the last producer's end); Kafka's own ``ProducerPerformance`` (the Java
  client, idempotent, acks=all, linger 5 ms) with 100-byte values, its steady state after
  10,000 warm-up records;
- transactions: a confluent-kafka transactional producer committing transactions of 10
  records spread over 1 and over 10 partitions (transactions/s);
- fetch: a confluent-kafka consumer reading every record of a 3-partition topic (librdkafka
  defaults, then ``fetch.queue.backoff.ms=0``), and Kafka's ``ConsumerPerformance`` (its
  fetch rate, without the group join);
- latency: end-to-end p50/p99/p99.9 (producer send to consumer receipt, one process, same
  clock) at a fixed rate, idle and while a second producer process saturates the broker;
- broker CPU seconds per million records, produced (1 producer, 100 B) and fetched (the
  default-consumer row): utime + stime of the broker process from /proc/<pid>/stat;
- groups (peer_groups.py): time to a complete assignment, classic and KIP-848, 3 and 30
  members, samsa and Kafka;
- memory (peer_memory.py): RSS of a fresh broker idle with 10,000 empty partitions;
- start-up with state (peer_startup.py): 10,000 partitions, 100,000 offset commits, a log
  after SIGKILL, 100,000 transactions; to the first answer, to the state served, clean stop;
- producer state (producer_state_memory.py): memory per idempotent producer entry.

``--sections`` runs some of them (startup, groups, load, memory, state, producer-state).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing as mp
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _brokers import (
    HOST,
    BrokerProcess,
    KafkaBroker,
    SamsaBroker,
    TansuBroker,
    _api_versions_ok,
    free_port,
)
from _peerlib import PARTITIONS, Row, Starter, create_topic, machine, rss_mb
from peer_groups import PROTOCOLS, group_rows
from peer_memory import partition_memory_rows
from peer_startup import StateScale, state_rows
from producer_state_memory import producer_state_rows

from samsa.testing.kafka import KafkaNode, tool_args
from samsa.testing.tansu import tansu_broker_args

BROKERS = ("samsa", "kafka", "tansu")


@dataclass
class Scale:
    produce: int  # records per produce row (1 producer)
    produce_1k: int
    produce_each: int  # records per producer process, 4 processes
    txns: int  # transactions per transactional row
    fetch: int  # records read per fetch row
    latency_rate: int  # messages/s in the latency rows
    latency_seconds: float
    group_sizes: tuple[int, ...]  # members per group row
    group_runs: int
    state: StateScale  # start-up with state (peer_startup.py)
    producers: int  # idempotent producers of the producer-state row
    partitions: int = 10_000  # partitions of the memory row
    startup_runs: int = 3  # empty brokers started and stopped, each (the median is shown)
    # Classic group samples per row: a sample either ends at once or waits out a 1 or 3 s
    # client timer (peer_groups.py), so three samples do not settle a median.
    classic_group_runs: int = 9
    perf_warmup: int = 10_000  # ProducerPerformance's records before its steady state
    java_bound: int = 20  # seconds the Java tools wait on a broker that does not answer
    settle: float = 10.0  # idle seconds before an idle RSS (and as long again for its CPU)
    # The memory and producer-state rows on the load rows' brokers instead of fresh ones,
    # and no uncounted KIP-848 group first (each saves a few seconds per broker).
    reuse: bool = False


FULL = Scale(600_000, 200_000, 150_000, 1_000, 1_200_000, 1_000, 10.0, (3, 30), 3, StateScale(),
             100_000)  # fmt: skip
# --quick: every section in about 3 minutes on 2 shared cores (a smoke run, not a basis for
# claims). The state rows restart one broker holding all four states, small: Kafka's recovery
# of 1,000 partitions after the SIGKILL alone took 44 s.
QUICK = Scale(30_000, 10_000, 8_000, 50, 60_000, 500, 1.5, (3,), 1,
              StateScale(100, 2_000, 4, 256, 30.0, together=True), 2_000, partitions=1_000,
              startup_runs=1, perf_warmup=1_000, java_bound=5, settle=1.0, reuse=True,
              classic_group_runs=1)  # fmt: skip
SECTIONS = ("startup", "groups", "load", "memory", "state", "producer-state")
# Kafka's launcher sets this (the default waits 3 s for more members); samsa gets the same.
SAME_AS_KAFKA = {"group.initial.rebalance.delay.ms": "0"}


# --- start-up and stop ----------------------------------------------------------------


def _spawn_and_time(cmd: list[str], port: int, timeout: float = 120.0) -> tuple[float, float]:
    """Seconds from exec to the first answered ApiVersions, and from SIGTERM to exit."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        while not _api_versions_ok(port, timeout=0.5):
            if proc.poll() is not None or time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"{cmd[:3]} did not answer on {port}")
            time.sleep(0.005)
        up = time.perf_counter() - t0
        t1 = time.perf_counter()
        proc.terminate()
        proc.wait(120)
        return up, time.perf_counter() - t1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def startup_rows(work: Path, runs: int = 3) -> list[Row]:
    up = Row("start-up to first answer (empty)", "s", higher_is_better=False)
    down = Row("clean stop (SIGTERM to exit, empty)", "s", higher_is_better=False)
    samples: dict[str, list[tuple[float, float]]] = {b: [] for b in BROKERS}
    for i in range(runs):
        for name in _rotated(i):
            port = free_port()
            d = work / f"startup-{name}-{i}"
            if name == "samsa":
                cmd = [sys.executable, "-m", "samsa", "broker", "--data-dir", str(d),
                       "--host", HOST, "--port", str(port)]  # fmt: skip
            elif name == "kafka":
                node = KafkaNode(d, port=port)
                node.format()  # formatting is installation, not start-up
                cmd = node.command()
            else:
                cmd = tansu_broker_args(port, HOST)
            samples[name].append(_spawn_and_time(cmd, port))
    for name, s in samples.items():
        up.values[name] = statistics.median(a for a, _ in s)
        down.values[name] = statistics.median(b for _, b in s)
    return [up, down]


# --- load generators ----------------------------------------------------------------------


def produce(bootstrap: str, topic: str, records: int, size: int, max_seconds: float = 120.0,
            ready: Callable[[], object] | None = None, stop: Any = None
            ) -> tuple[int, float]:  # fmt: skip
    """An idempotent confluent-kafka producer; (records acknowledged, seconds). The clock
    starts after one record has been acknowledged (connecting, metadata and the producer id
    are not counted) and after ``ready()`` returns (a start line shared with other
    producers); ``stop`` (an Event) ends it early."""
    from confluent_kafka import Producer

    done = [0, 0]

    def on_delivery(err: Any, _msg: Any) -> None:
        done[0 if err is None else 1] += 1

    p = Producer({
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
        "linger.ms": 5, "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576, "log_level": 4,
    })  # fmt: skip
    value = b"v" * size
    p.produce(topic, value, partition=0, on_delivery=on_delivery)
    p.flush(30)
    done[0] = 0
    if ready is not None:
        ready()
    start = time.perf_counter()
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, partition=i % PARTITIONS, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
            if time.perf_counter() - start > max_seconds or (stop is not None and stop.is_set()):
                break
    p.flush(max_seconds + 30)
    return done[0], time.perf_counter() - start


# The load generators' processes, spawned once per run and shared by every broker's rows
# (a spawn costs ~1.5 s of CPU on imports, which the 4-producer row used to time).
_start_line: Any = None
_stop: Any = None


def _init_worker(start_line: Any, stop: Any) -> None:
    global _start_line, _stop
    _start_line, _stop = start_line, stop


def _produce_timed(bootstrap: str, topic: str, records: int, size: int
                   ) -> tuple[int, float, float]:  # fmt: skip
    """One of the parallel producers: (records, start, end) on the machine's monotonic clock
    (CLOCK_MONOTONIC, the same in every process), all starting at one line."""
    t: list[float] = []

    def ready() -> None:
        _start_line.wait(120)
        t.append(time.perf_counter())

    n, seconds = produce(bootstrap, topic, records, size, ready=ready)
    return n, t[0], t[0] + seconds


def _saturate(bootstrap: str, topic: str, seconds: float) -> None:
    produce(bootstrap, topic, 50_000_000, 100, max_seconds=seconds, stop=_stop)


class Workers:
    """``procs`` spawned load-generator processes, with a start line and a stop event."""

    def __init__(self, procs: int = 4) -> None:
        ctx = mp.get_context("spawn")
        self.procs = procs
        self.start_line = ctx.Barrier(procs)
        self.stop = ctx.Event()
        self.pool = ctx.Pool(procs, _init_worker, (self.start_line, self.stop))

    def produce_parallel(self, bootstrap: str, topic: str, each: int) -> tuple[int, float]:
        """``procs`` producers at once; (records, seconds from the first start to the last
        end)."""
        self.start_line.reset()  # a producer that failed before the line left it broken
        got = self.pool.starmap(_produce_timed, [(bootstrap, topic, each, 100)] * self.procs,
                                chunksize=1)  # fmt: skip
        return sum(n for n, _, _ in got), max(e for _, _, e in got) - min(s for _, s, _ in got)

    def saturate(self, bootstrap: str, topic: str, seconds: float) -> Any:
        self.stop.clear()
        return self.pool.apply_async(_saturate, (bootstrap, topic, seconds))

    def close(self) -> None:
        self.stop.set()
        self.pool.terminate()
        self.pool.join()


def transactions(bootstrap: str, topic: str, txns: int, spread: int) -> tuple[int, float]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}-{spread}",
                  "linger.ms": 0})  # fmt: skip
    p.init_transactions(60)
    start = time.perf_counter()
    for _ in range(txns):
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, b"t" * 100, partition=i % spread)
        p.commit_transaction(60)
    return txns, time.perf_counter() - start


def fetch(bootstrap: str, topic: str, records: int, extra: dict[str, Any]) -> tuple[int, float]:
    """A confluent-kafka consumer reads ``records`` from the start; the clock starts at the
    first message (connecting and metadata are not counted)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  **extra})  # fmt: skip
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = 0
    start = 0.0
    deadline = time.perf_counter() + 300
    try:
        while got < records and time.perf_counter() < deadline:
            for m in c.consume(10_000, 0.5):
                if m.error() is None:
                    if not got:
                        start = time.perf_counter()
                    got += 1
    finally:
        c.close()
    return got, time.perf_counter() - start


# kafka-producer-perf-test.sh and kafka-consumer-perf-test.sh run their JVM with a 512 MB
# heap and Kafka's performance options (G1, full tiered JIT). tool_args is for the test
# suite's short-lived tools (serial GC, C1 only), which would handicap the Java client here.
_PERF_JVM = ["-Xmx512m", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
             "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
             "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true"]  # fmt: skip


# A broker that takes no record from the Java client (Tansu: every batch expires unsent)
# fails its rows within these bounds instead of the producer's default 120 s and a 60 s wait
# for records; on a broker that answers, they are never approached.
def _producer_bounds(seconds: int) -> list[str]:
    ms = seconds * 1000  # max.block.ms: send() waits that long for room in a full buffer
    return [f"delivery.timeout.ms={ms}", f"request.timeout.ms={ms * 3 // 4}", f"max.block.ms={ms}"]


def java_perf(tool: str, args: list[str]) -> str:
    cmd = tool_args(tool, *args)
    jvm_end = cmd.index("-cp")
    cmd = [cmd[0], *_PERF_JVM, *(a for a in cmd[1:jvm_end] if a.startswith("-Dlog4j2")),
           *cmd[jvm_end:]]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} failed: {_first_error(out.stderr)}")
    return out.stdout + "\n" + out.stderr


def _first_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if "Exception" in ln or "ERROR" in ln]
    return (lines[0] if lines else text[-300:]).strip()[:300]


# ProducerPerformance's summaries, printed after the interim lines: the whole run's, then with
# --warmup-records the steady state's (the records after the warm-up).
_PP_TOTAL = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec .*99\.9th\.$", re.M)
_PP_STEADY = re.compile(r"^(\d+) steady state records sent, ([\d.]+) records/sec", re.M)


def producer_performance(bootstrap: str, topic: str, records: int, warmup: int, bound: int
                         ) -> float:  # fmt: skip
    """Records/s of Kafka's ProducerPerformance (idempotent, acks=all, linger 5 ms) after
    ``warmup`` records, as the confluent rows start their clock after a first record."""
    out = java_perf("kafka-producer-perf-test", [
        "--topic", topic, "--num-records", str(records + warmup), "--record-size", "100",
        "--throughput", "-1", "--bootstrap-server", bootstrap, "--warmup-records", str(warmup),
        "--command-property", "acks=all", "enable.idempotence=true", "linger.ms=5",
        *_producer_bounds(bound),
    ])  # fmt: skip
    total, steady = _PP_TOTAL.search(out), _PP_STEADY.search(out)
    if total is None or steady is None:
        raise RuntimeError(f"no summary in ProducerPerformance's output: {out[-300:]}")
    # The summaries count acknowledged records: fewer than sent is a failed run, not a rate.
    if int(total.group(1)) != records + warmup:
        raise RuntimeError(f"{total.group(1)} of {records + warmup} records acknowledged: "
                           f"{_first_error(out)}")  # fmt: skip
    return float(steady.group(2))


def consumer_performance(bootstrap: str, topic: str, records: int, bound: int) -> float:
    """Records/s of Kafka's ConsumerPerformance (a group member), over its fetch time: its
    ``nMsg.sec`` also counts joining the group, which the confluent rows do not (they assign
    partitions and start the clock at the first record)."""
    out = java_perf("kafka-consumer-perf-test", [
        "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
        "--timeout", str(bound * 1000),
    ])  # fmt: skip
    lines = [ln.split(",") for ln in out.splitlines() if "," in ln]
    header = next((i for i, ln in enumerate(lines) if "nMsg.sec" in map(str.strip, ln)), None)
    if header is None or header + 1 >= len(lines) or len(lines[header + 1]) != len(lines[header]):
        raise RuntimeError(f"no summary in ConsumerPerformance's output: {_first_error(out)}")
    row = {h.strip(): v.strip() for h, v in zip(lines[header], lines[header + 1], strict=True)}
    if int(row["data.consumed.in.nMsg"]) < records:
        raise RuntimeError(f"{row['data.consumed.in.nMsg']} of {records} records read "
                           f"(none for {bound} s)")  # fmt: skip
    return float(row["fetch.nMsg.sec"])


def latency(bootstrap: str, topic: str, rate: int, seconds: float) -> tuple[float, float, float]:
    """p50/p99/p99.9 ms from send to receipt at ``rate`` messages/s (acks=all, no linger)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 0})  # fmt: skip
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "lat", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 500, "fetch.queue.backoff.ms": 0})  # fmt: skip
    c.assign([TopicPartition(topic, 0, 0)])
    p.produce(topic, b"%.9f" % time.perf_counter(), partition=0)
    p.flush(30)
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline:  # the consumer is caught up and fetching
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            break
    samples: list[float] = []
    total = int(rate * seconds)
    start = time.perf_counter()
    sent = 0
    while sent < total or len(samples) < sent:
        now = time.perf_counter()
        while sent < total and now >= start + sent / rate:
            p.produce(topic, b"%.9f" % time.perf_counter(), partition=0)
            sent += 1
        p.poll(0)
        m = c.poll(0.0005)
        if m is not None and m.error() is None:
            samples.append((time.perf_counter() - float(m.value())) * 1000)
        if now - start > seconds + 30:
            break
    p.flush(10)
    c.close()
    samples.sort()

    def q(f: float) -> float:
        return samples[min(len(samples) - 1, int(f * len(samples)))] if samples else float("nan")

    return q(0.50), q(0.99), q(0.999)


# --- the run --------------------------------------------------------------------------------


def _rotated(i: int) -> tuple[str, ...]:
    k = i % len(BROKERS)
    return BROKERS[k:] + BROKERS[:k]


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    """Print the wall time of a section or row: where a run's minutes go."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        print(f"[{what}: {time.perf_counter() - t0:.1f} s]", flush=True)


def run(scale: Scale, work: Path, sections: set[str]) -> list[Row]:
    rows: list[Row] = []
    if "startup" in sections:
        with timed("section startup"):
            rows += startup_rows(work, scale.startup_runs)
    on_running = {"load", "groups"} | ({"memory", "producer-state"} if scale.reuse else set())
    if sections & on_running:
        with timed("sections " + "+".join(sorted(sections & on_running))):
            rows += _running(scale, work, sections, len(rows))
    if "memory" in sections and not scale.reuse:
        with timed("section memory"):
            rows += partition_memory_rows(scale.partitions, FRESH, work, scale.settle)
    if "state" in sections:
        with timed("section state"):
            rows += state_rows(scale.state, work)
    if "producer-state" in sections and not scale.reuse:
        with timed("section producer-state"):
            rows += producer_state_rows(scale.producers, work, FRESH)
    return rows


# Fresh brokers for the memory and producer-state rows, each as peers.py runs it.
FRESH: dict[str, Starter] = {
    "samsa": lambda d: SamsaBroker(d, SAME_AS_KAFKA),
    "kafka": lambda d: KafkaBroker(d),
    "tansu": lambda _d: TansuBroker(),
}


def _running(scale: Scale, work: Path, sections: set[str], done: int) -> list[Row]:
    """The rows run on three brokers started once: groups, RSS, produce, fetch, latency (and
    with ``scale.reuse`` memory and producer state)."""
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        with timed("three brokers started"):
            brokers: dict[str, BrokerProcess] = {
                "samsa": stack.enter_context(SamsaBroker(work / "samsa", SAME_AS_KAFKA)),
                "kafka": stack.enter_context(KafkaBroker(work / "kafka")),
                "tansu": stack.enter_context(TansuBroker()),
            }
        time.sleep(min(2.0, scale.settle))
        idle = Row("RSS idle", "MB", higher_is_better=False)
        for name, b in brokers.items():
            idle.values[name] = rss_mb(b.pid)
        rows.append(idle)

        if "groups" in sections:
            gs = scale.group_sizes
            bss = {n: b.bootstrap for n, b in brokers.items() if n != "tansu"}
            with timed("groups"):
                warm = ("classic",) if scale.reuse else PROTOCOLS
                grows = group_rows(bss, gs, scale.group_runs, warm, scale.classic_group_runs)
            for label, values, notes in grows:
                r = Row(label, "s", False, values, notes)
                rows.append(r)
                print(_format_row(r), flush=True)
        if "load" in sections:
            workers = Workers()
            stack.callback(workers.close)
            rows += _load_rows(scale, brokers, workers, done + len(rows))
        if scale.reuse and sections & {"memory", "producer-state"}:
            # The same brokers, loaded: a smoke run of the code, not the fresh-broker figures.
            running = {n: (lambda _d, b=b: contextlib.nullcontext(b)) for n, b in brokers.items()}
            if "memory" in sections:
                with timed("memory"):
                    rows += partition_memory_rows(scale.partitions, running, work, scale.settle)
            if "producer-state" in sections:
                with timed("producer-state"):
                    rows += producer_state_rows(scale.producers, work, running)
    return rows


def _load_rows(scale: Scale, brokers: dict[str, BrokerProcess], workers: Workers, done: int
               ) -> list[Row]:  # fmt: skip
    """Produce, transactions, fetch, latency, RSS after them, broker CPU per record."""
    rows: list[Row] = []

    def row(label: str, unit: str, fn: Callable[[str, BrokerProcess], float],
            higher: bool = True) -> Row:  # fmt: skip
        r = Row(label, unit, higher)
        for name in _rotated(done + len(rows)):
            try:
                with timed(f"{label} / {name}"):
                    r.values[name] = fn(name, brokers[name])
            except Exception as e:  # a peer that cannot run a row is said, not hidden
                r.notes[name] = f"{type(e).__name__}: {e}"[:200]
        rows.append(r)
        print(_format_row(r), flush=True)
        return r

    cpu: dict[str, tuple[float, int]] = {}

    def p100(name: str, b: BrokerProcess) -> float:
        create_topic(b.bootstrap, "p100")
        c0 = b.cpu_seconds()
        n, s = produce(b.bootstrap, "p100", scale.produce, 100)
        cpu[name] = (b.cpu_seconds() - c0, n)
        return n / s

    row("produce, 1 producer, 100 B (confluent, idempotent)", "rec/s", p100)

    def on(topic: str, fn: Callable[[str], float], partitions: int = PARTITIONS
           ) -> Callable[[str, BrokerProcess], float]:  # fmt: skip
        """A row body: create ``topic`` on the broker, then time ``fn(bootstrap)``."""

        def body(_name: str, b: BrokerProcess) -> float:
            create_topic(b.bootstrap, topic, partitions)
            return fn(b.bootstrap)

        return body

    row(
        "produce, 1 producer, 1 KB",
        "rec/s",
        on("p1k", lambda bs: _rate(produce(bs, "p1k", scale.produce_1k, 1000))),
    )
    row(
        "produce, 4 producer processes, 100 B",
        "rec/s",
        on("p4", lambda bs: _rate(workers.produce_parallel(bs, "p4", scale.produce_each))),
    )
    row(
        "produce, Kafka's ProducerPerformance, 100 B",
        "rec/s",
        on(
            "pp",
            lambda bs: producer_performance(
                bs, "pp", scale.produce, scale.perf_warmup, scale.java_bound
            ),
        ),
    )
    row(
        "transactions of 10 records, 1 partition",
        "txn/s",
        on("tx1", lambda bs: _rate(transactions(bs, "tx1", scale.txns, 1))),
    )
    row(
        "transactions of 10 records, 10 partitions",
        "txn/s",
        on("tx10", lambda bs: _rate(transactions(bs, "tx10", scale.txns, 10)), 10),
    )

    def fill(b: BrokerProcess) -> None:
        if not getattr(b, "_filled", False):
            create_topic(b.bootstrap, "f")
            produce(b.bootstrap, "f", scale.fetch, 100)
            b._filled = True  # type: ignore[attr-defined]

    fcpu: dict[str, tuple[float, int]] = {}

    def f_default(name: str, b: BrokerProcess) -> float:
        fill(b)
        c0 = b.cpu_seconds()
        n, s = fetch(b.bootstrap, "f", scale.fetch, {})
        fcpu[name] = (b.cpu_seconds() - c0, n)
        return n / s

    row("fetch, confluent consumer (librdkafka defaults)", "rec/s", f_default)

    def f_nobackoff(_name: str, b: BrokerProcess) -> float:
        fill(b)
        return _rate(fetch(b.bootstrap, "f", scale.fetch, {"fetch.queue.backoff.ms": 0}))

    def f_java(_name: str, b: BrokerProcess) -> float:
        fill(b)
        return consumer_performance(b.bootstrap, "f", scale.fetch, scale.java_bound)

    row("fetch, confluent consumer, fetch.queue.backoff.ms=0", "rec/s", f_nobackoff)
    row("fetch, Kafka's ConsumerPerformance", "rec/s", f_java)

    lat: dict[str, dict[str, tuple[float, float, float]]] = {"idle": {}, "load": {}}

    def lat_idle(name: str, b: BrokerProcess) -> float:
        create_topic(b.bootstrap, "lat", 1)
        lat["idle"][name] = latency(b.bootstrap, "lat", scale.latency_rate,
                                    scale.latency_seconds)  # fmt: skip
        return lat["idle"][name][1]

    def lat_load(name: str, b: BrokerProcess) -> float:
        # A topic of its own: the idle row's records, read again, would be "late".
        create_topic(b.bootstrap, "lat-load", 1)
        create_topic(b.bootstrap, "sat")
        sat = workers.saturate(b.bootstrap, "sat", scale.latency_seconds + 40)
        try:
            time.sleep(1)  # the saturating producer (a warm process) is under way
            lat["load"][name] = latency(b.bootstrap, "lat-load", scale.latency_rate,
                                        scale.latency_seconds)  # fmt: skip
        finally:
            workers.stop.set()
            sat.get(120)
        return lat["load"][name][1]

    r_idle = row(f"latency p99, idle, {scale.latency_rate}/s", "ms", lat_idle, False)
    r_load = row(f"latency p99, under load, {scale.latency_rate}/s", "ms", lat_load, False)
    for key, r in (("idle", r_idle), ("load", r_load)):
        for name, (p50, p99, p999) in lat[key].items():
            r.notes[name] = f"p50 {p50:.1f} / p99 {p99:.1f} / p99.9 {p999:.1f} ms"

    loaded = Row("RSS after the load rows", "MB", higher_is_better=False)
    for name, b in brokers.items():
        loaded.values[name] = rss_mb(b.pid)
    rows.append(loaded)
    for label, d in (("broker CPU s per 1M records produced", cpu),
                     ("broker CPU s per 1M records fetched", fcpu)):  # fmt: skip
        r = Row(label, "s", higher_is_better=False)
        for name, (sec, n) in d.items():
            if n:
                r.values[name] = sec / n * 1e6
        rows.append(r)
    return rows


def _rate(result: tuple[int, float]) -> float:
    n, s = result
    return n / s if s > 0 else 0.0


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.2f}" if v >= 0.1 or v == 0 else f"{v:.3f}"  # a warm group's few ms


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _format_row(r: Row) -> str:
    v = r.values
    return (f"| {r.label} ({r.unit}) | {_fmt(v.get('samsa'))} | {_fmt(v.get('kafka'))} | "
            f"{_fmt(v.get('tansu'))} | {_ratio(v.get('samsa'), v.get('kafka'))} | "
            f"{_ratio(v.get('samsa'), v.get('tansu'))} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    ap.add_argument("--work-dir", type=Path, default=None)
    ap.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated, of {', '.join(SECTIONS)} (default: all)",
    )
    ap.add_argument(
        "--log-mb",
        type=int,
        default=None,
        help="size of the log recovered after SIGKILL (default 256; the issue's 1024)",
    )
    args = ap.parse_args(argv)
    scale = QUICK if args.quick else FULL
    if args.log_mb:
        scale = dataclasses.replace(
            scale, state=dataclasses.replace(scale.state, log_mb=args.log_mb)
        )
    sections = set(args.sections.split(","))
    if sections - set(SECTIONS):
        ap.error(f"unknown sections {sorted(sections - set(SECTIONS))}")
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with timed("whole run"):
        with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="samsa-peers-") as d:
            rows = run(scale, Path(d), sections)
    print_rows(rows)
    return 0


def print_rows(rows: list[Row]) -> None:
    """The table, then each row's notes."""
    print("\n| row | samsa | Kafka | Tansu | samsa/Kafka | samsa/Tansu |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(_format_row(r))
    print("\n(ratios are samsa's figure over the peer's: above 1 is better for rec/s and txn/s,"
          " below 1 is better for s, ms and MB)")  # fmt: skip
    for r in rows:
        for name, note in r.notes.items():
            print(f"  {r.label} / {name}: {note}")


if __name__ == "__main__":
    sys.exit(main())
