"""samsa's Spark source and exactly-once sink side by side with Spark's own Kafka connector.

Spark's Kafka connector (``spark-sql-kafka-0-10_2.13``, format ``kafka``) is what a PySpark
user picks today. The pinned pyspark is 4.3.0, but Maven Central does not serve the 4.3.0
connector here: this runs **4.2.0**, the nearest release it serves (``kafka/spark-connector/
pom.xml``; ``make spark-connector`` resolves it and its kafka-clients into a cache outside the
repository; the session gets those jars as ``spark.jars``).

One run, one local SparkSession (``local[2,4]``: two cores, a failed task is tried up to four
times), against a samsa broker and then an Apache Kafka node (the pinned release, one KRaft
node), each on 127.0.0.1 and stopped before the next starts. On each, the same data (N records,
8-byte keys, 100-byte values, 3 partitions):

1. read: a batch read of the whole topic, ``format("samsa")`` against ``format("kafka")``,
   both read_committed; each reads every value (``count(*)`` and ``sum(length(value))``,
   checked against N and N x 100);
2. write: the same cached rows through samsa's exactly-once sink (``format("samsa")``,
   per-task transactions committed by the driver) against the connector's at-least-once sink
   (``format("kafka")``, its defaults: kafka-clients' idempotent producer, acks=all);
3. a task failure: the same job through each sink, its value column made by a Python UDF
   that raises on attempt 0 of Spark partition 1 once a third of that partition's rows have
   gone by (Spark retries the task). The output is read back read_committed and its keys
   counted: duplicates (a key more than once) and missing keys; the records in the log
   (read_uncommitted) show how much the failed attempt had written. The UDF's output
   reaches either sink in Arrow batches of 10,000 rows, so the failed attempt writes
   something only from ~100k records up (30k rows in a partition).

Figures 1 and 2 are the best of ``--repeat`` rounds after a warm-up round (Python workers,
JIT, the connector's consumer and producer pools); within a round the order of the two
formats alternates. Ratios are samsa's records/s over the connector's.

    make bench-spark-connector                             # 200k records (~3 min)
    python benchmarks/spark_connector.py --records 20000   # smoke run
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _brokers import ROOT, BrokerProcess, KafkaBroker, SamsaBroker
from peers import machine

from samsa.client import Admin, Producer
from samsa.testing import read_topic
from samsa.testing.kafka import cache_dir

POM = ROOT / "kafka" / "spark-connector" / "pom.xml"
FAIL_PARTITION = 1


def connector_version() -> str:
    """The connector release pinned in kafka/spark-connector/pom.xml."""
    m = re.search(r"<spark\.kafka\.version>([^<]+)</spark\.kafka\.version>", POM.read_text())
    if m is None:
        raise SystemExit(f"no <spark.kafka.version> in {POM}")
    return m.group(1)


def connector_jars(version: str) -> list[str]:
    """The jars ``make spark-connector`` resolved (a classpath file beside Kafka's)."""
    path = cache_dir().parent / f"spark-kafka-{version}" / "classpath.txt"
    try:
        jars = [j for j in path.read_text().strip().split(":") if j]
    except FileNotFoundError:
        raise SystemExit(f"{path} is missing: run `make spark-connector` first") from None
    missing = [j for j in jars if not Path(j).exists()]
    if not jars or missing:
        raise SystemExit(f"{path} names missing jars {missing}: run `make spark-connector`")
    return jars


def measure(workloads: dict[str, Callable[[], None]], repeat: int) -> dict[str, float]:
    """Seconds of each workload: best of ``repeat`` rounds after a warm-up round; the order
    within a round alternates so that a slow spell of the machine hits both."""
    names = list(workloads)
    for name in names:
        workloads[name]()
    best = dict.fromkeys(names, float("inf"))
    for r in range(repeat):
        for name in names if r % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            workloads[name]()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def fill(bootstrap: str, topic: str, n: int) -> None:
    value = b"x" * 100
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                   "batch.size": 256 * 1024}) as p:  # fmt: skip
        for i in range(n):
            p.produce(topic, value, b"%08d" % i)
        p.flush()


