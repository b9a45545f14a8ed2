"""Unit tests for samsa.log.producer_state: one or more per rule of docs/semantics.md (rules 2-6, 8
and 12)."""

from __future__ import annotations

import copy
import tracemalloc

import pytest

from samsa.log.producer_state import (
    NO_SEQUENCE,
    NUM_BATCHES_TO_RETAIN,
    AppendOrigin,
    BatchAppend,
    BatchMetadata,
    Duplicate,
    EndTxnAppendInfo,
    ProducerAppendInfo,
    ProducerStateEntry,
    ProducerStateManager,
    Rejected,
    last_sequence_of,
    next_sequence,
)
from samsa.protocol.errors import ErrorCode

MAX_SEQ = 2**31 - 1
PID = 1000
NOW = 1_700_000_000_000


class Log:
    """A stand-in for the partition log: hands out offsets and applies accepted batches."""

    def __init__(self, psm: ProducerStateManager) -> None:
        self.psm = psm
        self.next_offset = 0

    def send(
        self,
        first_seq: int,
        count: int = 1,
        *,
        pid: int = PID,
        epoch: int = 0,
        ts: int = NOW,
        txn: bool = False,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> Duplicate | Rejected | tuple[int, int]:
        batch = BatchAppend(pid, epoch, first_seq, last_sequence_of(first_seq, count - 1), ts, txn)
        result = self.psm.prepare_update(batch, ts, origin)
        if not isinstance(result, ProducerAppendInfo):
            return result
        first, last = self.next_offset, self.next_offset + count - 1
        self.psm.update(result, first, last)
        self.next_offset = last + 1
        return first, last

    def end_txn(self, *, pid: int = PID, epoch: int = 0, commit: bool = True) -> None:
        """Write a COMMIT (or ABORT) marker through the marker path, as the log does."""
        info = self.psm.prepare_end_txn(pid, epoch, 0, commit)
        assert isinstance(info, EndTxnAppendInfo), info
        self.psm.complete_txn(info, self.next_offset, NOW)
        self.next_offset += 1


def code(result: object) -> ErrorCode:
    assert isinstance(result, Rejected), result
    return result.error


@pytest.fixture
def log() -> Log:
    return Log(ProducerStateManager())


# -- sequence arithmetic ---------------------------------------------------------------------------


def test_next_sequence_wraps() -> None:
    assert next_sequence(0, 1) == 1
    assert next_sequence(MAX_SEQ - 1, 1) == MAX_SEQ
    assert next_sequence(MAX_SEQ, 1) == 0
    assert next_sequence(MAX_SEQ - 2, 5) == 2
    assert next_sequence(NO_SEQUENCE, 1) == 0


def test_last_sequence_of() -> None:
    assert last_sequence_of(10, 0) == 10
    assert last_sequence_of(10, 9) == 19
    assert last_sequence_of(MAX_SEQ - 1, 3) == 1
    assert last_sequence_of(NO_SEQUENCE, 3) == NO_SEQUENCE


# -- rules 4, 5: in-sequence appends ---------------------------------------------------------------


def test_unknown_producer_accepts_any_first_sequence(log: Log) -> None:
    assert log.send(12345, 3) == (0, 2)
    assert log.send(7, 1, pid=2, epoch=9) == (3, 3)
    entry = log.psm.last_entry(PID)
    assert entry is not None
    assert (entry.epoch, entry.first_seq, entry.last_seq) == (0, 12345, 12347)
    assert (entry.first_offset, entry.last_offset) == (0, 2)


def test_in_sequence_batches_are_accepted(log: Log) -> None:
    assert log.send(0, 3) == (0, 2)
    assert log.send(3, 2) == (3, 4)
    assert log.send(5, 1) == (5, 5)
    assert log.psm.map_end_offset == 6
    assert len(log.psm) == 1


def test_gap_is_out_of_order(log: Log) -> None:
    log.send(0, 3)
    assert code(log.send(4, 1)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert code(log.send(2, 2)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # overlaps, not equal
    assert log.send(3, 1) == (3, 3)


def test_rejection_leaves_state_alone(log: Log) -> None:
    log.send(0, 3)
    before = copy.deepcopy(log.psm.entries())
    assert code(log.send(9, 1)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert code(log.send(3, 1, epoch=5)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.psm.entries() == before
    assert log.psm.map_end_offset == 3


# -- rule 6: duplicates ----------------------------------------------------------------------------


def test_duplicates_of_each_retained_batch_return_original_offsets(log: Log) -> None:
    sent = []
    seq = 0
    for i in range(7):
        first, last = log.send(seq, 2, ts=NOW + i)  # type: ignore[misc]
        sent.append((seq, first, last, NOW + i))
        seq += 2
    end = log.psm.map_end_offset
    for first_seq, first, last, ts in sent[-NUM_BATCHES_TO_RETAIN:]:
        assert log.send(first_seq, 2) == Duplicate(first, last, ts)
    assert log.psm.map_end_offset == end  # nothing written


def test_duplicate_older_than_window_is_out_of_order(log: Log) -> None:
    for i in range(NUM_BATCHES_TO_RETAIN + 1):
        log.send(i, 1)
    # The 6th-newest batch (seq 0) fell out of the window.
    assert code(log.send(0, 1)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.send(1, 1) == Duplicate(1, 1, NOW)


def test_duplicate_needs_exact_range(log: Log) -> None:
    log.send(0, 4)
    assert code(log.send(0, 2)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.send(0, 4) == Duplicate(0, 3, NOW)


def test_duplicate_needs_same_epoch(log: Log) -> None:
    log.send(0, 1, epoch=3)
    assert code(log.send(0, 1, epoch=2)) == ErrorCode.INVALID_PRODUCER_EPOCH
    # Epoch 4 at seq 0 is a new batch, not a duplicate.
    assert log.send(0, 1, epoch=4) == (1, 1)


def test_duplicate_detected_before_txn_check(log: Log) -> None:
    log.send(0, 1, txn=True)
    assert log.send(0, 1, txn=False) == Duplicate(0, 0, NOW)


# -- rules 2, 3: epochs ----------------------------------------------------------------------------


def test_lower_epoch_is_invalid_producer_epoch(log: Log) -> None:
    log.send(0, 1, epoch=5)
    assert code(log.send(1, 1, epoch=4)) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert code(log.send(0, 1, epoch=0)) == ErrorCode.INVALID_PRODUCER_EPOCH


def test_higher_epoch_at_zero_is_accepted_and_clears_batches(log: Log) -> None:
    for i in range(3):
        log.send(i * 10, 10)
    assert log.send(0, 2, epoch=1) == (30, 31)
    entry = log.psm.last_entry(PID)
    assert entry is not None
    assert entry.epoch == 1
    assert entry.batches == (BatchMetadata(0, 1, 30, 31, NOW),)
    # Old-epoch retries are now fenced, and the new epoch continues from its own sequence.
    assert code(log.send(10, 10, epoch=0)) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert log.send(2, 1, epoch=1) == (32, 32)


def test_higher_epoch_not_at_zero_is_out_of_order(log: Log) -> None:
    log.send(0, 5)
    assert code(log.send(5, 1, epoch=1)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert code(log.send(1, 1, epoch=2)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    entry = log.psm.last_entry(PID)
    assert entry is not None and entry.epoch == 0 and len(entry.batches) == 1
    assert log.send(5, 1) == (5, 5)


def test_same_epoch_without_batches_expects_zero() -> None:
    psm = ProducerStateManager()
    psm.load([ProducerStateEntry(PID, 2, [], NOW)], 10, NOW)
    log = Log(psm)
    assert code(log.send(5, 1, epoch=2)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.send(0, 1, epoch=2) == (0, 0)


# -- wrap-around -----------------------------------------------------------------------------------


def test_batch_whose_sequences_wrap(log: Log) -> None:
    log.send(MAX_SEQ - 9, 5)  # MAX-9 .. MAX-5
    assert log.send(MAX_SEQ - 4, 10) == (5, 14)  # MAX-4 .. 4, wraps inside the batch
    entry = log.psm.last_entry(PID)
    assert entry is not None and entry.last_seq == 4
    assert log.send(5, 1) == (15, 15)
    assert log.send(MAX_SEQ - 4, 10) == Duplicate(5, 14, NOW)


def test_batch_after_max_sequence_starts_at_zero(log: Log) -> None:
    log.send(MAX_SEQ - 2, 3)  # ends exactly at MAX
    assert code(log.send(1, 1)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.send(0, 1) == (3, 3)


# -- prepare_update is pure; only a client's batch is validated ------------------------------


def test_prepare_update_does_not_mutate(log: Log) -> None:
    log.send(0, 2, txn=True)
    log.send(0, 1, pid=2)
    before = copy.deepcopy(log.psm.entries())
    end = log.psm.map_end_offset
    batches = [
        BatchAppend(PID, 0, 2, 3, NOW + 5, True),  # valid next
        BatchAppend(PID, 1, 0, 0, NOW + 5, True),  # valid epoch bump
        BatchAppend(PID, 0, 0, 1, NOW, True),  # duplicate
        BatchAppend(PID, 0, 9, 9, NOW, True),  # gap
        BatchAppend(PID, 0, 2, 2, NOW, False),  # txn open
        BatchAppend(3, 0, 0, 0, NOW, True),  # unknown producer
    ]
    for b in batches:
        log.psm.prepare_update(b, NOW + 5)
        for origin in AppendOrigin:
            log.psm.prepare_update(b, NOW + 5, origin)
    assert log.psm.entries() == before
    assert log.psm.map_end_offset == end
    assert len(log.psm) == 2
    assert log.psm.last_entry(3) is None


@pytest.mark.parametrize("origin", [AppendOrigin.COORDINATOR, AppendOrigin.RECOVERY])
def test_only_a_client_batch_is_judged(log: Log, origin: AppendOrigin) -> None:
    log.send(0, 5, epoch=3, txn=True)
    # A client's batch like this one is refused; from the log or a coordinator it is the truth.
    assert code(log.send(100, 1, epoch=1)) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert log.send(100, 1, epoch=1, origin=origin) == (5, 5)  # lower epoch, gap, non-txn
    entry = log.psm.last_entry(PID)
    assert entry is not None
    assert entry.epoch == 1 and entry.batches == (BatchMetadata(100, 100, 5, 5, NOW),)
    assert entry.current_txn_first_offset == 0
    assert log.send(0, 5, epoch=1, origin=origin) == (6, 10)  # a "duplicate" is written again
    assert log.psm.map_end_offset == 11


def test_no_producer_id_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        ProducerStateManager().prepare_update(BatchAppend(-1, -1, -1, -1, NOW), NOW)


def test_negative_sequence_is_invalid_record(log: Log) -> None:
    assert code(log.send(-1, 1)) == ErrorCode.INVALID_RECORD


def test_only_five_batches_retained(log: Log) -> None:
    for i in range(12):
        log.send(i, 1)
    entry = log.psm.last_entry(PID)
    assert entry is not None
    assert [b.first_seq for b in entry.batches] == [7, 8, 9, 10, 11]


def test_update_uses_state_at_apply_time(log: Log) -> None:
    # Two infos prepared against the same state, applied in order: both land, the newest is last.
    a = log.psm.prepare_update(BatchAppend(PID, 0, 0, 0, NOW), NOW)
    assert isinstance(a, ProducerAppendInfo)
    log.psm.update(a, 0, 0)
    b = log.psm.prepare_update(BatchAppend(PID, 0, 1, 1, NOW + 1), NOW)
    assert isinstance(b, ProducerAppendInfo)
    log.psm.update(b, 1, 1)
    entry = log.psm.last_entry(PID)
    assert entry is not None and entry.last_seq == 1 and entry.last_timestamp_ms == NOW + 1
    with pytest.raises(ValueError):
        log.psm.update(b, 5, 4)


# -- transactions ----------------------------------------------------------------------------------


def test_non_transactional_batch_while_txn_open_is_invalid_txn_state(log: Log) -> None:
    log.send(0, 1)
    assert log.send(1, 2, txn=True) == (1, 2)
    entry = log.psm.last_entry(PID)
    assert entry is not None and entry.current_txn_first_offset == 1
    assert code(log.send(3, 1, txn=False)) == ErrorCode.INVALID_TXN_STATE
    assert log.send(3, 1, txn=True) == (3, 3)
    entry = log.psm.last_entry(PID)
    assert entry is not None and entry.current_txn_first_offset == 1  # the first offset stays
    # A new epoch does not close the transaction: only its marker does.
    assert code(log.send(0, 1, epoch=1, txn=False)) == ErrorCode.INVALID_TXN_STATE
    log.end_txn()  # at offset 4
    assert log.send(4, 1, txn=False) == (5, 5)


def test_sequence_errors_take_precedence_over_txn_state(log: Log) -> None:
    log.send(0, 1, epoch=3, txn=True)
    assert code(log.send(5, 1, epoch=3, txn=False)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert code(log.send(7, 1, epoch=4, txn=False)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert code(log.send(1, 1, epoch=2, txn=False)) == ErrorCode.INVALID_PRODUCER_EPOCH


# -- rule 12: expiry -------------------------------------------------------------------------------


def test_expiry_after_idle_time() -> None:
    psm = ProducerStateManager(producer_id_expiration_ms=1000)
    log = Log(psm)
    log.send(0, 1, pid=1, ts=NOW)
    log.send(0, 1, pid=2, ts=NOW + 500)
    assert psm.remove_expired_producers(NOW + 999) == []
    assert psm.remove_expired_producers(NOW + 1000) == [1]
    assert psm.last_entry(1) is None and psm.last_entry(2) is not None
    # An expired producer is unknown: any sequence starts it again.
    assert log.send(77, 1, pid=1, ts=NOW + 1000) == (2, 2)
    assert psm.remove_expired_producers(NOW + 1500) == [2]
    assert len(psm) == 1


def test_expiry_uses_last_batch_timestamp() -> None:
    psm = ProducerStateManager(producer_id_expiration_ms=1000)
    log = Log(psm)
    log.send(0, 1, ts=NOW)
    log.send(1, 1, ts=NOW + 800)
    assert psm.remove_expired_producers(NOW + 1700) == []
    assert psm.remove_expired_producers(NOW + 1800) == [PID]


def test_open_transaction_prevents_expiry() -> None:
    psm = ProducerStateManager(producer_id_expiration_ms=1000)
    log = Log(psm)
    log.send(0, 1, txn=True)
    assert psm.remove_expired_producers(NOW + 10_000_000) == []
    log.end_txn()
    assert psm.remove_expired_producers(NOW + 10_000_000) == [PID]


# -- retention, load, truncate ---------------------------------------------------------------------


def test_remove_producers_below(log: Log) -> None:
    log.send(0, 3, pid=1)  # 0..2
    log.send(0, 3, pid=2)  # 3..5
    log.send(3, 1, pid=1)  # 6
    log.psm.remove_producers_below(6)
    assert log.psm.last_entry(1) is not None  # its last record at 6 survives
    assert log.psm.last_entry(2) is None
    assert log.send(42, 1, pid=2) == (7, 7)  # now unknown: any sequence
    log.psm.remove_producers_below(8)
    assert len(log.psm) == 0


def test_load_replaces_state_copies_and_drops_expired() -> None:
    psm = ProducerStateManager(producer_id_expiration_ms=1000)
    Log(psm).send(0, 1, pid=99)
    live = ProducerStateEntry(1, 2, [BatchMetadata(0, 0, 5, 5, NOW)], NOW)
    old = ProducerStateEntry(2, 0, [BatchMetadata(0, 0, 6, 6, NOW - 5000)], NOW - 5000)
    old_txn = ProducerStateEntry(3, 0, [BatchMetadata(0, 0, 7, 7, NOW - 5000)], NOW - 5000, 4, 7)
    psm.load([live, old, old_txn], 8, NOW)
    assert psm.map_end_offset == 8
    assert sorted(e.producer_id for e in psm.entries()) == [1, 3]
    loaded = psm.last_entry(1)
    assert loaded == live and loaded is not live and loaded.batches is not live.batches
    txn_entry = psm.last_entry(3)
    assert txn_entry is not None
    assert txn_entry.coordinator_epoch == 4 and txn_entry.current_txn_first_offset == 7
    # Duplicate detection works against loaded state.
    assert psm.prepare_update(BatchAppend(1, 2, 0, 0, NOW), NOW) == Duplicate(5, 5, NOW)


def test_truncate_and_reload(log: Log) -> None:
    log.send(0, 3)
    log.psm.truncate_and_reload(2)
    assert len(log.psm) == 0
    assert log.psm.map_end_offset == 2
    assert log.psm.entries() == []


def test_entry_properties_when_empty() -> None:
    e = ProducerStateEntry(1, 0, [], NOW)
    assert (e.first_seq, e.last_seq, e.first_offset, e.last_offset) == (NO_SEQUENCE, -1, -1, -1)


# -- the packed representation ---------------------------------------------------------------------


def test_state_reads_back_unchanged_through_every_row_shape(log: Log) -> None:
    """A producer's first batch is kept in a smaller shape than later state; nothing the manager
    answers may depend on which shape it holds."""
    psm = log.psm
    assert log.send(5, 3, ts=NOW + 1) == (0, 2)  # the single shape
    first = BatchMetadata(5, 7, 0, 2, NOW + 1)
    assert psm.last_entry(PID) == ProducerStateEntry(PID, 0, [first], NOW + 1)
    assert log.send(8, 2, ts=NOW + 2, txn=True) == (3, 4)  # two batches: the full shape
    second = BatchMetadata(8, 9, 3, 4, NOW + 2)
    assert psm.last_entry(PID) == ProducerStateEntry(PID, 0, [first, second], NOW + 2, -1, 3)
    assert psm.prepare_update(BatchAppend(PID, 0, 5, 7, NOW), NOW) == Duplicate(0, 2, NOW + 1)
    # The coordinator bumped the epoch: its marker clears the batches, and the next batch keeps
    # the marker's coordinator epoch, so it cannot take the single shape.
    log.end_txn(epoch=1)  # at offset 5
    assert psm.last_entry(PID) == ProducerStateEntry(PID, 1, [], NOW + 2, 0)
    assert log.send(0, 1, epoch=1, ts=NOW + 3) == (6, 6)
    third = BatchMetadata(0, 0, 6, 6, NOW + 3)
    assert psm.last_entry(PID) == ProducerStateEntry(PID, 1, [third], NOW + 3, 0)
    assert psm.prepare_update(BatchAppend(PID, 1, 0, 0, NOW), NOW) == Duplicate(6, 6, NOW + 3)
    assert code(log.send(0, 1, epoch=0)) == ErrorCode.INVALID_PRODUCER_EPOCH


def test_a_batch_beyond_an_int32_offset_span_is_kept_exactly() -> None:
    # The single shape stores the last offset as a 32-bit delta; a wider batch takes the full one.
    psm = ProducerStateManager()
    first, last = 2**40, 2**40 + 2**31
    info = psm.prepare_update(BatchAppend(PID, 0, 0, 9, NOW), NOW)
    assert isinstance(info, ProducerAppendInfo)
    psm.update(info, first, last)
    entry = psm.last_entry(PID)
    assert entry is not None and (entry.first_offset, entry.last_offset) == (first, last)
    assert psm.prepare_update(BatchAppend(PID, 0, 0, 9, NOW), NOW) == Duplicate(first, last, NOW)
    psm.remove_producers_below(last)
    assert len(psm) == 1
    psm.remove_producers_below(last + 1)
    assert len(psm) == 0


def test_a_producer_with_one_batch_takes_under_150_bytes() -> None:
    """A broker keeps an entry per (producer, partition): with many short-lived idempotent
    producers it is most of its memory. The bound counts everything the entry adds (its key in
    the manager's dict too), with producer ids and offsets as large as real ones."""
    n = 5_000
    psm = ProducerStateManager()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            info = psm.prepare_update(BatchAppend(10_000_000 + i, 0, 0, 9, NOW + i), NOW)
            assert isinstance(info, ProducerAppendInfo)
            psm.update(info, 3_000_000_000 + 10 * i, 3_000_000_009 + 10 * i)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(psm) == n
    assert grown / n < 150, grown / n
