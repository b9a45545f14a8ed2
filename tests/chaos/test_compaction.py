"""SIGKILL the broker while its cleaner compacts a large log: after every kill the log holds
either the old or the cleaned segments of each range (never both, never neither), reads as the
last value per key, and the next start finishes the job.

The log (a topic created with ``cleanup.policy=compact``) is written in process before the
broker starts; the broker cleans it at start-up and is killed at a random moment of that
cleaning. After each kill the partition is opened in process, as the next start would open it,
and checked against the model; the last start runs to the end and stops cleanly.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

from tests.unit.log.test_cleaner import batches, read_committed

from samsa.broker.topics import TopicManager
from samsa.log.log import Log, LogConfig
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import NewRecord, RecordBatchView, build_batch, decode_records

TOPIC = "compacted"
KEYS = 2000
BATCHES = 12_000  # ~7 MB: about a second of cleaning on the 2-core machine
NOW = time.time_ns() // 1_000_000


def _write(
    data_dir: Path,
) -> tuple[dict[bytes, bytes | None], dict[int, tuple[bytes, bytes | None]]]:
    data_dir.mkdir()
    topics = TopicManager(data_dir, LogConfig(segment_bytes=256 * 1024))
    topic = topics.create(TOPIC, 1, NOW, {"cleanup.policy": "compact"})
    log = topic.partitions[0].log
    rng = random.Random(7)
    model: dict[bytes, bytes | None] = {}
    written: dict[int, tuple[bytes, bytes | None]] = {}
    for i in range(BATCHES):
        items = []
        for _ in range(5):
            key = b"key-%d" % rng.randrange(KEYS)
            value = None if rng.random() < 0.05 else b"%d-" % i + b"v" * 80
            items.append((key, value))
        data = build_batch(
            [NewRecord(key=k, value=v, timestamp=NOW) for k, v in items],
            producer_id=1,
            producer_epoch=0,
            base_sequence=5 * i,
        )
        result = log.append(RecordBatchView(data), NOW)
        assert result.error == ErrorCode.NONE
        for j, (k, v) in enumerate(items):
            written[result.base_offset + j] = (k, v)
            model[k] = v
    topics.close(NOW)
    return model, written


def _check(
    directory: Path,
    model: dict[bytes, bytes | None],
    written: dict[int, tuple[bytes, bytes | None]],
) -> int:
    """Open the partition as the broker would and check it; returns its size in bytes."""
    log = Log.open(directory, LogConfig(cleanup_policy="compact"), NOW)
    try:
        assert not list(directory.glob("*.swap")) and not list(directory.glob("*.cleaned"))
        live = {k: v for k, v in model.items() if v is not None}
        seen = {r.key: r.value for r in read_committed(log)}
        assert {k: v for k, v in seen.items() if v is not None} == live
        offsets = []
        for view in batches(log):
            for r in decode_records(view):
                assert written[r.offset] == (r.key, r.value), r.offset
                offsets.append(r.offset)
        assert offsets == sorted(set(offsets))
        assert log.log_end_offset == max(written) + 1
        return sum(s.size for s in log.segments)
    finally:
        log.close(NOW)


def test_sigkill_during_cleaning_leaves_old_or_new_segments(broker_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pristine = tmp_path / "pristine"
    model, written = _write(pristine)
    size = _check(pristine / f"{TOPIC}-0", model, written)
    overrides = {
        "log.cleaner.backoff.ms": "50",
        "log.cleaner.min.cleanable.ratio": "0.01",
        "log.segment.bytes": str(1024 * 1024),  # several groups, so several swaps to cut
    }
    rng = random.Random(11)
    interrupted = 0
    unfinished = tmp_path
    for round_ in range(6):
        # Each round kills a cleaning of the whole uncompacted log at another moment: the
        # first three anywhere in its first 0.8 s, the last three as soon as the cleaner's
        # new files appear (a busy machine may finish cleaning before a random moment).
        data_dir = tmp_path / f"data{round_}"
        shutil.copytree(pristine, data_dir)
        directory = data_dir / f"{TOPIC}-0"
        broker = broker_factory(data_dir, overrides).start()
        started = broker.wait_for_log(f"cleaning {directory}", timeout=20)
        assert started is not None, "\n".join(broker.log[-20:])
        if round_ < 3:
            time.sleep(rng.uniform(0.0, 0.8))
        else:
            deadline = time.monotonic() + 20
            while not any(directory.glob("*.cleaned")) and time.monotonic() < deadline:
                time.sleep(0.001)
        broker.kill()
        if list(directory.glob("*.cleaned")) or list(directory.glob("*.swap")):
            interrupted += 1
            unfinished = data_dir
        _check(directory, model, written)
    # The kills hit cleanings under way (their files were left behind), not only idle time.
    assert interrupted >= 3, interrupted
    # The next start of a log whose cleaning was cut short finishes the job.
    directory = unfinished / f"{TOPIC}-0"
    broker = broker_factory(unfinished, overrides).start()
    assert broker.wait_for_log(f"{directory}: cleaned offsets", timeout=60) is not None
    assert broker.stop() == 0
    assert _check(directory, model, written) < size / 3
