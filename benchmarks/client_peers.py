"""samsa's client, confluent-kafka and Kafka's Java client, on a samsa broker and on Kafka.

One workload (100-byte values, 8-byte keys, one topic of 4 partitions, idempotent, acks=all,
``--records`` records), three clients, two brokers, one run:

- samsa: per-record ``produce()`` then ``flush()``; ``produce_batch`` of Arrow columns;
  ``consume()`` and ``consume_arrow()`` of every record, partitions assigned from the start;
- confluent-kafka: per-record ``produce()`` then ``flush()``; ``consume()`` with
  ``fetch.queue.backoff.ms=0`` (the consumer cells and ratios) and with librdkafka's defaults
  (printed below the table: their 1 s backoff once the prefetch queue is full caps them);
- Kafka's Java client: ``ProducerPerformance`` (``--record-size 100``, idempotent, acks=all)
  and ``ConsumerPerformance`` (a group member reading the topic), in JVMs with the options
  peers.py gives them (Kafka's own perf-test options).

The Python runs are client.py's children (a fresh process each); every linger.ms is its
client's default (5 ms in all three). Where the Java tools are counted differently, they are
counted in the Java client's favour: ProducerPerformance sends no keys (it has no option for
them) and its figure is its steady state after ``--warmup`` records (connecting, metadata,
the producer id and the JIT's first minutes are not counted; the Python clients' clocks
start before their first record); ConsumerPerformance's figure is ``fetch.nMsg.sec``, which
leaves out its group join. The Python consumers read a topic filled once per broker by
confluent-kafka; ConsumerPerformance reads the same topic.

Both brokers are started fresh on free ports of 127.0.0.1 and stopped at the end; the
brokers alternate from repeat to repeat and so do the clients within a row, and each cell is
the median of ``--repeat`` runs. Every run is bounded in records and in time (``--cap``
seconds for a Python client; the Java tools by their record count, by the producer's
delivery/request/block timeouts and the consumer's ``--timeout`` at ``--java-bound`` seconds,
and by peers.py's 600 s on the JVM). ``--quick`` is a smoke run (small counts, under a
minute: 28 s at load average 2).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import BrokerProcess, KafkaBroker, SamsaBroker
from _peerlib import create_topic, machine, wait_producer_id
from client import PARTITIONS, run_child
from peers import _PP_STEADY, _PP_TOTAL, SAME_AS_KAFKA, _producer_bounds, java_perf

BROKERS = ("samsa", "kafka")


@dataclass(frozen=True)
class ClientRow:
    """A row: the role each client runs for it (client.py's child roles, or java-*)."""

    label: str
    samsa: str
    ck: str
    java: str


# The peers of produce_batch are the other clients' only producers, their per-record ones.
ROWS = (
    ClientRow("produce(), per record", "produce-samsa", "produce-ck", "java-produce"),
    ClientRow("produce_batch (Arrow)", "produce-batch-samsa", "produce-ck", "java-produce"),
    ClientRow("consume()", "consume-samsa", "consume-ck-nobackoff", "java-consume"),
    ClientRow("consume_arrow()", "consume-arrow-samsa", "consume-ck-nobackoff", "java-consume"),
)
PRODUCERS = ("produce-samsa", "produce-batch-samsa", "produce-ck", "java-produce")
CONSUMERS = ("consume-samsa", "consume-arrow-samsa", "consume-ck-nobackoff", "consume-ck",
             "java-consume")  # fmt: skip


# --- Kafka's perf tools: their summaries -------------------------------------------------


def parse_producer_performance(out: str, records: int) -> tuple[float, float]:
    """ProducerPerformance's records/s, the whole run's and the steady state's (after its
    warm-up). Fewer acknowledged than ``records`` is a failed run, not a rate."""
    total, steady = _PP_TOTAL.search(out), _PP_STEADY.search(out)
    if total is None or steady is None:
        raise RuntimeError(f"no summary in ProducerPerformance's output: {out[-300:]!r}")
    if int(total.group(1)) != records:
        raise RuntimeError(f"ProducerPerformance: {total.group(1)} of {records} acknowledged")
    return float(total.group(2)), float(steady.group(2))


_CP_HEADER = re.compile(r"^start\.time,.*$", re.M)


def parse_consumer_performance(out: str, records: int) -> float:
    """ConsumerPerformance's fetch records/s (its clock without the group join): the CSV line
    under its header. Fewer records read than ``records`` is a failed run."""
    head = _CP_HEADER.search(out)
    if head is None:
        raise RuntimeError(f"no summary in ConsumerPerformance's output: {out[-300:]!r}")
    names = [h.strip() for h in head.group(0).split(",")]
    line = out[head.end() :].lstrip("\n").split("\n", 1)[0]
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(names):
        raise RuntimeError(f"ConsumerPerformance's summary does not match its header: {line!r}")
    summary = dict(zip(names, cells, strict=True))
    read = int(summary["data.consumed.in.nMsg"])
    if read < records:
        raise RuntimeError(f"ConsumerPerformance: {read} of {records} records read")
    return float(summary["fetch.nMsg.sec"])


def java_produce(bootstrap: str, topic: str, records: int, warmup: int, bound: int) -> float:
    out = java_perf("kafka-producer-perf-test", [
        "--topic", topic, "--num-records", str(records + warmup), "--record-size", "100",
        "--throughput", "-1", "--bootstrap-server", bootstrap, "--warmup-records", str(warmup),
        "--command-property", "acks=all", "enable.idempotence=true", *_producer_bounds(bound),
    ])  # fmt: skip
    return parse_producer_performance(out, records + warmup)[1]


def java_consume(bootstrap: str, topic: str, records: int, bound: int) -> float:
    out = java_perf("kafka-consumer-perf-test", [
        "--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
        "--timeout", str(bound * 1000),
    ])  # fmt: skip
    return parse_consumer_performance(out, records)


# --- the run --------------------------------------------------------------------------------


@dataclass
class Scale:
    records: int
    repeat: int
    cap: float  # seconds at most per Python run
    warmup: int  # ProducerPerformance's records before its steady state
    java_bound: int  # seconds the Java tools wait on a broker that does not answer


FULL = Scale(1_000_000, 3, 120.0, 10_000, 30)
QUICK = Scale(20_000, 1, 20.0, 1_000, 10)


@dataclass
class Results:
    rates: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    capped: set[tuple[str, str]] = field(default_factory=set)

    def median(self, broker: str, role: str) -> float | None:
        got = self.rates.get((broker, role))
        return statistics.median(got) if got else None


def _rotate(seq: tuple[str, ...], k: int) -> tuple[str, ...]:
    k = k % len(seq) if seq else 0
    return seq[k:] + seq[:k]


def one_run(role: str, b: BrokerProcess, topic: str, scale: Scale) -> tuple[float, bool]:
    """(records/s, capped) of one client run on broker ``b``."""
    bs, n = b.bootstrap, scale.records
    if role == "java-produce":
        return java_produce(bs, topic, n, scale.warmup, scale.java_bound), False
    if role == "java-consume":
        return java_consume(bs, topic, n, scale.java_bound), False
    out = run_child(role, bs, topic, n, scale.cap)
    if out.get("missing"):
        raise RuntimeError(f"{out['missing']} not built")
    return out["records"] / out["seconds"], bool(out["capped"])


def run(scale: Scale, work: Path, log: Callable[[str], None], only: str | None = None
        ) -> Results:  # fmt: skip
    res = Results()
    producers = () if only == "consumer" else PRODUCERS
    consumers = () if only == "producer" else CONSUMERS
    with contextlib.ExitStack() as stack:
        t0 = time.perf_counter()
        brokers: dict[str, BrokerProcess] = {
            "samsa": stack.enter_context(SamsaBroker(work / "samsa", SAME_AS_KAFKA)),
            "kafka": stack.enter_context(KafkaBroker(work / "kafka")),
        }
        for b in brokers.values():
            wait_producer_id(b.port)
            if not consumers:
                continue
            # The topic every consumer reads, the same records on both brokers.
            create_topic(b.bootstrap, "read", PARTITIONS)
            fill = run_child("produce-ck", b.bootstrap, "read", scale.records, scale.cap)
            if fill["capped"]:
                raise RuntimeError(f"could not fill the read topic on {b.name}")
        log(f"[brokers started, read topics filled: {time.perf_counter() - t0:.1f} s]")
        seq = 0
        for rep in range(scale.repeat):
            for name in _rotate(BROKERS, rep):
                b = brokers[name]
                for role in _rotate(producers, rep) + _rotate(consumers, rep):
                    key = (name, role)
                    if key in res.errors:
                        continue  # failed once: said once, not retried
                    if role in PRODUCERS:
                        seq += 1
                        topic = f"w{seq}"
                        create_topic(b.bootstrap, topic, PARTITIONS)
                    else:
                        topic = "read"
                    t1 = time.perf_counter()
                    try:
                        rate, capped = one_run(role, b, topic, scale)
                    except Exception as e:  # a run that fails is said, not hidden
                        res.errors[key] = f"{type(e).__name__}: {e}"[:300]
                        log(f"  {name:5} {role:22} FAILED {res.errors[key]}")
                        continue
                    res.rates.setdefault(key, []).append(rate)
                    if capped:
                        res.capped.add(key)
                    wall = time.perf_counter() - t1
                    log(f"  {name:5} {role:22} {rate:>12,.0f} rec/s  ({wall:.1f} s wall)")
    return res


def _cell(res: Results, broker: str, role: str) -> str:
    if (broker, role) in res.errors:
        return "failed"
    v = res.median(broker, role)
    if v is None:
        return "-"
    return f"{v / 1e3:,.0f}k" + (" (capped)" if (broker, role) in res.capped else "")


def _ratio(res: Results, broker: str, a: str, b: str) -> str:
    x, y = res.median(broker, a), res.median(broker, b)
    return f"{x / y:.2f}x" if x and y else "-"


def table(res: Results) -> list[str]:
    out = ["| path | broker | samsa | confluent-kafka | Java client | samsa/ck | samsa/Java |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in ROWS:
        ran = {k for k in (*res.rates, *res.errors) if k[1] in (r.samsa, r.ck, r.java)}
        if not ran:
            continue  # a row left out by --only
        for name in BROKERS:
            out.append(
                f"| {r.label} | {name} | {_cell(res, name, r.samsa)} | {_cell(res, name, r.ck)} "
                f"| {_cell(res, name, r.java)} | {_ratio(res, name, r.samsa, r.ck)} "
                f"| {_ratio(res, name, r.samsa, r.java)} |"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    ap.add_argument("--records", type=int, help=f"records per run (default {FULL.records:,})")
    ap.add_argument("--repeat", type=int, help=f"runs per cell (default {FULL.repeat})")
    ap.add_argument("--cap", type=float, help="seconds at most per Python client run")
    ap.add_argument("--only", choices=("producer", "consumer"), help="run only these rows")
    ap.add_argument("--work-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    scale = dataclasses.replace(
        QUICK if args.quick else FULL,
        **{k: v for k in ("records", "repeat", "cap") if (v := getattr(args, k))},
    )
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="samsa-client-peers-") as d:
        res = run(scale, Path(d), lambda s: print(s, flush=True), args.only)
    load = os.getloadavg()
    print(
        f"\n{scale.records:,} records of 100 B (8 B keys; the Java producer none), "
        f"{PARTITIONS} partitions, idempotent, acks=all; records/s, median of {scale.repeat}"
    )
    print("\n".join(table(res)))
    if args.only != "producer":
        ck_defaults = ", ".join(f"{_cell(res, n, 'consume-ck')} on {n}" for n in BROKERS)
        print(f"\nconfluent-kafka's consumer with librdkafka's defaults: {ck_defaults}")
    print("\nevery run (records/s, in the order run):")
    for (name, role), rates in sorted(res.rates.items()):
        print(f"  {name} / {role}: {', '.join(f'{r / 1e3:,.0f}k' for r in rates)}")
    for (name, role), err in res.errors.items():
        print(f"  {name} / {role}: {err}")
    print(f"\n(whole run {time.perf_counter() - t0:.0f} s; load average at end {load[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
