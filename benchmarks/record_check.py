"""What reading every record of a client batch on append costs (issue 27): produce throughput
before and after, and the check of a 1 MB zstd batch against Kafka's.

(0) the CPU time of ``check_client_batch`` alone for the batches of (1), in processes of this
    tree and of ``--src``'s, alternately (steadier than (1) on a busy machine);

(1) raw idempotent produce, one connection, 5 requests in flight, acks=-1, 3 partitions, 100 B
    values (as benchmarks/produce.py's (a)), uncompressed and compressed, against a samsa broker
    from ``--src`` (the code before) and from this tree, alternately, ``--rounds`` times each:
    the best records/s of each, and the least broker CPU time per record;
(2) a 1 MB zstd batch of 10,000 records (alike: 92 random bytes each; varied: 0-184 bytes,
    a header on every third) checked as samsa's append does (header, CRC-32C, every record:
    ``validate_produce_batch`` + ``check_client_batch``) and by Kafka 4.4's own
    ``LogValidator.validateMessagesAndAssignOffsets`` in a JVM (benchmarks/java/
    LogValidatorBench.java, after 500 runs for the JIT): median CPU milliseconds of each;
(3) (``--only latency``) the alike batch produced (acks=1) one at a time to samsa and to a
    Kafka node: the median latency;
(4) (``--only client``) what a user sees: confluent-kafka idempotent producers (acks=all,
    linger.ms 5, each ``compression.type``, 1 and 4 producer processes, 100 B values as (1)'s)
    against a broker of this tree, of ``--src``'s and (``--no-read``) of this tree with
    ``check_client_batch`` returning before it reads the records, all running at once, each
    row's ``--rounds`` runs back to back in a rotating order: the median records/s, and the
    median broker CPU per record.

    python benchmarks/record_check.py --src /path/to/old/tree     # ~3 min
    python benchmarks/record_check.py --src /path/to/old/tree --only cpu   # ~1 min
    python benchmarks/record_check.py --no-kafka                  # without (2)'s Kafka part
    python benchmarks/record_check.py --only client --no-read [--src OLD]  # ~10 min
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import HOST, SamsaBroker
from produce import (
    CODECS,
    PARTITIONS,
    VALUE_SIZE,
    build_frames,
    ensure_topic,
    new_producer,
    pipelined_produce,
)

from samsa.client._connection import BlockingConnection
from samsa.log.log import LogConfig
from samsa.log.validator import check_client_batch
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import (
    Compression,
    NewRecord,
    RecordBatchView,
    build_batch,
    validate_produce_batch,
)
from samsa.testing import create_topic, produce_request
from samsa.testing.kafka import KafkaNode
from samsa.testing.kafka import classpath as kafka_classpath

JAVA = Path(__file__).resolve().parent / "java" / "LogValidatorBench.java"

ROWS = [(100, "none"), (1000, "none"), *((1000, c) for c in ("zstd", "gzip", "lz4", "snappy"))]
# (0) also: batches as large as librdkafka's make at a high rate (~550 KB inflated)
CPU_ROWS = [*ROWS, *((5000, c) for c in ("zstd", "gzip", "lz4", "snappy"))]


def throughput(
    broker: SamsaBroker, topic: str, per_batch: int, codec: int, records: int
) -> tuple[float, float]:
    """(records/s, broker CPU microseconds per record)."""
    ensure_topic(broker.port, topic)
    n_requests = records // (per_batch * PARTITIONS)
    conn, pid, epoch = new_producer(broker.port)
    frames = build_frames(conn, topic, pid, epoch, per_batch, n_requests, codec)
    cpu = broker.cpu_seconds()
    try:
        result = pipelined_produce(conn, frames, per_batch, 30.0)
    finally:
        conn.close()
    cpu = broker.cpu_seconds() - cpu
    if result.errors:
        raise RuntimeError(f"produce errors: {dict(result.errors)}")
    return result.records / result.seconds, cpu / result.records * 1e6


def compare_throughput(src: Path | None, rounds: int, records: int) -> None:
    rows = ROWS
    best: dict[tuple[str, int, str], float] = {}
    cpu: dict[tuple[str, int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="samsa-check-bench-") as tmp:
        trees = [("after", None)] + ([("before", src)] if src is not None else [])
        for r in range(rounds):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                with SamsaBroker(Path(tmp) / f"{name}-{r}", src=tree) as broker:
                    for per_batch, codec in rows:
                        topic = f"t{per_batch}-{codec}"
                        # compressed runs are ~10x as fast: as long a clock needs 10x records
                        n = records if codec == "none" else 10 * records
                        rate, us = throughput(broker, topic, per_batch, CODECS[codec], n)
                        key = (name, per_batch, codec)
                        best[key] = max(best.get(key, 0.0), rate)
                        cpu.setdefault(key, []).append(us)
    print(f"(1) raw produce, 1 conn, 5 in flight: best records/s of {rounds} rounds, and the "
          "broker's least CPU time per record (less sensitive to a busy machine)")  # fmt: skip
    print(f"{'batch':>16} {'before/s':>11} {'after/s':>11} {'ratio':>6} "
          f"{'before us':>10} {'after us':>9} {'ratio':>6}")  # fmt: skip
    for per_batch, codec in rows:
        after = best[("after", per_batch, codec)]
        before = best.get(("before", per_batch, codec), 0.0)
        cpu_after = min(cpu[("after", per_batch, codec)])
        cpu_before = min(cpu.get(("before", per_batch, codec), [0.0]))
        print(f"{f'{per_batch} rec, {codec}':>16} {before:11,.0f} {after:11,.0f} "
              f"{after / before if before else 0:6.2f} {cpu_before:10.3f} {cpu_after:9.3f} "
              f"{cpu_after / cpu_before if cpu_before else 0:6.2f}")  # fmt: skip


def check_cpu() -> dict[str, float]:
    """CPU microseconds (this thread's) of ``check_client_batch`` per batch of each row's
    kind, the least of 5 loops: the check alone, whatever else the machine runs."""
    out = {}
    for per_batch, codec in CPU_ROWS:
        ts = time.time_ns() // 1_000_000
        values = [(b"%08d" % i).ljust(VALUE_SIZE, b"v") for i in range(per_batch)]
        records = [NewRecord(value=v, timestamp=ts) for v in values]
        view = RecordBatchView(build_batch(records, producer_id=1, producer_epoch=0,
                                           base_sequence=0, compression=CODECS[codec]))  # fmt: skip
        config, now = LogConfig(), int(time.time() * 1000)
        reps = 300 if per_batch >= 1000 else 2000
        loops = []
        for _ in range(6):  # the first warms up
            t0 = time.thread_time_ns()
            for _ in range(reps):
                check_client_batch(view, config, now)
            loops.append((time.thread_time_ns() - t0) / reps / 1000)
        out[f"{per_batch} rec, {codec}"] = min(loops[1:])
    return out


def compare_check_cpu(src: Path | None, rounds: int) -> None:
    """check_cpu() in a process of this tree and of ``src``'s, alternately: the medians."""
    trees = [("after", None)] + ([("before", src)] if src is not None else [])
    runs: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for name, tree in trees if r % 2 == 0 else trees[::-1]:
            env = dict(os.environ)
            if tree is not None:
                env["PYTHONPATH"] = str(tree.resolve() / "src")
            code = "import json, record_check; print(json.dumps(record_check.check_cpu()))"
            proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).parent,
                                  capture_output=True, text=True, check=True)  # fmt: skip
            for row, us in json.loads(proc.stdout).items():
                runs.setdefault((name, row), []).append(us)
    print(f"(0) check_client_batch alone, CPU us per batch: median of {rounds} processes each")
    print(f"{'batch':>16} {'before us':>10} {'after us':>9} {'ratio':>6}")
    for per_batch, codec in CPU_ROWS:
        row = f"{per_batch} rec, {codec}"
        after = statistics.median(runs[("after", row)])
        before = statistics.median(runs.get(("before", row), [0.0]))
        print(f"{row:>16} {before:10.1f} {after:9.1f} {after / before if before else 0:6.2f}")