def failing_rows(spark: Any, n: int, partitions: int, marker: Path) -> Any:
    """N rows (key, 100-byte value, both naming the row) whose value UDF raises on attempt 0 of
    Spark partition 1 after a third of its rows, touching ``marker`` as it does."""
    from pyspark import TaskContext
    from pyspark.sql.functions import udf

    warnings.filterwarnings("ignore", message="Cannot infer the eval type from type hints")

    # spark.range gives partition p the ids [p*n//partitions, (p+1)*n//partitions)
    lo, hi = FAIL_PARTITION * n // partitions, (FAIL_PARTITION + 1) * n // partitions
    fail_at = lo + (hi - lo) // 3
    marker_path = str(marker)

    def value(i: int) -> str:
        ctx = TaskContext.get()
        if i == fail_at and ctx is not None and ctx.attemptNumber() == 0:
            Path(marker_path).touch()
            raise RuntimeError(f"injected task failure at row {i}")
        return f"{i:08d}" + "x" * 92

    make_value = udf(value, "string").asNondeterministic()
    return (
        spark.range(0, n, numPartitions=partitions)
        .select(make_value("id").alias("value"), "id")
        .selectExpr("lpad(CAST(id AS STRING), 8, '0') AS key", "value")
    )


def count_output(bootstrap: str, topic: str, n: int) -> dict[str, int]:
    """Duplicates and missing keys of ``topic`` read_committed; records in its log."""
    keys = collections.Counter(r.key for r in read_topic(bootstrap, topic, timeout=120))
    expected = {b"%08d" % i for i in range(n)}
    strays = set(keys) - expected
    if strays:
        raise AssertionError(f"{topic}: {len(strays)} keys that no input row has")
    in_log = len(read_topic(bootstrap, topic, committed=False, timeout=120))
    return {
        "output": sum(keys.values()),
        "duplicates": sum(c - 1 for c in keys.values()),
        "missing": len(expected - set(keys)),
        "in_log": in_log,
    }


