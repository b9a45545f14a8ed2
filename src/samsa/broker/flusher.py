"""Group commit: fsyncs of concurrent requests are grouped into one round.

With ``log.flush.interval.messages=1`` every acknowledged write must be fsynced. One fsync
per request would cap throughput at the disk's fsync rate per connection; instead, every
request that needs a flush registers its log and waits on the current round's future. A
round runs in a worker thread (the event loop keeps appending meanwhile) and fsyncs each
dirty log once; requests arriving during a round join the next one. So N concurrent
producers share one fsync per log per round.

A round that fails is never retried: after a failed fsync the kernel may have dropped the
dirty pages and cleared the error, so a later fsync that succeeds would prove nothing. The
failure is reported once (``on_failure``; the broker takes the data directory offline) and
every waiting and later flush completes with it instead of fsyncing again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from samsa.log.log import Log

log = logging.getLogger("samsa.flusher")


class Flusher:
    def __init__(
        self,
        on_failure: Callable[[BaseException], None] | None = None,
        on_fsync: Callable[[float], None] | None = None,  # seconds of each log's fsync
    ) -> None:
        self._dirty: set[Log] = set()
        self._next: asyncio.Future[BaseException | None] | None = None
        self._running = False
        self._on_failure = on_failure
        self._on_fsync = on_fsync
        self.failure: BaseException | None = None  # the first failed round's error
        self.rounds = 0  # fsync rounds run, for tests and benchmarks

    def flush(self, dirty_log: Log) -> asyncio.Future[BaseException | None]:
        """A future that completes once ``dirty_log``'s data appended so far is on disk: with
        None, or with the error if that could not be done."""
        if self.failure is not None:
            done = asyncio.get_running_loop().create_future()
            done.set_result(self.failure)
            return done
        self._dirty.add(dirty_log)
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        fut = self._next
        if not self._running:
            self._start_round()
        return fut

    def _start_round(self) -> None:
        logs, self._dirty = self._dirty, set()
        fut, self._next = self._next, None
        assert fut is not None
        self._running = True
        task = asyncio.get_running_loop().create_task(self._run(logs, fut))
        task.add_done_callback(lambda _t: None)

    async def _run(self, logs: set[Log], fut: asyncio.Future[BaseException | None]) -> None:
        outcome: BaseException | None = None
        try:
            await asyncio.to_thread(_flush_all, logs, self._on_fsync)
        except Exception as exc:
            outcome = self.failure = exc
            log.error("fsync failed, never to be retried: %s", exc)
        finally:
            self.rounds += 1
            self._running = False
        if not fut.done():
            fut.set_result(outcome)
        if self.failure is not None:
            # Those waiting for the next round get the failure, not a round.
            pending, self._next = self._next, None
            self._dirty.clear()
            if pending is not None and not pending.done():
                pending.set_result(self.failure)
            if outcome is not None and self._on_failure is not None:
                self._on_failure(outcome)
        elif self._dirty:
            self._start_round()


def _flush_all(logs: set[Log], on_fsync: Callable[[float], None] | None = None) -> None:
    for dirty in logs:
        started = time.perf_counter()
        dirty.flush()
        if on_fsync is not None:
            on_fsync(time.perf_counter() - started)