def _zstd_batch(varied: bool = False) -> bytes:
    """1 MB of zstd: 10,000 records of 92 random bytes keyed k0..k9999 (laid out alike but for
    the key's length), or ``varied``: values of 0-184 random bytes, a header on every third."""
    rng = random.Random(27)
    records = [
        NewRecord(value=rng.randbytes(92), key=b"k%d" % i)
        if not varied
        else NewRecord(
            value=rng.randbytes(rng.randrange(185)),
            key=b"k%d" % i,
            headers=[("h", b"x")] if i % 3 == 0 else [],
        )
        for i in range(10_000)
    ]
    return build_batch(records, compression=Compression.ZSTD, now_ms=int(time.time() * 1000))


def samsa_check_ms(batch: bytes, n: int) -> tuple[float, float]:
    """The median and least CPU milliseconds (this thread's: steadier than wall time on a busy
    machine) of what samsa's append does to a client batch before writing it: the batch's
    header and CRC-32C, then every record (check_client_batch)."""
    config, times = LogConfig(), []
    for _ in range(n + 5):
        t0 = time.thread_time_ns()
        view = validate_produce_batch(batch)
        assert check_client_batch(view, config, int(time.time() * 1000)).error == 0
        times.append((time.thread_time_ns() - t0) / 1e6)
    return statistics.median(times[5:]), min(times[5:])


