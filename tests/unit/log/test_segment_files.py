"""The bounded cache of open segment files (log.max.open.files): segments hold a descriptor
only while the cache keeps them; evicted ones reopen on use and lose nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from samsa.log.log import Log, LogConfig
from samsa.log.segment import SEGMENT_FILES, LogSegment
from samsa.protocol.records import NewRecord, build_batch, validate_produce_batch

NOW = 1_700_000_000_000


@pytest.fixture
def small_cache() -> Iterator[None]:
    saved = SEGMENT_FILES.capacity
    SEGMENT_FILES.resize(4)
    yield
    SEGMENT_FILES.resize(saved)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _append(seg: LogSegment, value: bytes) -> bytes:
    raw = build_batch([NewRecord(value, timestamp=1_000)])
    view = validate_produce_batch(raw)
    offset = seg.next_offset
    assert offset is not None
    seg.append(view, offset, offset)
    return raw[8:]


def test_at_most_capacity_files_open_and_evicted_ones_reopen(
    tmp_path: Path, small_cache: None
) -> None:
    before = _open_fds()
    segs = [LogSegment.create(tmp_path, base * 1000, 4096) for base in range(20)]
    try:
        written = [_append(seg, b"value-%d" % i) for i, seg in enumerate(segs)]
        assert sum(seg.is_open for seg in segs) <= 4
        assert _open_fds() - before <= 4
        # Every segment still reads back what was appended, through a reopened descriptor.
        for seg, data in zip(segs, written, strict=True):
            assert seg.read(0, seg.size)[8:] == data
            assert _open_fds() - before <= 4
        assert SEGMENT_FILES.evictions >= 16
    finally:
        for seg in segs:
            seg.close()
    assert _open_fds() <= before  # (other tests' leftovers may have been evicted too)


def test_recently_used_files_stay_open(tmp_path: Path, small_cache: None) -> None:
    hot = LogSegment.create(tmp_path, 0, 4096)
    others = [LogSegment.create(tmp_path, base * 1000, 4096) for base in range(1, 30)]
    try:
        for seg in others:
            _append(hot, b"hot")  # used between every other open: never the one evicted
            _append(seg, b"x")  # opens a file: the cache is full, one goes
            assert hot.is_open
    finally:
        for seg in [hot, *others]:
            seg.close()


def test_a_pinned_file_is_not_closed_under_a_flush(tmp_path: Path, small_cache: None) -> None:
    others = [LogSegment.create(tmp_path, base * 1000, 4096) for base in range(1, 10)]
    flushing = LogSegment.create(tmp_path, 0, 4096)
    try:
        _append(flushing, b"data")
        fd = SEGMENT_FILES.pin(flushing)  # as fsync_data does on the flusher thread
        assert fd >= 0
        for seg in others:
            _append(seg, b"x")
        assert flushing.is_open
        os.fdatasync(fd)  # still this segment's descriptor
        assert os.path.samestat(os.fstat(fd), os.stat(flushing.path))
        SEGMENT_FILES.unpin(flushing)
        for _ in range(2):
            for seg in others:
                _append(seg, b"y")
        assert not flushing.is_open  # unpinned: evicted like any other
        flushing.fsync_data()  # syncs through a descriptor of its own, not the cache
        assert not flushing.is_open
    finally:
        flushing.close()
        for seg in others:
            seg.close()


def test_log_reads_across_more_segments_than_the_cache_holds(
    tmp_path: Path, small_cache: None
) -> None:
    config = LogConfig(segment_bytes=400)
    lg = Log.open(tmp_path / "t-0", config, NOW)
    batches = []
    for i in range(40):
        raw = build_batch([NewRecord(b"v" * 200, key=b"%d" % i, timestamp=1_000 + i)])
        assert lg.append(validate_produce_batch(raw), NOW).error == 0
        batches.append(raw)
    assert len(lg.segments) > 10
    assert sum(seg.is_open for seg in lg.segments) <= 4
    lg.flush()  # syncs segments whose descriptors were closed
    read = b"".join(lg.read(0, 10**9).chunks)
    assert len(read) == sum(len(b) for b in batches)
    lg.close(NOW)
    reopened = Log.open(tmp_path / "t-0", config, NOW)
    try:
        assert reopened.load_report.recovered_segments == 0
        # A clean open reads only the active segment's tail: one file open, not 40.
        assert sum(seg.is_open for seg in reopened.segments) == 1
        assert b"".join(reopened.read(0, 10**9).chunks) == read
    finally:
        reopened.close(NOW)


def test_out_of_descriptors_gives_back_cached_files(tmp_path: Path) -> None:
    # In a child process with a limit of 64 descriptors: 30 segment files cached, the rest of
    # the table taken by other files (as connections would), then a closed segment is read.
    # Without the fallback that open fails with EMFILE; with it, the cache closes half its
    # files and retries.
    script = textwrap.dedent(
        f"""
        import os, resource
        from pathlib import Path
        from samsa.log.segment import SEGMENT_FILES, LogSegment
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        SEGMENT_FILES.resize(1000)
        segs = [LogSegment.create(Path({str(tmp_path)!r}), i * 10, 4096) for i in range(30)]
        SEGMENT_FILES.close(segs[0])
        others = []
        while True:
            try:
                others.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        assert segs[0].read(0, 0) == b""
        print("open", sum(s.is_open for s in segs), "of", len(segs))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "out of file descriptors" in out.stderr
    assert out.stdout.split()[1] == "15"  # 29 cached, 15 closed, then segs[0] opened
