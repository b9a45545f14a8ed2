"""Start-up replay of ``__consumer_offsets`` collapses each run of plain offset commits to the
last record of every key (``OffsetStore.load_batch``) and reads stored batches as columns
(``record_columns``). Both must leave exactly what reading every record did: random logs of
commits (v0-v4 values, legacy v0 keys, keys with trailing bytes), tombstones, unreadable
keys and values, transactional commits with COMMIT/ABORT markers (some never decided), and
classic and consumer group records, replayed through the one-by-one path (the oracle below,
the code before runs) and the new one, runs cut at any size, give the same coordinator."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from samsa.coordinator.consumer_group_records import (
    GROUP_METADATA_TYPE,
    ConsumerGroupKey,
    ConsumerGroupMetadataValue,
)
from samsa.coordinator.group_coordinator import GroupConfig, GroupCoordinator
from samsa.coordinator.offsets import MAX_RUN_KEYS, decode
from samsa.coordinator.offsets_records import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    encode_key,
    encode_offset_value,
    encode_value,
)
from samsa.coordinator.ports import StoredBatch
from samsa.protocol.records import (
    Compression,
    ControlType,
    NewRecord,
    RecordBatchView,
    build_batch,
    decode_records,
    record_columns,
)

NOW = 1_000
PARTITION = 0
Row = tuple[bytes | None, bytes | None]


def one_by_one(c: GroupCoordinator, batch: StoredBatch) -> None:
    """The replay before runs: every record decoded and applied as it is read."""
    store = c.offsets
    if batch.control is not None:
        commit = batch.control == ControlType.COMMIT
        for offset, record in store.replay_marker(PARTITION, batch.producer_id, commit):
            c.load_record(record, NOW, offset)
        return
    decoded = []
    for offset, key, value in batch.rows():
        if key is None:
            continue
        try:
            decoded.append((offset, decode(key, value)))
        except RecordFormatError:
            pass
    if batch.transactional and batch.producer_id >= 0:
        store.stage(PARTITION, batch.producer_id, decoded)
    else:
        for offset, record in decoded:
            c.load_record(record, NOW, offset)


def _value(version: int, offset: int, metadata: str) -> bytes:
    if version == 3:
        return encode_offset_value(OffsetCommitValue(offset, metadata, NOW + offset, offset % 3))
    meta = metadata.encode()
    if version == 4:  # flexible: compact metadata, no tagged fields
        head = struct.pack(">hqiB", 4, offset, -1, len(meta) + 1)
        return head + meta + struct.pack(">qB", NOW, 0)
    out = struct.pack(">hqh", version, offset, len(meta)) + meta + struct.pack(">q", NOW)
    return out + struct.pack(">q", NOW + 50) if version == 1 else out


def _key(group: str, partition: int, spelling: str) -> bytes:
    raw = encode_key(OffsetCommitKey(group, "t", partition))
    if spelling == "v0":  # key version 0 (Kafka 0.8.2): the same key
        return b"\x00\x00" + raw[2:]
    return raw + b"\x07" if spelling == "trailing" else raw


commit_rows = st.builds(
    lambda g, p, spelling, version, offset, meta: (
        _key(g, p, spelling),
        _value(version, offset, meta),
    ),
    st.sampled_from(["g1", "g2", "c1"]),
    st.integers(0, 1),
    st.sampled_from(["v1", "v1", "v1", "v0", "trailing"]),
    st.sampled_from([3, 3, 3, 1, 0, 2, 4]),
    st.integers(0, 1_000),
    st.sampled_from(["", "", "m", "é"]),
)
tombstones = st.builds(
    lambda g, p, spelling: (_key(g, p, spelling), None),
    st.sampled_from(["g1", "g2", "c1"]),
    st.integers(0, 2),
    st.sampled_from(["v1", "v1", "v0"]),
)
unreadable = st.sampled_from(
    [
        (_key("g1", 0, "v1"), b"\x00\x03\x00"),  # truncated
        (_key("g1", 1, "v1"), b"\x00\x09" + bytes(22)),  # unknown version
        (_key("g2", 0, "v1"), _value(3, 5, "")[:14] + b"\x00\x01\xff" + bytes(8)),  # not UTF-8
        (_key("g2", 1, "v1"), _value(3, 5, "")[:14] + b"\xff\xff" + bytes(8)),  # null string
        (_key("c1", 0, "v1"), _value(3, 5, "")[:14] + b"\x00\x05" + bytes(8)),  # metadata cut
        (b"\x00\x01\x00\x05ab", _value(3, 1, "")),  # truncated key
        (b"\x00", _value(3, 1, "")),
        (b"\x00\x63", b""),  # unknown key version
        (None, b"x"),
    ]
)
group_rows = st.one_of(
    st.builds(
        lambda g, gen: (
            encode_key(GroupMetadataKey(g)),
            encode_value(GroupMetadataValue("consumer", gen, "range", None, NOW)),
        ),
        st.sampled_from(["g1", "g2"]),
        st.integers(0, 5),
    ),
    st.builds(lambda g: (encode_key(GroupMetadataKey(g)), None), st.sampled_from(["g1", "g2"])),
    st.builds(
        lambda epoch: (
            encode_key(ConsumerGroupKey(GROUP_METADATA_TYPE, "c1")),
            None if epoch is None else encode_value(ConsumerGroupMetadataValue(epoch)),
        ),
        st.none() | st.integers(1, 9),
    ),
)
plain_rows = st.one_of(
    commit_rows, commit_rows, commit_rows, tombstones, unreadable, group_rows
)  # fmt: skip

# ("plain", rows) | ("txn", producer id, rows) | ("marker", producer id, commit)
steps = st.one_of(
    st.tuples(st.just("plain"), st.lists(plain_rows, min_size=1, max_size=6)),
    st.tuples(
        st.just("txn"),
        st.integers(1, 3),
        st.lists(st.one_of(commit_rows, commit_rows, tombstones), min_size=1, max_size=3),
    ),
    st.tuples(st.just("marker"), st.integers(1, 3), st.booleans()),
)


def _batches(plan: list[Any]) -> list[StoredBatch]:
    out: list[StoredBatch] = []
    at = 0
    for step in plan:
        if step[0] == "marker":
            control = ControlType.COMMIT if step[2] else ControlType.ABORT
            out.append(StoredBatch(at, step[1], 0, True, control))
            at += 1
            continue
        rows: list[Row] = step[-1]
        pid = step[1] if step[0] == "txn" else -1
        out.append(
            StoredBatch(
                at,
                pid,
                0 if pid >= 0 else -1,
                pid >= 0,
                None,
                range(at, at + len(rows)),
                [k for k, _ in rows],
                [v for _, v in rows],
            )
        )
        at += len(rows)
    return out


def _state(c: GroupCoordinator) -> dict[str, Any]:
    return {
        "durable": c.durable_state(),
        "offsets": c.offsets.state(),
        "classic": sorted(c.registry.classic),
        "consumer": sorted(c.registry.consumer),
    }


K, K0 = _key("g2", 0, "v1"), _key("g2", 0, "v0")  # one key, two spellings
V, V2 = _value(3, 7, ""), _value(3, 8, "m")


@settings(max_examples=400, deadline=None)
@given(st.lists(steps, max_size=25), st.sampled_from([MAX_RUN_KEYS, 1, 2, 3]))
# a tombstone drops the key's pending transactional offset though a commit follows it
@example([("txn", 1, [(K, V)]), ("plain", [(K, None), (K, V2)])], MAX_RUN_KEYS)
# a commit deleted in the same run still made its group one storing offsets
@example([("plain", [(K, V), (K, None)])], MAX_RUN_KEYS)
# two spellings of a key: the later record wins, whichever spelling was seen first
@example([("plain", [(K0, V), (K, V2), (K0, None)])], MAX_RUN_KEYS)
# a v3 value whose metadata runs past its end is unreadable, not a crash
@example([("plain", [(K, V), (K, _value(3, 5, "")[:14] + b"\x00\x05" + bytes(8))])], 2)
def test_collapsed_replay_leaves_what_one_by_one_replay_leaves(
    plan: list[Any], max_run_keys: int
) -> None:
    batches = _batches(plan)
    oracle = GroupCoordinator(GroupConfig(num_partitions=1))
    for batch in batches:
        one_by_one(oracle, batch)
    c = GroupCoordinator(GroupConfig(num_partitions=1))
    c.offsets.max_run_keys = max_run_keys
    c.begin_load(PARTITION)
    for batch in batches:
        for _ in c.load_batch(PARTITION, batch, NOW):
            pass
    for _ in c.load_held(PARTITION, NOW):
        pass
    c.end_load(PARTITION, NOW)
    assert _state(c) == _state(oracle)
    # and what is still staged is decided the same way afterwards
    for pid in (1, 2, 3):
        for shard in (c, oracle):
            shard.replay_marker(PARTITION, pid, True, NOW)
    assert _state(c) == _state(oracle)


# --- record_columns reads what decode_records reads, and refuses what it refuses ------------

records = st.lists(
    st.builds(
        NewRecord,
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=200),
        st.integers(0, 2**40),
        st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2),
    ),
    min_size=1,
    max_size=8,
)


def _read(read: Any, view: RecordBatchView) -> Any:
    """What ``read`` makes of the batch, or None if it refuses it (which error is not the
    point: the port skips the batch either way)."""
    try:
        return read(view)
    except Exception:
        return None


@settings(max_examples=300, deadline=None)
@given(
    records,
    st.sampled_from([Compression.NONE, Compression.NONE, Compression.GZIP, Compression.LZ4]),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
)
# offset deltas past 63 take two bytes
@example([NewRecord(b"v", b"k", 5) for _ in range(70)], Compression.NONE, [])
@example([NewRecord(b"v", b"k", 5) for _ in range(70)], Compression.NONE, [(700, 0x80)])
def test_record_columns_reads_what_decode_records_reads(
    recs: list[NewRecord], codec: int, flips: list[tuple[int, int]]
) -> None:
    batch = bytearray(build_batch(recs, base_offset=40, compression=codec))
    for at, byte in flips:  # damage past the header: whatever one reads, so must the other
        batch[61 + at % max(1, len(batch) - 61)] = byte
    view = RecordBatchView(bytes(batch))
    rows = _read(decode_records, view)
    columns = _read(record_columns, view)
    if rows is None:
        assert columns is None, "record_columns read a batch decode_records refuses"
    else:
        assert columns == ([r.offset for r in rows], [r.key for r in rows], [r.value for r in rows])
