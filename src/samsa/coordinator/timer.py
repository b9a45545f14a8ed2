"""Deadlines keyed by name, earliest first: the pure half of a coordinator's timer (Kafka's
``CoordinatorTimer``, whose keys are per group or member).

A key has at most one deadline: scheduling it again replaces the old one, cancelling drops
it. The heap keeps replaced and cancelled entries until they reach its top, where they are
skipped (and it is rebuilt when they outnumber the live ones), so both are O(log n). The
runtime asks :meth:`Timer.next_deadline` when to wake up and takes :meth:`Timer.due` keys.
No clock: times are the caller's ``now_ms``.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Generic, TypeVar

K = TypeVar("K")


class Timer(Generic[K]):
    def __init__(self) -> None:
        self._deadlines: dict[K, int] = {}
        # (deadline, tie-breaker, key); the tie-breaker keeps keys out of comparisons.
        self._heap: list[tuple[int, int, K]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._deadlines)

    def deadline(self, key: K) -> int | None:
        return self._deadlines.get(key)

    def schedule(self, key: K, deadline_ms: int) -> None:
        if self._deadlines.get(key) == deadline_ms:
            return
        self._deadlines[key] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, next(self._seq), key))
        if len(self._heap) > 2 * len(self._deadlines) + 64:
            self._heap = [(d, next(self._seq), k) for k, d in self._deadlines.items()]
            heapq.heapify(self._heap)

    def cancel(self, key: K) -> None:
        self._deadlines.pop(key, None)

    def next_deadline(self) -> int | None:
        heap = self._heap
        while heap and self._deadlines.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)  # replaced or cancelled
        return heap[0][0] if heap else None

    def due(self, now_ms: int) -> list[K]:
        """The keys whose deadline is ``now_ms`` or earlier, earliest first; they are no
        longer scheduled."""
        out: list[K] = []
        while (deadline := self.next_deadline()) is not None and deadline <= now_ms:
            _, _, key = heapq.heappop(self._heap)
            del self._deadlines[key]
            out.append(key)
        return out
