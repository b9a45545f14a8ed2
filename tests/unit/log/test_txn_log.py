"""The log side of transactions: markers, last stable offset, aborted-transaction index
(docs/semantics.md, rules 16-17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from samsa.log.log import Log, LogConfig
from samsa.log.txn_index import read_txn_index, txn_index_path
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    ControlType,
    NewRecord,
    RecordBatchView,
    build_batch,
    control_type_of,
    iter_batches,
)

NOW = 1_800_000_000_000


def txn_batch(pid: int, epoch: int, seq: int, n: int = 2) -> RecordBatchView:
    return RecordBatchView(
        build_batch(
            [NewRecord(value=b"t%d" % i, timestamp=NOW) for i in range(n)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            transactional=True,
        )
    )


def plain(n: int = 1) -> RecordBatchView:
    return RecordBatchView(build_batch([NewRecord(value=b"p", timestamp=NOW)] * n))


def open_log(path: Path, **kw: int) -> Log:
    return Log.open(path, LogConfig(**kw), NOW)


def test_open_transaction_holds_back_the_last_stable_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(plain(), NOW)  # 0
    assert log.append(txn_batch(7, 0, 0), NOW).base_offset == 1  # 1-2
    log.append(plain(), NOW)  # 3
    assert (log.last_stable_offset, log.high_watermark) == (1, 4)
    assert log.read(0, 1 << 20, max_offset=log.last_stable_offset).size == len(plain().to_bytes())
    result = log.append_end_txn_marker(7, 0, 0, True, NOW)
    assert (result.error, result.base_offset) == (ErrorCode.NONE, 4)
    assert log.last_stable_offset == log.high_watermark == 5
    assert log.aborted_transactions(0, 5) == []
    marker = next(iter_batches(log.read(4, 1 << 20).chunks[0]))
    assert marker.is_control and control_type_of(marker) == ControlType.COMMIT


def test_aborted_transactions_are_indexed_and_collected_by_range(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(1, 0, 0), NOW)  # 0-1
    log.append(txn_batch(2, 0, 0), NOW)  # 2-3
    assert log.last_stable_offset == 0
    log.append_end_txn_marker(1, 0, 0, False, NOW)  # 4: abort pid 1
    assert log.last_stable_offset == 2  # pid 2 still open
    log.append_end_txn_marker(2, 0, 0, True, NOW)  # 5: commit pid 2
    log.append(txn_batch(1, 0, 2), NOW)  # 6-7: pid 1's next transaction
    log.append_end_txn_marker(1, 0, 0, False, NOW)  # 8
    assert log.aborted_transactions(0, 9) == [(1, 0), (1, 6)]
    assert log.aborted_transactions(5, 9) == [(1, 6)]  # first one ended at 4
    assert log.aborted_transactions(0, 5) == [(1, 0)]  # second one starts at 6
    assert log.last_stable_offset == 9


def test_markers_fence_older_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(3, 0, 0), NOW)
    # The coordinator fenced the producer: the abort marker carries the bumped epoch.
    assert log.append_end_txn_marker(3, 1, 0, False, NOW).error == ErrorCode.NONE
    assert log.append(txn_batch(3, 0, 2), NOW).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert log.append_end_txn_marker(3, 0, 0, True, NOW).error == ErrorCode.INVALID_PRODUCER_EPOCH
    # The new epoch starts at sequence 0.
    assert log.append(txn_batch(3, 1, 0), NOW).error == ErrorCode.NONE
    assert log.append_end_txn_marker(3, 1, 0, True, NOW).error == ErrorCode.NONE
    # A marker from an older coordinator epoch is refused.
    log.append(txn_batch(3, 1, 2), NOW)
    assert log.append_end_txn_marker(3, 1, 5, True, NOW).error == ErrorCode.NONE
    log.append(txn_batch(3, 1, 4), NOW)
    result = log.append_end_txn_marker(3, 1, 4, True, NOW)
    assert result.error == ErrorCode.TRANSACTION_COORDINATOR_FENCED


def test_non_transactional_batch_during_open_transaction_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(4, 0, 0), NOW)
    idem = RecordBatchView(
        build_batch(
            [NewRecord(value=b"x", timestamp=NOW)], producer_id=4, producer_epoch=0, base_sequence=2
        )
    )
    assert log.append(idem, NOW).error == ErrorCode.INVALID_TXN_STATE


@pytest.mark.parametrize("shutdown", ["clean", "crash", "crash-no-snapshot"])
def test_transaction_state_survives_reopen(tmp_path: Path, shutdown: str) -> None:
    log = open_log(tmp_path, segment_bytes=400)  # small segments: markers land in later ones
    log.append(txn_batch(1, 0, 0), NOW)  # 0-1
    log.append_end_txn_marker(1, 0, 0, False, NOW)  # 2
    for _ in range(4):
        log.append(plain(2), NOW)  # 3..10
    log.append(txn_batch(2, 0, 0), NOW)  # 11-12, left open
    log.append(txn_batch(1, 0, 2), NOW)  # 13-14
    log.append_end_txn_marker(1, 0, 0, False, NOW)  # 15
    before = (log.last_stable_offset, log.aborted_transactions(0, 100), log.log_end_offset)
    assert before == (11, [(1, 0), (1, 13)], 16)
    if shutdown == "clean":
        log.close(NOW)
    else:
        log._close_files()  # a kill -9: nothing flushed, no snapshot at the end
        if shutdown == "crash-no-snapshot":
            for snap in tmp_path.glob("*.snapshot"):
                snap.unlink()
            for idx in tmp_path.glob("*.txnindex"):
                idx.unlink()  # rebuilt from the markers in the log
    again = open_log(tmp_path, segment_bytes=400)
    assert (
        again.last_stable_offset,
        again.aborted_transactions(0, 100),
        again.log_end_offset,
    ) == before
    # The open transaction can still be completed after the restart.
    assert again.append_end_txn_marker(2, 0, 0, True, NOW).error == ErrorCode.NONE
    assert again.last_stable_offset == again.high_watermark == 17


def test_torn_txn_index_entry_is_ignored(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(1, 0, 0), NOW)
    log.append_end_txn_marker(1, 0, 0, False, NOW)
    log.close(NOW)
    path = txn_index_path(tmp_path, 0)
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x01")  # half an entry
    assert [(e.producer_id, e.first_offset, e.last_offset) for e in read_txn_index(path)] == [
        (1, 0, 2)
    ]
    assert open_log(tmp_path).aborted_transactions(0, 10) == [(1, 0)]
