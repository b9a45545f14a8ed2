"""``__consumer_offsets`` key/value formats: round trips, Kafka's byte layout, partitioning."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from samsa.coordinator.offsets_records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    java_string_hash,
    offset_value_readable,
    partition_for,
    subscribed_topics,
)

names = st.text(min_size=1, max_size=40)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@given(names, names, st.integers(0, 2**31 - 1), i64, i32, st.text(max_size=50), i64)
def test_offset_commit_round_trip(
    group: str, topic: str, partition: int, offset: int, epoch: int, meta: str, ts: int
) -> None:
    key = OffsetCommitKey(group, topic, partition)
    value = OffsetCommitValue(offset, meta, ts, epoch)
    assert decode_key(encode_key(key)) == key
    assert decode_value(key, encode_value(value)) == value
    assert decode_value(key, None) is None  # tombstone


members = st.builds(
    MemberMetadata,
    names,
    st.none() | names,
    st.text(max_size=20),
    st.text(max_size=20),
    i32,
    i32,
    st.binary(max_size=64),
    st.binary(max_size=64),
)


@given(
    names,
    st.text(max_size=20),
    i32,
    st.none() | names,
    st.none() | names,
    i64,
    st.lists(members, max_size=4),
)
def test_group_metadata_round_trip(
    group: str,
    ptype: str,
    generation: int,
    protocol: str | None,
    leader: str | None,
    ts: int,
    ms: list[MemberMetadata],
) -> None:
    key = GroupMetadataKey(group)
    value = GroupMetadataValue(ptype, generation, protocol, leader, ts, tuple(ms))
    assert decode_key(encode_key(key)) == key
    assert decode_value(key, encode_value(value)) == value


def test_layout_is_kafkas() -> None:
    # Key version 1: group, topic, partition as int16-length strings and an int32.
    assert encode_key(OffsetCommitKey("g", "t", 3)) == b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x03"
    assert encode_key(GroupMetadataKey("g")) == b"\x00\x02\x00\x01g"
    # Value version 3: offset, leader epoch, metadata, commit timestamp.
    assert encode_value(OffsetCommitValue(5, "m", 7, 2)) == struct.pack(
        ">hqih1sq", 3, 5, 2, 1, b"m", 7
    )
    # Version 1 values (old Kafka) carry an expire timestamp after the commit timestamp.
    v1 = struct.pack(">hqh1sqq", 1, 9, 1, b"x", 100, 200)
    assert decode_value(OffsetCommitKey("g", "t", 0), v1) == OffsetCommitValue(9, "x", 100, -1, 200)


def test_partitioning_follows_java_hash_code() -> None:
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("") == 0
    assert java_string_hash("polygenelubricants") == -(2**31)  # Kafka's abs maps it to 0
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # UTF-16 surrogates


def test_subscribed_topics_of_consumer_protocol() -> None:
    sub = struct.pack(">hi", 1, 2) + b"\x00\x01a" + b"\x00\x02bb" + struct.pack(">i", -1)
    assert subscribed_topics(sub) == {"a", "bb"}
    assert subscribed_topics(b"\x00") is None  # not known: OffsetDelete counts it subscribed


def test_offset_commit_value_v4_is_read() -> None:
    """Kafka's OffsetCommitValue v4 (flexible: compact metadata, tagged topic id) is read,
    the tags skipped; a v4 value cut inside its tags is unreadable, as any cut value."""
    key = OffsetCommitKey("g", "t", 0)
    topic_id = bytes(range(16))
    v4 = (
        struct.pack(">hqi", 4, 42, 7)
        + bytes([len("mé".encode()) + 1])
        + "mé".encode()
        + struct.pack(">q", 1_234)
        + bytes([1, 0, 16])  # one tagged field: tag 0, 16 bytes
        + topic_id
    )
    assert decode_value(key, v4) == OffsetCommitValue(42, "mé", 1_234, 7)
    assert offset_value_readable(v4)
    assert not offset_value_readable(v4[:-1])
    assert not offset_value_readable(struct.pack(">hqi", 4, 42, 7) + b"\x00" + bytes(9))  # null
