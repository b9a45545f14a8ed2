"""Append throughput of the partition log: batches of 100 records of 100 bytes, appended
through ``Log.append`` (offset assignment, indexing, segment rolls), without and with an
fsync (``Log.flush``) after every append.

    .venv/bin/python benchmarks/log_append.py [--dir DIR] [--seconds 2]

DIR should be on the disk under test (the default is a temporary directory in the current
one, since /tmp may be RAM-backed).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from samsa.log.log import Log, LogConfig
from samsa.protocol.records import NewRecord, build_batch, validate_produce_batch

NOW = 1_700_000_000_000


def run(directory: Path, *, fsync: bool, seconds: float, batch: bytes) -> tuple[float, float]:
    view = validate_produce_batch(batch)
    log = Log.open(directory, LogConfig(segment_bytes=64 * 1024 * 1024), NOW)
    try:
        appends = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            for _ in range(100):
                log.append(view, NOW)
                if fsync:
                    log.flush()
            appends += 100
            now = time.perf_counter()
            if now >= deadline:
                break
        elapsed = now - start
    finally:
        log.delete()
    rate = appends / elapsed
    return rate, rate * len(batch) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to create the log")
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each run")
    args = parser.parse_args()
    batch = build_batch([NewRecord(b"x" * 100, timestamp=NOW) for _ in range(100)], now_ms=NOW)
    print(f"batch: 100 records x 100 B = {len(batch)} bytes on disk")
    with tempfile.TemporaryDirectory(prefix="samsa-bench-", dir=args.dir) as tmp:
        for fsync in (False, True):
            rate, mb = run(
                Path(tmp) / f"bench-{int(fsync)}", fsync=fsync, seconds=args.seconds, batch=batch
            )
            label = "fsync per append" if fsync else "no fsync        "
            print(
                f"{label}: {rate:>10,.0f} appends/s  {mb:>8.1f} MB/s  ({rate * 100:,.0f} records/s)"
            )


if __name__ == "__main__":
    main()
