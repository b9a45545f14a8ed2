"""What ``_idempotence.decide`` makes of each Produce answer (the paths the state machine in
tests/property/test_client_idempotence.py does not reach: transactions, fencing, epochs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from samsa.client._idempotence import (
    Action,
    Decision,
    Idempotence,
    PartitionSequences,
    decide,
    on_failure,
    on_lost,
)
from samsa.protocol.errors import ErrorCode as E


@dataclass(eq=False)
class B:
    count: int = 2
    created: float = 0.0
    base_sequence: int = -1
    producer_id: int = -1
    epoch: int = -1
    payload: Any = None
    in_flight: bool = False
    attempts: int = 0
    retry_at: float = 0.0

    def drop_first(self, n: int) -> None:
        self.count -= n


def _two_pending(epoch: int = 0) -> tuple[PartitionSequences, B, B]:
    ps = PartitionSequences(7, epoch, 0)
    first, second = B(), B()
    ps.assign(first, True)
    ps.assign(second, True)
    return ps, first, second


def _decide(code: int, b: B, ps: PartitionSequences, **kw: Any) -> Decision:
    args: dict[str, Any] = dict(
        idempotent=True, transactional=False, bump_pending=False, first_epoch=0
    )
    args.update(kw)
    return decide(code, E(code).retriable, b, ps, **args)


def test_first_divergence_bumps_later_ones_only_retry() -> None:
    ps, first, second = _two_pending()
    for code in (E.OUT_OF_ORDER_SEQUENCE_NUMBER, E.UNKNOWN_PRODUCER_ID):
        assert _decide(code, first, ps) == Decision(Action.RETRY, bump=True)
        assert _decide(code, second, ps) == Decision(Action.RETRY)
        assert _decide(code, first, ps, bump_pending=True) == Decision(Action.RETRY)


def test_refused_local_bump_asks_for_a_new_producer_id() -> None:
    ps, first, _ = _two_pending(epoch=3)
    ps.reset(7, 3)  # renumbered from 0 under the (locally bumped) epoch 3
    d = _decide(E.UNKNOWN_PRODUCER_ID, first, ps)
    assert d == Decision(Action.RETRY, bump=True, new_id=True)
    # the epoch we started with is not a local bump: a plain bump
    assert not _decide(E.UNKNOWN_PRODUCER_ID, first, ps, first_epoch=3).new_id
    d = _decide(E.INVALID_PRODUCER_EPOCH, first, ps)
    assert d == Decision(Action.RETRY, bump=True, new_id=True)


def test_stale_epoch_mid_sequence_is_fenced() -> None:
    ps, _, second = _two_pending()
    assert _decide(E.INVALID_PRODUCER_EPOCH, second, ps) == Decision(Action.FATAL, fenced=True)
    assert _decide(E.PRODUCER_FENCED, second, ps).fenced
    d = _decide(E.CLUSTER_AUTHORIZATION_FAILED, second, ps)
    assert d == Decision(Action.FATAL)


def test_transactional_divergence_aborts_and_stale_epoch_is_fenced() -> None:
    ps, first, _ = _two_pending()
    for code in (E.OUT_OF_ORDER_SEQUENCE_NUMBER, E.UNKNOWN_PRODUCER_ID):
        d = _decide(code, first, ps, transactional=True)
        assert d == Decision(Action.ABORTABLE, bump=True)
    d = _decide(E.INVALID_PRODUCER_EPOCH, first, ps, transactional=True)
    assert d.action is Action.FATAL and d.fenced


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (E.NONE, Decision(Action.SUCCEED)),
        (E.DUPLICATE_SEQUENCE_NUMBER, Decision(Action.DUPLICATE)),
        (E.NOT_LEADER_OR_FOLLOWER, Decision(Action.RETRY, refresh=True)),
        (E.REQUEST_TIMED_OUT, Decision(Action.RETRY)),
        (E.MESSAGE_TOO_LARGE, Decision(Action.FAIL, bump=True)),
    ],
)
def test_plain_answers(code: int, expected: Decision) -> None:
    ps, first, _ = _two_pending()
    assert _decide(code, first, ps) == expected


def test_failures_without_idempotence_leave_no_bump_and_resolved_batches_are_ignored() -> None:
    ps, first, _ = _two_pending()
    assert _decide(E.MESSAGE_TOO_LARGE, first, ps, idempotent=False) == Decision(Action.FAIL)
    assert on_lost(ps, first, retriable=False, idempotent=False) == Decision(Action.FAIL)
    assert on_lost(ps, first, retriable=False, idempotent=True) == Decision(Action.RETRY)
    assert on_failure(ps, first, idempotent=True, transactional=True) == Decision(
        Action.ABORTABLE, bump=True
    )
    ps.acknowledged(first)
    assert ps.last_acked == 1
    assert _decide(E.NONE, first, ps).action is Action.IGNORE
    assert on_lost(ps, first, retriable=True, idempotent=True).action is Action.IGNORE


def test_bump_renumbers_requesting_partitions_others_adopt_when_resolved() -> None:
    idem = Idempotence(7, 0)
    a, a1, a2 = _two_pending()
    b, b1, _ = _two_pending()
    idem.request_bump("a")
    assert idem.local_bump() == (7, 1)
    idem.bumped(7, 1, [("a", a), ("b", b)])
    assert [(x.base_sequence, x.epoch) for x in (a1, a2)] == [(0, 1), (2, 1)]
    assert a.next_seq == 4 and not idem.bump_requested
    assert b1.epoch == 0 and not idem.adopt(b)  # its old-epoch batches first
    b.pending.clear()
    assert idem.adopt(b) and (b.epoch, b.next_seq) == (1, 0)
    idem.request_bump("a", new_id=True)
    assert idem.local_bump() is None
    assert Idempotence(7, 32767).local_bump() is None  # epoch exhausted


def test_retry_waits_for_its_backoff_and_goes_alone() -> None:
    ps, first, second = _two_pending()
    ps.sent(first)
    ps.sent(second)
    ps.landed(first)
    ps.retry(first, now=10.0, base=0.1, cap=1.0)
    assert ps.unresolved() is first
    assert ps.retry_ready(first, 10.5) == float("inf")  # second still in flight
    ps.landed(second)
    assert ps.retry_ready(first, 10.05) == pytest.approx(10.1)
    assert ps.retry_ready(first, 10.2) is None
    first.attempts = 10
    ps.retry(first, now=0.0, base=0.1, cap=1.0)
    assert first.retry_at == 1.0  # retry.backoff.max.ms caps it
