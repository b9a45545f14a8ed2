"""Group commit: concurrent flush requests share fsync rounds."""

from __future__ import annotations

import asyncio
import threading
import time

from samsa.broker.flusher import Flusher


class SlowLog:
    """Stands in for a Log: flush() takes time, like an fsync, and is counted."""

    def __init__(self) -> None:
        self.flushes = 0
        self.lock = threading.Lock()

    def flush(self) -> None:
        time.sleep(0.02)
        with self.lock:
            self.flushes += 1


def test_concurrent_flushes_are_grouped() -> None:
    async def main() -> tuple[int, int]:
        flusher = Flusher()
        logs = [SlowLog() for _ in range(3)]
        waits = []
        for i in range(60):
            waits.append(flusher.flush(logs[i % 3]))  # type: ignore[arg-type]
            if i % 20 == 19:
                await asyncio.sleep(0.005)
        await asyncio.gather(*waits)
        return flusher.rounds, sum(log.flushes for log in logs)

    rounds, flushes = asyncio.run(main())
    assert 1 <= rounds <= 4  # 60 requests, a handful of rounds
    assert flushes <= rounds * 3  # each dirty log fsynced once per round


def test_request_during_a_round_waits_for_the_next_round() -> None:
    async def main() -> list[int]:
        flusher = Flusher()
        log = SlowLog()
        first = flusher.flush(log)  # type: ignore[arg-type]
        await asyncio.sleep(0.005)  # the first round is now running
        second = flusher.flush(log)  # type: ignore[arg-type]
        await first
        seen_after_first = log.flushes
        await second
        return [seen_after_first, log.flushes]

    assert asyncio.run(main()) == [1, 2]
