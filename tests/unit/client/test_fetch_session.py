"""The consumer's fetch session handler (KIP-227), sans-IO; and against the broker's cache."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from samsa.broker.fetch_session import FetchSessionCache
from samsa.client._fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    FetchSessionHandler,
    fetch_request,
)
from samsa.protocol.errors import ErrorCode

MB = 1 << 20


def _opened(
    wanted: dict[tuple[str, int], tuple[int, int, int]], sid: int = 7
) -> FetchSessionHandler:
    h = FetchSessionHandler()
    plan = h.build(wanted)
    assert (plan.session_id, plan.epoch, plan.to_send, plan.forgotten) == (0, 0, wanted, [])
    assert h.handle_response(ErrorCode.NONE, sid)
    return h


def test_a_new_leader_epoch_resends_the_partition_and_is_carried() -> None:
    """KIP-320: the consumer's Fetch names the leader epoch its metadata knows; a partition
    whose epoch moved is sent again in the next incremental request, so the leader checks
    the new one (as Java's session builder, which compares the epoch too)."""
    h = _opened({("a", 0): (10, MB, 3), ("a", 1): (20, MB, 3)})
    plan = h.build({("a", 0): (10, MB, 4), ("a", 1): (20, MB, 3)})
    assert plan.to_send == {("a", 0): (10, MB, 4)}
    req = fetch_request(12, plan, max_wait_ms=0, min_bytes=1, max_bytes=MB, isolation_level=0)
    assert [(p.partition, p.current_leader_epoch) for t in req.topics for p in t.partitions] == [
        (0, 4)
    ]


def test_full_then_incremental_with_only_changes() -> None:
    wanted = {("a", 0): (10, MB, -1), ("a", 1): (20, MB, -1), ("b", 0): (0, MB, -1)}
    h = _opened(wanted)
    # nothing changed: an empty incremental request of epoch 1
    plan = h.build(wanted)
    assert (plan.session_id, plan.epoch, plan.to_send, plan.forgotten) == (7, 1, {}, [])
    assert not plan.full
    assert h.handle_response(ErrorCode.NONE, 7)
    # one offset moved, one partition added, one dropped
    nxt = {("a", 0): (15, MB, -1), ("a", 1): (20, MB, -1), ("c", 3): (5, MB, -1)}
    plan = h.build(nxt)
    assert plan.epoch == 2
    assert plan.to_send == {("a", 0): (15, MB, -1), ("c", 3): (5, MB, -1)}
    assert plan.forgotten == [("b", 0)]
    assert h.handle_response(ErrorCode.NONE, 7)
    assert h.session == nxt and h.epoch == 3
    # a changed size is sent too
    plan = h.build({**nxt, ("a", 1): (20, 2 * MB, -1)})
    assert plan.to_send == {("a", 1): (20, 2 * MB, -1)}
    assert (h.full_requests, h.incremental_requests) == (1, 3)


def test_session_id_not_found_starts_a_new_session() -> None:
    wanted = {("a", 0): (10, MB, -1)}
    h = _opened(wanted)
    h.build({("a", 0): (11, MB, -1)})
    assert not h.handle_response(ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0)
    plan = h.build({("a", 0): (11, MB, -1)})
    assert (plan.session_id, plan.epoch, plan.to_send) == (
        0,
        INITIAL_EPOCH,
        {("a", 0): (11, MB, -1)},
    )
    assert h.handle_response(ErrorCode.NONE, 9)
    assert h.build({("a", 0): (11, MB, -1)}).session_id == 9
    assert h.session_errors == 1


def test_invalid_epoch_closes_the_session_and_opens_another() -> None:
    wanted = {("a", 0): (10, MB, -1), ("a", 1): (0, MB, -1)}
    h = _opened(wanted)
    h.build(wanted)
    assert not h.handle_response(ErrorCode.INVALID_FETCH_SESSION_EPOCH, 7)
    plan = h.build(wanted)
    # full, naming the old session so that the broker frees it
    assert (plan.session_id, plan.epoch, plan.to_send, plan.forgotten) == (7, 0, wanted, [])


def test_failed_request_makes_the_next_full() -> None:
    wanted = {("a", 0): (10, MB, -1)}
    h = _opened(wanted)
    h.build({("a", 0): (12, MB, -1)})
    h.handle_error()  # e.g. the connection dropped: what the broker applied is unknown
    plan = h.build({("a", 0): (12, MB, -1)})
    assert (plan.session_id, plan.epoch, plan.to_send) == (7, 0, {("a", 0): (12, MB, -1)})


def test_no_session_from_the_broker_means_full_fetches() -> None:
    wanted = {("a", 0): (10, MB, -1)}
    h = FetchSessionHandler()
    for _ in range(3):
        plan = h.build(wanted)
        assert (plan.session_id, plan.epoch, plan.to_send) == (0, 0, wanted)
        assert h.handle_response(ErrorCode.NONE, 0)  # no slot free: records still count
    # an incremental answered sessionless (the broker closed it) goes back to full too
    h = _opened(wanted)
    h.build({})
    assert h.handle_response(ErrorCode.NONE, 0)
    assert h.build(wanted).epoch == INITIAL_EPOCH


def test_a_response_of_another_session_is_not_used() -> None:
    h = _opened({("a", 0): (10, MB, -1)})
    h.build({("a", 0): (10, MB, -1)})
    assert not h.handle_response(ErrorCode.NONE, 8)
    assert h.build({("a", 0): (10, MB, -1)}).epoch == INITIAL_EPOCH


def test_one_request_in_flight_and_close() -> None:
    h = _opened({("a", 0): (10, MB, -1)})
    h.build({("a", 0): (10, MB, -1)})
    with pytest.raises(RuntimeError):
        h.build({("a", 0): (10, MB, -1)})
    plan = h.close()
    assert plan is not None
    assert (plan.session_id, plan.epoch, plan.to_send, plan.forgotten) == (7, FINAL_EPOCH, {}, [])
    # the answer to the request that was out when closing is not used
    assert not h.handle_response(ErrorCode.NONE, 7)
    assert h.close() is None
    assert h.build({("a", 0): (10, MB, -1)}).session_id == 0


def test_epoch_wraps_to_one() -> None:
    h = _opened({("a", 0): (0, MB, -1)})
    h.epoch = 0x7FFFFFFF
    h.build({("a", 0): (0, MB, -1)})
    assert h.handle_response(ErrorCode.NONE, 7)
    assert h.epoch == 1


def _results(request: Any) -> list[tuple[str, list[Any]]]:
    return [
        (t.topic, [SimpleNamespace(index=p.partition, error_code=0, high_watermark=100,
                                   log_start_offset=0) for p in t.partitions])
        for t in request.topics
    ]  # fmt: skip


def test_broker_session_follows_what_the_consumer_wants() -> None:
    """The handler's requests, applied by the broker's session cache over many rounds of
    partitions coming, going and moving, keep the broker's session equal to what the
    consumer wants; a lost session is found again by a full fetch."""
    rng = random.Random(5)
    cache = FetchSessionCache(max_entries=4)
    h = FetchSessionHandler()
    keys = [(t, p) for t in "abc" for p in range(4)]
    wanted = {k: (0, MB, -1) for k in keys[:6]}
    now = 0
    for rnd in range(300):
        now += 10
        for k in rng.sample(keys, 3):
            if k in wanted and rng.random() < 0.3:
                del wanted[k]
            else:
                wanted[k] = (wanted.get(k, (0, MB, -1))[0] + rng.randrange(3), MB, -1)
        if not wanted:
            wanted[keys[0]] = (0, MB, -1)
        if rnd % 50 == 49:
            cache.sessions.clear()  # e.g. a broker restart
            cache._cached = 0
        plan = h.build(wanted)
        req = fetch_request(12, plan, max_wait_ms=0, min_bytes=1, max_bytes=MB,
                            isolation_level=0)  # fmt: skip
        ctx = cache.new_context(12, req, now)
        if ctx.error:
            assert ctx.error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
            assert not h.handle_response(ctx.error, 0)
            continue
        sid = plan.session_id if ctx.session is not None else 0
        if ctx.create:
            sid = cache.maybe_create(12, ctx.topics, _results(req), now)
        assert h.handle_response(ErrorCode.NONE, sid)
        session = cache.sessions[sid]
        held = {(t, p): (c.fetch_offset, c.partition_max_bytes)
                for (t, p), c in session.partitions.items()}  # fmt: skip
        assert held == {k: w[:2] for k, w in wanted.items()}
    assert h.incremental_requests > 250 and h.session_errors == 300 // 50
