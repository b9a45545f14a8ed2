"""Transactions v2 (KIP-890 part 2, rule 36) and two-phase commit (KIP-939, rule 37) in the
transaction coordinator's state machine; every record goes through its bytes and a rebuilt
coordinator must hold the same state. Rules: docs/semantics.md."""

from __future__ import annotations

import itertools
from typing import Any

from _coordinators import CoordinatorHarness
from samsa.coordinator.transaction import MAX_EPOCH, NO_TIMEOUT_MS, TxnMetadata, TxnState
from samsa.coordinator.transaction_coordinator import (
    EndTxnResult,
    InitPidResult,
    MarkerJob,
    TransactionCoordinator,
    TxnConfig,
    TxnOutcome,
    TxnRecord,
)
from samsa.protocol.errors import ErrorCode as E

S = TxnState
TP0 = ("t", 0)
TP1 = ("t", 1)


class Harness(CoordinatorHarness[TxnRecord]):
    """The coordinator run by the runtime (tests/_coordinators.py); marker jobs are collected."""

    def __init__(self) -> None:
        self.pids = itertools.count(1000)
        self.config = TxnConfig(abort_timed_out_interval_ms=0)
        self.coord = TransactionCoordinator(self.config, lambda: next(self.pids))
        super().__init__(self.coord)
        self.jobs: list[MarkerJob] = []

    def apply(self, outcome: TxnOutcome[Any]) -> Any:
        response = self.run(outcome)
        self.jobs += outcome.markers
        return response

    def init(self, **kw: Any) -> InitPidResult:
        expected = kw.pop("expected", None)
        return self.apply(self.coord.init_producer_id("tx", 60_000, expected, self.now, **kw))  # type: ignore[no-any-return]

    def add(self, pid: int, epoch: int, *tps: tuple[str, int], implicit: bool = True) -> E:
        return self.apply(  # type: ignore[no-any-return]
            self.coord.add_partitions("tx", pid, epoch, tps, self.now, implicit=implicit)
        )

    def end2(self, pid: int, epoch: int, commit: bool) -> EndTxnResult:
        return self.apply(self.coord.end_txn("tx", pid, epoch, commit, self.now, tv2=True))  # type: ignore[no-any-return]

    def complete_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            self.apply(self.coord.complete(job, self.now))

    @property
    def meta(self) -> TxnMetadata:
        return self.coord.txns["tx"]

    def rebuilt(self) -> TransactionCoordinator:  # type: ignore[override]
        return super().rebuilt(TransactionCoordinator(self.config, lambda: 0))


def test_tv2_commit_bumps_the_epoch_and_fences_the_old_one() -> None:
    h = Harness()
    r = h.init()
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.add(pid, epoch, TP0, TP1) == E.NONE
    assert h.meta.client_transaction_version == 2  # implicit add: a TV2 transaction
    assert h.end2(pid, epoch, True) == EndTxnResult(E.NONE, pid, epoch + 1)
    # The Prepare record and the markers carry the new epoch: they fence the old one.
    assert h.meta.state == S.PREPARE_COMMIT and h.meta.producer_epoch == epoch + 1
    assert [(j.producer_epoch, j.partitions) for j in h.jobs] == [(epoch + 1, (TP0, TP1))]
    assert h.rebuilt().durable_state() == h.coord.durable_state()  # the tag replays
    # The next transaction waits for the markers; the old epoch is fenced.
    assert h.add(pid, epoch + 1, TP0) == E.CONCURRENT_TRANSACTIONS
    h.complete_all()
    assert (h.meta.state, h.meta.producer_epoch) == (S.COMPLETE_COMMIT, epoch + 1)
    assert h.add(pid, epoch, TP0) == E.PRODUCER_FENCED
    assert h.add(pid, epoch + 1, TP0) == E.NONE
    assert h.end2(pid, epoch, False).error == E.PRODUCER_FENCED  # the old epoch cannot end it
    assert h.end2(pid, epoch + 1, False) == EndTxnResult(E.NONE, pid, epoch + 2)
    assert h.rebuilt().durable_state() == h.coord.durable_state()


def test_tv2_retries_of_a_lost_answer_are_recognised() -> None:
    h = Harness()
    r = h.init()
    pid, epoch = r.producer_id, r.producer_epoch
    h.add(pid, epoch, TP0)
    h.end2(pid, epoch, True)
    assert h.end2(pid, epoch, True).error == E.CONCURRENT_TRANSACTIONS  # still in Prepare
    assert h.end2(pid, epoch, False).error == E.INVALID_TXN_STATE
    h.complete_all()
    assert h.end2(pid, epoch, True) == EndTxnResult(E.NONE, pid, epoch + 1)  # no new record
    assert h.meta.state == S.COMPLETE_COMMIT and h.jobs == []
    assert h.end2(pid, epoch + 1, True).error == E.INVALID_TXN_STATE  # nothing to commit


