"""The broker's fetch path: a confluent-kafka consumer reading 1.2M records, samsa vs Tansu.

Fresh samsa and Tansu brokers (started by this script), one topic of 3 partitions written
with the raw idempotent load generator of ``produce.py`` in 1000-record batches (100-byte
values), then read back from offset 0:

- "consumer, fetch.queue.backoff.ms=0": librdkafka fetches again as soon as a response is
  in, so the broker is the bound;
- "consumer, backoff=0, 8 MiB/partition": the same with ``max.partition.fetch.bytes`` 8 MiB;
- "consumer, backoff=0, wait.max.ms=10": the same with a short long-poll wait (below);
- "consumer, backoff=0, queued.min=1M": the same with ``queued.min.messages`` at 1,000,000;
- "consumer, librdkafka defaults": ``fetch.queue.backoff.ms`` at its default (1 s), which
  stalls both brokers after the first prefetch;
- "raw Fetch v12": sequential Fetch requests for all 3 partitions (64 MiB per response).

Where the consumer rows' time goes (librdkafka debug=fetch,protocol; see benchmarks/README.md
for the figures): samsa's broker is busy a few percent of the read and answers a 3 MB Fetch in
~1-2.5 ms. The gap to Tansu is one ~450 ms stall near the end of most samsa reads. librdkafka
fetches a partition only while its consumer queue (shared by all partitions) is below
``queued.min.messages``; with no backoff the queue hovers there and the partition checked first
is left out of more Fetches, so the partitions drift apart (samsa, as Kafka, answers each
requested partition with up to ``max.partition.fetch.bytes``). Once the others are at their end,
a Fetch that leaves the laggard out holds only partitions at their end, the broker long-polls
``fetch.wait.max.ms`` (500 ms) as Kafka's does, and with one Fetch in flight per broker the
consumer's queue runs dry. Tansu fills ~5 MB per response from the first partitions of the
request whatever the limit says, so the laggard reaches its end first and the stall rarely
comes. Rows with a 10 ms wait or a queue threshold near the topic's size (no partition left
out for long) have no stall. Each consumer read notes its longest consume() wait, and a table counts
the reads with a stall (a wait of 300 ms or more).

Each row is the median of ``--repeats`` reads (alternating samsa, Tansu, Tansu, samsa...),
records/s over wall-clock time from the first message; "cpu: broker" is the broker
process's CPU per wall second.

    python benchmarks/fetch.py                    # 1.2M records, 3 reads per row (~1.5 min)
    python benchmarks/fetch.py --quick            # 120k records, a smoke run
    python benchmarks/fetch.py --only samsa --profile   # samsa under py-spy, top frames
    python benchmarks/fetch.py --baseline ../main      # + samsa from another tree, same run
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import PySpy, SamsaBroker, TansuBroker
from produce import (
    PARTITIONS,
    Result,
    Target,
    _collapsed_report,
    _print_run,
    _timed,
    ensure_topic,
    high_watermarks,
    median,
    raw_fetch,
    raw_produce,
)

TOPIC = "bench-fetch"
PER_BATCH = 1000
MAX_SECONDS = 60.0  # per read
LIBRDKAFKA_FETCH_DEFAULTS = {
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 1_048_576,
    "fetch.wait.max.ms": 500,
    "queued.max.messages.kbytes": 65_536,
}


# A consume() call that waits this long for its messages is a stall (a normal 10,000-message
# call takes ~10 ms): the read's longest wait is in each run's note.
STALL_S = 0.3


def consumer_fetch(
    port: int,
    ends: dict[int, int],
    backoff_ms: int | None,
    partition_bytes: int | None = None,
    wait_ms: int | None = None,
    queued_min: int | None = None,
) -> Result:
    """Read offsets [0, ends[p]) with a confluent-kafka consumer, as produce.py's
    confluent_fetch, with ``fetch.queue.backoff.ms`` set (None: librdkafka's default) and
    the longest consume() wait after the first message noted."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    # librdkafka's own fetch sizes and wait, not produce.py's larger ones.
    config: dict[str, object] = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "group.id": "samsa-bench",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        **LIBRDKAFKA_FETCH_DEFAULTS,
    }
    if backoff_ms is not None:
        config["fetch.queue.backoff.ms"] = backoff_ms
    if partition_bytes is not None:
        config["max.partition.fetch.bytes"] = partition_bytes
    if wait_ms is not None:
        config["fetch.wait.max.ms"] = wait_ms
    if queued_min is not None:
        config["queued.min.messages"] = queued_min
    consumer = Consumer(config)
    expected = sum(ends.values())
    errors: Counter[int] = Counter()
    records = 0
    longest = 0.0
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p, end in ends.items() if end])
        # The clock starts at the first message: connecting and metadata are not counted.
        start = cpu0 = 0.0
        deadline = time.perf_counter() + 30.0  # for the first message
        while records < expected and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            msgs = consumer.consume(num_messages=10_000, timeout=0.5)
            if records:
                longest = max(longest, time.perf_counter() - t0)
            for msg in msgs:
                err = msg.error()
                if err is None:
                    if not records:
                        start, cpu0 = time.perf_counter(), time.process_time()
                        deadline = start + MAX_SECONDS
                    if msg.offset() < ends[msg.partition()]:
                        records += 1
                elif err.code() != KafkaError._PARTITION_EOF:
                    errors[int(err.code())] += 1
        seconds = time.perf_counter() - start if records else 0.0
        cpu = time.process_time() - cpu0 if records else 0.0
    finally:
        consumer.close()
    note = f"longest wait {longest * 1000:.0f} ms"
    if records != expected:
        note += f"; read {records} of {expected}"
    return Result(records, seconds, errors, note, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="120k records, 1 read per row")
    parser.add_argument("--only", choices=("samsa", "tansu"), help="run one broker only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_200_000)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy on samsa during the backoff=0 reads; print top frames",
    )
    parser.add_argument("--work-dir", type=Path, help="parent of broker data (default $TMPDIR)")
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also run a samsa broker from this source tree (before/after)",
    )
    parser.add_argument("--rows", help="only the rows whose label contains this text")
    args = parser.parse_args(argv)
    records = 120_000 if args.quick else args.records
    repeats = 1 if args.quick else max(1, args.repeats)
    work = Path(tempfile.mkdtemp(prefix="samsa-bench-fetch-", dir=args.work_dir))
    try:
        with contextlib.ExitStack() as stack:
            targets: list[Target] = []
            if args.only != "tansu":
                targets.append(Target("samsa", stack.enter_context(SamsaBroker(work / "s"))))
                if args.baseline is not None:
                    targets.append(
                        Target(
                            "samsa-base",
                            stack.enter_context(SamsaBroker(work / "b", src=args.baseline)),
                        )
                    )
            if args.only != "samsa":
                targets.append(Target("tansu", stack.enter_context(TansuBroker())))
            for tg in targets:
                ensure_topic(tg.port, TOPIC)
                r = raw_produce(tg.port, TOPIC, PER_BATCH, records, 60.0)
                tg.read_to[TOPIC] = high_watermarks(tg.port, TOPIC)
                print(
                    f"  {tg.name}: wrote {r.records} records in {PER_BATCH}-record batches "
                    f"({r.rate:,.0f} rec/s), ends {tg.read_to[TOPIC]}",
                    flush=True,
                )
            rows: list[tuple[str, Callable[[Target], Result]]] = [
                (
                    "consumer, fetch.queue.backoff.ms=0",
                    lambda tg: consumer_fetch(tg.port, tg.read_to[TOPIC], 0),
                ),
                (
                    # Tansu answers up to ~5 MB per partition whatever the request says;
                    # samsa keeps to max.partition.fetch.bytes (1 MiB by default), as Kafka.
                    "consumer, backoff=0, 8 MiB/partition",
                    lambda tg: consumer_fetch(tg.port, tg.read_to[TOPIC], 0, 8 << 20),
                ),
                (
                    # The at-end long poll bounded to 10 ms: the brokers' fetch paths
                    # without librdkafka's stall (see the module docstring).
                    "consumer, backoff=0, wait.max.ms=10",
                    lambda tg: consumer_fetch(tg.port, tg.read_to[TOPIC], 0, wait_ms=10),
                ),
                (
                    # The queue threshold above the topic: every partition is in every Fetch
                    # until the end (see the module docstring).
                    "consumer, backoff=0, queued.min=1M",
                    lambda tg: consumer_fetch(tg.port, tg.read_to[TOPIC], 0, queued_min=1_000_000),
                ),
                (
                    "consumer, librdkafka defaults",
                    lambda tg: consumer_fetch(tg.port, tg.read_to[TOPIC], None),
                ),
                (
                    "raw Fetch v12",
                    lambda tg: raw_fetch(tg.port, TOPIC, tg.read_to[TOPIC], MAX_SECONDS),
                ),
            ]
            if args.rows:
                rows = [row for row in rows if args.rows in row[0]]
            table: list[tuple[str, dict[str, Result]]] = []
            runs_of: dict[str, dict[str, list[Result]]] = {}
            for label, fn in rows:
                runs: dict[str, list[Result]] = {tg.name: [] for tg in targets}
                for i in range(repeats):
                    order = targets if i % 2 == 0 else targets[::-1]
                    for tg in order:
                        spy = contextlib.nullcontext()
                        if args.profile and tg.name == "samsa" and i == 0 and label.endswith("=0"):
                            out = work / "fetch.pyspy"
                            spy = PySpy(tg.broker.pid or 0, out)  # type: ignore[assignment]
                        with spy:
                            r = _timed(tg, functools.partial(fn, tg))
                        _print_run(tg.name, label, r)
                        runs[tg.name].append(r)
                        if args.profile and isinstance(spy, PySpy):
                            _collapsed_report(work / "fetch.pyspy")
                table.append((label, {name: median(rs) for name, rs in runs.items()}))
                runs_of[label] = runs
        names = [tg.name for tg in targets]
        print(
            f"\n{records:,} records in {PER_BATCH}-record batches over {PARTITIONS} "
            f"partitions; records/s, median of {repeats}"
        )
        head = f"{'workload':<38}" + "".join(f"{n:>14}" for n in names)
        ratios = [n for n in names if n != "tansu"] if "tansu" in names else []
        head += "".join(f"{n + '/tansu':>18}" for n in ratios)
        print(head)
        for label, res in table:
            line = f"{label:<38}" + "".join(f"{res[n].rate:>14,.0f}" for n in names)
            if res.get("tansu") and res["tansu"].rate:
                line += "".join(f"{res[n].rate / res['tansu'].rate:>17.2f}x" for n in ratios)
            print(line)
        print(f"\nreads with a consume() wait of {STALL_S * 1000:.0f} ms or more")
        print(f"{'workload':<38}" + "".join(f"{n:>14}" for n in names))
        for label, _res in table:
            if not label.startswith("consumer"):
                continue
            stalls = {
                n: sum(1 for r in rs if _longest_wait(r) >= STALL_S)
                for n, rs in runs_of[label].items()
            }
            print(
                f"{label:<38}"
                + "".join(f"{f'{stalls[n]} of {len(runs_of[label][n])}':>14}" for n in names)
            )
        # What the broker spent, whatever the client and the noisy machine did to the rates.
        print("\nbroker CPU ms per million records read (median of the runs)")
        print(f"{'workload':<38}" + "".join(f"{n:>14}" for n in names))
        for label, _res in table:
            cpu = {
                n: statistics.median(r.broker_cpu * 1e9 / max(r.records, 1) for r in rs)
                for n, rs in runs_of[label].items()
            }
            print(f"{label:<38}" + "".join(f"{cpu[n]:>14.1f}" for n in names))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _longest_wait(r: Result) -> float:
    for part in r.note.split(";"):
        part = part.strip()
        if part.startswith("longest wait "):
            return float(part.split()[2]) / 1000
    return 0.0


if __name__ == "__main__":
    sys.exit(main())