def kafka_check_ms(batch: bytes, n: int) -> tuple[float, float]:
    """The median and least CPU milliseconds of Kafka 4.4's LogValidator on the same batch, in
    a JVM of its own (benchmarks/java/LogValidatorBench.java), after 500 runs for the JIT."""
    with tempfile.NamedTemporaryFile(prefix="samsa-batch-", suffix=".bin") as f:
        f.write(batch)
        f.flush()
        cmd = ["java", "-Xmx512m", "-cp", kafka_classpath(), str(JAVA), f.name, "500", str(n)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"LogValidatorBench failed:\n{done.stderr[-3000:]}")
    got = json.loads(lines[-1])
    assert got["records"] == 10_000
    return float(got["median_ms"]), float(got["min_ms"])


def compare_with_kafka(with_kafka: bool, n: int) -> None:
    print(f"\n(2) a 1 MB zstd batch of 10,000 records checked on append: CPU ms, median of {n}")
    print(f"{'batch':>20} {'samsa ms':>9} {'Kafka ms':>9} {'ratio':>6}   least: samsa, Kafka")
    for varied in (False, True):
        batch = _zstd_batch(varied)
        samsa, samsa_min = samsa_check_ms(batch, n)
        kafka, kafka_min = kafka_check_ms(batch, n) if with_kafka else (0.0, 0.0)
        name = f"{len(batch) / 1e6:.2f} MB, {'varied' if varied else 'alike'}"
        print(f"{name:>20} {samsa:9.3f} {kafka:9.3f} {samsa / kafka if kafka else 0:5.2f}x   "
              f"{samsa_min:.3f}, {kafka_min:.3f}")  # fmt: skip


def compare_produce_latency(n: int) -> None:
    """Produce (acks=1) of the alike batch, one at a time, to samsa and to a Kafka node."""
    batch = _zstd_batch()
    with tempfile.TemporaryDirectory(prefix="samsa-check-bench-") as tmp:
        with SamsaBroker(Path(tmp) / "samsa") as broker:
            samsa = produce_latency(f"{HOST}:{broker.port}", batch, n)
        node = KafkaNode(Path(tmp) / "kafka").start()
        try:
            kafka = produce_latency(node.bootstrap, batch, n)
        finally:
            node.stop()
    print(f"\n(3) Produce (acks=1) of the alike batch, median of {n}: samsa {samsa:.2f} ms, "
          f"Kafka {kafka:.2f} ms (samsa/Kafka {samsa / kafka:.2f}x)")  # fmt: skip


