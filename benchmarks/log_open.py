"""Start-up cost of opening a partition log of ``--mb`` megabytes (one active segment, the
default ``segment.bytes``): after a clean shutdown and after a crash (kill -9: no marker),
each as a ratio to the peer in the same run, a plain sequential read of the same files (the
I/O floor: the page cache is warm for both).

    .venv/bin/python benchmarks/log_open.py [--dir DIR] [--mb 100] [--records 100]

``--records`` is the number of 100-byte records per batch: fewer means more, smaller batches
and more per-batch work. DIR should be on the disk under test (the default is a temporary
directory in the current one, since /tmp may be RAM-backed).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from samsa.log.log import Log, LogConfig
from samsa.protocol.records import NewRecord, build_batch, validate_produce_batch

NOW = 1_700_000_000_000
CONFIG = LogConfig()


def build(directory: Path, megabytes: int, records: int) -> int:
    batch = build_batch([NewRecord(b"v" * 100, timestamp=NOW + i) for i in range(records)])
    view = validate_produce_batch(batch)
    log = Log.open(directory, CONFIG, NOW)
    count = megabytes * 1_000_000 // len(batch)
    for _ in range(count):
        log.append(view, NOW)
    log.close(NOW)
    return count


def read_all(directory: Path) -> float:
    start = time.perf_counter()
    for name in sorted(os.listdir(directory)):
        with open(directory / name, "rb") as f:
            while f.read(8 * 1024 * 1024):
                pass
    return time.perf_counter() - start


def open_log(directory: Path, *, clean: bool) -> float:
    start = time.perf_counter()
    log = Log.open(directory, CONFIG, NOW)
    elapsed = time.perf_counter() - start
    if clean:
        log.close(NOW)
    else:
        for seg in log.segments:  # kill -9: no flush, no clean-shutdown marker
            seg.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to create the log")
    parser.add_argument("--mb", type=int, default=100, help="size of the log")
    parser.add_argument("--records", type=int, default=100, help="records per batch")
    parser.add_argument("--runs", type=int, default=3, help="best of this many opens")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="samsa-bench-") as tmp:
        directory = Path(tmp) / "t-0"
        batches = build(directory, args.mb, args.records)
        floor = min(read_all(directory) for _ in range(args.runs))
        clean = min(open_log(directory, clean=True) for _ in range(args.runs))
        open_log(directory, clean=False)  # leaves no marker: the next opens recover
        crashed = min(open_log(directory, clean=False) for _ in range(args.runs))
    print(f"log of {args.mb} MB in {batches} batches of {args.records} records")
    print(f"read the files:        {floor * 1000:8.1f} ms  (peer)")
    print(f"open after clean stop: {clean * 1000:8.1f} ms  = {clean / floor:6.2f} x peer")
    print(f"open after a crash:    {crashed * 1000:8.1f} ms  = {crashed / floor:6.2f} x peer")


if __name__ == "__main__":
    main()
