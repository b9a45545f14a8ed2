"""Storage errors: error codes, never half-done state.

A full disk is a real one: a small tmpfs mounted for the test (the tests run as root, as in
CI). A failed fsync cannot be produced by a real filesystem here, so those tests replace
``Log.flush`` with one raising EIO, in the test process or in a wrapper of the broker's
command line; production code has no hook for it. A failed segment deletion is the real
retention meeting an ``os.unlink`` that fails; damaged data is a real segment with a flipped
byte.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _disks import tmpfs
from samsa.broker.broker import ShutdownError
from samsa.broker.config import BrokerConfig
from samsa.broker.server import BrokerServer
from samsa.broker.topics import TopicError, TopicManager
from samsa.client._connection import BlockingConnection
from samsa.log.log import Log, LogConfig
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing import (
    create_topic,
    fetch_request,
    idempotent_batch,
    init_producer_id,
    produce_one,
)

STORAGE = ErrorCode.KAFKA_STORAGE_ERROR
NOT_AVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE
READY = re.compile(r"samsa broker ready on 127\.0\.0\.1:(\d+)")


# -- a disk that fills up -------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: writes past it fail with ENOSPC, like a full disk."""
    with tmpfs(tmp_path / "disk", "size=8m") as mnt:
        yield mnt


