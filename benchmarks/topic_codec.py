"""Cost of a topic's ``compression.type`` on append (docs/semantics.md rule 39): batches of
100 records of 100 bytes sent in lz4 through ``Log.append`` into a topic that keeps the
producer's codec (the peer), and into topics that re-encode them in zstd, gzip or none, each
as a ratio of appends/s to the peer in the same run.

    .venv/bin/python benchmarks/topic_codec.py [--dir DIR] [--seconds 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from samsa.log.log import Log, LogConfig
from samsa.protocol.records import Compression, NewRecord, build_batch, validate_produce_batch

NOW = 1_700_000_000_000


def rate(directory: Path, topic_codec: str, batch: bytes, seconds: float) -> float:
    view = validate_produce_batch(batch)
    config = LogConfig(segment_bytes=64 * 1024 * 1024, compression_type=topic_codec)
    log = Log.open(directory, config, NOW)
    try:
        appends = 0
        start = time.perf_counter()
        while True:
            for _ in range(50):
                log.append(view, NOW)
            appends += 50
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return appends / elapsed
    finally:
        log.delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to create the logs")
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each run")
    args = parser.parse_args()
    records = [NewRecord(b"value %d " % i * 12, key=b"k%d" % i, timestamp=NOW) for i in range(100)]
    batch = build_batch(records, compression=Compression.LZ4, now_ms=NOW)
    print(f"batch: 100 records, {len(batch)} bytes in lz4")
    with tempfile.TemporaryDirectory(prefix="samsa-bench-", dir=args.dir) as tmp:
        peer = rate(Path(tmp) / "producer", "producer", batch, args.seconds)
        print(f"{'producer (kept):':<27}{peer:>9,.0f} appends/s  1.00x")
        for codec in ("zstd", "gzip", "uncompressed"):
            r = rate(Path(tmp) / codec, codec, batch, args.seconds)
            print(f"{codec + ' (re-encoded):':<27}{r:>9,.0f} appends/s  {r / peer:.2f}x")


if __name__ == "__main__":
    main()
