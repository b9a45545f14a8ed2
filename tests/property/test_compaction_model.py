"""Compaction against a model: a dict of the last committed value per key.

Random workloads of idempotent producers (with retries), transactions that commit or abort and
tombstones, cleaned at random points. After each cleaning a read_committed reader of the log
must see exactly the model's live keys with their values, every record it sees must be one that
was written at that offset, and after a restart (producer state replayed from the compacted
log) no transaction is left open and every producer's last batch is still known.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.log.test_cleaner import batches, read_committed

from samsa.log.cleaner import LogCleaner
from samsa.log.log import Log, LogConfig
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import NewRecord, RecordBatchView, build_batch, decode_records

NOW = 1_800_000_000_000
KEYS = [b"k%d" % i for i in range(6)]

records = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=30))),
    min_size=1,
    max_size=3,
)
op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 1), records),
    st.tuples(st.just("retry"), st.integers(0, 1)),
    st.tuples(st.just("txn"), st.booleans(), st.lists(records, min_size=1, max_size=2)),
    st.tuples(st.just("clean")),
)


def _batch(items: list[tuple[bytes, bytes | None]], pid: int, seq: int, txn: bool) -> bytes:
    return build_batch(
        [NewRecord(key=k, value=v, timestamp=NOW) for k, v in items],
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        transactional=txn,
    )


def _live(values: dict[bytes, bytes | None]) -> dict[bytes, bytes]:
    return {k: v for k, v in values.items() if v is not None}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=5, max_size=60))
def test_a_compacted_log_reads_like_the_model(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        config = LogConfig(
            segment_bytes=300,
            cleanup_policy="compact",
            min_cleanable_dirty_ratio=0.0,
            delete_retention_ms=0,
        )
        log = Log.open(directory, config, NOW)
        cleaner = LogCleaner()
        model: dict[bytes, bytes | None] = {}
        written: dict[int, tuple[bytes, bytes | None]] = {}
        seqs = {10: 0, 11: 0, 20: 0}
        last: dict[int, tuple[bytes, int]] = {}  # pid -> (batch, its base offset)

        def append(data: bytes, pid: int) -> int:
            result = log.append(RecordBatchView(data), NOW)
            assert result.error == ErrorCode.NONE and not result.duplicate, result
            for r in decode_records(RecordBatchView(data)):
                written[result.base_offset + r.offset] = (r.key or b"", r.value)
            last[pid] = (data, result.base_offset)
            seqs[pid] += len(decode_records(RecordBatchView(data)))
            return result.base_offset

        def check() -> None:
            assert _live({r.key or b"": r.value for r in read_committed(log)}) == _live(model)
            offsets = []
            for view in batches(log):
                for r in [] if view.is_control else decode_records(view):
                    assert written[r.offset] == (r.key, r.value)
                    offsets.append(r.offset)
            assert offsets == sorted(set(offsets))

        for o in ops:
            if o[0] == "put":
                pid = 10 + o[1]
                append(_batch(o[2], pid, seqs[pid], False), pid)
                model.update(o[2])
            elif o[0] == "retry" and 10 + o[1] in last:
                data, base = last[10 + o[1]]
                result = log.append(RecordBatchView(data), NOW)
                assert result.duplicate and result.base_offset == base
            elif o[0] == "txn":
                for items in o[2]:
                    append(_batch(items, 20, seqs[20], True), 20)
                marker = log.append_end_txn_marker(20, 0, 0, commit=o[1], now_ms=NOW)
                assert marker.error == ErrorCode.NONE
                if o[1]:
                    for items in o[2]:
                        model.update(items)
            elif o[0] == "clean":
                cleaner.clean(log, NOW)
                check()
        cleaner.clean(log, NOW)
        check()
        # A restart without a clean shutdown or snapshots: producer state from the log alone.
        log._close_files()
        for snap in directory.glob("*.snapshot"):
            snap.unlink()
        log = Log.open(directory, config, NOW)
        check()
        assert log.last_stable_offset == log.log_end_offset
        for pid, (data, base) in last.items():
            if pid != 20:
                retry = log.append(RecordBatchView(data), NOW)
                assert retry.duplicate and retry.base_offset == base
            nxt = _batch([(b"k0", b"next")], pid, seqs[pid], pid == 20)
            assert log.append(RecordBatchView(nxt), NOW).error == ErrorCode.NONE
        log._close_files()
