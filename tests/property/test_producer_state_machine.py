"""Stateful property test: ProducerStateManager against a deliberately naive model.

The model is written from docs/semantics.md (rules 2-6, 12 and 16-17; error 48) without reusing any
code of the module under test: plain tuples, a deque per producer and modulo arithmetic for
sequence wrap. Transactions end through the real marker path (prepare_end_txn/complete_txn), and
the first unstable offset (the last stable offset) is checked against the model after every step.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from samsa.log.producer_state import (
    BatchAppend,
    CompletedTxn,
    Duplicate,
    EndTxnAppendInfo,
    ProducerAppendInfo,
    ProducerStateEntry,
    ProducerStateManager,
    Rejected,
)
from samsa.log.snapshot import latest_valid_snapshot, write_snapshot
from samsa.protocol.errors import ErrorCode

SEQ_SPACE = 2**31  # sequences live in [0, 2**31) and wrap
EXPIRATION_MS = 10_000
START_MS = 1_700_000_000_000

# (first_seq, last_seq, first_offset, last_offset, timestamp_ms)
Batch = tuple[int, int, int, int, int]


@dataclass
class ModelProducer:
    epoch: int
    batches: deque[Batch] = field(default_factory=lambda: deque(maxlen=5))
    last_ts: int = 0
    txn_first: int | None = None
    coordinator_epoch: int = -1
    history: list[Batch] = field(default_factory=list)  # every batch of the current epoch


def seq_add(seq: int, n: int) -> int:
    return (seq + n) % SEQ_SPACE


class ProducerStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.psm = ProducerStateManager(producer_id_expiration_ms=EXPIRATION_MS)
        self.model: dict[int, ModelProducer] = {}
        self.log_end = 0
        self.now = START_MS
        self.dir = Path(tempfile.mkdtemp(prefix="samsa-psm-"))

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model's verdict -------------------------------------------------------------------

    def expect(self, pid: int, epoch: int, first: int, last: int, txn: bool) -> object:
        """'append', a Duplicate, or an ErrorCode."""
        p = self.model.get(pid)
        if p is None:
            return "append"
        if epoch == p.epoch:
            for b in p.batches:
                if (b[0], b[1]) == (first, last):
                    return Duplicate(b[2], b[3], b[4])
        if epoch < p.epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if epoch > p.epoch:
            if first != 0:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        else:
            last_seq = p.batches[-1][1] if p.batches else -1
            if first != seq_add(last_seq, 1):
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        if p.txn_first is not None and not txn:
            return ErrorCode.INVALID_TXN_STATE
        return "append"

    def model_append(self, pid: int, epoch: int, batch: Batch, txn: bool) -> None:
        p = self.model.get(pid)
        if p is None:
            p = self.model[pid] = ModelProducer(epoch)
        if epoch != p.epoch:
            p.epoch = epoch
            p.batches.clear()
            p.history.clear()
        p.batches.append(batch)
        p.history.append(batch)
        p.last_ts = batch[4]
        if txn and p.txn_first is None:
            p.txn_first = batch[2]

    # -- driving both --------------------------------------------------------------------------

    def send(
        self, pid: int, epoch: int, first: int, count: int, ts_skew: int = 0, txn: bool = False
    ) -> object:
        last = seq_add(first, count - 1)
        ts = self.now + ts_skew
        expected = self.expect(pid, epoch, first, last, txn)
        result = self.psm.prepare_update(BatchAppend(pid, epoch, first, last, ts, txn), self.now)
        if expected == "append":
            assert isinstance(result, ProducerAppendInfo), (expected, result)
            first_off, last_off = self.log_end, self.log_end + count - 1
            self.psm.update(result, first_off, last_off)
            self.log_end = last_off + 1
            self.model_append(pid, epoch, (first, last, first_off, last_off, ts), txn)
        elif isinstance(expected, Duplicate):
            assert result == expected
        else:
            assert isinstance(result, Rejected), (expected, result)
            assert result.error == expected, (expected, result)
        return expected

    def marker(
        self, pid: int, epoch: int, coordinator_epoch: int, commit: bool, skew: int
    ) -> object:
        """Drive a COMMIT/ABORT marker through prepare_end_txn/complete_txn as the log does;
        returns 'append' or the ErrorCode the model expects."""
        p = self.model.get(pid)
        ts = self.now + skew
        expected: object = "append"
        if p is not None and epoch < p.epoch:
            expected = ErrorCode.INVALID_PRODUCER_EPOCH
        elif p is not None and coordinator_epoch < p.coordinator_epoch:
            expected = ErrorCode.TRANSACTION_COORDINATOR_FENCED
        info = self.psm.prepare_end_txn(pid, epoch, coordinator_epoch, commit)
        if expected != "append":
            assert isinstance(info, Rejected), (expected, info)
            assert info.error == expected, (expected, info)
            return expected
        assert isinstance(info, EndTxnAppendInfo), info
        marker_offset = self.log_end  # the control batch takes one offset
        completed = self.psm.complete_txn(info, marker_offset, ts)
        self.log_end += 1
        if p is None:
            p = self.model[pid] = ModelProducer(epoch, last_ts=ts)
        elif epoch != p.epoch:  # the coordinator bumped the epoch: sequences restart
            p.epoch = epoch
            p.batches.clear()
            p.history.clear()
        p.coordinator_epoch = coordinator_epoch
        p.last_ts = max(p.last_ts, ts)
        want = None
        if p.txn_first is not None:
            want = CompletedTxn(pid, p.txn_first, marker_offset, not commit)
        p.txn_first = None
        assert completed == want, (completed, want)
        return expected

    def pick(self, i: int) -> int:
        pids = sorted(self.model)
        return pids[i % len(pids)]

    # -- rules ---------------------------------------------------------------------------------

    @rule(
        pid=st.integers(0, 20),
        epoch=st.integers(0, 5),
        first=st.one_of(st.integers(0, 100), st.integers(SEQ_SPACE - 8, SEQ_SPACE - 1)),
        count=st.integers(1, 10),
        txn=st.booleans(),
    )
    def any_batch(self, pid: int, epoch: int, first: int, count: int, txn: bool) -> None:
        """Unknown producers (any sequence, including just below the wrap) or arbitrary garbage."""
        self.send(pid, epoch, first, count, txn=txn)

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100), count=st.integers(1, 10), skew=st.integers(-50, 50))
    def next_in_sequence(self, i: int, count: int, skew: int) -> None:
        pid = self.pick(i)
        p = self.model[pid]
        last_seq = p.batches[-1][1] if p.batches else -1
        txn = p.txn_first is not None  # stay legal while a transaction is open
        assert self.send(pid, p.epoch, seq_add(last_seq, 1), count, skew, txn) == "append"

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100), count=st.integers(1, 3))
    def begin_transaction(self, i: int, count: int) -> None:
        pid = self.pick(i)
        p = self.model[pid]
        last_seq = p.batches[-1][1] if p.batches else -1
        assert self.send(pid, p.epoch, seq_add(last_seq, 1), count, txn=True) == "append"

    @precondition(lambda self: any(p.txn_first is not None for p in self.model.values()))
    @rule(
        i=st.integers(0, 100),
        bump=st.sampled_from([0, 0, 1]),
        new_coordinator=st.booleans(),
        commit=st.booleans(),
        skew=st.integers(-50, 50),
    )
    def end_transaction(
        self, i: int, bump: int, new_coordinator: bool, commit: bool, skew: int
    ) -> None:
        """The coordinator's marker closes an open transaction (bump: it fenced the producer)."""
        open_pids = sorted(pid for pid, p in self.model.items() if p.txn_first is not None)
        pid = open_pids[i % len(open_pids)]
        p = self.model[pid]
        coordinator_epoch = max(p.coordinator_epoch, 0) + int(new_coordinator)
        assert self.marker(pid, p.epoch + bump, coordinator_epoch, commit, skew) == "append"

    @rule(
        pid=st.integers(0, 20),
        epoch=st.integers(0, 5),
        coordinator_epoch=st.integers(-1, 3),
        commit=st.booleans(),
    )
    def any_marker(self, pid: int, epoch: int, coordinator_epoch: int, commit: bool) -> None:
        """Markers for unknown producers, closed transactions, stale epochs or coordinators."""
        self.marker(pid, epoch, coordinator_epoch, commit, 0)

    @precondition(lambda self: any(p.txn_first is not None for p in self.model.values()))
    @rule(i=st.integers(0, 100))
    def non_transactional_during_txn(self, i: int) -> None:
        open_pids = sorted(pid for pid, p in self.model.items() if p.txn_first is not None)
        pid = open_pids[i % len(open_pids)]
        p = self.model[pid]
        first = seq_add(p.batches[-1][1], 1) if p.batches else 0
        assert self.send(pid, p.epoch, first, 1, txn=False) == ErrorCode.INVALID_TXN_STATE

    @precondition(lambda self: any(p.batches for p in self.model.values()))
    @rule(i=st.integers(0, 100), j=st.integers(0, 4))
    def retry_recent(self, i: int, j: int) -> None:
        pids = sorted(pid for pid, p in self.model.items() if p.batches)
        pid = pids[i % len(pids)]
        p = self.model[pid]
        b = p.batches[j % len(p.batches)]
        count = b[3] - b[2] + 1
        txn = p.txn_first is not None
        assert isinstance(self.send(pid, p.epoch, b[0], count, txn=txn), Duplicate)

    @precondition(lambda self: any(len(p.history) > 5 for p in self.model.values()))
    @rule(i=st.integers(0, 100), j=st.integers(0, 100))
    def stale_retry(self, i: int, j: int) -> None:
        pids = sorted(pid for pid, p in self.model.items() if len(p.history) > 5)
        pid = pids[i % len(pids)]
        p = self.model[pid]
        stale = p.history[:-5]
        b = stale[j % len(stale)]
        expected = self.send(pid, p.epoch, b[0], b[3] - b[2] + 1, txn=True)
        assert expected == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100), gap=st.integers(2, 1000))
    def gap(self, i: int, gap: int) -> None:
        pid = self.pick(i)
        p = self.model[pid]
        if not p.batches:
            return
        first = seq_add(p.batches[-1][1], gap)
        assert self.send(pid, p.epoch, first, 1, txn=True) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100), bump=st.integers(1, 3), first=st.integers(0, 3))
    def epoch_bump(self, i: int, bump: int, first: int) -> None:
        """Valid at sequence 0 (KIP-360), 45 otherwise."""
        pid = self.pick(i)
        p = self.model[pid]
        txn = p.txn_first is not None
        expected = self.send(pid, p.epoch + bump, first, 2, txn=txn)
        assert expected == ("append" if first == 0 else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)

    @precondition(lambda self: any(p.epoch > 0 for p in self.model.values()))
    @rule(i=st.integers(0, 100), first=st.integers(0, 100))
    def zombie_epoch(self, i: int, first: int) -> None:
        pids = sorted(pid for pid, p in self.model.items() if p.epoch > 0)
        pid = pids[i % len(pids)]
        expected = self.send(pid, self.model[pid].epoch - 1, first, 1)
        assert expected == ErrorCode.INVALID_PRODUCER_EPOCH

    @rule(ms=st.integers(0, 6_000))
    def advance_time(self, ms: int) -> None:
        self.now += ms

    @precondition(lambda self: self.model)
    @rule(i=st.integers(0, 100), early=st.booleans())
    def advance_to_expiry_of(self, i: int, early: bool) -> None:
        """Land exactly on (or 1 ms before) a producer's expiry boundary."""
        target = self.model[self.pick(i)].last_ts + EXPIRATION_MS - int(early)
        self.now = max(self.now, target)

    @rule()
    def expire(self) -> None:
        expired = sorted(
            pid
            for pid, p in self.model.items()
            if p.txn_first is None and self.now - p.last_ts >= EXPIRATION_MS
        )
        for pid in expired:
            del self.model[pid]
        assert sorted(self.psm.remove_expired_producers(self.now)) == expired

    @rule(back=st.integers(0, 40))
    def retention(self, back: int) -> None:
        log_start = max(0, self.log_end - back)
        # A producer with no retained batch (only markers since its epoch) has nothing left.
        gone = [
            pid
            for pid, p in self.model.items()
            if (p.batches[-1][3] if p.batches else -1) < log_start
        ]
        for pid in gone:
            del self.model[pid]
        self.psm.remove_producers_below(log_start)

    def _restore(self, entries: list[ProducerStateEntry], map_end: int) -> None:
        fresh = ProducerStateManager(producer_id_expiration_ms=EXPIRATION_MS)
        fresh.load(entries, map_end, self.now)
        self.psm = fresh
        # Loading drops what has expired by now.
        for pid in [
            pid
            for pid, p in self.model.items()
            if p.txn_first is None and self.now - p.last_ts >= EXPIRATION_MS
        ]:
            del self.model[pid]

    @rule()
    def restart_in_memory(self) -> None:
        self._restore(self.psm.entries(), self.psm.map_end_offset)

    @rule()
    def restart_from_snapshot_file(self) -> None:
        write_snapshot(self.dir, self.psm.map_end_offset, self.psm.entries())
        found = latest_valid_snapshot(self.dir)
        assert found is not None and found[0] == self.log_end
        self._restore(found[1], found[0])

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def matches_model(self) -> None:
        assert len(self.psm) == len(self.model)
        assert self.psm.map_end_offset == self.log_end
        for pid, p in self.model.items():
            e = self.psm.last_entry(pid)
            assert e is not None, pid
            assert e.epoch == p.epoch
            got = [
                (b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp_ms)
                for b in e.batches
            ]
            assert got == list(p.batches)
            assert e.last_timestamp_ms == p.last_ts
            assert e.current_txn_first_offset == p.txn_first
            assert e.coordinator_epoch == p.coordinator_epoch
        for e in self.psm.entries():
            assert e.producer_id in self.model
        open_txns = [p.txn_first for p in self.model.values() if p.txn_first is not None]
        assert self.psm.first_unstable_offset() == (min(open_txns) if open_txns else None)


ProducerStateMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestProducerStateMachine = ProducerStateMachine.TestCase