def fill(disk: Path) -> None:
    """Write a filler file until the disk has no free page left."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (1 << 16, 1 << 12):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0


def free(disk: Path) -> None:
    (disk / "filler").unlink()


def big_batch() -> bytes:
    # Larger than a page, so it cannot fit in the free tail of an allocated page.
    return idempotent_batch(-1, -1, -1, value=os.urandom(12_000))


def partition_dirs(data_dir: Path, topic: str) -> list[str]:
    return sorted(p.name for p in data_dir.iterdir() if re.fullmatch(rf"{topic}-\d+", p.name))


def find_group_coordinator(conn: BlockingConnection) -> int:
    req = make_request(
        ApiKey.FIND_COORDINATOR, 4, "FindCoordinatorRequest", key_type=0, coordinator_keys=("g",)
    )
    return int(conn.request(ApiKey.FIND_COORDINATOR, 4, req).coordinators[0].error_code)


def topic_partitions(conn: BlockingConnection) -> dict[str, int]:
    req = make_request(
        ApiKey.METADATA,
        12,
        "MetadataRequest",
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    resp = conn.request(ApiKey.METADATA, 12, req)
    return {t.name: len(t.partitions) for t in resp.topics}


def high_watermark(conn: BlockingConnection, topic: str, partition: int = 0) -> tuple[int, int]:
    resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, partition): 0}))
    p = resp.responses[0].partitions[0]
    return int(p.error_code), int(p.high_watermark)


def test_full_disk_gives_error_codes_and_creates_nothing_half(small_disk, broker_factory) -> None:  # type: ignore[no-untyped-def]
    overrides = {"offsets.topic.num.partitions": "10", "transaction.state.log.num.partitions": "5"}
    broker = broker_factory(small_disk, overrides).start()
    with BlockingConnection("127.0.0.1", broker.port, timeout=10) as conn:
        assert create_topic(conn, "before") == 0
        assert init_producer_id(conn)[0] == 0  # reserves a block of producer ids
        fill(small_disk)

        # Each failure is an error code on a connection that stays open.
        assert create_topic(conn, "t", 4) == STORAGE
        assert produce_one(conn, "before", 0, big_batch()) == (STORAGE, -1)
        assert find_group_coordinator(conn) == NOT_AVAILABLE
        assert init_producer_id(conn, "txn")[0] == NOT_AVAILABLE
        assert create_topic(conn, "t", 4) == STORAGE
        # Nothing half-made: no partition of any of the three topics, no staging directory.
        for topic in ("t", "__consumer_offsets", "__transaction_state"):
            assert partition_dirs(small_disk, topic) == []
        assert not [p for p in small_disk.iterdir() if p.name.endswith(".creating")]

        free(small_disk)
        # Space again: each topic is created whole on the next try.
        assert create_topic(conn, "t", 4) == 0
        assert find_group_coordinator(conn) == 0
        assert init_producer_id(conn, "txn")[0] == 0
        assert produce_one(conn, "before", 0, big_batch()) == (0, 0)
    assert broker.proc is not None and broker.proc.poll() is None
    assert broker.stop() == 0
    broker.start()
    with BlockingConnection("127.0.0.1", broker.port, timeout=10) as conn:
        counts = topic_partitions(conn)
        assert high_watermark(conn, "before") == (0, 1)
    assert counts == {"before": 1, "t": 4, "__consumer_offsets": 10, "__transaction_state": 5}
    assert not broker.log_contains("Traceback"), "\n".join(broker.log)


def test_sigterm_on_a_full_disk_closes_everything_and_says_so(small_disk, broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(small_disk).start()
    with BlockingConnection("127.0.0.1", broker.port, timeout=10) as conn:
        assert create_topic(conn, "s", 3) == 0
        for p in range(3):
            assert produce_one(conn, "s", p, idempotent_batch(-1, -1, -1, 5)) == (0, 0)
    fill(small_disk)
    seen = len(broker.log)
    assert broker.stop() == 1  # the shutdown state could not be written
    tail = broker.log[seen:]
    assert not any("Traceback" in line for line in tail), "\n".join(tail)
    problems = [line for line in tail if "could not close 3 of 3 partitions" in line]
    assert len(problems) == 1 and "No space left on device" in problems[0], "\n".join(tail)
    assert tail[-1].startswith("samsa broker: error: 3 partitions"), tail[-1]

    free(small_disk)
    broker.start()  # recovery: nothing acknowledged is lost
    with BlockingConnection("127.0.0.1", broker.port, timeout=10) as conn:
        assert [high_watermark(conn, "s", p) for p in range(3)] == [(0, 5)] * 3


# -- a failed fsync ---------------------------------------------------------------------------


def _broken_flush(calls: list[int]) -> Any:
    def flush(self: Log) -> None:
        calls.append(1)
        raise OSError(errno.EIO, "Input/output error (injected by the test)")

    return flush


class ThreadedBroker:
    """A BrokerServer on its own event loop thread, for tests that patch the process."""

    def __init__(self, config: BrokerConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = BrokerServer(config)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedBroker:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    def __exit__(self, *exc: object) -> None:
        if not self.loop.is_closed():
            self.stop()


def test_failed_fsync_takes_the_data_directory_offline(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[int] = []
    config = BrokerConfig(data_dir=tmp_path, port=0, log_flush_interval_messages=1)
    with ThreadedBroker(config) as tb:
        broker = tb.server.broker
        reasons: list[str] = []
        broker.offline_listeners.append(reasons.append)
        with BlockingConnection("127.0.0.1", tb.server.port, timeout=10) as conn:
            assert create_topic(conn, "f", 2) == 0
            monkeypatch.setattr(Log, "flush", _broken_flush(calls))
            # Appended, but not known to be on disk: the producer is told so.
            assert produce_one(conn, "f", 0, idempotent_batch(-1, -1, -1)) == (STORAGE, -1)
            assert len(reasons) == 1 and "Input/output error" in reasons[0]
            # From now on nothing is served from the directory, and nothing fsynced again.
            assert produce_one(conn, "f", 1, idempotent_batch(-1, -1, -1)) == (STORAGE, -1)
            assert high_watermark(conn, "f", 0)[0] == STORAGE
            assert create_topic(conn, "g") == STORAGE
            assert find_group_coordinator(conn) == NOT_AVAILABLE
        assert len(calls) == 1
        with pytest.raises(ShutdownError, match="went offline"):
            tb.stop()
    # Nothing was written at shutdown: the next start recovers the logs.
    assert not (tmp_path / "clean-shutdown").exists()
    assert len(list(tmp_path.glob("f-*"))) == 2


FAILING_FSYNC_BROKER = """
import errno, sys
from samsa.log.log import Log
def flush(self):
    raise OSError(errno.EIO, "Input/output error (injected by the test)")
