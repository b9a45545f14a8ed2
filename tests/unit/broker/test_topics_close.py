"""A clean stop closes partitions in several threads (their fsyncs release the GIL, as
Kafka's shutdown threads close its logs); a partition that fails to close is reported, with
its files closed, and does not keep the others from closing."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from samsa.broker.topics import TopicManager
from samsa.log.log import Log, LogConfig

NOW = 1_800_000_000_000


def test_partitions_close_in_parallel_and_failures_are_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = TopicManager(tmp_path, LogConfig())
    topics.create("t", 6, NOW)
    together = threading.Barrier(2, timeout=10)  # t-0 and t-1 must be closing at once
    closed: list[str] = []
    real = Log.close

    def close(self: Log, now_ms: int) -> None:
        name = self.directory.name
        if name == "t-3":
            raise OSError(errno.EIO, "Input/output error (injected by the test)")
        if name in ("t-0", "t-1"):
            together.wait()
        real(self, now_ms)
        closed.append(name)

    monkeypatch.setattr(Log, "close", close)
    failures = topics.close(NOW)
    assert [(p.topic, p.index, e.errno) for p, e in failures] == [("t", 3, errno.EIO)]
    assert sorted(closed) == ["t-0", "t-1", "t-2", "t-4", "t-5"]
    again = TopicManager(tmp_path, LogConfig())
    again.load(NOW)  # the closed ones were closed cleanly: they load again
    clean = [p.log.load_report.clean_shutdown for p in again.topics["t"].partitions]
    assert clean == [True, True, True, False, True, True]  # t-3 is recovered
    again.close(NOW)


STOP_OR_KILL = """
import os, signal, sys
from pathlib import Path
from samsa.broker.topics import TopicManager
from samsa.log.log import LogConfig
from samsa.protocol.records import NewRecord, build_batch, validate_produce_batch
topics = TopicManager(Path(sys.argv[1]), LogConfig())
topics.load(1)
if "t" not in topics.topics:
    topics.create("t", 3, 1)
for p in topics.topics["t"].partitions:
    p.log.append(validate_produce_batch(build_batch([NewRecord(b"v")])), 1)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
topics.close(1)
"""


def test_a_clean_stop_then_start_scans_nothing_where_a_sigkill_is_recovered(
    tmp_path: Path,
) -> None:
    def run(how: str) -> list[tuple[bool, int, int]]:
        done = subprocess.run([sys.executable, "-c", STOP_OR_KILL, str(tmp_path), how])
        assert done.returncode == (-signal.SIGKILL if how == "kill" else 0)
        topics = TopicManager(tmp_path, LogConfig())
        topics.load(NOW)
        logs = [p.log for p in topics.topics["t"].partitions]
        seen = [
            (lg.load_report.clean_shutdown, lg.load_report.recovered_segments, lg.log_end_offset)
            for lg in logs
        ]
        topics.close(NOW)
        return seen

    assert run("stop") == [(True, 0, 1)] * 3
    assert run("kill") == [(False, 1, 2)] * 3  # nothing lost, the unflushed segment rescanned
