"""``make demo`` / ``samsa demo``: delivery semantics, then an exactly-once Spark pipeline.

Everything is embedded and local: a samsa broker in a temporary directory (a subprocess on a
free port of 127.0.0.1), fault-injecting proxies in this process, Spark in local mode.

1. Delivery semantics, shown rather than told: the same events go through the same faulty
   network (a proxy that loses acknowledgements and resets connections, same seed) with
   at-most-once, at-least-once and exactly-once producer settings; the log is then read back
   and what each lost and duplicated is counted.
2. The pipeline: a payments producer writes settlement events in transactions (some voided,
   i.e. aborted) through a fault-injecting proxy, so it retries; a Spark Structured Streaming
   job reads them read_committed, totals them per merchant and writes the totals to an output
   topic with the exactly-once sink while one of its write tasks is made to fail and be
   retried. An audit table ends it: Spark's totals against the producer's own bookkeeping.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.protocol.messages import ApiKey
from samsa.testing import FaultProxy, Faults, ProxyStats, read_topic

READY = re.compile(r"samsa broker ready on 127\.0\.0\.1:(\d+)")
MERCHANTS = [
    "acme-books", "blue-bottle", "corner-deli", "dune-surf", "echo-audio", "fern-florist",
    "gold-gym", "harbor-hotel", "iris-optics", "jade-garden", "kite-toys", "lumen-lamps",
]  # fmt: skip
_T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {msg}", flush=True)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                v.rjust(w) if i else v.ljust(w)
                for i, (v, w) in enumerate(zip(values, widths, strict=True))
            )
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


# --- the embedded broker -------------------------------------------------------------------


@contextlib.contextmanager
def embedded_broker(data_dir: Path) -> Iterator[str]:
    """A ``samsa broker`` subprocess on a free port; yields its bootstrap address."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "samsa", "broker", "--data-dir", str(data_dir),
         "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    port: list[int] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            m = READY.search(line)
            if m and not port:
                port.append(int(m.group(1)))
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(30) or not port:
            raise RuntimeError("the embedded broker did not start within 30 s")
        yield f"127.0.0.1:{port[0]}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def faulty_proxy(bootstrap: str, seed: int, drop: float, reset: float) -> FaultProxy:
    faults = Faults(drop_response_rate=drop, reset_rate=reset, grace_requests=2,
                    apis=frozenset({ApiKey.PRODUCE}))  # fmt: skip
    return FaultProxy(bootstrap, faults=faults, seed=seed).start()


# --- part 1: delivery semantics ------------------------------------------------------------

SEMANTICS = [
    ("at-most-once", "acks=0, no retries", {"acks": "0", "enable.idempotence": False}),
    ("at-least-once", "acks=all, retries, no idempotence",
     {"acks": "all", "enable.idempotence": False}),
    ("exactly-once", "idempotent producer (acks=all, retries)", {}),
]  # fmt: skip


