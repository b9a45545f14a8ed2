"""samsa's consumer fetches through KIP-227 sessions, and recovers when a session is lost.

A spy on the consumer's session handler records each request's session id and epoch and
how the broker answered: the first request is full, the next ones incremental with epochs
1, 2, 3, ... that the broker accepts. Sessions are made to go wrong from outside, through
a raw connection to the broker: one request of the session's next epoch (the consumer's
then gets INVALID_FETCH_SESSION_EPOCH) and one full fetch naming the session (closing it:
FETCH_SESSION_ID_NOT_FOUND). Records read must equal what was produced, once each.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.client._fetch_session import FINAL_EPOCH, FetchPlan, FetchSessionHandler, fetch_request
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.testing.proxy import FaultProxy, Faults

T = 20.0


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """("req", handler, session id, epoch, partitions sent, forgotten) and
    ("resp", handler, error, session id) for every fetch of every samsa consumer."""
    events: list[tuple[Any, ...]] = []
    build, handle = FetchSessionHandler.build, FetchSessionHandler.handle_response

    def spy_build(self: FetchSessionHandler, wanted: Any) -> Any:
        plan = build(self, wanted)
        events.append(("req", self, plan.session_id, plan.epoch, len(plan.to_send),
                       len(plan.forgotten)))  # fmt: skip
        return plan

    def spy_handle(self: FetchSessionHandler, error_code: int, session_id: int) -> bool:
        events.append(("resp", self, error_code, session_id))
        return handle(self, error_code, session_id)

    monkeypatch.setattr(FetchSessionHandler, "build", spy_build)
    monkeypatch.setattr(FetchSessionHandler, "handle_response", spy_handle)
    return events


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"sessions-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


def _produce(bootstrap: str, topic: str, partition: int, start: int, n: int) -> None:
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(start, start + n):
            p.produce(topic, f"p{partition}-{i}".encode(), partition=partition)
        p.flush(T)


def _expected(counts: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    return {p: [(i, f"p{p}-{i}".encode()) for i in range(n)] for p, n in counts.items()}


@contextlib.contextmanager
def _consumer(bootstrap: str, topic: str, partitions: int, **extra: str) -> Iterator[Consumer]:
    # small fetches and short waits: many rounds, some with news, some without
    cfg = {
        "bootstrap.servers": bootstrap,
        "fetch.max.wait.ms": "100",
        "max.partition.fetch.bytes": "1024",
        **extra,
    }
    with Consumer(cfg) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        c.seek_to_beginning()
        yield c


def _read(c: Consumer, got: dict[int, list[Any]], want: int, how: str = "poll") -> None:
    end = time.monotonic() + T
    while sum(map(len, got.values())) < want and time.monotonic() < end:
        if how == "poll":
            for r in c.poll(0.2):
                got[r.partition].append((r.offset, r.value))
        else:
            d = c.consume_arrow(50, 0.2).to_pydict()
            for p, o, v in zip(d["partition"], d["offset"], d["value"], strict=True):
                got[p].append((o, v))


def _handler(c: Consumer) -> FetchSessionHandler:
    """The consumer's only session handler, once no fetch is in flight."""
    core = c._core

    async def settle() -> FetchSessionHandler:
        if core.fetcher.fetching is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(core.fetcher.fetching), T)
        (h,) = core.fetcher.sessions.values()
        return h

    return c._lt.run(settle())


def _raw_fetch(port: int, plan: FetchPlan) -> Any:
    req = fetch_request(12, plan, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                        isolation_level=0)  # fmt: skip
    with BlockingConnection("127.0.0.1", port) as conn:
        return conn.request(ApiKey.FETCH, 12, req)


@pytest.mark.parametrize("how", ["poll", "consume_arrow"])
def test_consumer_reads_through_incremental_sessions(broker, spy, how: str) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(broker.bootstrap, 3)
    for p in range(3):
        _produce(broker.bootstrap, topic, p, 0, 60)
    got: dict[int, list[Any]] = {p: [] for p in range(3)}
    with _consumer(broker.bootstrap, topic, 3) as c:
        _read(c, got, 180, how)
        assert c.poll(0.5) == []  # caught up: rounds with nothing new
        _produce(broker.bootstrap, topic, 1, 60, 40)
        _read(c, got, 220, how)
        handler = _handler(c)
        sid, epoch = handler.session_id, handler.epoch
    assert got == _expected({0: 60, 1: 100, 2: 60})
    reqs = [e[2:] for e in spy if e[0] == "req"]
    resps = [e[2:] for e in spy if e[0] == "resp"]
    assert sid != 0 and reqs[0] == (0, 0, 3, 0)  # full: every partition
    # then incremental requests of epochs 1, 2, 3, ... all answered in the session
    assert [r[:2] for r in reqs[1:]] == [(sid, e) for e in range(1, len(reqs))]
    assert epoch == len(reqs) and len(reqs) > 5
    assert resps == [(0, sid)] * len(reqs)
    # only moved offsets are sent: some rounds name no partition at all
    assert any(n == 0 for _s, _e, n, _f in reqs[1:])
    assert all(n <= 3 and f == 0 for _s, _e, n, f in reqs)
    # close() closed the session on the broker
    gone = _raw_fetch(broker.port, FetchPlan(sid, epoch, {}))
    assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_unsubscribe_closes_the_session(broker, spy) -> None:  # type: ignore[no-untyped-def]
    topic = _topic(broker.bootstrap, 2)
    for p in range(2):
        _produce(broker.bootstrap, topic, p, 0, 10)
    got: dict[int, list[Any]] = {0: [], 1: []}
    with _consumer(broker.bootstrap, topic, 2) as c:
        _read(c, got, 20)
        handler = _handler(c)
        sid, epoch = handler.session_id, handler.epoch
        assert sid != 0
        c.unsubscribe()
        gone = _raw_fetch(broker.port, FetchPlan(sid, epoch, {}))
        assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        # assigned again, it opens a new session and reads on from its positions
        c.assign([TopicPartition(topic, 0)])
        c.seek(TopicPartition(topic, 0), 5)
        _produce(broker.bootstrap, topic, 0, 10, 5)
        again: dict[int, list[Any]] = {0: [], 1: []}
        _read(c, again, 10)
        assert _handler(c).session_id not in (0, sid)
    assert got == _expected({0: 10, 1: 10})
    assert again == {0: _expected({0: 15})[0][5:], 1: []}