def produce_latency(bootstrap: str, batch: bytes, n: int) -> float:
    host, port = bootstrap.split(":")
    with BlockingConnection(host, int(port)) as conn:
        assert create_topic(conn, "zstd-10k") == 0
        time.sleep(1)
        req = produce_request({("zstd-10k", 0): batch}, acks=1)
        times = []
        for _ in range(n + 3):
            t0 = time.perf_counter()
            resp = conn.request(ApiKey.PRODUCE, 9, req)
            times.append((time.perf_counter() - t0) * 1000)
            assert resp.responses[0].partition_responses[0].error_code == 0
    return statistics.median(times[3:])


# --- (4) a real client ----------------------------------------------------------------------

CLIENT_CODECS = ("none", "zstd", "gzip", "lz4", "snappy")
CLIENT_PRODUCERS = (1, 4)
_NO_READ_AT = "    codec = target_codec(config)\n"


def no_read_tree(root: Path) -> Path:
    """A copy of this tree's src/ in ``root`` whose check_client_batch returns before reading
    the records (the batch size check kept): the records' check's own cost, all else equal."""
    dest = root / "src"
    here = Path(__file__).resolve().parent.parent / "src"
    shutil.copytree(here, dest, ignore=shutil.ignore_patterns("__pycache__"))
    validator = dest / "samsa" / "log" / "validator.py"
    text = validator.read_text()
    if text.count(_NO_READ_AT) != 1:
        raise RuntimeError("validator.py changed: the no-read tree cannot be made")
    validator.write_text(
        text.replace(_NO_READ_AT, "    return CheckedBatch(batch)\n" + _NO_READ_AT)
    )
    return root