def run_broker(
    spark: Any, broker: BrokerProcess, a: argparse.Namespace, work: Path
) -> dict[str, Any]:
    bs = broker.bootstrap
    with Admin({"bootstrap.servers": bs}) as admin:
        for topic in ("in", "out-samsa", "out-kafka", "fail-samsa", "fail-kafka"):
            admin.create_topic(topic, a.partitions)
    t = time.perf_counter()
    fill(bs, "in", a.records)
    print(f"{broker.name}: filled 'in' with {a.records} records in "
          f"{time.perf_counter() - t:.1f} s", flush=True)  # fmt: skip

    def reader(fmt: str) -> Callable[[], None]:
        df = (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", bs)
            .option("subscribe", "in")
            .option("kafka.isolation.level", "read_committed")
            .load()
        )

        def read() -> None:
            n, size = df.selectExpr("count(*)", "sum(length(value))").first()
            assert (n, size) == (a.records, 100 * a.records), (fmt, n, size)

        return read

    rows = (
        spark.range(0, a.records, numPartitions=a.partitions)
        .selectExpr("lpad(CAST(id AS STRING), 8, '0') AS key", "repeat('x', 100) AS value")
        .cache()
    )
    rows.count()

    def writer(fmt: str, df: Any, topic: str) -> Callable[[], None]:
        def write() -> None:
            (
                df.write.format(fmt)
                .option("kafka.bootstrap.servers", bs)
                .option("topic", topic)
                .mode("append")
                .save()
            )

        return write

    secs = measure(
        {
            "read samsa": reader("samsa"),
            "read kafka": reader("kafka"),
            "write samsa": writer("samsa", rows, "out-samsa"),
            "write kafka": writer("kafka", rows, "out-kafka"),
        },
        a.repeat,
    )
    rows.unpersist()
    print(f"{broker.name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in secs.items()), flush=True)

    failures: dict[str, dict[str, Any]] = {}
    for fmt in ("samsa", "kafka"):
        marker = work / f"{broker.name}-{fmt}.failed"
        t = time.perf_counter()
        writer(fmt, failing_rows(spark, a.records, a.partitions, marker), f"fail-{fmt}")()
        took = time.perf_counter() - t
        failures[fmt] = {"injected": marker.exists(), "seconds": took,
                         **count_output(bs, f"fail-{fmt}", a.records)}  # fmt: skip
        print(f"{broker.name}: {fmt} sink with a failed task: {failures[fmt]}", flush=True)
    return {"secs": secs, "failures": failures}


def report(results: dict[str, dict[str, Any]], a: argparse.Namespace, version: str) -> None:
    import pyspark

    print(f"\nmachine: {machine()}")
    print(f"{a.records} records (8 B keys, 100 B values), {a.partitions} partitions; pyspark "
          f"{pyspark.__version__}, {a.master}; Spark's Kafka connector spark-sql-kafka-0-10_2.13 "
          f"{version} (the 4.3.0 connector is not served by Maven Central here; 4.2.0 is the "
          f"nearest); best of {a.repeat} after a warm-up")  # fmt: skip
    print("\n| broker | workload | samsa format rec/s | kafka format rec/s | samsa/connector |")
    print("|---|---|---|---|---|")
    for broker, r in results.items():
        s = r["secs"]
        for label, key in (
            ("batch read, read_committed", "read"),
            ("write: samsa exactly-once, connector at-least-once", "write"),
        ):
            ours, theirs = a.records / s[f"{key} samsa"], a.records / s[f"{key} kafka"]
            print(f"| {broker} | {label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f} |")
    print(
        "\nA task failure (attempt 0 of partition 1 raises after a third of its rows; "
        "Spark retries it), output read back read_committed:"
    )
    print(
        "\n| broker | sink | failure injected | output records | duplicates | missing "
        "| records in the log (read_uncommitted) | job s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for broker, r in results.items():
        for fmt, label in (("samsa", "samsa exactly-once"), ("kafka", "connector")):
            f = r["failures"][fmt]
            print(f"| {broker} | {label} | {'yes' if f['injected'] else 'NO'} | {f['output']:,} "
                  f"| {f['duplicates']:,} | {f['missing']:,} | {f['in_log']:,} "
                  f"| {f['seconds']:.1f} |")  # fmt: skip

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print()
    for broker, r in results.items():
        s, f = r["secs"], r["failures"]
        read_ok = s["read samsa"] <= s["read kafka"]
        write_ok = s["write samsa"] <= s["write kafka"]
        dup_ok = f["samsa"]["injected"] and f["samsa"]["duplicates"] == 0
        dup_ok = dup_ok and f["samsa"]["missing"] == 0
        print(f"{broker}: samsa read >= connector read: {met(read_ok)}; samsa exactly-once "
              f"write >= connector at-least-once write: {met(write_ok)}; no duplicate or lost "
              f"record from samsa's sink after the failed task: {met(dup_ok)}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--master", default="local[2,4]")
    ap.add_argument("--only", choices=("samsa", "kafka"), help="one broker only")
    ap.add_argument("--timeout", type=float, default=1200.0,
                    help="seconds before every Spark job is cancelled")  # fmt: skip
    a = ap.parse_args(argv)
    version = connector_version()
    jars = connector_jars(version)

    import samsa.spark

    spark = samsa.spark.local_session(
        a.master, "samsa-vs-spark-kafka", conf={"spark.jars": ",".join(jars)}
    )
    # a hung job (a broker that stopped answering) is cancelled, so every broker is stopped
    watchdog = threading.Timer(a.timeout, spark.sparkContext.cancelAllJobs)
    watchdog.daemon = True
    watchdog.start()
    results: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="samsa-spark-connector-") as tmp:
            work = Path(tmp)
            brokers: list[BrokerProcess] = [
                SamsaBroker(work / "samsa"),
                KafkaBroker(work / "kafka"),
            ]
            for b in brokers:
                if a.only in (None, b.name):
                    with b:
                        results[b.name] = run_broker(spark, b, a, work)
    finally:
        watchdog.cancel()
        spark.stop()
    report(results, a, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