def test_lost_sessions_are_recovered_without_loss_or_duplicates(broker_factory, spy) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(overrides={"max.incremental.fetch.session.cache.slots": "1"}).start()
    topic = _topic(broker.bootstrap, 2)
    for p in range(2):
        _produce(broker.bootstrap, topic, p, 0, 30)
    got_a: dict[int, list[Any]] = {0: [], 1: []}
    with _consumer(broker.bootstrap, topic, 2) as a:
        _read(a, got_a, 60)
        ha = _handler(a)
        first = ha.session_id
        assert first != 0
        # B finds the only slot taken (and not evictable for minutes): no session, it reads
        # everything through full fetches
        got_b: dict[int, list[Any]] = {0: [], 1: []}
        with _consumer(broker.bootstrap, topic, 2) as b:
            _read(b, got_b, 60)
            hb = _handler(b)
        assert got_b == _expected({0: 30, 1: 30})
        assert hb.incremental_requests == 0 and hb.full_requests >= 1
        assert {e[3] for e in spy if e[0] == "resp" and e[1] is hb} == {0}

        # Someone else uses A's next epoch: A's next request is answered
        # INVALID_FETCH_SESSION_EPOCH and A opens a new session with a full fetch.
        assert _raw_fetch(broker.port, FetchPlan(first, ha.epoch, {})).error_code == 0
        _produce(broker.bootstrap, topic, 0, 30, 20)
        _read(a, got_a, 80)
        ha = _handler(a)
        second = ha.session_id
        assert second not in (0, first)
        # The session is closed under A: FETCH_SESSION_ID_NOT_FOUND, then a new one.
        closing = _raw_fetch(broker.port, FetchPlan(second, FINAL_EPOCH, {}))
        assert closing.error_code == 0 and closing.session_id == 0
        _produce(broker.bootstrap, topic, 1, 30, 20)
        _read(a, got_a, 100)
        assert a.poll(0.3) == []  # nothing more comes
        third = _handler(a).session_id
        assert third not in (0, first, second)
    assert got_a == _expected({0: 50, 1: 50})
    errors = [e[2] for e in spy if e[0] == "resp" and e[1] is ha and e[2]]
    assert errors == [ErrorCode.INVALID_FETCH_SESSION_EPOCH, ErrorCode.FETCH_SESSION_ID_NOT_FOUND]
    # each error was followed by a full request: the old session's id, then none
    reqs = [e[2:4] for e in spy if e[0] == "req" and e[1] is ha]
    assert (first, 0) in reqs and (0, 0) in reqs[1:]


def test_failed_fetches_restart_the_session_without_loss_or_duplicates(broker, spy) -> None:  # type: ignore[no-untyped-def]
    """Fetches lost on the way (the connection reset before the broker saw them, or after it
    answered): the consumer cannot know what the broker's session holds, so its next Fetch
    is full, naming the old session to replace it."""
    topic = _topic(broker.bootstrap, 2)
    faults = Faults(reset_rate=0.15, drop_response_rate=0.15, apis=frozenset({ApiKey.FETCH}))
    got: dict[int, list[Any]] = {0: [], 1: []}
    with FaultProxy(("127.0.0.1", broker.port), faults=faults, seed=4) as proxy:
        proxy.start()
        with _consumer(proxy.address, topic, 2, **{"reconnect.backoff.ms": "10",
                                                   "retry.backoff.ms": "10"}) as c:  # fmt: skip
            for chunk in range(4):
                for p in range(2):
                    _produce(broker.bootstrap, topic, p, 15 * chunk, 15)
                _read(c, got, 30 * (chunk + 1))
                # rounds with nothing new, faults still on: a restarted session re-delivers nothing
                assert c.poll(0.5) == []
        assert proxy.stats.faults >= 3
    assert got == _expected({0: 60, 1: 60})
    reqs = [e[2:4] for e in spy if e[0] == "req"]
    restarts = [i for i, (sid, epoch) in enumerate(reqs) if sid != 0 and epoch == 0]
    assert restarts  # a full request naming the session it replaces
    # and the new session went on incrementally
    assert any(epoch > 0 for _sid, epoch in reqs[restarts[0] :])
