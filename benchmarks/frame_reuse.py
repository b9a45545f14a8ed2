"""What reading large requests costs the broker (issue 27, framing): produce.py's (a) raw row
with 1000-record batches (3 batches, ~330 KB a request) against a samsa broker from ``--src``
(the code before) and from this tree, alternately, ``--rounds`` times each, then one more run
of each under py-spy: the share of the broker's busy samples in the frame reader
(``FrameDecoder._allocate`` and the frame reader as a whole, protocol/framing.py).

    python benchmarks/frame_reuse.py --src /path/to/old/tree             # ~3 min
    python benchmarks/frame_reuse.py --src /path/to/old/tree --no-profile
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import PySpy, SamsaBroker, find_py_spy
from produce import Target, _timed, ensure_topic, raw_produce, warm_up

PER_BATCH = 1000


def run(broker: SamsaBroker, topic: str, records: int) -> tuple[float, float]:
    """records/s and broker CPU microseconds per record of one (a) run."""
    tg = Target("samsa", broker)
    r = _timed(tg, lambda: raw_produce(broker.port, topic, PER_BATCH, records, 60.0))
    if r.errors:
        raise RuntimeError(f"produce errors: {dict(r.errors)}")
    return r.rate, r.broker_cpu / r.records * 1e6


def shares(path: Path) -> tuple[int, float, float]:
    """Busy samples, and the shares with ``_allocate`` and with framing.py on the stack."""
    total = allocate = framing = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        allocate += n if "_allocate (" in stack else 0
        framing += n if "protocol/framing.py" in stack else 0
    return total, allocate / max(total, 1), framing / max(total, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="source tree of the code before")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=600_000, help="records per run")
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    trees: list[tuple[str, Path | None]] = [("before", args.src), ("after", None)]
    rates: dict[str, list[float]] = {name: [] for name, _ in trees}
    cpu: dict[str, list[float]] = {name: [] for name, _ in trees}
    print(f"{os.uname().nodename}, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="samsa-frame-bench-") as tmp:
        for r in range(args.rounds):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                with SamsaBroker(Path(tmp) / f"{name}-{r}", src=tree) as broker:
                    warm_up(Target("samsa", broker))
                    ensure_topic(broker.port, "a1000")
                    rate, us = run(broker, "a1000", args.records)
                rates[name].append(rate)
                cpu[name].append(us)
                print(f"  round {r + 1} {name:<6} {rate:10,.0f} rec/s {us:6.2f} us/rec broker CPU")
        print(f"(a) raw, {PER_BATCH} rec/batch, 1 conn: median of {args.rounds} rounds each")
        print(f"{'':8} {'rec/s':>10} {'us/rec':>7}")
        for name, _ in trees:
            print(
                f"{name:8} {statistics.median(rates[name]):10,.0f} "
                f"{statistics.median(cpu[name]):7.2f}"
            )
        ratio = statistics.median(rates["after"]) / statistics.median(rates["before"])
        cpu_ratio = statistics.median(cpu["after"]) / statistics.median(cpu["before"])
        print(f"after/before: {ratio:.2f}x rec/s, {cpu_ratio:.2f}x broker CPU per record")
        if args.no_profile or not find_py_spy():
            return 0
        for name, tree in trees:
            with SamsaBroker(Path(tmp) / f"{name}-spy", src=tree) as broker:
                warm_up(Target("samsa", broker))
                ensure_topic(broker.port, "a1000")
                out = Path(tmp) / f"{name}.collapsed.txt"
                with PySpy(broker.pid or 0, out):
                    run(broker, "a1000", args.records)
            total, allocate, framing = shares(out)
            print(
                f"py-spy {name}: {total} busy samples, _allocate {allocate:.1%}, "
                f"protocol/framing.py {framing:.1%}"
            )
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
