"""ListOffsets by time reads a compressed batch's records as a stream: the answer of the
per-record decoder, without the inflated records (or a Python object per record) in memory."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from samsa.log.log import Log, LogConfig
from samsa.protocol.records import Compression, NewRecord, RecordBatchView, build_batch

NOW = 1_700_000_000_000


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    lg = Log.open(tmp_path / "t-0", LogConfig(message_timestamp_before_max_ms=2**62), NOW)
    yield lg
    lg.close(NOW)


def _append(lg: Log, records: list[NewRecord], codec: int) -> None:
    batch = RecordBatchView(build_batch(records, compression=codec, now_ms=NOW))
    assert lg.append(batch, NOW).error == 0


def test_the_first_record_at_or_after_a_time_in_compressed_batches(log: Log) -> None:
    _append(log, [NewRecord(value=b"a", timestamp=NOW)], Compression.NONE)
    records = [NewRecord(value=b"v%d" % i, timestamp=NOW + 10 * i) for i in range(5000)]
    _append(log, records, Compression.ZSTD)
    _append(log, [NewRecord(value=b"z", timestamp=NOW + 60_000)], Compression.GZIP)
    assert log.offset_for_timestamp(NOW + 12_341) == (1 + 1235, NOW + 12_350)
    assert log.offset_for_timestamp(NOW + 50_000) == (5001, NOW + 60_000)
    assert log.offset_for_timestamp(NOW + 60_001) is None


def test_a_search_through_a_long_record_holds_no_copy_of_it(log: Log) -> None:
    """A 40 MB record before the one looked for: the search keeps chunks of it, never all
    of it (the per-record decoder made a bytes object of the whole value)."""
    records = [
        NewRecord(value=bytes(40 << 20), timestamp=NOW),
        NewRecord(value=b"late", timestamp=NOW + 5),
    ]
    _append(log, records, Compression.ZSTD)
    del records
    tracemalloc.start()
    try:
        assert log.offset_for_timestamp(NOW + 1) == (1, NOW + 5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
