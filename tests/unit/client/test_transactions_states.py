"""Pure parts of the client's transactions: state transitions, error classification, and
the hand-over record of a prepared transaction (docs/semantics.md, rule 21: which errors end a
producer or a transaction)."""

from __future__ import annotations

import json

import pytest

from samsa.client import (
    AbortableTransactionError,
    KafkaError,
    PreparedTransaction,
    ProducerFencedError,
    TransactionState,
    TransactionStateError,
)
from samsa.client._transactions import (
    ABORTABLE_ADD,
    ABORTABLE_OFFSETS,
    Outcome,
    check_transition,
    classify,
    first_error,
)
from samsa.protocol.errors import ErrorCode as E

S = TransactionState

ALLOWED = {
    (S.UNINITIALIZED, S.INITIALIZING),
    (S.INITIALIZING, S.READY),
    (S.READY, S.IN_TRANSACTION),
    (S.IN_TRANSACTION, S.COMMITTING),
    (S.IN_TRANSACTION, S.ABORTING),
    (S.IN_TRANSACTION, S.PREPARED),
    (S.IN_TRANSACTION, S.ABORTABLE_ERROR),
    (S.COMMITTING, S.READY),
    (S.COMMITTING, S.COMMITTING),
    (S.COMMITTING, S.ABORTABLE_ERROR),
    (S.ABORTING, S.READY),
    (S.ABORTING, S.ABORTING),
    (S.ABORTABLE_ERROR, S.ABORTING),
    (S.ABORTABLE_ERROR, S.ABORTABLE_ERROR),
    (S.PREPARED, S.COMMITTING),
    (S.PREPARED, S.ABORTING),
}


@pytest.mark.parametrize("source", list(S))
@pytest.mark.parametrize("target", [t for t in S if t is not S.UNINITIALIZED])
def test_transitions_match_kafkas_state_machine(source: S, target: S) -> None:
    if target is S.FATAL_ERROR or (source, target) in ALLOWED:
        check_transition(source, target, "op")
    else:
        with pytest.raises(TransactionStateError):
            check_transition(source, target, "op")


@pytest.mark.parametrize(
    ("code", "abortable", "outcome", "exc"),
    [
        (0, frozenset(), Outcome.OK, None),
        (E.PRODUCER_FENCED, frozenset(), Outcome.FATAL, ProducerFencedError),
        (E.INVALID_PRODUCER_EPOCH, ABORTABLE_OFFSETS, Outcome.FATAL, ProducerFencedError),
        (E.UNKNOWN_PRODUCER_ID, frozenset(), Outcome.ABORTABLE_BUMP, AbortableTransactionError),
        (
            E.INVALID_PRODUCER_ID_MAPPING,
            frozenset(),
            Outcome.ABORTABLE_BUMP,
            AbortableTransactionError,
        ),
        (E.TOPIC_AUTHORIZATION_FAILED, ABORTABLE_ADD, Outcome.ABORTABLE, AbortableTransactionError),
        (E.ILLEGAL_GENERATION, ABORTABLE_OFFSETS, Outcome.ABORTABLE, AbortableTransactionError),
        (E.UNKNOWN_MEMBER_ID, ABORTABLE_OFFSETS, Outcome.ABORTABLE, AbortableTransactionError),
        (E.INVALID_TXN_STATE, frozenset(), Outcome.FATAL, KafkaError),
        (E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ABORTABLE_ADD, Outcome.FATAL, KafkaError),
    ],
)
def test_classify(code: int, abortable: frozenset[int], outcome: Outcome, exc: type | None) -> None:
    got, err = classify(code, "Req", abortable)
    assert got is outcome
    if exc is None:
        assert err is None
    else:
        assert type(err) is exc
        assert err is not None and err.code == code


def test_first_error_prefers_a_real_error_over_retriable_ones() -> None:
    assert first_error([0, 0]) == 0
    assert first_error([E.OPERATION_NOT_ATTEMPTED, E.TOPIC_AUTHORIZATION_FAILED]) == (
        E.TOPIC_AUTHORIZATION_FAILED
    )
    assert first_error([E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR]) == E.NOT_COORDINATOR
    assert first_error([0, E.CONCURRENT_TRANSACTIONS]) == E.CONCURRENT_TRANSACTIONS


def test_prepared_transaction_round_trips_through_json() -> None:
    p = PreparedTransaction("app-task-3", 4711, 12, started=False)
    assert PreparedTransaction.from_json(json.loads(json.dumps(p.to_json()))) == p
    legacy = {"transactional_id": "x", "producer_id": 1, "epoch": 2}
    assert PreparedTransaction.from_json(legacy).started is True  # type: ignore[arg-type]
