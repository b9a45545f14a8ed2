"""Log compaction: what a cleaning keeps, when it runs, and its crash safety at load."""

from __future__ import annotations

import time
from pathlib import Path

from samsa.log.cleaner import (
    DELETE_HORIZON_FLAG,
    CleanerConfig,
    LogCleaner,
    read_cleaner_checkpoint,
)
from samsa.log.log import Log, LogConfig
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    ControlType,
    NewRecord,
    Record,
    RecordBatchView,
    build_batch,
    control_type_of,
    decode_records,
    iter_batches,
)

NOW = 1_800_000_000_000
HOUR = 3_600_000


def open_log(path: Path, **kw: object) -> Log:
    kw.setdefault("min_cleanable_dirty_ratio", 0.0)
    kw.setdefault("delete_retention_ms", 0)
    return Log.open(path, LogConfig(segment_bytes=600, cleanup_policy="compact", **kw), NOW)  # type: ignore[arg-type]


def put(
    log: Log,
    items: list[tuple[bytes, bytes | None]],
    *,
    pid: int = -1,
    seq: int = -1,
    txn: bool = False,
    ts: int = NOW,
) -> int:
    data = build_batch(
        [NewRecord(key=k, value=v, timestamp=ts) for k, v in items],
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=seq,
        transactional=txn,
    )
    result = log.append(RecordBatchView(data), NOW)
    assert result.error == ErrorCode.NONE, result
    return result.base_offset


def batches(log: Log) -> list[RecordBatchView]:
    res = log.read(log.log_start_offset, 1 << 30)
    return [v for chunk in res.chunks for v in iter_batches(chunk)]


def read_committed(log: Log) -> list[Record]:
    """The records a read_committed consumer gets (the Java consumer's aborted-txn filter)."""
    res = log.read(log.log_start_offset, 1 << 30, max_offset=log.last_stable_offset)
    aborted = sorted(
        log.aborted_transactions(log.log_start_offset, log.log_end_offset), key=lambda a: a[1]
    )
    skipping: set[int] = set()
    out: list[Record] = []
    for chunk in res.chunks:
        for view in iter_batches(chunk):
            while aborted and aborted[0][1] <= view.last_offset:
                skipping.add(aborted.pop(0)[0])
            if view.is_control:
                if control_type_of(view) == ControlType.ABORT:
                    skipping.discard(view.producer_id)
                continue
            if view.is_transactional and view.producer_id in skipping:
                continue
            out.extend(decode_records(view))
    return out


def latest(records: list[Record]) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    for r in records:
        assert r.key is not None
        out[r.key] = r.value
    return out


def test_keeps_the_last_record_per_key_at_its_original_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    history: list[tuple[bytes, int, bytes]] = []
    for i in range(40):
        key = b"k%d" % (i % 4)
        history.append((key, put(log, [(key, b"v%d" % i)]), b"v%d" % i))
    before = sum(s.size for s in log.segments)
    cleaner = LogCleaner()
    assert cleaner.clean(log, NOW)
    after = batches(log)
    records = [r for v in after for r in decode_records(v)]
    # Below the active segment each key appears once: its last record there, at the offset
    # it was written at.
    active = log.segments[-1].base_offset
    cleaned = [(r.key, r.offset, r.value) for r in records if r.offset < active]
    last_below = {k: (k, o, v) for k, o, v in history if o < active}
    assert sorted(cleaned, key=lambda t: t[1]) == sorted(last_below.values(), key=lambda t: t[1])
    assert latest(records) == {k: v for k, _, v in history}
    assert sum(s.size for s in log.segments) < before / 3
    assert [r.offset for r in records] == sorted(r.offset for r in records)
    assert read_cleaner_checkpoint(tmp_path) == active
    # Reopened (no clean shutdown): the same records, and the checkpoint says nothing is dirty.
    log._close_files()
    again = open_log(tmp_path)
    assert [r for v in batches(again) for r in decode_records(v)] == records
    assert not LogCleaner().clean(again, NOW)


