"""Fetch sessions (KIP-227): incremental requests and responses, session errors, eviction."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from samsa.broker.fetch_session import EVICTION_MS, FetchSessionCache
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import iter_batches
from samsa.testing import create_topic, idempotent_batch, produce_one

V = 12
_names = iter(range(10_000))


@pytest.fixture
def conn(shared_broker) -> BlockingConnection:  # type: ignore[no-untyped-def]
    with BlockingConnection("127.0.0.1", shared_broker.port) as c:
        yield c


@pytest.fixture
def topic(conn: BlockingConnection) -> str:
    name = f"sessions-{next(_names)}"
    assert create_topic(conn, name, 3) == 0
    return name


def _request(
    parts: dict[tuple[str, int], int],
    session_id: int,
    epoch: int,
    forget: dict[str, list[int]] | None = None,
    max_wait_ms: int = 0,
    max_bytes: int = 50 << 20,
) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for (t, index), offset in parts.items():
        by_topic.setdefault(t, []).append(
            make_request(
                ApiKey.FETCH,
                V,
                "FetchPartition",
                partition=index,
                current_leader_epoch=-1,
                fetch_offset=offset,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
        )
    return make_request(
        ApiKey.FETCH, V, "FetchRequest", cluster_id=None, replica_id=-1, max_wait=max_wait_ms,
        min_bytes=1, max_bytes=max_bytes, isolation_level=0, session_id=session_id,
        session_epoch=epoch,
        topics=tuple(make_request(ApiKey.FETCH, V, "FetchTopic", topic=t, partitions=tuple(p))
                     for t, p in by_topic.items()),
        forgotten_topics_data=tuple(
            make_request(ApiKey.FETCH, V, "ForgottenTopic", topic=t, partitions=tuple(p))
            for t, p in (forget or {}).items()),
        rack_id="",
    )  # fmt: skip


def _fetch(conn: BlockingConnection, *args: Any, **kw: Any) -> Any:
    return conn.request(ApiKey.FETCH, V, _request(*args, **kw))


def _answered(resp: Any) -> dict[tuple[str, int], Any]:
    return {(t.topic, p.partition_index): p for t in resp.responses for p in t.partitions}


def _offsets(part: Any) -> list[int]:
    return [b.base_offset for b in iter_batches(part.records or b"")]


def test_incremental_fetch_answers_only_partitions_with_news(
    conn: BlockingConnection, topic: str
) -> None:
    for p in (0, 1):
        produce_one(conn, topic, p, idempotent_batch(-1, -1, -1, 2))
    full = _fetch(conn, {(topic, 0): 0, (topic, 1): 0}, 0, 0)
    sid = full.session_id
    assert int(full.error_code) == 0 and sid != 0
    assert {k: _offsets(v) for k, v in _answered(full).items()} == {
        (topic, 0): [0],
        (topic, 1): [0],
    }
    # Epoch 1 moves partition 0 on; partition 1 stays at offset 0 in the session.
    inc = _fetch(conn, {(topic, 0): 2}, sid, 1)
    assert int(inc.error_code) == 0 and inc.session_id == sid
    answered = _answered(inc)
    # Partition 1 is re-read from the session's offset 0 and carries records again; partition
    # 0 has nothing new and an unchanged high watermark: left out.
    assert set(answered) == {(topic, 1)} and _offsets(answered[(topic, 1)]) == [0]

    inc = _fetch(conn, {(topic, 1): 2}, sid, 2)
    assert _answered(inc) == {}  # nothing changed anywhere

    produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1, 3))
    inc = _fetch(conn, {}, sid, 3)
    answered = _answered(inc)
    assert set(answered) == {(topic, 0)}
    assert _offsets(answered[(topic, 0)]) == [2] and int(answered[(topic, 0)].high_watermark) == 5

    # Adding a partition: it is fetched and answered (its high watermark is news).
    inc = _fetch(conn, {(topic, 0): 5, (topic, 2): 0}, sid, 4)
    answered = _answered(inc)
    assert set(answered) == {(topic, 2)} and int(answered[(topic, 2)].high_watermark) == 0

    # Forgetting partition 1: new data there is no longer answered.
    produce_one(conn, topic, 1, idempotent_batch(-1, -1, -1, 1))
    produce_one(conn, topic, 2, idempotent_batch(-1, -1, -1, 1))
    inc = _fetch(conn, {}, sid, 5, forget={topic: [1]})
    answered = _answered(inc)
    assert set(answered) == {(topic, 2)} and _offsets(answered[(topic, 2)]) == [0]


def test_session_errors(conn: BlockingConnection, topic: str) -> None:
    full = _fetch(conn, {(topic, 0): 0}, 0, 0)
    sid = full.session_id
    assert sid != 0
    unknown = _fetch(conn, {}, sid + 1 if sid < 0x7FFFFFFE else 1, 1)
    assert int(unknown.error_code) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert unknown.session_id == 0 and unknown.responses == ()
    bad = _fetch(conn, {}, sid, 2)  # epoch 1 is due
    assert int(bad.error_code) == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert bad.responses == ()
    ok = _fetch(conn, {}, sid, 1)
    assert int(ok.error_code) == 0 and ok.session_id == sid
    again = _fetch(conn, {}, sid, 1)  # a duplicate of the request just answered
    assert int(again.error_code) == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    # A full fetch naming the session closes it; epoch -1 opens none.
    closed = _fetch(conn, {(topic, 0): 0}, sid, -1)
    assert int(closed.error_code) == 0 and closed.session_id == 0
    gone = _fetch(conn, {}, sid, 2)
    assert int(gone.error_code) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_answered_partitions_go_to_the_back_of_the_fetch_order(
    conn: BlockingConnection, topic: str
) -> None:
    for p, batches in ((0, 3), (1, 1)):
        for _ in range(batches):
            produce_one(conn, topic, p, idempotent_batch(-1, -1, -1, 1))
    # max_bytes of 1: each response carries the first batch of the first partition with data.
    full = _fetch(conn, {(topic, 0): 0, (topic, 1): 0}, 0, 0, max_bytes=1)
    sid = full.session_id
    assert [(k, _offsets(v)) for k, v in _answered(full).items() if v.records] == [
        ((topic, 0), [0])
    ]
    inc = _fetch(conn, {(topic, 0): 1}, sid, 1, max_bytes=1)
    assert {k: _offsets(v) for k, v in _answered(inc).items()} == {(topic, 0): [1]}
    # Partition 0 was just answered and went to the back: partition 1 is read first now,
    # though partition 0 still has data.
    inc = _fetch(conn, {(topic, 0): 2}, sid, 2, max_bytes=1)
    assert {k: _offsets(v) for k, v in _answered(inc).items()} == {(topic, 1): [0]}
    inc = _fetch(conn, {(topic, 1): 1}, sid, 3, max_bytes=1)
    assert {k: _offsets(v) for k, v in _answered(inc).items()} == {(topic, 0): [2]}


def test_incremental_long_poll_and_a_request_that_overtakes_it(
    shared_broker, conn: BlockingConnection, topic: str
) -> None:  # type: ignore[no-untyped-def]
    full = _fetch(conn, {(topic, 0): 0}, 0, 0)
    sid = full.session_id

    def produce_later() -> None:
        time.sleep(0.3)
        with BlockingConnection("127.0.0.1", shared_broker.port) as other:
            produce_one(other, topic, 0, idempotent_batch(-1, -1, -1, 2))

    t = threading.Thread(target=produce_later)
    start = time.monotonic()
    t.start()
    woke = _fetch(conn, {}, sid, 1, max_wait_ms=10_000)
    t.join()
    assert time.monotonic() - start < 5
    assert {k: _offsets(v) for k, v in _answered(woke).items()} == {(topic, 0): [0]}

    # A waiting request (epoch 2) overtaken by the next one (epoch 3) on another connection
    # is answered INVALID_FETCH_SESSION_EPOCH, as Kafka answers a duplicate.
    waiting: list[Any] = []
    t = threading.Thread(
        target=lambda: waiting.append(_fetch(conn, {(topic, 0): 2}, sid, 2, max_wait_ms=1500))
    )
    t.start()
    time.sleep(0.3)
    with BlockingConnection("127.0.0.1", shared_broker.port) as other:
        assert int(_fetch(other, {}, sid, 3).error_code) == 0
    t.join()
    assert int(waiting[0].error_code) == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert waiting[0].session_id == sid and waiting[0].responses == ()


def test_session_by_name_refuses_topic_ids(conn: BlockingConnection, topic: str) -> None:
    sid = _fetch(conn, {(topic, 0): 0}, 0, 0).session_id
    req = make_request(
        ApiKey.FETCH, 13, "FetchRequest", cluster_id=None, replica_id=-1, max_wait=0,
        min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=sid, session_epoch=1,
        topics=(), forgotten_topics_data=(), rack_id="",
    )  # fmt: skip
    resp = conn.request(ApiKey.FETCH, 13, req)
    assert int(resp.error_code) == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR


def test_sessionless_fetch_opens_no_session(conn: BlockingConnection, topic: str) -> None:
    resp = _fetch(conn, {(topic, 0): 0}, 0, -1)
    assert int(resp.error_code) == 0 and resp.session_id == 0
    assert set(_answered(resp)) == {(topic, 0)}


def test_slots_bound_the_sessions(broker_factory) -> None:  # type: ignore[no-untyped-def]
    broker = broker_factory(overrides={"max.incremental.fetch.session.cache.slots": "1"}).start()
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        assert create_topic(conn, "t", 2) == 0
        first = _fetch(conn, {("t", 0): 0}, 0, 0)
        assert first.session_id != 0
        # No free slot and the first session is neither stale nor old: no session, a full
        # answer all the same.
        second = _fetch(conn, {("t", 0): 0, ("t", 1): 0}, 0, 0)
        assert int(second.error_code) == 0 and second.session_id == 0
        assert set(_answered(second)) == {("t", 0), ("t", 1)}
        assert int(_fetch(conn, {}, first.session_id, 1).error_code) == 0


# -- the cache on its own: eviction by last use and by size --------------------------------


def _full(cache: FetchSessionCache, n: int, now: int) -> int:
    """Open a session of ``n`` partitions of topic "t" through a full epoch-0 request."""
    parts = [_Part(i) for i in range(n)]
    req = _Req(topics=[_Topic("t", parts)], session_id=0, session_epoch=0)
    ctx = cache.new_context(V, req, now)
    assert ctx.create
    results = [("t", [_Result(i) for i in range(n)])]
    return cache.maybe_create(V, ctx.topics, results, now)


class _Part:
    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.fetch_offset = 0
        self.partition_max_bytes = 1 << 20


class _Topic:
    def __init__(self, topic: str | uuid.UUID, partitions: list[_Part]) -> None:
        self.topic = self.topic_id = topic
        self.partitions = partitions


class _Req:
    def __init__(self, topics: list[_Topic], session_id: int, session_epoch: int) -> None:
        self.topics = topics
        self.session_id = session_id
        self.session_epoch = session_epoch
        self.forgotten_topics_data: list[_Topic] = []


class _Result:
    def __init__(self, index: int) -> None:
        self.index = index
        self.error_code = 0
        self.high_watermark = 0
        self.log_start_offset = 0
        self.records_size = 0


def test_cache_evicts_the_stale_session_first() -> None:
    cache = FetchSessionCache(max_entries=2)
    a = _full(cache, 1, now=0)
    b = _full(cache, 5, now=10)
    assert _full(cache, 3, now=20) == 0  # full, nothing stale or old
    # a, unused for more than EVICTION_MS, is stale and goes, though the new session is no
    # bigger than a (which eviction by size would require).
    cache.sessions[b].last_used_ms = EVICTION_MS  # b in use
    c = _full(cache, 1, now=EVICTION_MS + 1)
    assert c != 0 and set(cache.sessions) == {b, c} and cache.evictions == 1
    assert a not in cache.sessions


def test_cache_evicts_a_smaller_old_session_for_a_bigger_one() -> None:
    cache = FetchSessionCache(max_entries=2)
    small = _full(cache, 2, now=0)
    big = _full(cache, 8, now=0)
    later = EVICTION_MS + 1
    for s in (small, big):
        cache.sessions[s].last_used_ms = later  # both in use: none stale
    # Old enough to be evicted, but not by a session no bigger than the smallest (2).
    assert _full(cache, 2, now=later) == 0
    newer = _full(cache, 3, now=later)
    assert newer != 0 and set(cache.sessions) == {big, newer}
    hundred = _full(cache, 100, now=later + 1)  # big is old and smaller: it goes
    assert hundred != 0 and set(cache.sessions) == {newer, hundred}
    # Sessions younger than EVICTION_MS are never evicted for size.
    assert _full(cache, 1000, now=later + 2) == 0


def test_partitions_of_all_sessions_are_bounded() -> None:
    cache = FetchSessionCache(max_entries=10, max_partitions=4)
    assert _full(cache, 5, now=0) == 0  # over the bound: no session
    a = _full(cache, 3, now=0)
    assert a != 0
    assert _full(cache, 2, now=1) == 0  # 3 + 2 > 4, and a is not stale
    grow = _Req(topics=[_Topic("t", [_Part(8)])], session_id=a, session_epoch=1)
    assert cache.new_context(V, grow, now_ms=2).error == 0 and cache.total_partitions == 4
    grow = _Req(topics=[_Topic("t", [_Part(9)])], session_id=a, session_epoch=2)
    ctx = cache.new_context(V, grow, now_ms=3)
    assert ctx.error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND and a not in cache.sessions
    assert cache.total_partitions == 0
    # A stale session is evicted to make room.
    b = _full(cache, 3, now=10)
    c = _full(cache, 2, now=10 + EVICTION_MS + 1)
    assert c != 0 and set(cache.sessions) == {c} and cache.total_partitions == 2
    assert b not in cache.sessions
