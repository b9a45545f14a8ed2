"""The retry policy every client request path goes through: what is retried, how long the
waits are, when it gives up; and the per-address reconnect backoff of the cluster layer."""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
from typing import Any

import pytest

from samsa.client import CorruptRecordError, KafkaConnectionError, KafkaError, KafkaTimeoutError
from samsa.client._cluster import Cluster
from samsa.client._errors import BootstrapError
from samsa.client._retry import Backoff, RetryLater, deciding_code, retry
from samsa.protocol.errors import ErrorCode as E


def test_backoff_doubles_up_to_the_maximum_with_bounded_jitter() -> None:
    b = Backoff(0.1, 1.0, rng=random.Random(7))
    for failures, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (40, 1.0)]:
        delays = [b.delay(failures) for _ in range(200)]
        assert all(0.8 * base - 1e-9 <= d <= min(1.0, 1.2 * base) + 1e-9 for d in delays)
        assert max(delays) - min(delays) > 0.1 * base  # jittered, not constant
    assert b.delay(0) == 0.0
    assert Backoff(0, 1).delay(3) == 0.0


def test_errors_are_classified_like_kafkas() -> None:
    assert KafkaConnectionError("reset").retriable
    assert KafkaError(E.NOT_COORDINATOR).retriable
    assert KafkaError(E.COORDINATOR_LOAD_IN_PROGRESS).retriable
    assert not KafkaError(E.ILLEGAL_GENERATION).retriable
    assert not KafkaError(E.PRODUCER_FENCED).retriable
    # Kafka's CORRUPT_MESSAGE is retriable for a produce; a fetched CRC failure is not.
    assert KafkaError(E.CORRUPT_MESSAGE).retriable
    assert not CorruptRecordError("crc", "t", 0, 5).retriable
    assert not BootstrapError("nobody there").retriable
    assert RetryLater(E.OPERATION_NOT_ATTEMPTED, "again").retriable


def test_deciding_code_prefers_final_errors() -> None:
    retry_codes = frozenset({E.COORDINATOR_LOAD_IN_PROGRESS})
    assert deciding_code([0, 0], retry_codes) == 0
    assert deciding_code([E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR], retry_codes) == (
        E.NOT_COORDINATOR
    )
    assert deciding_code([E.NOT_COORDINATOR, E.ILLEGAL_GENERATION], retry_codes) == (
        E.ILLEGAL_GENERATION
    )
    assert deciding_code([0, E.COORDINATOR_LOAD_IN_PROGRESS], retry_codes) == (
        E.COORDINATOR_LOAD_IN_PROGRESS
    )


class Flaky:
    """An attempt that fails with ``errors`` in turn, then returns "ok"."""

    def __init__(self, *errors: KafkaError) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


FAST = Backoff(0.001, 0.002)


def test_retriable_errors_are_retried_and_seen_by_the_hook() -> None:
    attempt = Flaky(KafkaConnectionError("lost"), KafkaError(E.NOT_COORDINATOR))
    seen: list[int] = []
    hook = seen.append
    result = run(
        retry(attempt, what="x", timeout=5, backoff=FAST, on_retriable=lambda e: hook(e.code))
    )
    assert result == "ok" and attempt.calls == 3
    assert seen == [E.NETWORK_EXCEPTION, E.NOT_COORDINATOR]


def test_a_final_error_is_raised_at_once() -> None:
    attempt = Flaky(KafkaConnectionError("lost"), KafkaError(E.ILLEGAL_GENERATION))
    with pytest.raises(KafkaError) as info:
        run(retry(attempt, what="x", timeout=5, backoff=FAST))
    assert info.value.code == E.ILLEGAL_GENERATION and attempt.calls == 2


def test_gives_up_at_the_deadline_with_the_last_error() -> None:
    async def always() -> None:
        raise KafkaConnectionError("still down")

    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(KafkaTimeoutError) as info:
            await retry(always, what="Metadata", timeout=0.3, backoff=Backoff(0.02, 0.05))
        assert isinstance(info.value.__cause__, KafkaConnectionError)
        assert "still down" in str(info.value) and "Metadata" in str(info.value)
        return loop.time() - start

    assert 0.3 <= run(main()) < 2.0


def test_timeout_zero_is_one_attempt_with_its_own_error() -> None:
    attempt = Flaky(KafkaConnectionError("lost"))
    with pytest.raises(KafkaConnectionError):
        run(retry(attempt, what="x", timeout=0, backoff=FAST))
    assert attempt.calls == 1


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connecting is refused


def test_reconnects_to_an_address_back_off_exponentially() -> None:
    port = _refused_port()

    async def main() -> list[float]:
        cluster = Cluster(f"127.0.0.1:{port}", reconnect_backoff=0.05, reconnect_backoff_max=0.4)
        loop = asyncio.get_running_loop()
        ends: list[float] = []  # each call waits for its backoff, then fails at once
        for _ in range(5):
            with pytest.raises(KafkaConnectionError):
                await cluster._open("127.0.0.1", port, -1)
            ends.append(loop.time())
        await cluster.close()
        return [b - a for a, b in itertools.pairwise(ends)]

    gaps = run(main())
    # 1st retry waits ~0.05 s, then ~0.1, ~0.2, ~0.4 (capped), each +-20%
    for gap, base in zip(gaps, [0.05, 0.1, 0.2, 0.4], strict=True):
        assert gap >= 0.8 * base - 0.005, gaps
    # ~0.75 s nominal; loose, as sleeps overrun on a loaded machine (the cap: test above)
    assert sum(gaps) < 5.0, gaps


def test_a_cluster_never_reached_gives_up_after_the_connection_setup_timeout() -> None:
    port = _refused_port()

    async def main() -> None:
        cluster = Cluster(
            f"127.0.0.1:{port}",
            connect_timeout=0.3,
            api_timeout=30,
            retry_backoff=0.02,
            retry_backoff_max=0.05,
            reconnect_backoff=0.01,
            reconnect_backoff_max=0.05,
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(BootstrapError, match="no broker reachable"):
            await cluster.refresh([])
        assert loop.time() - start < 5  # not the 30 s API timeout
        await cluster.close()

    run(main())