def test_a_producers_last_batch_stays_empty_so_its_sequence_survives(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    seq = 0
    for _ in range(10):
        put(log, [(b"a", b"x" * 40), (b"b", b"y" * 40)], pid=7, seq=seq)
        seq += 2
    # Another producer overwrites every key of producer 7, in later segments.
    for i in range(10):
        put(log, [(b"a", b"%d" % i), (b"b", b"%d" % i)], pid=8, seq=2 * i)
    put(log, [(b"c", b"tail")])
    LogCleaner().clean(log, NOW)
    of7 = [v for v in batches(log) if v.producer_id == 7]
    # Only the last batch of producer 7 is left, with no records, same offsets and sequences.
    assert len(of7) == 1 and of7[0].record_count == 0
    assert (of7[0].base_sequence, of7[0].last_sequence) == (18, 19)
    assert of7[0].last_offset_delta == 1
    # After a restart without a clean shutdown (producer state replayed from the log), the
    # producer's retry is a duplicate and its next sequence is accepted.
    log._close_files()
    for snap in tmp_path.glob("*.snapshot"):
        snap.unlink()
    again = open_log(tmp_path)
    retry = build_batch(
        [NewRecord(key=b"a", value=b"x" * 40), NewRecord(key=b"b", value=b"y" * 40)],
        producer_id=7,
        producer_epoch=0,
        base_sequence=18,
    )
    assert again.append(RecordBatchView(retry), NOW).duplicate
    nxt = build_batch(
        [NewRecord(key=b"a", value=b"z")], producer_id=7, producer_epoch=0, base_sequence=20
    )
    assert again.append(RecordBatchView(nxt), NOW).error == ErrorCode.NONE


def test_tombstones_stay_for_delete_retention_ms_after_their_first_cleaning(
    tmp_path: Path,
) -> None:
    # The horizon runs from the first cleaning's time (KIP-534), whatever the clock says.
    now = time.time_ns() // 1_000_000
    log = open_log(tmp_path, delete_retention_ms=HOUR)
    for i in range(10):
        put(log, [(b"gone", b"v%d" % i), (b"kept", b"w%d" % i)], ts=now)
    put(log, [(b"gone", None)], ts=now)
    for i in range(10):
        put(log, [(b"other", b"o" * 40 + b"%d" % i)], ts=now)
    cleaner = LogCleaner()
    assert cleaner.clean(log, now)
    assert latest(read_committed(log))[b"gone"] is None  # the delete is still visible
    for i in range(6):
        put(log, [(b"more", b"m" * 40 + b"%d" % i)], ts=now)
    assert cleaner.clean(log, now + HOUR // 2)
    assert latest(read_committed(log))[b"gone"] is None  # cleaned, but not an hour ago
    for i in range(6):
        put(log, [(b"more", b"n" * 40 + b"%d" % i)], ts=now)
    assert cleaner.clean(log, now + 2 * HOUR)
    final = latest(read_committed(log))
    assert b"gone" not in final and final[b"kept"] == b"w9"


def test_first_cleaning_stamps_the_delete_horizon_in_the_batch_header(tmp_path: Path) -> None:
    # KIP-534: the batch keeping a tombstone is rewritten with base timestamp = cleaning time +
    # delete.retention.ms and the isDeleteHorizonSet bit; record timestamps read back as
    # written; the tombstone goes at the first cleaning at or after that horizon, not before.
    log = open_log(tmp_path, delete_retention_ms=HOUR)
    put(log, [(b"gone", b"v")], ts=NOW - 5000)
    put(log, [(b"gone", None), (b"kept", b"w")], ts=NOW - 4000)
    for i in range(10):
        put(log, [(b"other", b"o" * 60 + b"%d" % i)], ts=NOW - 3000)
    cleaner = LogCleaner()
    first_cleaning = NOW + 7
    assert cleaner.clean(log, first_cleaning)
    (stamped,) = [v for v in batches(log) if any(r.value is None for r in decode_records(v))]
    assert stamped.attributes & DELETE_HORIZON_FLAG
    assert stamped.base_timestamp == first_cleaning + HOUR
    assert stamped.max_timestamp == NOW - 4000
    assert [r.timestamp for r in decode_records(stamped)] == [NOW - 4000, NOW - 4000]
    plain = [v for v in batches(log) if v.base_offset != stamped.base_offset]
    assert not any(v.attributes & DELETE_HORIZON_FLAG for v in plain)  # no tombstone: no stamp

    def clean_at(when: int) -> None:
        for i in range(10):
            put(log, [(b"other", b"p" * 60 + b"%d" % i)], ts=NOW)
        assert cleaner.clean(log, when)

    clean_at(first_cleaning + HOUR - 1)  # one millisecond early
    assert latest(read_committed(log))[b"gone"] is None
    again = [v for v in batches(log) if v.base_offset == stamped.base_offset]
    assert again[0].base_timestamp == first_cleaning + HOUR  # stamped once, never moved
    clean_at(first_cleaning + HOUR)
    final = latest(read_committed(log))
    assert b"gone" not in final and final[b"kept"] == b"w"


def test_aborted_data_goes_and_markers_go_once_nothing_of_their_txn_is_left(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path)
    put(log, [(b"k", b"committed-1")], pid=1, seq=0, txn=True)
    log.append_end_txn_marker(1, 0, 0, commit=True, now_ms=NOW)
    put(log, [(b"k", b"aborted"), (b"j", b"aborted")], pid=2, seq=0, txn=True)
    log.append_end_txn_marker(2, 0, 0, commit=False, now_ms=NOW)
    put(log, [(b"k", b"plain" + b"p" * 60)])
    for i in range(8):
        put(log, [(b"filler", b"f" * 60 + b"%d" % i)])
    assert latest(read_committed(log))[b"k"] == b"plain" + b"p" * 60
    cleaner = LogCleaner()
    assert cleaner.clean(log, NOW)
    seen = batches(log)
    # The aborted records are gone at once; the aborted txn's batch is producer 2's last, so
    # it stays empty. Its marker and producer 1's stay this time: batches of theirs were seen.
    assert all(r.value != b"aborted" for v in seen for r in decode_records(v))
    assert [v.is_control for v in seen if v.producer_id in (1, 2)].count(True) == 2
    assert latest(read_committed(log)) == {b"k": b"plain" + b"p" * 60, b"filler": b"f" * 60 + b"7"}
    # Both producers write again: their old batches are no longer their last, so they go;
    # the cleaning after finds their markers guarding nothing and stamps their delete
    # horizon (KIP-534; delete.retention.ms is 0 here), and the next one removes them.
    put(log, [(b"p1", b"x")], pid=1, seq=1)
    put(log, [(b"p2", b"y")], pid=2, seq=2)
    for pass_ in range(3):
        for i in range(8):
            put(log, [(b"filler", b"g" * 60 + b"%d%d" % (pass_, i))])
        assert cleaner.clean(log, NOW)
        markers = [v for v in batches(log) if v.is_control]
        if pass_ == 1:
            assert [bool(v.attributes & DELETE_HORIZON_FLAG) for v in markers] == [True, True]
    assert not markers
    assert len(log.txn_index) == 0
    assert latest(read_committed(log))[b"k"] == b"plain" + b"p" * 60
    # A restart replays producer state from the log: no transaction is left open.
    log._close_files()
    for snap in tmp_path.glob("*.snapshot"):
        snap.unlink()
    again = open_log(tmp_path)
    assert again.last_stable_offset == again.log_end_offset


def test_open_transactions_bound_the_cleaning_and_read_committed_sees_no_aborted_data(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path)
    put(log, [(b"k", b"old" + b"o" * 60)])
    first_open = put(log, [(b"k", b"maybe")], pid=3, seq=0, txn=True)
    for i in range(10):
        put(log, [(b"filler", b"f" * 60 + b"%d" % i)])
    cleaner = LogCleaner()
    cleaner.clean(log, NOW)
    # Nothing at or past the open transaction was used: "old" is still there.
    assert read_cleaner_checkpoint(tmp_path) <= first_open
    assert any(r.value == b"old" + b"o" * 60 for v in batches(log) for r in decode_records(v))
    log.append_end_txn_marker(3, 0, 0, commit=False, now_ms=NOW)
    for i in range(10):
        put(log, [(b"filler", b"g" * 60 + b"%d" % i)])
    assert cleaner.clean(log, NOW)
    assert latest(read_committed(log))[b"k"] == b"old" + b"o" * 60


def test_min_compaction_lag_and_dirty_ratio_hold_a_cleaning_back(tmp_path: Path) -> None:
    log = open_log(tmp_path, min_compaction_lag_ms=HOUR, min_cleanable_dirty_ratio=0.5)
    for i in range(40):
        put(log, [(b"k%d" % i, b"v" * 60)], ts=NOW)
    cleaner = LogCleaner()
    assert not cleaner.clean(log, NOW + HOUR // 2)  # too young
    assert cleaner.clean(log, NOW + 2 * HOUR)
    for i in range(10):  # a little dirt over a big clean head: under the 0.5 ratio
        put(log, [(b"k%d" % i, b"w" * 60)], ts=NOW)
    assert cleaner.plan(log, NOW + 2 * HOUR) is None
    for i in range(40):  # more dirt than clean data
        put(log, [(b"k%d" % i, b"x" * 60)], ts=NOW)
    plan = cleaner.plan(log, NOW + 2 * HOUR)
    assert plan is not None and plan.dirty_ratio >= 0.5


def test_a_small_offset_map_cleans_in_several_passes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(60):
        put(log, [(b"k%d" % i, b"v" * 40), (b"k%d" % (i + 1), b"w" * 40)])
    cleaner = LogCleaner(CleanerConfig(dedupe_buffer_size=24 * 8))  # eight keys
    passes = 0
    while cleaner.clean(log, NOW):
        passes += 1
        assert passes < 40
    assert passes >= 3
    assert read_cleaner_checkpoint(tmp_path) == log.segments[-1].base_offset
    values = latest(read_committed(log))
    assert values[b"k60"] == b"w" * 40 and values[b"k0"] == b"v" * 40


def test_keyless_records_are_refused_by_a_compacted_log(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data = build_batch([NewRecord(key=b"a", value=b"1"), NewRecord(value=b"no key")])
    result = log.append(RecordBatchView(data), NOW)
    assert result.error == ErrorCode.INVALID_RECORD and "without key" in (result.message or "")
    assert log.log_end_offset == 0
    plain = Log.open(tmp_path / "plain", LogConfig(), NOW)
    assert plain.append(RecordBatchView(data), NOW).error == ErrorCode.NONE


def _cleaned_but_not_swapped(tmp_path: Path) -> tuple[Log, list[Path], list[Record]]:
    log = open_log(tmp_path)
    for i in range(40):
        put(log, [(b"k%d" % (i % 3), b"v" * 30 + b"%d" % i)])
    expected = read_committed(log)
    cleaner = LogCleaner()
    plan = cleaner.plan(log, NOW)
    assert plan is not None
    cleaner.build(plan)
    swaps = [swap for _, swap, _, _ in plan.swaps]
    assert swaps and all(s.exists() for s in swaps)
    log._close_files()  # the "crash": the swap files are committed, nothing swapped yet
    return log, swaps, expected


def test_a_crash_after_the_swap_commit_is_completed_at_load(tmp_path: Path) -> None:
    old, _, expected = _cleaned_but_not_swapped(tmp_path)
    # The crash hit in the middle of the swap: one old segment already deleted.
    old.segments[1].path.unlink()
    log = open_log(tmp_path)
    assert not list(tmp_path.glob("*.swap"))
    assert latest(read_committed(log)) == latest(expected)
    assert sum(s.size for s in log.segments) < sum(s.size for s in old.segments)
    assert [s.base_offset for s in log.segments] == sorted({s.base_offset for s in log.segments})


def test_a_crash_before_the_swap_commit_keeps_the_old_segments(tmp_path: Path) -> None:
    old, swaps, expected = _cleaned_but_not_swapped(tmp_path)
    for swap in swaps:  # as if killed before the rename: only .cleaned files
        swap.rename(swap.with_name(swap.name.replace(".swap", ".cleaned")))
    log = open_log(tmp_path)
    assert not list(tmp_path.glob("*.cleaned"))
    assert read_committed(log) == expected
    assert [s.size for s in log.segments] == [s.size for s in old.segments]


def test_max_compaction_lag_forces_a_cleaning_under_the_dirty_ratio(tmp_path: Path) -> None:
    log = open_log(tmp_path, min_cleanable_dirty_ratio=0.9, max_compaction_lag_ms=HOUR)
    for i in range(40):
        put(log, [(b"k%d" % i, b"v" * 60)], ts=NOW)
    cleaner = LogCleaner()
    assert cleaner.clean(log, NOW)  # all dirty: ratio 1.0
    for i in range(10):  # a little dirt: ratio well under 0.9
        put(log, [(b"k%d" % i, b"w" * 60)], ts=NOW)
    assert cleaner.plan(log, NOW + HOUR // 2) is None
    # Once the oldest dirty record is older than max.compaction.lag.ms it must be cleaned.
    plan = cleaner.plan(log, NOW + 2 * HOUR)
    assert plan is not None and plan.dirty_ratio < 0.9


def test_cleaning_io_is_throttled(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(40):  # few, large batches: bytes dominate, not per-batch work
        put(log, [(b"k%d" % (i % 10), b"v" * 20_000)])
    size = sum(s.size for s in log.segments[:-1])
    start = time.monotonic()
    # log.cleaner.io.max.bytes.per.second at twice the log's size: reading it alone takes
    # half a second.
    assert LogCleaner(CleanerConfig(io_max_bytes_per_second=2 * size)).clean(log, NOW)
    assert time.monotonic() - start >= 0.45
