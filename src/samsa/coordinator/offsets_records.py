"""Kafka's ``__consumer_offsets`` record formats, so Kafka's own tooling can read our topic.

Theory of operation
-------------------
Every record in ``__consumer_offsets`` has a key that starts with an int16 key version naming
its type, then the type's fields in Kafka's classic (non-flexible) encoding: int16-length
UTF-8 strings (-1 for null), int32-length bytes, int32-count arrays, big-endian integers.

- key version 1, OffsetCommitKey ``(group, topic, partition)``; value OffsetCommitValue, which
  we write in version 3 ``(offset, leader_epoch, metadata, commit_timestamp)`` and read in
  versions 0-4 (v1 adds ``expire_timestamp`` after the commit timestamp; v2 drops it; v4 is
  flexible: a compact metadata string, then tagged fields, the topic id among them).
- key version 2, GroupMetadataKey ``(group)``; value GroupMetadataValue, which we write in
  version 3 ``(protocol_type, generation, protocol, leader, current_state_timestamp, members)``
  and read in versions 0-3 (v1 adds the members' rebalance timeout, v2 the state timestamp,
  v3 the members' group instance id).

Key versions 3-8 are KIP-848 consumer groups' records (``consumer_group_records.py``).

A null value is a tombstone: the offset, or the whole group, is gone. Keys are compared as
bytes by compaction, so encoding is canonical (one encoding per key).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from samsa.coordinator.consumer_group_records import (
    CONSUMER_GROUP_KEY_TYPES,
    ConsumerGroupKey,
    ConsumerGroupValue,
    ConsumerRecordFormatError,
    decode_consumer_key,
    decode_consumer_value,
    encode_consumer_key,
    encode_consumer_value,
)
from samsa.protocol.framing import FrameError, read_uvarint, skip_tagged_fields

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# OffsetCommitValue v3 up to its metadata: version, offset, leader epoch, metadata length.
_V3_HEAD = struct.Struct(">hqih")
_V3_MIN = _V3_HEAD.size + 8  # and an empty metadata, then the commit timestamp

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3


class RecordFormatError(ValueError):
    """A record of ``__consumer_offsets`` we cannot read."""


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    leader_epoch: int = -1
    expire_timestamp: int = -1  # only in v1 records (written by old Kafka); never by us


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: tuple[MemberMetadata, ...] = field(default_factory=tuple)


Key = OffsetCommitKey | GroupMetadataKey | ConsumerGroupKey
Value = OffsetCommitValue | GroupMetadataValue | ConsumerGroupValue


# --- primitive writers and a reader ------------------------------------------------------------


def _str(out: bytearray, s: str | None) -> None:
    if s is None:
        out += _I16.pack(-1)
        return
    data = s.encode()
    if len(data) > 0x7FFF:
        raise RecordFormatError(f"string of {len(data)} bytes is too long")
    out += _I16.pack(len(data))
    out += data


def _bytes(out: bytearray, b: bytes) -> None:
    out += _I32.pack(len(b))
    out += b


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise RecordFormatError("record truncated")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def nullable_str(self) -> str | None:
        n = self.i16()
        if n < 0:
            return None
        try:
            return self._take(n).decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string is not UTF-8: {exc}") from None

    def str(self) -> str:
        s = self.nullable_str()
        if s is None:
            raise RecordFormatError("null where a string is required")
        return s

    def bytes(self) -> bytes:
        n = self.i32()
        return b"" if n < 0 else self._take(n)

    def compact_str(self) -> str:
        try:
            n, self.pos = read_uvarint(self.buf, self.pos)  # length + 1; 0 is null
        except FrameError as exc:
            raise RecordFormatError(str(exc)) from None
        if not n:
            raise RecordFormatError("null where a string is required")
        try:
            return self._take(n - 1).decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError(f"string is not UTF-8: {exc}") from None

    def skip_tags(self) -> None:
        try:
            self.pos = skip_tagged_fields(self.buf, self.pos)
        except FrameError as exc:
            raise RecordFormatError(str(exc)) from None


# --- keys ---------------------------------------------------------------------------------------


def encode_key(key: Key) -> bytes:
    if isinstance(key, ConsumerGroupKey):
        return encode_consumer_key(key)
    out = bytearray()
    if isinstance(key, OffsetCommitKey):
        out += _I16.pack(OFFSET_COMMIT_KEY_VERSION)
        _str(out, key.group)
        _str(out, key.topic)
        out += _I32.pack(key.partition)
    else:
        out += _I16.pack(GROUP_METADATA_KEY_VERSION)
        _str(out, key.group)
    return bytes(out)


def decode_key(data: bytes) -> Key:
    r = _Reader(data)
    version = r.i16()
    # Key versions 0 and 1 are both offset commits (0 was written by Kafka 0.8.2).
    if version in (0, 1):
        return OffsetCommitKey(r.str(), r.str(), r.i32())
    if version == 2:
        return GroupMetadataKey(r.str())
    if version in CONSUMER_GROUP_KEY_TYPES:
        try:
            return decode_consumer_key(version, data, r.pos)
        except ConsumerRecordFormatError as exc:
            raise RecordFormatError(str(exc)) from None
    raise RecordFormatError(f"unknown key version {version}")


# --- values -------------------------------------------------------------------------------------


def encode_offset_value(value: OffsetCommitValue) -> bytes:
    out = bytearray(_I16.pack(OFFSET_COMMIT_VALUE_VERSION))
    out += _I64.pack(value.offset)
    out += _I32.pack(value.leader_epoch)
    _str(out, value.metadata)
    out += _I64.pack(value.commit_timestamp)
    return bytes(out)


def decode_offset_value(data: bytes) -> OffsetCommitValue:
    # Version 3, what Kafka (since 2.1) and samsa write, read with two unpacks; the rest by
    # the reader, which fails the same way on a value too short for its fields.
    if len(data) >= _V3_MIN and data[0] == 0 and data[1] == 3:
        _, offset, leader_epoch, n = _V3_HEAD.unpack_from(data)
        end = _V3_HEAD.size + n
        if n >= 0 and end + 8 <= len(data):
            try:
                metadata = data[_V3_HEAD.size : end].decode() if n else ""
            except UnicodeDecodeError as exc:
                raise RecordFormatError(f"string is not UTF-8: {exc}") from None
            return OffsetCommitValue(offset, metadata, _I64.unpack_from(data, end)[0], leader_epoch)
    r = _Reader(data)
    version = r.i16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unsupported OffsetCommitValue version {version}")
    offset = r.i64()
    leader_epoch = r.i32() if version >= 3 else -1
    metadata = r.compact_str() if version >= 4 else r.str()
    commit_ts = r.i64()
    expire_ts = r.i64() if version == 1 else -1
    if version >= 4:
        r.skip_tags()  # the topic id (tag 0): offsets are kept by topic name
    return OffsetCommitValue(offset, metadata, commit_ts, leader_epoch, expire_ts)


def offset_value_readable(data: bytes) -> bool:
    """Whether :func:`decode_offset_value` reads ``data`` (replay skips a value it cannot).
    A version 3 value with no metadata, nearly every one, is told by its bytes alone."""
    if len(data) >= _V3_MIN and not data[0] and data[1] == 3 and not data[14] and not data[15]:
        return True
    try:
        decode_offset_value(data)
    except RecordFormatError:
        return False
    return True


def encode_group_value(value: GroupMetadataValue) -> bytes:
    out = bytearray(_I16.pack(GROUP_METADATA_VALUE_VERSION))
    _str(out, value.protocol_type)
    out += _I32.pack(value.generation)
    _str(out, value.protocol)
    _str(out, value.leader)
    out += _I64.pack(value.current_state_timestamp)
    out += _I32.pack(len(value.members))
    for m in value.members:
        _str(out, m.member_id)
        _str(out, m.group_instance_id)
        _str(out, m.client_id)
        _str(out, m.client_host)
        out += _I32.pack(m.rebalance_timeout)
        out += _I32.pack(m.session_timeout)
        _bytes(out, m.subscription)
        _bytes(out, m.assignment)
    return bytes(out)


def decode_group_value(data: bytes) -> GroupMetadataValue:
    r = _Reader(data)
    version = r.i16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"unsupported GroupMetadataValue version {version}")
    protocol_type = r.str()
    generation = r.i32()
    protocol = r.nullable_str()
    leader = r.nullable_str()
    state_ts = r.i64() if version >= 2 else -1
    members = []
    for _ in range(r.i32()):
        member_id = r.str()
        instance_id = r.nullable_str() if version >= 3 else None
        client_id = r.str()
        client_host = r.str()
        rebalance_timeout = r.i32() if version >= 1 else None
        session_timeout = r.i32()
        if rebalance_timeout is None:
            rebalance_timeout = session_timeout  # v0 had one timeout for both
        members.append(
            MemberMetadata(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                r.bytes(),
                r.bytes(),
            )
        )
    return GroupMetadataValue(protocol_type, generation, protocol, leader, state_ts, tuple(members))


def encode_value(value: Value | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, OffsetCommitValue):
        return encode_offset_value(value)
    if isinstance(value, GroupMetadataValue):
        return encode_group_value(value)
    return encode_consumer_value(value)


def decode_value(key: Key, data: bytes | None) -> Value | None:
    if data is None:
        return None
    if isinstance(key, OffsetCommitKey):
        return decode_offset_value(data)
    if isinstance(key, ConsumerGroupKey):
        try:
            return decode_consumer_value(key, data)
        except ConsumerRecordFormatError as exc:
            raise RecordFormatError(str(exc)) from None
    return decode_group_value(data)


# --- partitioning -------------------------------------------------------------------------------


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, wrapping at 32 bits."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode) % partitions`` (abs maps MIN_VALUE to 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


def subscribed_topics(subscription: bytes) -> frozenset[str] | None:
    """The topics of a ``consumer`` protocol subscription (every version starts with them);
    None if it does not parse."""
    try:
        r = _Reader(subscription)
        r.i16()
        return frozenset(r.str() for _ in range(r.i32()))
    except RecordFormatError:
        return None
