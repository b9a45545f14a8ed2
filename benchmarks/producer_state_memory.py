"""Memory per (producer, partition) entry of ProducerStateManager, with 5 retained batches.

Run directly, it measures samsa's ProducerStateManager alone. peers.py calls
:func:`producer_state_rows`, which measures whole brokers, samsa beside Kafka: N idempotent
producers (InitProducerId, then one batch each, pipelined) on one partition, and the growth of
the broker's RSS per producer; for Kafka also the growth of its live heap after a full GC
(``jcmd GC.run`` then ``GC.heap_info``), since its RSS also holds garbage not yet collected.

Alone, it feeds N producers through the real prepare_update/update path, one batch each (as
in peers.py's row), then 7 batches each (so every entry has evicted down to the 5 it retains),
and measures the heap growth with tracemalloc. Realistic magnitudes are used for producer ids,
offsets and timestamps, since Python ints above 256 are separate objects.

    .venv/bin/python benchmarks/producer_state_memory.py [N]
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from _brokers import BrokerProcess
from _peerlib import Row, Starter, create_topic, pipelined, rss_mb, wait_producer_id

from samsa.client._connection import BlockingConnection
from samsa.log.producer_state import (
    NUM_BATCHES_TO_RETAIN,
    BatchAppend,
    ProducerAppendInfo,
    ProducerStateManager,
)
from samsa.log.snapshot import read_snapshot, write_snapshot
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing import PRODUCE_VERSION, idempotent_batch, produce_request

BATCHES_PER_PRODUCER = NUM_BATCHES_TO_RETAIN + 2
RECORDS_PER_BATCH = 10


def fill(psm: ProducerStateManager, producers: int, batches: int) -> None:
    offset = 3_000_000_000  # a long-lived partition
    ts = 1_700_000_000_000
    base_pid = 10_000_000
    for b in range(batches):
        for i in range(producers):
            first_seq = 1_000_000 + b * RECORDS_PER_BATCH
            batch = BatchAppend(
                base_pid + i, 3, first_seq, first_seq + RECORDS_PER_BATCH - 1, ts + i + b
            )
            info = psm.prepare_update(batch, ts)
            assert isinstance(info, ProducerAppendInfo)
            psm.update(info, offset, offset + RECORDS_PER_BATCH - 1)
            offset += RECORDS_PER_BATCH


def measure(producers: int, batches: int) -> ProducerStateManager:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    psm = ProducerStateManager()
    t0 = time.perf_counter()
    fill(psm, producers, batches)
    elapsed = time.perf_counter() - t0
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()

    assert len(psm) == producers
    retained = min(batches, NUM_BATCHES_TO_RETAIN)
    assert all(len(e.batches) == retained for e in psm.entries())
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    print(f"{batches} batch(es) per producer, {retained} retained:")
    print(f"  heap growth:             {grown / 2**20:.1f} MiB for {producers} producers")
    print(f"  bytes per entry:         {grown / producers:.0f}")
    print(
        f"  append path:             {elapsed / (producers * batches) * 1e6:.2f}"
        " us per batch (prepare_update + update, traced)"
    )
    return psm


def main() -> None:
    producers = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    measure(producers, 1)
    psm = measure(producers, BATCHES_PER_PRODUCER)
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


def add_producers(b: BrokerProcess, topic: str, n: int) -> None:
    """``n`` new idempotent producers, one batch each on partition 0 of ``topic``."""
    init = make_request(ApiKey.INIT_PRODUCER_ID, 4, "InitProducerIdRequest",
                        transactional_id=None, transaction_timeout=60_000, producer_id=-1,
                        producer_epoch=-1)  # fmt: skip
    with BlockingConnection("127.0.0.1", b.port, timeout=120) as c:
        ids: list[Any] = []
        deadline = time.monotonic() + 300
        while len(ids) < n:
            # Kafka answers COORDINATOR_LOAD_IN_PROGRESS while it fetches its next block of
            # ids from the controller: those are asked again.
            got = pipelined(c, ApiKey.INIT_PRODUCER_ID, 4, [init] * (n - len(ids)))
            ids += [r for r in got if r.error_code == 0]
            if errors := {r.error_code for r in got} - {0, 14}:
                raise RuntimeError(f"InitProducerId failed: {sorted(errors)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(ids)} of {n} producer ids after 300 s")
            time.sleep(0.05 if len(ids) < n else 0)
        produce = [produce_request({(topic, 0): idempotent_batch(r.producer_id,
                                                                 r.producer_epoch, 0)})
                   for r in ids]  # fmt: skip
        for resp in pipelined(c, ApiKey.PRODUCE, PRODUCE_VERSION, produce):
            if err := resp.responses[0].partition_responses[0].error_code:
                raise RuntimeError(f"Produce failed: {err}")


def _jvm_live_heap_mb(pid: int) -> float:
    """Kafka's heap in use after a full GC, from jcmd (0 if jcmd is missing)."""
    try:
        subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60, check=True)
        out = subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True,
                             timeout=60, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return 0.0
    m = re.search(r"used (\d+)K", out)
    return int(m.group(1)) / 1024 if m else 0.0


def producer_state_rows(producers: int, work: Path, starters: dict[str, Starter]) -> list[Row]:
    """RSS (and Kafka's live heap) growth per idempotent producer, on a broker of each of
    ``starters``' samsa and Kafka (name: a function of a data dir that makes it)."""
    rss = Row(f"producer state, RSS growth per idempotent producer ({producers:,})", "B", False)
    heap = Row("producer state, live heap growth per producer (Kafka: after full GC)", "B", False)
    for name in ("samsa", "kafka"):
        try:
            with starters[name](work / f"pstate-{name}") as b:
                assert b.pid is not None
                create_topic(b.bootstrap, "pstate", 1)
                wait_producer_id(b.port)
                add_producers(b, "pstate", min(1_000, producers))  # warm-up, not counted
                time.sleep(1)
                before, heap0 = rss_mb(b.pid), _jvm_live_heap_mb(b.pid) if name == "kafka" else 0
                add_producers(b, "pstate", producers)
                time.sleep(1)
                rss.values[name] = (rss_mb(b.pid) - before) * 2**20 / producers
                if name == "kafka":
                    heap.values[name] = (_jvm_live_heap_mb(b.pid) - heap0) * 2**20 / producers
        except Exception as e:  # said in the notes, not hidden
            rss.notes[name] = f"{type(e).__name__}: {e}"[:200]
    heap.notes["samsa"] = "samsa's RSS row is its live memory (no collector holding garbage)"
    return [rss, heap]


if __name__ == "__main__":
    main()
