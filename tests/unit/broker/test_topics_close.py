"""A clean stop closes partitions in several threads (their fsyncs release the GIL, as
Kafka's shutdown threads close its logs); a partition that fails to close is reported, with
its files closed, and does not keep the others from closing."""

from __future__ import annotations

import errno
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
    assert len(again.topics["t"].partitions) == 6
    again.close(NOW)