def delivery_semantics(bootstrap: str, events: int, seed: int) -> str:
    rows: list[list[Any]] = []
    for i, (name, settings, config) in enumerate(SEMANTICS):
        topic = f"semantics-{name}"
        with Admin({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topic(topic, 1)
        proxy = faulty_proxy(bootstrap, seed, drop=0.08, reset=0.05)
        failed = 0
        try:
            producer = Producer(
                {"bootstrap.servers": proxy.address, "linger.ms": 2, "batch.size": 2048,
                 "delivery.timeout.ms": 30_000, "request.timeout.ms": 2_000,
                 "client.id": f"demo-{name}", **config}
            )  # fmt: skip
            futures = []
            for n in range(events):
                futures.append(producer.send(topic, b"event-%06d" % n))
                if n % 20 == 19:
                    time.sleep(0.003)  # many small requests: many chances for faults
            producer.flush(60)
            for f in futures:
                if not f.done() or f.exception() is not None:
                    failed += 1
            producer.close(10)
            stats = proxy.stats
        finally:
            proxy.stop()
        log = collections.Counter(r.value for r in read_topic(bootstrap, topic, committed=True))
        distinct = len(log)
        rows.append(
            [name, settings, events, stats.dropped_responses, stats.resets,
             stats.produce_retries if config.get("enable.idempotence", True) else "n/a",
             sum(log.values()), events - distinct,
             sum(log.values()) - distinct, failed]
        )  # fmt: skip
        say(f"semantics {i + 1}/3 {name}: {sum(log.values())} records in the log")
    return table(
        ["semantics", "producer settings", "sent", "acks lost", "resets", "retried batches",
         "in log", "lost", "duplicated", "reported failed"],
        rows,
    )  # fmt: skip


# --- part 2: the pipeline ------------------------------------------------------------------


@dataclass
class Payments:
    """The payments producer's own bookkeeping."""

    sent: int = 0
    committed: int = 0
    voided: int = 0
    transactions: int = 0
    totals: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    counts: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


def produce_payments(
    address: str, topic: str, events: int, per_txn: int, seed: int, book: Payments, pace: float
) -> None:
    rng = random.Random(seed)
    producer = Producer(
        {"bootstrap.servers": address, "transactional.id": "payments-demo",
         "request.timeout.ms": 2_000, "linger.ms": 5, "batch.size": 4096}
    )  # fmt: skip
    try:
        producer.init_transactions()
        n = 0
        while n < events:
            producer.begin_transaction()
            txn: list[tuple[str, int]] = []
            for _ in range(min(per_txn, events - n)):
                merchant = rng.choice(MERCHANTS)
                cents = rng.randint(100, 50_000)
                value = json.dumps({"id": n, "merchant": merchant, "amount_cents": cents})
                producer.produce(topic, value.encode(), merchant.encode())
                txn.append((merchant, cents))
                n += 1
                if n % 10 == 0:
                    time.sleep(pace)
            book.transactions += 1
            book.sent += len(txn)
            if book.transactions % 7 == 0:  # a voided settlement run
                producer.flush()
                producer.abort_transaction()
                book.voided += len(txn)
            else:
                producer.commit_transaction()
                book.committed += len(txn)
                for merchant, cents in txn:
                    book.totals[merchant] += cents
                    book.counts[merchant] += 1
    except BaseException as exc:  # reported by the main thread
        book.error = exc
    finally:
        producer.close(10)
        book.done.set()


def _end_offsets(progress: dict[str, Any] | None) -> dict[str, dict[str, int]] | None:
    if not progress or not progress.get("sources"):
        return None
    end = progress["sources"][0].get("endOffset")
    return json.loads(end) if isinstance(end, str) else end


def pipeline(
    bootstrap: str, workdir: Path, events: int, seed: int, master: str
) -> tuple[str, bool]:
    """Start the payments producer and the Spark query, wait until Spark has read every
    committed payment, then audit: the tables and whether everything was equal."""
    import samsa.spark

    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic("payments", 3)
        admin.create_topic("merchant-totals", 2)
    say(f"starting Spark ({master}) ...")
    spark = samsa.spark.local_session(master, "samsa-demo", {"spark.sql.shuffle.partitions": "2"})
    # The injected task failure would make Spark log its stack trace as an ERROR; the demo
    # reports the failure and its retry itself (and a real failure still stops the query).
    spark.sparkContext.setLogLevel("FATAL")
    say("Spark is up; the first attempt of one write task will fail on purpose and be retried")
    proxy = faulty_proxy(bootstrap, seed, drop=0.05, reset=0.03)
    book = Payments()
    producer = threading.Thread(
        target=produce_payments,
        # ~15 s of production, so that Spark reads while payments still come in
        args=(proxy.address, "payments", events, 50, seed, book, 150.0 / max(events, 1)),
        name="payments",
        daemon=True,
    )
    query = None
    try:
        query = start_totals(spark, bootstrap, workdir, events)
        producer.start()
        wait_for_totals(query, bootstrap, events, book, proxy)
        progress_all = list(query.recentProgress)
        query.stop()
        query = None
        spark_rows = sum(p["numInputRows"] for p in progress_all)
        batches = len({p["batchId"] for p in progress_all if p["numInputRows"]})
        stats = proxy.stats
    finally:
        if query is not None:
            query.stop()
        proxy.stop()
        producer.join(30)
        spark.stop()
    say("pipeline finished; auditing")
    return audit(bootstrap, book, stats, spark_rows, batches)


def start_totals(spark: Any, bootstrap: str, workdir: Path, events: int) -> Any:
    """The streaming query: payments read read_committed, totalled per merchant, written to
    ``merchant-totals`` by the exactly-once sink, one write task failing once on purpose."""
    from pyspark.sql import functions as F

    schema = "id LONG, merchant STRING, amount_cents LONG"
    totals = (
        spark.readStream.format("samsa")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "payments")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max(500, events // 4)))
        .load()
        .select(F.from_json(F.col("value").cast("string"), schema).alias("p"))
        .groupBy("p.merchant")
        .agg(F.sum("p.amount_cents").alias("total_cents"), F.count("*").alias("payments"))
        .select(
            F.col("merchant").alias("key"),
            F.to_json(F.struct("merchant", "total_cents", "payments")).alias("value"),
        )
    )
    return (
        totals.writeStream.format("samsa")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "merchant-totals")
        .option("checkpointLocation", str(workdir / "checkpoint"))
        # the first attempt of write task 1 dies after 3 records, once
        .option("injectTaskFailure", f"1:3:{workdir / 'task-failed-once'}")
        .outputMode("complete")
        .trigger(processingTime="1 second")
        .queryName("merchant_totals")
        .start()
    )


def wait_for_totals(
    query: Any, bootstrap: str, events: int, book: Payments, proxy: FaultProxy
) -> None:
    """Until the query has read up to the payments' last stable offsets once the producer is
    done (progress noted every 3 s); RuntimeError if the query or the producer fails, or after
    240 s."""
    deadline = time.monotonic() + 240
    last_note = 0.0
    target: dict[str, dict[str, int]] | None = None
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if query.exception() is not None:
            raise RuntimeError(f"the Spark query failed: {query.exception()}")
        progress = query.lastProgress
        if time.monotonic() - last_note > 3:
            last_note = time.monotonic()
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            batch = progress["batchId"] if progress else "-"
            say(
                f"producer {book.sent}/{events} events in {book.transactions} txns "
                f"({book.voided} voided), faults injected {proxy.stats.faults}, "
                f"retried batches {proxy.stats.produce_retries} | Spark batch {batch}, "
                f"{rows} rows read"
            )
        if book.done.is_set() and book.error is not None:
            raise RuntimeError(f"the payments producer failed: {book.error!r}")
        if book.done.is_set() and target is None:
            with Consumer(
                {"bootstrap.servers": bootstrap, "isolation.level": "read_committed"}
            ) as c:
                tps = [TopicPartition("payments", p) for p in range(3)]
                lso = c.list_offsets(tps, -1)
            target = {"payments": {str(tp.partition): off for tp, off in lso.items()}}
            say(f"producer done; waiting for Spark to reach {json.dumps(target)}")
        if target is not None and _end_offsets(progress) == target:
            return
    raise RuntimeError("the pipeline did not finish within 240 s")


def audit(
    bootstrap: str, book: Payments, stats: ProxyStats, spark_rows: int, batches: int
) -> tuple[str, bool]:
    """Spark's totals (the output topic, read_committed) against the producer's bookkeeping,
    and the logs' counts: the tables, and whether everything was equal."""
    log_all = read_topic(bootstrap, "payments", committed=False)
    log_committed = read_topic(bootstrap, "payments", committed=True)
    ids = collections.Counter(json.loads(r.value or b"{}")["id"] for r in log_all)
    out_committed = read_topic(bootstrap, "merchant-totals", committed=True)
    out_all = read_topic(bootstrap, "merchant-totals", committed=False)
    latest: dict[str, dict[str, Any]] = {}
    for r in sorted(out_committed, key=lambda r: (r.partition, r.offset)):
        doc = json.loads(r.value or b"{}")
        latest[doc["merchant"]] = doc

    merchant_rows = []
    all_equal = True
    for m in sorted(set(book.totals) | set(latest)):
        got = latest.get(m, {})
        ok = got.get("total_cents") == book.totals.get(m) and got.get(
            "payments"
        ) == book.counts.get(m)
        all_equal &= ok
        merchant_rows.append(
            [m, book.counts.get(m, 0), got.get("payments", "-"),
             f"{book.totals.get(m, 0) / 100:,.2f}", f"{got.get('total_cents', 0) / 100:,.2f}",
             "yes" if ok else "NO"]
        )  # fmt: skip
    spark_total = sum(d["total_cents"] for d in latest.values())
    expected_total = sum(book.totals.values())
    all_equal &= spark_total == expected_total and spark_rows == book.committed
    audit = [
        ["payment events sent (in transactions)", book.sent],
        ["  committed", book.committed],
        ["  voided (aborted transactions)", book.voided],
        ["acknowledgements lost / connections reset by the proxy",
         f"{stats.dropped_responses} / {stats.resets}"],
        ["producer retries (batches sent again)", stats.produce_retries],
        ["duplicates the broker refused (acks lost: re-sent batches already in the log)",
         f"those of {stats.dropped_responses} requests; "
         f"{len(log_all) - len(ids)} duplicate records written"],
        ["records in the payments log (all / read_committed)",
         f"{len(log_all)} / {len(log_committed)}"],
        ["distinct events in the log (= events sent)", f"{len(ids)} (= {book.sent})"],
        ["rows Spark read, read_committed (= committed events)",
         f"{spark_rows} in {batches} micro-batches (= {book.committed})"],
        ["output records committed (one per merchant per batch, complete mode)",
         f"{len(out_committed)} in {batches} batches"],
        ["output records of the failed task attempt (aborted, invisible)",
         len(out_all) - len(out_committed)],
        ["Spark's grand total vs expected",
         f"{spark_total / 100:,.2f} vs {expected_total / 100:,.2f}"],
        ["equal", "yes" if all_equal else "NO"],
    ]  # fmt: skip
    text = (
        table(["merchant", "payments sent", "Spark count", "expected total", "Spark total",
               "equal"], merchant_rows)
        + "\n\n"
        + table(["audit", "value"], audit)
    )  # fmt: skip
    return text, all_equal


def run(events: int = 3000, semantics_events: int = 2000, seed: int = 7,
        master: str = "local[2,4]", keep: bool = False) -> int:  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="samsa-demo-"))
    say(f"work directory {workdir}")
    try:
        with embedded_broker(workdir / "broker") as bootstrap:
            say(f"embedded samsa broker on {bootstrap}")
            print("\n== 1. Delivery semantics: the same events through the same faulty network",
                  flush=True)  # fmt: skip
            semantics = delivery_semantics(bootstrap, semantics_events, seed)
            print(semantics, flush=True)
            print("\n== 2. Payments -> Spark (read_committed, per merchant) -> exactly-once sink",
                  flush=True)  # fmt: skip
            audit, ok = pipeline(bootstrap, workdir, events, seed, master)
            print(audit, flush=True)
        say("done" if ok else "MISMATCH")
        return 0 if ok else 1
    finally:
        if keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=3000, help="payment events (default 3000)")
    p.add_argument("--semantics-events", type=int, default=2000,
                   help="events per delivery-semantics run (default 2000)")  # fmt: skip
    p.add_argument("--seed", type=int, default=7, help="fault and data seed (default 7)")
    p.add_argument("--master", default="local[2,4]", help="Spark master (default local[2,4])")
    p.add_argument("--keep", action="store_true", help="keep the temporary work directory")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m samsa.demo", description=__doc__)
    add_arguments(parser)
    a = parser.parse_args(argv)
    return run(a.events, a.semantics_events, a.seed, a.master, a.keep)


if __name__ == "__main__":
    sys.exit(main())
