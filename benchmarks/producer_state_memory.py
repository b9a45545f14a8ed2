"""Memory per (producer, partition) entry of ProducerStateManager, with 5 retained batches.

Feeds N producers through the real prepare_update/update path (7 batches each, so every entry has
evicted down to the 5 it retains) and measures the heap growth with tracemalloc. Realistic
magnitudes are used for offsets and timestamps, since Python ints above 256 are separate objects.

    .venv/bin/python benchmarks/producer_state_memory.py [N]
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from samsa.log.producer_state import (
    NUM_BATCHES_TO_RETAIN,
    BatchAppend,
    ProducerAppendInfo,
    ProducerStateManager,
)
from samsa.log.snapshot import read_snapshot, write_snapshot

BATCHES_PER_PRODUCER = NUM_BATCHES_TO_RETAIN + 2
RECORDS_PER_BATCH = 10


def fill(psm: ProducerStateManager, producers: int) -> None:
    offset = 3_000_000_000  # a long-lived partition
    ts = 1_700_000_000_000
    base_pid = 10_000_000
    for b in range(BATCHES_PER_PRODUCER):
        for i in range(producers):
            first_seq = 1_000_000 + b * RECORDS_PER_BATCH
            batch = BatchAppend(
                base_pid + i, 3, first_seq, first_seq + RECORDS_PER_BATCH - 1, ts + i + b
            )
            info = psm.prepare_update(batch, ts)
            assert isinstance(info, ProducerAppendInfo)
            psm.update(info, offset, offset + RECORDS_PER_BATCH - 1)
            offset += RECORDS_PER_BATCH


def main() -> None:
    producers = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    psm = ProducerStateManager()
    t0 = time.perf_counter()
    fill(psm, producers)
    elapsed = time.perf_counter() - t0
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()

    assert len(psm) == producers
    assert all(len(e.batches) == NUM_BATCHES_TO_RETAIN for e in psm.entries())
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    print(f"producers:                 {producers}")
    print(f"batches retained/producer: {NUM_BATCHES_TO_RETAIN}")
    print(f"heap growth:               {grown / 2**20:.1f} MiB")
    print(f"bytes per entry:           {grown / producers:.0f}")
    print(
        f"append path:               {elapsed / (producers * BATCHES_PER_PRODUCER) * 1e6:.2f}"
        " us per batch (prepare_update + update)"
    )

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        path = write_snapshot(Path(d), psm.map_end_offset, psm.entries())
        t_write = time.perf_counter() - t0
        t0 = time.perf_counter()
        entries = read_snapshot(path)
        t_read = time.perf_counter() - t0
        assert len(entries) == producers
        size = path.stat().st_size
    print(
        f"snapshot:                  {size / producers:.0f} bytes per entry on disk, "
        f"write {t_write:.2f} s, read {t_read:.2f} s"
    )


if __name__ == "__main__":
    main()