def _client_producer(
    port: int, topic: str, codec: str, seconds: float, rate: int, start: Any, out: Any
) -> None:
    """One confluent-kafka idempotent producer (a process of its own: the GIL is not
    shared) producing 100 B values for ``seconds`` once every producer is ready, then
    flushing: (records delivered, seconds from the start to the last delivery)."""
    from confluent_kafka import Producer

    delivered = 0
    failed = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal delivered, failed
        if err is None:
            delivered += 1
        else:
            failed += 1

    producer = Producer(
        {
            "bootstrap.servers": f"{HOST}:{port}",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": codec,
            "enable.metrics.push": False,  # no telemetry lines on stderr
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    values = [(b"%08d" % i).ljust(VALUE_SIZE, b"v") for i in range(1000)]
    producer.produce(topic, values[0], on_delivery=on_delivery)  # metadata, producer id
    if producer.flush(30) != 0:
        raise RuntimeError("the producer could not deliver its first record")
    delivered = 0
    start.wait()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    i = 0
    produce = producer.produce
    while True:
        try:
            produce(topic, values[i % 1000], partition=i % PARTITIONS, on_delivery=on_delivery)
        except BufferError:
            producer.poll(0.005)
            continue
        i += 1
        if i % 1000 == 0:
            producer.poll(0)
            now = time.perf_counter()
            if now > deadline:
                break
            if rate and i / rate > now - t0:  # ahead of the rate asked for
                time.sleep(i / rate - (now - t0))
    left = producer.flush(60)
    out.put((delivered, time.perf_counter() - t0, failed + left))


def cpu_ns(pid: int) -> int:
    """CPU nanoseconds of every live thread of ``pid`` (schedstat: /proc's utime ticks of
    10 ms are too coarse for a throttled run's ~100,000 records)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):  # the thread ended meanwhile
            pass
    return total


def client_throughput(
    broker: SamsaBroker, topic: str, codec: str, producers: int, seconds: float, rate: int = 0
) -> tuple[float, float]:
    """(records/s, broker CPU microseconds per record) of ``producers`` processes, each at
    most ``rate`` records/s if given."""
    ensure_topic(broker.port, topic)
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(producers + 1), ctx.Queue()
    procs = [
        ctx.Process(
            target=_client_producer, args=(broker.port, topic, codec, seconds, rate, start, out)
        )
        for _ in range(producers)
    ]
    for proc in procs:
        proc.start()
    assert broker.pid is not None
    start.wait(60)
    cpu = cpu_ns(broker.pid)
    results = [out.get(timeout=seconds + 120) for _ in procs]
    cpu = cpu_ns(broker.pid) - cpu
    for proc in procs:
        proc.join()
    records = sum(r[0] for r in results)
    if any(r[2] for r in results):
        raise RuntimeError(f"undelivered records: {[r[2] for r in results]}")
    return records / max(r[1] for r in results), cpu / records / 1000


def compare_client(
    src: Path | None, no_read: bool, rounds: int, seconds: float, rate: int = 0
) -> None:
    rows = [(codec, n) for n in CLIENT_PRODUCERS for codec in CLIENT_CODECS]
    rates: dict[tuple[str, str, int], list[float]] = {}
    cpus: dict[tuple[str, str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="samsa-check-bench-") as tmp:
        trees: list[tuple[str, Path | None]] = [("this", None)]
        if no_read:
            trees.append(("no read", no_read_tree(Path(tmp) / "no-read")))
        if src is not None:
            trees.append(("src", src))
        with contextlib.ExitStack() as stack:
            # every broker up at once (an idle one costs ~nothing): each row's rounds run the
            # trees back to back, their order rotating, so the machine's load drifts less
            # between them than between whole passes
            brokers = [
                (name, stack.enter_context(SamsaBroker(Path(tmp) / f"data-{i}", src=tree)))
                for i, (name, tree) in enumerate(trees)
            ]
            for codec, n in rows:
                for r in range(rounds):
                    for name, broker in brokers[r % len(brokers) :] + brokers[: r % len(brokers)]:
                        topic = f"c-{codec}-{n}-{r}"
                        got, us = client_throughput(broker, topic, codec, n, seconds, rate)
                        rates.setdefault((name, codec, n), []).append(got)
                        cpus.setdefault((name, codec, n), []).append(us)
    names = [name for name, _ in trees]
    limit = f", at most {rate:,} records/s each" if rate else ""
    print(f"(4) confluent-kafka idempotent producers (acks=all, linger.ms 5{limit}), "
          f"{seconds:g} s a run: median records/s of {rounds} rounds, median broker CPU us "
          "per record")  # fmt: skip
    print(f"{'codec, producers':>17} " + " ".join(f"{n + ' /s':>11} {n + ' us':>9}" for n in names)
          + "".join(f" {'this/' + n:>14}" for n in names[1:]))  # fmt: skip
    for codec, n in rows:
        rate = {name: statistics.median(rates[(name, codec, n)]) for name in names}
        cpu = {name: statistics.median(cpus[(name, codec, n)]) for name in names}
        cells = " ".join(f"{rate[name]:11,.0f} {cpu[name]:9.3f}" for name in names)
        ratios = "".join(
            f" {rate['this'] / rate[name]:6.2f}x,{cpu['this'] / cpu[name]:5.2f}x"
            for name in names[1:]
        )
        print(f"{f'{codec}, {n}':>17} {cells}{ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, help="the source tree of the code before")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--records", type=int, default=900_000, help="records per uncompressed run (x10 compressed)"
    )
    parser.add_argument("--no-kafka", action="store_true")
    parser.add_argument("--only", choices=("cpu", "throughput", "kafka", "latency", "client"))
    parser.add_argument(
        "--no-read", action="store_true", help="(4): also a broker that reads no records"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="(4): seconds a run")
    parser.add_argument(
        "--rate", type=int, default=0, help="(4): records/s a producer at most (0: no limit)"
    )
    args = parser.parse_args()
    if args.only in (None, "cpu"):
        compare_check_cpu(args.src, max(args.rounds, 5))
    if args.only in (None, "throughput"):
        compare_throughput(args.src, args.rounds, args.records)
    if args.only in (None, "kafka"):
        compare_with_kafka(not args.no_kafka, 200)
    if args.only == "latency":
        compare_produce_latency(30)
    if args.only == "client":
        compare_client(args.src, args.no_read, args.rounds, args.seconds, args.rate)


if __name__ == "__main__":
    main()
