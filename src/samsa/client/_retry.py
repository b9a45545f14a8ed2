"""Retries: which failures are worth another attempt, how long to wait, and the retry loop.

Every client request path except the producer's sender (which keeps its own per-batch
retries) goes through :func:`retry`, usually by way of :meth:`Cluster.retry` or
:meth:`Cluster.coordinator_call`. This is the role of the Java client's NetworkClient,
ConsumerNetworkClient and ``RetriableException`` hierarchy:

* a lost connection (:class:`KafkaConnectionError`, the outcome is unknown) and the error
  codes Kafka calls retriable are retried; anything else is raised at once;
* between attempts the caller may react to the error (refresh metadata after
  NOT_LEADER_OR_FOLLOWER, find the coordinator again after NOT_COORDINATOR);
* waits grow exponentially from ``retry.backoff.ms`` to ``retry.backoff.max.ms`` with
  +-20% jitter, as Java's ``ExponentialBackoff``; reconnections use the same shape with
  ``reconnect.backoff.ms`` / ``reconnect.backoff.max.ms`` (see ``Cluster``);
* attempts go on until the caller's deadline (``default.api.timeout.ms`` for consumers and
  admin, ``max.block.ms`` / ``delivery.timeout.ms`` / ``transaction.timeout.ms`` for the
  producer), then :class:`KafkaTimeoutError` carries the last error.

Whether resending is safe is the caller's business: it decides which answers end the loop
(an OffsetCommit refused with ILLEGAL_GENERATION is final, not retried; an EndTxn is
resent with the same outcome only, which the coordinator answers consistently).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from samsa.client._errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from samsa.protocol.errors import ErrorCode

log = logging.getLogger("samsa.client.retry")

T = TypeVar("T")
E = ErrorCode

# Java's InvalidMetadataException family: the client's metadata is stale, refresh it.
INVALID_METADATA = frozenset(
    {
        E.NOT_LEADER_OR_FOLLOWER,
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.LEADER_NOT_AVAILABLE,
        E.FENCED_LEADER_EPOCH,
        E.UNKNOWN_LEADER_EPOCH,
        E.UNKNOWN_TOPIC_ID,
        E.KAFKA_STORAGE_ERROR,
        E.REPLICA_NOT_AVAILABLE,
        E.NOT_CONTROLLER,
    }
)
# The coordinator moved or is not there yet: find it again (markCoordinatorUnknown).
COORDINATOR_MOVED = frozenset({E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE})
# CONCURRENT_TRANSACTIONS clears as soon as the previous transaction's markers are written:
# polled faster than other errors, as Kafka's client does.
QUICK_RETRY = frozenset({E.CONCURRENT_TRANSACTIONS})
QUICK_BACKOFF = 0.02


class RetryLater(KafkaError):
    """An answer whose error code means "ask again" for this request (raised inside an
    attempt); ``response`` is the answer, for the caller that gives up waiting."""

    def __init__(self, code: int, message: str, response: Any = None) -> None:
        super().__init__(code, message)
        self.response = response

    @property
    def retriable(self) -> bool:
        return True


class Backoff:
    """Exponential backoff with jitter: ``initial * 2**(failures-1)``, capped at ``maximum``,
    then spread by +-``jitter`` so that clients that failed together do not retry together."""

    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        self.initial = max(0.0, initial)
        self.maximum = max(self.initial, maximum)
        self.jitter = jitter
        self._rng = rng or random.Random()

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th consecutive failure (1, 2, ...)."""
        if failures <= 0 or self.initial <= 0:
            return 0.0
        base = min(self.maximum, self.initial * 2.0 ** min(failures - 1, 62))
        spread = base * self.jitter
        return max(0.0, min(self.maximum, base + self._rng.uniform(-spread, spread)))


def deciding_code(codes: Iterable[int], retry_codes: frozenset[int]) -> int:
    """The code that decides a multi-partition answer: a final error before one that moves
    the coordinator, before one that only asks to retry; 0 if all succeeded."""
    nonzero = [int(c) for c in codes if int(c)]
    for c in nonzero:
        if c not in retry_codes and c not in COORDINATOR_MOVED:
            return c
    for c in nonzero:
        if c in COORDINATOR_MOVED:
            return c
    return nonzero[0] if nonzero else 0


async def retry(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: str,
    timeout: float,
    backoff: Backoff,
    on_retriable: Callable[[KafkaError], Awaitable[None] | None] | None = None,
) -> T:
    """Run ``attempt`` until it returns, raises a non-retriable error, or ``timeout`` seconds
    have passed (then KafkaTimeoutError from the last error). The first attempt is always
    made, even with ``timeout`` 0. ``on_retriable`` sees each retriable error before the
    wait (to refresh metadata, forget a coordinator); its own KafkaErrors are only logged."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout)
    failures = 0
    while True:
        try:
            return await attempt()
        except KafkaError as exc:
            if not exc.retriable:
                raise
            failures += 1
            now = loop.time()
            if timeout <= 0:
                raise  # a single attempt was asked for: its own error says most
            if now >= deadline:
                raise KafkaTimeoutError(
                    f"{what}: gave up after {failures} attempt(s) in {timeout:g}s; "
                    f"last error: {exc}"
                ) from exc
            log.debug("%s: attempt %d failed (%s); retrying", what, failures, exc)
            if on_retriable is not None:
                try:
                    pending = on_retriable(exc)
                    if pending is not None:
                        await pending
                except KafkaError as inner:
                    log.debug("%s: while reacting to %s: %s", what, exc.name, inner)
            wait = backoff.delay(failures)
            if exc.code in QUICK_RETRY and not isinstance(exc, KafkaConnectionError):
                wait = min(wait, QUICK_BACKOFF)
            await asyncio.sleep(max(0.0, min(wait, deadline - loop.time())))
