"""Prometheus metrics: what they cost, and the README's figure, from scraped values.

(1) Overhead. produce.py's raw idempotent load generator ((a): pre-encoded Produce v9
    requests, 100-record batches of 100-byte values, 3 partitions, 5 in flight, acks=-1)
    against one broker with ``metrics.port`` set, alternately while ``/metrics`` is scraped
    every 100 ms by another thread (ten times Prometheus' most eager usual interval) and
    while nobody scrapes it; the median of 5 runs each, alternating. With ``--baseline SRC``
    the same load also runs against a broker started from another source tree (e.g. a worktree of
    the commit before the metrics hooks) with no scraping: the ratio is then the cost of
    the hooks themselves. Prints records/s and the ratios.
(2) Figure. A 16-second run on a broker scraped every 0.5 s: the samsa client produces at
    about 2,000 then 6,000 records/s (a paced loop, 4 s each), then a consumer reads the
    topic from the start while production stops. Messages in/s, bytes in/out per second and
    the Produce p99 latency (from the histogram's bucket deltas, as Prometheus'
    ``histogram_quantile`` computes it) are plotted from the scrapes into
    ``docs/metrics-run.png``. It shows what the exporter reports during that run, nothing
    more: one machine, one broker, rates set by the script.

    python benchmarks/metrics.py                       # both parts (~1 min)
    python benchmarks/metrics.py --quick               # small counts (< 30 s)
    python benchmarks/metrics.py --baseline ../main    # also against another tree's broker
    python benchmarks/metrics.py --no-figure           # overhead only

Everything listens on 127.0.0.1 on ports picked at run time; data goes to a temporary
directory removed at the end; every broker started is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import SamsaBroker
from produce import ensure_topic, raw_produce
from prometheus_client.parser import text_string_to_metric_families

from samsa.client import Consumer, Producer

ROOT = Path(__file__).resolve().parent.parent
FIGURE = ROOT / "docs" / "metrics-run.png"
REPEATS = 5
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_port(broker: SamsaBroker, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(broker.lines):
            if "metrics on http://" in line:
                return int(line.rsplit(":", 1)[1].split("/")[0])
        time.sleep(0.05)
    raise RuntimeError("the broker did not log its metrics port:\n" + broker.tail())


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class Scraper:
    """Scrapes ``/metrics`` every ``interval`` seconds on its own thread until stopped."""

    def __init__(self, port: int, interval: float, keep: bool = False) -> None:
        self.port = port
        self.interval = interval
        self.keep = keep
        self.scrapes: list[tuple[float, Samples]] = []
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        while not self._stop.is_set():
            samples = scrape(self.port)
            self.count += 1
            if self.keep:
                self.scrapes.append((time.monotonic(), samples))
            self._stop.wait(self.interval)


# -- (1) overhead ------------------------------------------------------------------------------


def overhead(work: Path, records: int, max_seconds: float, baseline: Path | None) -> None:
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(SamsaBroker(work / "metered", {"metrics.port": "0"}))
        port = metrics_port(broker)
        targets: dict[str, tuple[int, int | None]] = {
            "scraped every 100 ms": (broker.port, port),
            "not scraped": (broker.port, None),
        }
        if baseline is not None:
            # Both brokers run throughout and runs alternate, so a slow spell hits both.
            other = stack.enter_context(SamsaBroker(work / "baseline", src=baseline))
            targets[f"tree {baseline}, not scraped"] = (other.port, None)
        for kafka_port in {p for p, _ in targets.values()}:
            ensure_topic(kafka_port, "load")
            raw_produce(kafka_port, "load", 100, records // 4, max_seconds)  # warm-up
        runs: dict[str, list[float]] = {label: [] for label in targets}
        scrapes = 0
        for i in range(REPEATS):
            order = list(targets.items())
            for label, (kafka_port, scrape_port) in order if i % 2 == 0 else order[::-1]:
                if scrape_port is None:
                    rate = raw_produce(kafka_port, "load", 100, records, max_seconds).rate
                else:
                    with Scraper(scrape_port, 0.1) as scraper:
                        rate = raw_produce(kafka_port, "load", 100, records, max_seconds).rate
                    scrapes += scraper.count
                runs[label].append(rate)
        size = len(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read())
    print(
        f"\n(1) raw idempotent produce, 100-record batches, {records} records a run, "
        f"median of {REPEATS}"
    )
    print(f"    {scrapes} scrapes during the scraped runs; one /metrics answer is {size} bytes")
    reference = statistics.median(runs["not scraped"])
    for label, rates in runs.items():
        median = statistics.median(rates)
        spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
        print(
            f"    {label:<40} {median:>10,.0f} records/s  (runs {spread})  "
            f"ratio to not scraped: {median / reference:.2f}"
        )


# -- (2) the figure ----------------------------------------------------------------------------


def paced_produce(bootstrap: str, rate: float, seconds: float) -> int:
    sent = 0
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(elapsed * rate)
            while sent < due:
                producer.produce("figure", b"x" * 100)
                sent += 1
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(30)
    return sent


def read_all(bootstrap: str, expected: int, seconds: float) -> int:
    got = 0
    conf = {"bootstrap.servers": bootstrap, "group.id": "figure", "auto.offset.reset": "earliest"}
    with Consumer(conf) as consumer:
        consumer.subscribe(["figure"])
        deadline = time.monotonic() + seconds
        while got < expected and time.monotonic() < deadline:
            got += len(consumer.poll(0.2, 2000))
    return got


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """``histogram_quantile`` over cumulative (upper bound, count) pairs, sorted by bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            width = count - below
            return lower + (bound - lower) * ((rank - below) / width if width else 1.0)
        lower, below = bound, count
    return lower


