"""Stateful property test: the producer's idempotence decisions against a model broker.

The producer side is ``client/_idempotence`` driven as the sender drives it (drain the
lowest unresolved batch alone, else a new one; no send while a bump is pending; bump only
with nothing in flight). The broker is a naive model of the dedup rule (rules 20-21 of
docs/semantics.md), written without the module's code: per producer id the epoch, the last
sequence and the last five batches; a sequence must follow the last one, a new epoch starts
at 0, a batch seen among the last five is a duplicate. One connection carries the requests
in order; it may drop with requests processed but unanswered; the broker may forget an idle
producer; time passes and batches expire.

Checked after every step: the broker never sees a sequence gap (OUT_OF_ORDER_SEQUENCE_NUMBER
is only an answer to a forgotten producer), no batch is written twice and the log keeps the
append order, every batch the producer completed as written is in the log, the pending
batches of a partition carry contiguous sequences. At the end everything settles: with the
connection steady, every batch is resolved and nothing is left in flight.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from samsa.client._idempotence import (
    Action,
    Decision,
    Idempotence,
    PartitionSequences,
    decide,
    on_failure,
    on_lost,
)
from samsa.protocol.errors import ErrorCode

E = ErrorCode
SEQ_MOD = 2**31
PARTITIONS = (0, 1)
MAX_IN_FLIGHT = 5
TIMEOUT = 6.0  # delivery.timeout.ms, in the model's seconds
BACKOFF, BACKOFF_MAX = 0.1, 1.0


@dataclass(eq=False)
class FakeBatch:
    ident: int  # append order within its partition
    count: int
    created: float
    base_sequence: int = -1
    producer_id: int = -1
    epoch: int = -1
    payload: Any = None
    in_flight: bool = False
    attempts: int = 0
    retry_at: float = 0.0
    outcome: str = ""  # "", "written", "failed"

    def drop_first(self, n: int) -> None:
        self.count -= n


@dataclass
class BrokerProducer:
    epoch: int
    last_seq: int
    recent: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=5))


@dataclass
class Request:
    part: int
    batch: FakeBatch
    pid: int
    epoch: int
    first: int
    last: int
    answer: int | None = None  # set when the broker processed it


class IdempotenceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.next_pid = 1
        self.idem = Idempotence(1000, 0)
        self.parts = {p: PartitionSequences(1000, 0, 0) for p in PARTITIONS}
        self.queues: dict[int, deque[FakeBatch]] = {p: deque() for p in PARTITIONS}
        self.all: dict[int, list[FakeBatch]] = {p: [] for p in PARTITIONS}
        self.broker: dict[int, dict[int, BrokerProducer]] = {p: {} for p in PARTITIONS}
        self.log: dict[int, list[int]] = {p: [] for p in PARTITIONS}
        self.wire: deque[Request] = deque()  # in order on the one connection
        self.out_of_order_ok: set[int] = set()  # partitions whose broker forgot us
        self.disturbed: set[int] = set()  # a request of the partition failed transiently

    # --- the broker model -----------------------------------------------------------------

    def _broker_answer(self, r: Request) -> int:
        producers = self.broker[r.part]
        st_ = producers.get(r.pid)
        if st_ is None:
            if r.first != 0:
                return E.UNKNOWN_PRODUCER_ID
            st_ = producers[r.pid] = BrokerProducer(r.epoch, -1)
        elif r.epoch < st_.epoch:
            return E.INVALID_PRODUCER_EPOCH
        elif r.epoch > st_.epoch:
            if r.first != 0:
                return E.OUT_OF_ORDER_SEQUENCE_NUMBER
            st_.epoch, st_.last_seq = r.epoch, -1
            st_.recent.clear()
        elif (r.first, r.last) in st_.recent:
            return E.DUPLICATE_SEQUENCE_NUMBER
        elif r.first != (st_.last_seq + 1) % SEQ_MOD:
            return E.OUT_OF_ORDER_SEQUENCE_NUMBER
        st_.last_seq = r.last
        st_.recent.append((r.first, r.last))
        self.log[r.part].append(r.batch.ident)
        return E.NONE

    # --- the producer, driven as the sender drives the module -----------------------------

    def _pick(self, part: int) -> FakeBatch | None:
        """What the sender would send of ``part`` now (and mark it sent)."""
        if self.idem.bump_requested:
            return None
        ps = self.parts[part]
        if ps.in_flight >= MAX_IN_FLIGHT:
            return None
        retry = ps.unresolved()
        if retry is not None:
            if ps.retry_ready(retry, self.now) is not None:
                return None
            batch = retry
        else:
            if not self.idem.adopt(ps) or not self.queues[part]:
                return None
            batch = self.queues[part].popleft()
            ps.assign(batch, idempotent=True)
        ps.sent(batch)
        return batch

    def _send(self, part: int, batch: FakeBatch) -> None:
        last = (batch.base_sequence + batch.count - 1) % SEQ_MOD
        self.wire.append(
            Request(part, batch, batch.producer_id, batch.epoch, batch.base_sequence, last)
        )

    def _apply(self, part: int, batch: FakeBatch, d: Decision) -> None:
        ps = self.parts[part]
        a = d.action
        assert a is not Action.FATAL, "nothing fences this producer"
        assert a is not Action.ABORTABLE, "not transactional"
        if a is Action.IGNORE:
            return
        if a in (Action.SUCCEED, Action.DUPLICATE):
            ps.acknowledged(batch)
            batch.outcome = "written"
            return
        if d.new_id:
            self.idem.require_new_id()
        if d.bump and a is Action.RETRY:
            self.idem.request_bump(part, new_id=d.new_id)
        if a is Action.RETRY:
            ps.retry(batch, self.now, BACKOFF, BACKOFF_MAX)
            return
        assert a is Action.FAIL
        if ps.remove(batch) and d.bump:
            self.idem.request_bump(part)
        batch.outcome = "failed"

    def _respond(self, r: Request, code: int) -> None:
        ps = self.parts[r.part]
        ps.landed(r.batch)
        if code == E.OUT_OF_ORDER_SEQUENCE_NUMBER:
            # legal only after the broker forgot us, or behind a batch refused just before
            ok = r.part in self.out_of_order_ok or r.part in self.disturbed
            assert ok, "the producer sent a sequence gap"
        d = decide(
            code,
            ErrorCode(code).retriable,
            r.batch,
            ps,
            idempotent=True,
            transactional=False,
            bump_pending=self.idem.bump_requested,
            first_epoch=self.idem.first_epoch,
        )
        self._apply(r.part, r.batch, d)

    def _bump_now(self) -> None:
        ident = self.idem.local_bump()
        if ident is None:  # InitProducerId: a fresh producer id at epoch 0
            self.next_pid += 1
            ident = (1000 + self.next_pid, 0)
        self.idem.bumped(*ident, self.parts.items())

    def _in_flight(self) -> int:
        return sum(ps.in_flight for ps in self.parts.values())

    # --- rules ----------------------------------------------------------------------------

    @rule(part=st.sampled_from(PARTITIONS), count=st.integers(1, 4))
    def append(self, part: int, count: int) -> None:
        b = FakeBatch(len(self.all[part]), count, self.now)
        self.all[part].append(b)
        self.queues[part].append(b)

    @rule(part=st.sampled_from(PARTITIONS))
    def drain(self, part: int) -> None:
        batch = self._pick(part)
        if batch is not None:
            self._send(part, batch)

    @precondition(lambda self: any(r.answer is None for r in self.wire))
    @rule()
    def broker_processes(self) -> None:
        r = next(r for r in self.wire if r.answer is None)
        r.answer = self._broker_answer(r)

    @precondition(lambda self: any(r.answer is None for r in self.wire))
    @rule(code=st.sampled_from([E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS]))
    def broker_refuses_transiently(self, code: int) -> None:
        r = next(r for r in self.wire if r.answer is None)
        r.answer = code
        self.disturbed.add(r.part)

    @precondition(lambda self: self.wire and self.wire[0].answer is not None)
    @rule()
    def response_arrives(self) -> None:
        r = self.wire.popleft()
        assert r.answer is not None
        self._respond(r, r.answer)

    @rule(processed=st.integers(0, 3))
    def connection_lost(self, processed: int) -> None:
        """Some requests reach the broker, no answer comes back."""
        for r in self.wire:
            if r.answer is None and processed > 0:
                r.answer = self._broker_answer(r)
                processed -= 1
        lost, self.wire = list(self.wire), deque()
        for r in lost:
            ps = self.parts[r.part]
            ps.landed(r.batch)
            self._apply(r.part, r.batch, on_lost(ps, r.batch, retriable=True, idempotent=True))

    @rule(dt=st.sampled_from([0.05, 0.5, 4.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule()
    def expire(self) -> None:
        for part, ps in self.parts.items():
            for b in ps.expired(self.now, TIMEOUT):
                self._apply(part, b, on_failure(ps, b, idempotent=True, transactional=False))

    @precondition(lambda self: self.idem.bump_requested)
    @rule()
    def bump(self) -> None:
        if self._in_flight() == 0:
            self._bump_now()

    @rule(part=st.sampled_from(PARTITIONS))
    def broker_forgets_idle_producer(self, part: int) -> None:
        """Producer state expired at the broker (transactional.id.expiration / retention)."""
        if self.parts[part].pending or any(r.part == part for r in self.wire):
            return
        if self.broker[part]:
            self.broker[part].clear()
            self.out_of_order_ok.add(part)

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def calm_partitions_forget_transient_errors(self) -> None:
        for part, ps in self.parts.items():
            if not ps.pending and not ps.in_flight:
                self.disturbed.discard(part)

    @invariant()
    def log_is_in_append_order_without_duplicates(self) -> None:
        for part, written in self.log.items():
            assert written == sorted(set(written)), (part, written)

    @invariant()
    def completed_batches_are_in_the_log(self) -> None:
        for part, batches in self.all.items():
            logged = set(self.log[part])
            for b in batches:
                if b.outcome == "written":
                    assert b.ident in logged, (part, b)

    @invariant()
    def pending_sequences_are_contiguous(self) -> None:
        for ps in self.parts.values():
            seq = None
            for b in ps.pending:
                assert (b.producer_id, b.epoch) == (ps.producer_id, ps.epoch)
                if seq is not None:
                    assert b.base_sequence == seq
                seq = (b.base_sequence + b.count) % SEQ_MOD
            if seq is not None:
                assert seq == ps.next_seq

    @invariant()
    def no_gap_after_the_last_acknowledged(self) -> None:
        """Unless a bump renumbers it, a partition's next sequence to send follows the
        last one acknowledged: a failed batch must not leave a hole."""
        for part, ps in self.parts.items():
            if part in self.idem.bump_partitions:
                continue
            first = ps.pending[0].base_sequence if ps.pending else ps.next_seq
            assert first == (ps.last_acked + 1) % SEQ_MOD, (part, first, ps.last_acked)

    @invariant()
    def in_flight_counts_match_the_wire(self) -> None:
        for part, ps in self.parts.items():
            assert ps.in_flight == sum(r.part == part for r in self.wire)

    def teardown(self) -> None:
        """With a steady connection everything resolves: nothing stays stuck."""
        for _ in range(500):
            if self.idem.bump_requested and not self._in_flight():
                self._bump_now()
            for part in PARTITIONS:
                while (batch := self._pick(part)) is not None:
                    self._send(part, batch)
            while self.wire:
                r = self.wire.popleft()
                self._respond(r, r.answer if r.answer is not None else self._broker_answer(r))
            self.log_is_in_append_order_without_duplicates()
            self.completed_batches_are_in_the_log()
            self.pending_sequences_are_contiguous()
            self.no_gap_after_the_last_acknowledged()
            if not any(self.queues.values()) and not any(ps.pending for ps in self.parts.values()):
                break
            self.now += BACKOFF_MAX
        for part, batches in self.all.items():
            for b in batches:
                assert b.outcome, f"partition {part}: {b} never resolved"
        assert not self.idem.bump_requested


IdempotenceMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None, derandomize=True
)
TestIdempotenceMachine = IdempotenceMachine.TestCase
