"""The transaction coordinator's state machine: transitions, fencing, KIP-360, timeouts,
expiry, and that replaying its records (through their bytes) rebuilds the same state
(docs/semantics.md, rules 10-11 and 14, 16, 18-19)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _coordinators import CoordinatorHarness
from samsa.coordinator.runtime import Outcome as RuntimeOutcome
from samsa.coordinator.transaction import IllegalTransition, TxnMetadata, TxnState
from samsa.coordinator.transaction_coordinator import (
    InitPidResult,
    MarkerJob,
    Outcome,
    TransactionCoordinator,
    TxnConfig,
    TxnRecord,
)
from samsa.coordinator.txn_records import (
    TransactionLogValue,
    encode_key,
)
from samsa.protocol.errors import ErrorCode as E

S = TxnState
TP0 = ("t", 0)
TP1 = ("t", 1)


class Harness(CoordinatorHarness[TxnRecord]):
    """The coordinator run by the runtime (tests/_coordinators.py); marker jobs are collected."""

    def __init__(self, config: TxnConfig | None = None) -> None:
        self.pids = itertools.count(1000)
        self.config = config or TxnConfig(abort_timed_out_interval_ms=0)
        self.coord = TransactionCoordinator(self.config, lambda: next(self.pids))
        super().__init__(self.coord)
        self.jobs: list[MarkerJob] = []

    def apply(self, outcome: Outcome) -> object:
        response = self.run(outcome)
        self.jobs += outcome.markers
        return response

    def init(self, tid: str = "tx", timeout: int = 60_000, expected=None) -> InitPidResult:
        return self.apply(self.coord.init_producer_id(tid, timeout, expected, self.now))  # type: ignore[return-value]

    def add(self, pid: int, epoch: int, *tps: tuple[str, int], tid: str = "tx") -> E:
        return self.apply(self.coord.add_partitions(tid, pid, epoch, tps, self.now))  # type: ignore[return-value]

    def end(self, pid: int, epoch: int, commit: bool, tid: str = "tx") -> E:
        return self.apply(self.coord.end_txn(tid, pid, epoch, commit, self.now))  # type: ignore[return-value]

    def complete_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            self.apply(self.coord.complete(job, self.now))

    def state(self, tid: str = "tx") -> TxnState:
        return self.coord.txns[tid].state

    def rebuilt(self) -> TransactionCoordinator:  # type: ignore[override]
        return super().rebuilt(TransactionCoordinator(self.config, lambda: 0))


def test_new_id_gets_a_producer_id_at_epoch_0_and_each_init_bumps() -> None:
    h = Harness()
    first = h.init()
    assert first == InitPidResult(E.NONE, 1000, 0)
    assert h.init() == InitPidResult(E.NONE, 1000, 1)
    assert h.state() == S.EMPTY
    assert len(h.log.entries) == 2


def test_transaction_commit_cycle() -> None:
    h = Harness()
    r = h.init()
    assert h.add(r.producer_id, 0, TP0) == E.NONE
    assert h.state() == S.ONGOING
    assert h.coord.txns["tx"].start_timestamp_ms == h.now
    records = len(h.log.entries)
    assert h.add(r.producer_id, 0, TP0) == E.NONE  # already in: no record
    assert len(h.log.entries) == records
    assert h.add(r.producer_id, 0, TP1, ("__consumer_offsets", 3)) == E.NONE
    assert h.end(r.producer_id, 0, True) == E.NONE
    assert h.state() == S.PREPARE_COMMIT
    assert h.jobs == [MarkerJob("tx", 1000, 0, True, (("__consumer_offsets", 3), TP0, TP1))]
    # Busy until the markers are written.
    assert h.end(r.producer_id, 0, True) == E.CONCURRENT_TRANSACTIONS
    assert h.end(r.producer_id, 0, False) == E.INVALID_TXN_STATE
    assert h.add(r.producer_id, 0, TP0) == E.CONCURRENT_TRANSACTIONS
    assert h.init() == InitPidResult(E.CONCURRENT_TRANSACTIONS)
    h.complete_all()
    assert h.state() == S.COMPLETE_COMMIT
    assert h.coord.txns["tx"].partitions == set()
    # Retried EndTxn after completion: same result succeeds, the other is refused.
    assert h.end(r.producer_id, 0, True) == E.NONE
    assert h.end(r.producer_id, 0, False) == E.INVALID_TXN_STATE
    # The next transaction starts from CompleteCommit.
    h.now += 5
    assert h.add(r.producer_id, 0, TP1) == E.NONE
    assert h.coord.txns["tx"].start_timestamp_ms == h.now
    assert h.end(r.producer_id, 0, False) == E.NONE
    h.complete_all()
    assert h.state() == S.COMPLETE_ABORT
    assert h.end(r.producer_id, 0, False) == E.NONE
    assert h.end(r.producer_id, 0, True) == E.INVALID_TXN_STATE


def test_end_txn_errors() -> None:
    h = Harness()
    assert h.end(1, 0, True) == E.INVALID_PRODUCER_ID_MAPPING
    r = h.init()
    assert h.end(r.producer_id, 0, True) == E.INVALID_TXN_STATE  # Empty: nothing to end
    assert h.end(r.producer_id + 1, 0, True) == E.INVALID_PRODUCER_ID_MAPPING
    assert h.end(r.producer_id, 1, True) == E.PRODUCER_FENCED
    assert h.add(r.producer_id, 1, TP0) == E.PRODUCER_FENCED
    assert h.add(r.producer_id + 1, 0, TP0) == E.INVALID_PRODUCER_ID_MAPPING


def test_init_fences_the_old_instance_and_aborts_its_transaction() -> None:
    h = Harness()
    old = h.init()
    h.add(old.producer_id, 0, TP0, TP1)
    # The new instance: its first attempt aborts the open transaction at a bumped epoch.
    assert h.init() == InitPidResult(E.CONCURRENT_TRANSACTIONS)
    meta = h.coord.txns["tx"]
    assert (meta.state, meta.producer_epoch) == (S.PREPARE_ABORT, 1)
    assert h.jobs == [MarkerJob("tx", old.producer_id, 1, False, (TP0, TP1))]
    # The zombie can no longer do anything.
    assert h.end(old.producer_id, 0, True) == E.PRODUCER_FENCED
    assert h.coord.verify("tx", old.producer_id, 0, TP0) == E.INVALID_PRODUCER_EPOCH
    assert h.init() == InitPidResult(E.CONCURRENT_TRANSACTIONS)  # still aborting
    h.complete_all()
    assert h.state() == S.COMPLETE_ABORT
    assert h.init() == InitPidResult(E.NONE, old.producer_id, 2)
    assert h.add(old.producer_id, 0, TP0) == E.PRODUCER_FENCED


def test_invalid_timeouts_and_ids() -> None:
    h = Harness(TxnConfig(max_timeout_ms=1000))
    assert h.init(timeout=1001).error == E.INVALID_TRANSACTION_TIMEOUT
    assert h.init(timeout=0).error == E.INVALID_TRANSACTION_TIMEOUT
    assert h.init(tid="").error == E.INVALID_REQUEST
    assert h.coord.txns == {}
    assert h.init(timeout=1000).error == E.NONE


def test_kip360_current_epoch_bumps_previous_is_a_retry_else_fenced() -> None:
    h = Harness()
    r = h.init()
    pid = r.producer_id
    assert h.init(expected=(pid, 0)) == InitPidResult(E.NONE, pid, 1)
    # The answer was lost and the producer retries with the epoch it had: same answer.
    assert h.init(expected=(pid, 0)) == InitPidResult(E.NONE, pid, 1)
    assert h.init(expected=(pid, 5)) == InitPidResult(E.PRODUCER_FENCED)
    assert h.init(expected=(pid + 7, 1)) == InitPidResult(E.PRODUCER_FENCED)
    # A plain InitProducerId (a new instance) resets the retry window.
    assert h.init() == InitPidResult(E.NONE, pid, 2)
    assert h.init(expected=(pid, 1)) == InitPidResult(E.PRODUCER_FENCED)
    assert h.init(expected=(pid, 2)) == InitPidResult(E.NONE, pid, 3)


def _seed(h: Harness, epoch: int, state: TxnState = S.EMPTY) -> None:
    value = TransactionLogValue(
        500, epoch, 60_000, state.id, None if state == S.EMPTY else (("t", (0,)),), 1, 1
    )
    h.run(RuntimeOutcome([TxnRecord("tx", value)], None))


def test_epoch_exhaustion_rotates_the_producer_id() -> None:
    h = Harness()
    _seed(h, 32765)
    assert h.init() == InitPidResult(E.NONE, 500, 32766)
    assert h.init() == InitPidResult(E.NONE, 1000, 0)
    meta = h.coord.txns["tx"]
    assert meta.previous_producer_id == 500
    assert h.rebuilt().txns["tx"].previous_producer_id == 500  # written as value v1


def test_kip360_rotation_and_its_retry() -> None:
    h = Harness()
    _seed(h, 32766)
    assert h.init(expected=(500, 32766)) == InitPidResult(E.NONE, 1000, 0)
    # Retry of the rotation (answer lost): the old id at the exhausted epoch is recognised.
    assert h.init(expected=(500, 32766)) == InitPidResult(E.NONE, 1000, 0)
    assert h.init(expected=(500, 3)) == InitPidResult(E.PRODUCER_FENCED)


def test_fencing_at_the_epoch_ceiling_still_aborts() -> None:
    h = Harness()
    _seed(h, 32767, S.ONGOING)
    assert h.init() == InitPidResult(E.CONCURRENT_TRANSACTIONS)
    assert h.coord.txns["tx"].producer_epoch == 32767
    h.complete_all()
    assert h.init() == InitPidResult(E.NONE, 1000, 0)  # exhausted: a new producer id


def test_timed_out_transaction_is_fenced_and_aborted() -> None:
    h = Harness()
    r = h.init(timeout=10_000)
    h.add(r.producer_id, 0, TP0)
    h.now += 10_000
    assert h.apply(h.coord.tick(h.now)) is None
    assert h.state() == S.ONGOING  # not older than its timeout yet
    h.now += 1
    h.apply(h.coord.tick(h.now))
    meta = h.coord.txns["tx"]
    assert (meta.state, meta.producer_epoch) == (S.PREPARE_ABORT, 1)
    assert h.jobs == [MarkerJob("tx", r.producer_id, 1, False, (TP0,))]
    h.complete_all()
    assert h.end(r.producer_id, 0, False) == E.PRODUCER_FENCED
    assert h.coord.verify("tx", r.producer_id, 0, TP0) == E.INVALID_PRODUCER_EPOCH


def test_timeout_check_runs_at_its_interval() -> None:
    h = Harness(TxnConfig(abort_timed_out_interval_ms=5000))
    r = h.init(timeout=1000)
    h.add(r.producer_id, 0, TP0)
    h.apply(h.coord.tick(h.now))  # first check: not timed out
    h.now += 2000
    h.apply(h.coord.tick(h.now))  # timed out, but the next check is due at +5000
    assert h.state() == S.ONGOING
    h.now += 3000
    h.apply(h.coord.tick(h.now))
    assert h.state() == S.PREPARE_ABORT


def test_transactional_id_expiry() -> None:
    day = 24 * 3600 * 1000
    h = Harness(TxnConfig(id_expiration_ms=7 * day, remove_expired_interval_ms=0))
    r = h.init(tid="idle")
    h.init(tid="busy")
    h.add(h.coord.txns["busy"].producer_id, 0, TP0, tid="busy")
    h.now += 7 * day
    h.apply(h.coord.tick(h.now))
    assert "idle" not in h.coord.txns  # tombstoned
    # An id with a transaction does not expire (this one timed out: it is being aborted).
    assert h.coord.txns["busy"].state == S.PREPARE_ABORT
    assert (encode_key("idle"), None) in h.log.entries
    assert "idle" not in h.rebuilt().txns
    [d] = h.coord.describe(["idle"])
    assert d.error == E.TRANSACTIONAL_ID_NOT_FOUND
    # The id starts over with a new producer id.
    assert h.init(tid="idle").producer_id != r.producer_id


def test_verify_rule_19() -> None:
    h = Harness()
    r = h.init()
    assert h.coord.verify("tx", r.producer_id, 0, TP0) == E.INVALID_TXN_STATE
    h.add(r.producer_id, 0, TP0)
    assert h.coord.verify("tx", r.producer_id, 0, TP0) == E.NONE
    assert h.coord.verify("tx", r.producer_id, 0, TP1) == E.INVALID_TXN_STATE
    assert h.coord.verify("other", r.producer_id, 0, TP0) == E.INVALID_PRODUCER_ID_MAPPING
    assert h.coord.verify(None, r.producer_id, 0, TP0) == E.INVALID_PRODUCER_ID_MAPPING
    h.end(r.producer_id, 0, True)
    assert h.coord.verify("tx", r.producer_id, 0, TP0) == E.INVALID_TXN_STATE  # late batch


def test_describe_and_list() -> None:
    h = Harness()
    a = h.init(tid="a")
    h.init(tid="b")
    h.add(a.producer_id, 0, TP1, TP0, tid="a")
    [da, dx] = h.coord.describe(["a", "x"])
    assert (da.error, da.state, da.producer_id, da.partitions) == (
        E.NONE,
        "Ongoing",
        a.producer_id,
        (TP0, TP1),
    )
    assert da.start_timestamp_ms == h.now and da.timeout_ms == 60_000
    assert dx.error == E.TRANSACTIONAL_ID_NOT_FOUND
    err, unknown, all_ = h.coord.list()
    assert err == E.NONE and unknown == []
    assert [(t.transactional_id, t.state) for t in all_] == [("a", "Ongoing"), ("b", "Empty")]
    _, unknown, ongoing = h.coord.list(states=["Ongoing", "Bogus"])
    assert unknown == ["Bogus"] and [t.transactional_id for t in ongoing] == ["a"]
    _, _, by_pid = h.coord.list(producer_ids=[h.coord.txns["b"].producer_id])
    assert [t.transactional_id for t in by_pid] == ["b"]
    _, _, long_running = h.coord.list(duration_ms=10, now_ms=h.now + 11)
    assert [t.transactional_id for t in long_running] == ["a"]
    _, _, matched = h.coord.list(pattern="[ab]", now_ms=h.now)
    assert len(matched) == 2
    assert h.coord.list(pattern="(")[0] == E.INVALID_REGULAR_EXPRESSION


def test_states_and_their_valid_previous_states() -> None:
    assert S.PREPARE_COMMIT.valid_previous == {S.ONGOING}
    # TV2 may abort with nothing added (KIP-890 part 2), as Kafka 4 allows.
    assert S.PREPARE_ABORT.valid_previous == {
        S.ONGOING,
        S.PREPARE_EPOCH_FENCE,
        S.EMPTY,
        S.COMPLETE_COMMIT,
        S.COMPLETE_ABORT,
    }
    assert S.PREPARE_EPOCH_FENCE.valid_previous == {S.ONGOING}
    assert S.DEAD.valid_previous == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert [s.id for s in S] == [0, 1, 2, 3, 4, 5, 6, 7]
    meta = TxnMetadata("x", 1, 0, 1000, S.EMPTY)
    with pytest.raises(IllegalTransition):
        meta.transition(S.PREPARE_COMMIT)
    meta.transition(S.ONGOING)
    with pytest.raises(IllegalTransition):
        meta.transition(S.COMPLETE_ABORT)


def test_restart_in_prepare_resumes_markers() -> None:
    h = Harness()
    r = h.init()
    h.add(r.producer_id, 0, TP0, TP1)
    h.end(r.producer_id, 0, True)
    fresh = h.rebuilt()
    assert fresh.pending_marker_jobs() == [MarkerJob("tx", r.producer_id, 0, True, (TP0, TP1))]
    assert fresh.durable_state() == h.coord.durable_state()
    # A KIP-360 retry epoch is memory only, as in Kafka.
    assert fresh.txns["tx"].last_producer_epoch == -1


_ops = st.lists(
    st.tuples(
        st.sampled_from(["init", "init360", "add", "commit", "abort", "complete", "tick"]),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 3),
        st.integers(0, 20_000),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_replay_rebuilds_the_same_state(ops: list[tuple[str, str, int, int]]) -> None:
    h = Harness()
    for op, tid, n, dt in ops:
        h.now += dt
        meta = h.coord.txns.get(tid)
        pid, epoch = (meta.producer_id, meta.producer_epoch) if meta else (-1, -1)
        if op == "init":
            h.init(tid, timeout=15_000)
        elif op == "init360" and meta is not None:
            h.init(tid, timeout=15_000, expected=(pid, epoch - (n == 3)))
        elif op == "add":
            h.add(pid, epoch, ("t", n), tid=tid)
        elif op in ("commit", "abort"):
            h.end(pid, epoch - (n == 3), op == "commit", tid=tid)
        elif op == "complete":
            h.complete_all()
        elif op == "tick":
            h.apply(h.coord.tick(h.now))
        for m in h.coord.txns.values():
            assert m.state != S.PREPARE_EPOCH_FENCE  # never stored
            assert m.state != S.EMPTY or not m.partitions
    assert h.rebuilt().durable_state() == h.coord.durable_state()