Log.flush = flush
from samsa.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_broker_stops_with_status_1_when_fsync_fails(tmp_path: Path, broker_factory) -> None:  # type: ignore[no-untyped-def]
    data_dir = tmp_path / "data"
    cmd = [sys.executable, "-c", FAILING_FSYNC_BROKER, "broker", "--data-dir", str(data_dir)]
    cmd += ["--port", "0", "--override", "log.flush.interval.messages=1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        port = 0
        deadline = time.monotonic() + 30
        while not port and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            m = READY.search(line)
            port = int(m.group(1)) if m else 0
        assert port, "\n".join(lines)
        with BlockingConnection("127.0.0.1", port, timeout=10) as conn:
            assert create_topic(conn, "f") == 0
            assert produce_one(conn, "f", 0, idempotent_batch(-1, -1, -1)) == (STORAGE, -1)
        assert proc.wait(15) == 1
        lines += proc.stderr.read().splitlines()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert sum("is offline (fsync failed" in line for line in lines) == 1, "\n".join(lines)
    assert lines[-1].startswith("samsa broker: error: log directory"), lines[-1]
    # A normal start recovers the directory (the batch reached the page cache, not a crash).
    broker = broker_factory(data_dir).start()
    with BlockingConnection("127.0.0.1", broker.port, timeout=10) as conn:
        assert high_watermark(conn, "f") == (0, 1)


# -- atomic creation, leftovers -------------------------------------------------------------------


def test_creation_failing_midway_leaves_nothing(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    topics = TopicManager(tmp_path, LogConfig())
    real_rename = os.rename
    renames: list[str] = []

    def rename(src: Any, dst: Any) -> None:
        renames.append(str(dst))
        if len(renames) == 3:  # the third partition put in place fails
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(TopicError) as caught:
        topics.create("t", 5, 0)
    assert caught.value.code == STORAGE
    assert renames[:3] == [str(tmp_path / f"t-{i}") for i in (4, 3, 2)]  # highest first
    monkeypatch.setattr(os, "rename", real_rename)
    assert [p.name for p in tmp_path.iterdir()] == []
    topic = topics.create("t", 5, 0)
    assert len(topic.partitions) == 5
    topics.close(0)
    again = TopicManager(tmp_path, LogConfig())
    again.load(0)
    assert len(again.topics["t"].partitions) == 5
    again.close(0)


def test_leftovers_of_interrupted_creation_and_deletion_are_removed_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topics = TopicManager(tmp_path, LogConfig())
    topics.create("kept", 2, 0)
    topics.close(0)
    # A creation of "half" interrupted after partitions 2 and 3 were renamed into place.
    topic_id = uuid.uuid4()
    staging = tmp_path / f"{topic_id.hex}.creating"
    for i in range(4):
        d = (staging if i < 2 else tmp_path) / f"half-{i}"
        d.mkdir(parents=True)
        (d / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")
    # A deletion interrupted after its rename.
    (tmp_path / f"gone-0.{uuid.uuid4().hex}-delete").mkdir()
    with caplog.at_level(logging.WARNING, logger="samsa.topics"):
        loaded = TopicManager(tmp_path, LogConfig())
        loaded.load(0)
    assert set(loaded.topics) == {"kept"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["kept-0", "kept-1"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("interrupted topic creation" in m and "half-2, half-3" in m for m in messages)
    assert any("interrupted topic deletion" in m for m in messages)
    loaded.close(0)


def test_deletion_failing_midway_keeps_the_whole_topic(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    topics = TopicManager(tmp_path, LogConfig())
    topics.create("d", 3, 0)
    real_rename = os.rename
    calls: list[str] = []

    def rename(src: Any, dst: Any) -> None:
        calls.append(str(src))
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error", str(src))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(TopicError) as caught:
        topics.delete("d")
    assert caught.value.code == STORAGE
    monkeypatch.setattr(os, "rename", real_rename)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d-0", "d-1", "d-2"]
    assert len(topics.topics["d"].partitions) == 3
    topics.delete("d")
    assert list(tmp_path.iterdir()) == [] and "d" not in topics.topics
    topics.close(0)


def test_read_errors_are_storage_errors_per_partition(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def unreadable(self: Log, *args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error (injected by the test)")

    with (
        ThreadedBroker(BrokerConfig(data_dir=tmp_path, port=0)) as tb,
        BlockingConnection("127.0.0.1", tb.server.port, timeout=10) as conn,
    ):
        assert create_topic(conn, "r") == 0
        assert produce_one(conn, "r", 0, idempotent_batch(-1, -1, -1)) == (0, 0)
        monkeypatch.setattr(Log, "read", unreadable)
        monkeypatch.setattr(Log, "offset_for_timestamp", unreadable)
        monkeypatch.setattr(Log, "timestamp_probes", unreadable)
        assert high_watermark(conn, "r") == (STORAGE, -1)
        req = make_request(
            ApiKey.LIST_OFFSETS,
            7,
            "ListOffsetsRequest",
            replica_id=-1,
            isolation_level=0,
            topics=(
                make_request(
                    ApiKey.LIST_OFFSETS,
                    7,
                    "ListOffsetsTopic",
                    name="r",
                    partitions=(
                        make_request(
                            ApiKey.LIST_OFFSETS,
                            7,
                            "ListOffsetsPartition",
                            partition_index=0,
                            current_leader_epoch=-1,
                            timestamp=0,
                        ),
                    ),
                ),
            ),
        )
        resp = conn.request(ApiKey.LIST_OFFSETS, 7, req)
        assert int(resp.topics[0].partitions[0].error_code) == STORAGE
        monkeypatch.undo()
        assert high_watermark(conn, "r") == (0, 1)  # same connection, still served


def test_damaged_data_met_by_a_fetch_is_corrupt_message_for_that_partition(
    tmp_path: Path,
) -> None:
    with (
        ThreadedBroker(BrokerConfig(data_dir=tmp_path, port=0)) as tb,
        BlockingConnection("127.0.0.1", tb.server.port, timeout=10) as conn,
    ):
        assert create_topic(conn, "c") == 0 and create_topic(conn, "ok") == 0
        assert produce_one(conn, "c", 0, idempotent_batch(-1, -1, -1)) == (0, 0)
        assert produce_one(conn, "ok", 0, idempotent_batch(-1, -1, -1)) == (0, 0)
        # Damage the batch on disk: its magic byte (byte 16 of the header) is no longer 2.
        (segment,) = (tmp_path / "c-0").glob("*.log")
        with open(segment, "r+b") as f:
            f.seek(16)
            magic = f.read(1)
            f.seek(16)
            f.write(b"\x07")
        assert magic == b"\x02"
        assert high_watermark(conn, "c") == (ErrorCode.CORRUPT_MESSAGE, -1)
        assert high_watermark(conn, "ok") == (0, 1)  # only that partition
        with open(segment, "r+b") as f:
            f.seek(16)
            f.write(magic)
        assert high_watermark(conn, "c") == (0, 1)  # same connection, still served


def test_a_failed_segment_deletion_takes_the_data_directory_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real retention deletes a real segment; only the file system's unlink of a segment
    # file fails (os.unlink, under pathlib's Path.unlink).
    real_unlink = os.unlink
    failed: list[str] = []

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).startswith(str(tmp_path)) and str(path).endswith(".log"):
            failed.append(str(path))
            raise OSError(errno.EIO, "Input/output error (injected by the test)", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    config = BrokerConfig(
        data_dir=tmp_path,
        port=0,
        log_retention_check_interval_ms=50,
        log_roll_ms=1,  # a batch per segment
        log_retention_ms=1,  # every segment but the active one is due
    )
    with ThreadedBroker(config) as tb:
        reasons: list[str] = []
        tb.server.broker.offline_listeners.append(reasons.append)
        with BlockingConnection("127.0.0.1", tb.server.port, timeout=10) as conn:
            assert create_topic(conn, "r") == 0
            for i in range(2):
                time.sleep(0.01)
                assert produce_one(conn, "r", 0, idempotent_batch(-1, -1, -1)) == (0, i)
            deadline = time.monotonic() + 10
            while not reasons and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(reasons) == 1 and "deleting old segments" in reasons[0], reasons
            assert failed and all(Path(f).exists() for f in failed)  # the unlink did fail
            assert produce_one(conn, "r", 0, idempotent_batch(-1, -1, -1)) == (STORAGE, -1)
        with pytest.raises(ShutdownError, match="went offline"):
            tb.stop()