def test_tv2_abort_with_nothing_added() -> None:
    h = Harness()
    r = h.init()
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.end2(pid, epoch, True).error == E.INVALID_TXN_STATE  # commit needs a transaction
    assert h.end2(pid, epoch, False) == EndTxnResult(E.NONE, pid, epoch + 1)
    assert [j.partitions for j in h.jobs] == [()]
    h.complete_all()
    assert (h.meta.state, h.meta.producer_epoch) == (S.COMPLETE_ABORT, epoch + 1)


def test_tv2_bump_at_the_top_epoch_rotates_the_producer_id() -> None:
    h = Harness()
    r = h.init()
    pid = r.producer_id
    # An Ongoing transaction at the last epoch a client can hold.
    top = MAX_EPOCH - 1
    start = TxnMetadata("tx", pid, top, 60_000, S.ONGOING, {TP0}, h.now, h.now)
    h.apply(TxnOutcome([TransactionCoordinator._record(start)], None))
    res = h.end2(pid, top, True)
    assert res.error == E.NONE and res.producer_epoch == 0 and res.producer_id != pid
    new_pid = res.producer_id
    assert [j.producer_epoch for j in h.jobs] == [MAX_EPOCH]  # markers fence the old id
    assert h.add(new_pid, 0, TP0) == E.CONCURRENT_TRANSACTIONS  # waits for the completion
    assert h.rebuilt().durable_state() == h.coord.durable_state()  # next_producer_id replays
    h.complete_all()
    assert (h.meta.producer_id, h.meta.producer_epoch) == (new_pid, 0)
    assert h.meta.previous_producer_id == pid
    assert h.end2(pid, top, True) == EndTxnResult(E.NONE, new_pid, 0)  # a retry
    assert h.add(new_pid, 0, TP0) == E.NONE


def test_a_timed_out_tv2_transaction_fences_its_client() -> None:
    h = Harness()
    r = h.init()
    pid, epoch = r.producer_id, r.producer_epoch
    h.add(pid, epoch, TP0)
    h.now += 61_000
    h.apply(h.coord.tick(h.now))
    assert h.meta.state == S.PREPARE_ABORT
    h.complete_all()
    # The client's late EndTxn is not taken for a retry of the timeout's abort.
    assert h.end2(pid, epoch, True).error == E.PRODUCER_FENCED
    assert h.end2(pid, epoch, False).error == E.PRODUCER_FENCED


def test_tv1_is_unchanged() -> None:
    h = Harness()
    r = h.init()
    pid, epoch = r.producer_id, r.producer_epoch
    assert h.add(pid, epoch, TP0, implicit=False) == E.NONE
    assert h.apply(h.coord.end_txn("tx", pid, epoch, True, h.now)) == E.NONE
    assert h.meta.producer_epoch == epoch and h.meta.client_transaction_version == 0
    h.complete_all()
    assert h.meta.producer_epoch == epoch
    # Its records are still value version 0, byte for byte what a TV1 Kafka writes.
    assert all(v is None or v[:2] == b"\x00\x00" for _, v in h.log.entries)


def test_2pc_transactions_never_time_out_and_survive_a_restart() -> None:
    h = Harness()
    r = h.init(enable_2pc=True)
    assert h.meta.timeout_ms == NO_TIMEOUT_MS
    h.add(r.producer_id, r.producer_epoch, TP0)
    h.now += 30 * 24 * 3600 * 1000  # 30 days: past even Integer.MAX_VALUE ms
    assert h.apply(h.coord.tick(h.now)) is None and h.jobs == []
    assert h.meta.state == S.ONGOING
    rebuilt = h.rebuilt()
    assert rebuilt.txns["tx"].state == S.ONGOING and rebuilt.timed_out(h.now) == []
    # A plain producer of the same id is not exempt.
    h.init()  # fences and aborts the 2PC transaction (no keep_prepared_txn)
    assert h.meta.state == S.PREPARE_ABORT


def test_keep_prepared_txn_hands_the_transaction_to_the_new_instance() -> None:
    h = Harness()
    r = h.init(enable_2pc=True)
    pid, epoch = r.producer_id, r.producer_epoch
    h.add(pid, epoch, TP0, TP1)
    kept = h.init(enable_2pc=True, keep_prepared=True)
    assert kept == InitPidResult(E.NONE, pid, epoch + 1, pid, epoch)
    assert h.meta.state == S.ONGOING and h.meta.partitions == {TP0, TP1} and h.jobs == []
    assert h.add(pid, epoch, TP0) == E.PRODUCER_FENCED  # the previous instance is fenced
    assert h.end2(pid, epoch, True).error == E.PRODUCER_FENCED
    assert h.rebuilt().txns["tx"].partitions == {TP0, TP1}  # a restart keeps it
    assert h.end2(pid, epoch + 1, True) == EndTxnResult(E.NONE, pid, epoch + 2)
    assert [j.partitions for j in h.jobs] == [(TP0, TP1)]
    # Without a transaction open, keep_prepared_txn is a plain init: no ongoing identity.
    h.complete_all()
    again = h.init(enable_2pc=True, keep_prepared=True)
    assert (again.error, again.ongoing_producer_id, again.ongoing_producer_epoch) == (
        E.NONE,
        -1,
        -1,
    )
    assert h.init(keep_prepared=True).error == E.INVALID_REQUEST  # only with enable_2pc
