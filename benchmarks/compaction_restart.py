"""Broker restart time after many offset commits, without and with compaction of
``__consumer_offsets``: the start-up replay of an uncompacted log grows with every commit ever
made, a compacted one with the live keys (groups x partitions) plus the active segments.

    .venv/bin/python benchmarks/compaction_restart.py [--commits 200000] [--groups 1000]

Each commit is one record (group, topic, partition) -> offset; a group commits its
``--partitions`` partitions in one batch, as one OffsetCommit request does. The broker runs in
process (no sockets) with ``offsets.topic.segment.bytes`` at 1 MiB and, by default, one
partition of ``__consumer_offsets``, so that the log rolls many segments at these volumes
(only whole inactive segments are cleaned; with the default of 100 MiB, as in Kafka, the
replay is bounded by that per partition plus the live keys). Printed: restart seconds
before and after one cleaning, and their ratio, for each commit count.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.coordinator.offsets_records import (
    OffsetCommitKey,
    OffsetCommitValue,
    encode_key,
    encode_value,
    partition_for,
)

OFFSETS = "__consumer_offsets"


PARTITIONS = 1  # of __consumer_offsets (--offsets-partitions)


def config(data_dir: Path) -> BrokerConfig:
    return BrokerConfig(
        data_dir=data_dir,
        offsets_topic_segment_bytes=1024 * 1024,
        offsets_topic_num_partitions=PARTITIONS,
        log_cleaner_enable=False,
    )


def fill(data_dir: Path, commits: int, groups: int, partitions: int) -> None:
    broker = Broker(config(data_dir))
    broker.start()
    broker.groups.ensure_topic()
    n = 0
    round_ = 0
    while n < commits:
        for g in range(groups):
            group = f"group-{g}"
            records = [
                (
                    encode_key(OffsetCommitKey(group, "events", p)),
                    encode_value(OffsetCommitValue(offset=round_ * 100 + p, commit_timestamp=1)),
                )
                for p in range(partitions)
            ]
            target = partition_for(group, PARTITIONS)
            appended = broker.coordinator_logs.append(OFFSETS, target, records)
            assert appended.error == 0, appended
            n += partitions
            if n >= commits:
                break
        round_ += 1
    broker.close()


def restart(data_dir: Path) -> tuple[float, int]:
    start = time.perf_counter()
    broker = Broker(config(data_dir))
    broker.start()
    elapsed = time.perf_counter() - start
    committed = sum(len(o) for o in broker.groups.coordinator.offsets._committed.values())
    broker.close()
    return elapsed, committed


def compact(data_dir: Path) -> float:
    broker = Broker(config(data_dir))
    broker.start()
    start = time.perf_counter()
    now = time.time_ns() // 1_000_000
    for p in broker.topics.topics[OFFSETS].partitions:
        broker.cleaner.clean(p.log, now)
    elapsed = time.perf_counter() - start
    broker.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, nargs="+", default=[100_000, 200_000])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--offsets-partitions", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    args = parser.parse_args()
    global PARTITIONS
    PARTITIONS = args.offsets_partitions
    for commits in args.commits:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="compaction-bench-") as tmp:
            data_dir = Path(tmp)
            fill(data_dir, commits, args.groups, args.partitions)
            size = sum(f.stat().st_size for f in data_dir.rglob("*.log"))
            before, keys = restart(data_dir)
            cleaning = compact(data_dir)
            after, keys_after = restart(data_dir)
            size_after = sum(f.stat().st_size for f in data_dir.rglob("*.log"))
            assert keys == keys_after, (keys, keys_after)
            print(
                f"{commits:>9} commits, {keys} live offsets: log {size / 1e6:.1f} MB -> "
                f"{size_after / 1e6:.1f} MB; restart {before:.2f} s -> {after:.2f} s "
                f"(after/before {after / before:.2f}); cleaning took {cleaning:.1f} s"
            )


if __name__ == "__main__":
    main()
