"""Compaction against a model: the records a read_committed reader may see, in offset order.

Random workloads of idempotent producers (with retries), two transactional producers whose
transactions begin, append (with retried batches) and end (commit or abort) as separate,
interleaved steps, and tombstones, cleaned at random points, also while transactions are
open. The model keeps every record visible to read_committed once its transaction committed
(a plain record at once) and the first offset of each open transaction, so the last stable
offset too. After each cleaning the log's last stable offset must be the model's, a
read_committed reader must see exactly the model's live keys below it with their values, and
every record it sees must be one that was written at that offset; after a restart (producer
state replayed from the compacted log) no transaction is left open and every producer's last
batch is still known.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
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
    st.tuples(st.just("txn_append"), st.integers(0, 1), records),  # begins one if none is open
    st.tuples(st.just("txn_retry"), st.integers(0, 1)),
    st.tuples(st.just("txn_end"), st.integers(0, 1), st.booleans()),
    st.tuples(st.just("clean")),
)
TXN = (20, 21)


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


_BIG = b"x" * 30
# A key written before a transaction opens and again, in later segments, while it is open:
# cleaning past the open transaction (the last stable offset) would drop the value a
# read_committed reader still sees.
_PAST_THE_LSO = [
    ("put", 0, [(b"k1", _BIG)]),
    ("txn_append", 0, [(b"k2", _BIG)]),
    *[("put", 1, [(b"k1", _BIG), (b"k3", _BIG), (b"k4", _BIG)])] * 6,
    ("clean",),
]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=5, max_size=60))
@example(_PAST_THE_LSO)
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
        # (offset, key, value) of every record read_committed may return once below the LSO:
        # plain ones as appended, transactional ones when their transaction commits.
        visible: list[tuple[int, bytes, bytes | None]] = []
        pending: dict[int, list[tuple[int, bytes, bytes | None]]] = {pid: [] for pid in TXN}
        open_first: dict[int, int] = {}  # pid -> first offset of its open transaction
        written: dict[int, tuple[bytes, bytes | None]] = {}
        seqs = {10: 0, 11: 0, 20: 0, 21: 0}
        last: dict[int, tuple[bytes, int]] = {}  # pid -> (batch, its base offset)

        def append(data: bytes, pid: int) -> list[tuple[int, bytes, bytes | None]]:
            result = log.append(RecordBatchView(data), NOW)
            assert result.error == ErrorCode.NONE and not result.duplicate, result
            out = []
            for r in decode_records(RecordBatchView(data)):
                written[result.base_offset + r.offset] = (r.key or b"", r.value)
                out.append((result.base_offset + r.offset, r.key or b"", r.value))
            last[pid] = (data, result.base_offset)
            seqs[pid] += len(out)
            return out

        def end(pid: int, commit: bool) -> None:
            marker = log.append_end_txn_marker(pid, 0, 0, commit=commit, now_ms=NOW)
            assert marker.error == ErrorCode.NONE
            if commit:
                visible.extend(pending[pid])
            pending[pid] = []
            del open_first[pid]

        def check() -> None:
            lso = min(open_first.values(), default=log.log_end_offset)
            assert log.last_stable_offset == lso
            model: dict[bytes, bytes | None] = {}
            for _offset, key, value in sorted(e for e in visible if e[0] < lso):
                model[key] = value
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
                visible.extend(append(_batch(o[2], pid, seqs[pid], False), pid))
            elif o[0] == "retry" and 10 + o[1] in last:
                data, base = last[10 + o[1]]
                result = log.append(RecordBatchView(data), NOW)
                assert result.duplicate and result.base_offset == base
            elif o[0] == "txn_append":
                pid = TXN[o[1]]
                appended = append(_batch(o[2], pid, seqs[pid], True), pid)
                open_first.setdefault(pid, appended[0][0])
                pending[pid] += appended
            elif o[0] == "txn_retry" and TXN[o[1]] in open_first:
                data, base = last[TXN[o[1]]]
                result = log.append(RecordBatchView(data), NOW)
                assert result.duplicate and result.base_offset == base
            elif o[0] == "txn_end" and TXN[o[1]] in open_first:
                end(TXN[o[1]], o[2])
            elif o[0] == "clean":
                cleaner.clean(log, NOW)
                check()
        cleaner.clean(log, NOW)
        check()
        for pid in sorted(open_first):
            end(pid, True)
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
            if pid not in TXN:
                retry = log.append(RecordBatchView(data), NOW)
                assert retry.duplicate and retry.base_offset == base
            nxt = _batch([(b"k0", b"next")], pid, seqs[pid], pid in TXN)
            assert log.append(RecordBatchView(nxt), NOW).error == ErrorCode.NONE
        log._close_files()
