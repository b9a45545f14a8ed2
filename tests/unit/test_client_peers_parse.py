"""benchmarks/client_peers.py reads Kafka's perf tools from their printed summaries: output
captured from Kafka 4.4's ProducerPerformance and ConsumerPerformance (against a samsa
broker), parsed here without a JVM."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# An interim line (printed every 5 s of a long run) ahead of the whole run's and the steady
# state's summaries.
PRODUCER_OUT = """\
Warmup first 1000 records. Steady state results will print after the complete test summary.
1501 records sent, 300.2 records/sec (0.03 MB/sec), 80.1 ms avg latency, 1222.0 ms max latency.
3000 records sent, 1883.239171 records/sec (0.18 MB/sec), 61.05 ms avg latency, 1222.00 ms \
max latency, 54 ms 50th, 141 ms 95th, 182 ms 99th, 213 ms 99.9th.
2000 steady state records sent, 5405.405405 records/sec (0.52 MB/sec), 47.35 ms avg latency, \
124.00 ms max latency, 44 ms 50th, 91 ms 95th, 91 ms 99th, 92 ms 99.9th.
"""

CONSUMER_OUT = """\
start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, \
rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
2026-11-27 23:09:02:076, 2026-11-27 23:09:05:960, 0.2861, 0.0737, 3000, 772.3996, 3000, 884, \
0.3236, 3393.6652
"""


@pytest.fixture(scope="module")
def cp() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import client_peers
    finally:
        sys.path.remove(str(BENCHMARKS))
    return client_peers


def test_producer_performance_whole_run_and_steady_state(cp: ModuleType) -> None:
    assert cp.parse_producer_performance(PRODUCER_OUT, 3000) == (1883.239171, 5405.405405)


def test_producer_performance_short_of_acknowledgements_is_an_error(cp: ModuleType) -> None:
    # 3,000 acknowledged of 3,001 sent: the rate of a failed run is not a figure.
    with pytest.raises(RuntimeError, match="3000 of 3001 acknowledged"):
        cp.parse_producer_performance(PRODUCER_OUT, 3001)
    with pytest.raises(RuntimeError, match="no summary"):
        cp.parse_producer_performance(PRODUCER_OUT.split("3000 records")[0], 3000)


def test_consumer_performance_fetch_rate(cp: ModuleType) -> None:
    # fetch.nMsg.sec, not nMsg.sec (which counts the group join too).
    assert cp.parse_consumer_performance(CONSUMER_OUT, 3000) == 3393.6652


def test_consumer_performance_short_read_is_an_error(cp: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="3000 of 3001 records read"):
        cp.parse_consumer_performance(CONSUMER_OUT, 3001)
    with pytest.raises(RuntimeError, match="does not match its header"):
        cp.parse_consumer_performance(CONSUMER_OUT.rsplit(",", 1)[0], 3000)
    with pytest.raises(RuntimeError, match="no summary"):
        cp.parse_consumer_performance("ERROR Timed out\n", 3000)