def produce_buckets(samples: Samples) -> dict[float, float]:
    out = {}
    for (name, labels), v in samples.items():
        lab = dict(labels)
        if name == "kafka_network_requestmetrics_totaltimems_bucket" and lab["request"] == (
            "Produce"
        ):
            out[float(lab["le"])] = v
    return out


def figure(work: Path, seconds_per_phase: float, rates: tuple[float, float]) -> None:
    overrides = {"metrics.port": "0", "group.initial.rebalance.delay.ms": "0"}
    with SamsaBroker(work / "figure", overrides) as broker:
        port = metrics_port(broker)
        boot = broker.bootstrap
        with Scraper(port, 0.5, keep=True) as scraper:
            time.sleep(1.0)
            sent = sum(paced_produce(boot, rate, seconds_per_phase) for rate in rates)
            read = read_all(boot, sent, 30)
            time.sleep(1.0)
        scrapes = scraper.scrapes
    print(f"\n(2) figure: produced {sent} records, read {read}, {len(scrapes)} scrapes")
    t0 = scrapes[0][0]
    series: dict[str, list[float]] = {"in": [], "bin": [], "bout": [], "p99": []}
    times = []
    counter = "kafka_server_brokertopicmetrics_"
    for (ta, a), (tb, b) in itertools.pairwise(scrapes):
        dt = tb - ta
        times.append(tb - t0)
        series["in"].append(
            (
                total(b, counter + "messagesin_total", topic="figure")
                - total(a, counter + "messagesin_total", topic="figure")
            )
            / dt
        )
        series["bin"].append(
            (
                total(b, counter + "bytesin_total", topic="figure")
                - total(a, counter + "bytesin_total", topic="figure")
            )
            / dt
            / 1e6
        )
        series["bout"].append(
            (
                total(b, counter + "bytesout_total", topic="figure")
                - total(a, counter + "bytesout_total", topic="figure")
            )
            / dt
            / 1e6
        )
        ba, bb = produce_buckets(a), produce_buckets(b)
        delta = sorted((le, bb[le] - ba.get(le, 0.0)) for le in bb)
        p99 = quantile(0.99, delta)
        series["p99"].append(float("nan") if p99 is None else p99)
    _plot(times, series)
    print(f"    wrote {FIGURE.relative_to(ROOT)}")


def _plot(times: list[float], series: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    top.plot(times, series["in"], color="tab:blue")
    top.set_ylabel("messages in / s")
    top.set_title("samsa /metrics scraped every 0.5 s during a paced produce, then a read")
    middle.plot(times, series["bin"], label="bytes in", color="tab:blue")
    middle.plot(times, series["bout"], label="bytes out", color="tab:orange")
    middle.set_ylabel("MB / s")
    middle.legend(loc="upper left")
    bottom.plot(times, series["p99"], color="tab:red")
    bottom.set_ylabel("Produce p99 (ms)")
    bottom.set_xlabel("seconds")
    for ax in (top, middle, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="small counts, a smoke run")
    ap.add_argument("--baseline", type=Path, help="another source tree to compare the hooks")
    ap.add_argument("--no-figure", action="store_true", help="skip part (2)")
    ap.add_argument("--work-dir", type=Path, help="parent of the temporary data directory")
    args = ap.parse_args(argv)
    records, max_seconds = (300_000, 5.0) if args.quick else (2_400_000, 20.0)
    work = Path(tempfile.mkdtemp(prefix="samsa-metrics-bench-", dir=args.work_dir))
    steps: list[Callable[[], None]] = [lambda: overhead(work, records, max_seconds, args.baseline)]
    if not args.no_figure:
        phase = 2.0 if args.quick else 4.0
        steps.append(lambda: figure(work, phase, (2000.0, 6000.0)))
    try:
        for step in steps:
            step()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
