"""Kafka's ``__consumer_offsets`` records of KIP-848 consumer groups.

Theory of operation
-------------------
A consumer group's durable state is spread over one record per concern, each keyed so that
compaction keeps only the latest (Kafka's ``group-coordinator`` message formats):

=====  ==========================================  =====================================
type   key                                         value (version 0)
=====  ==========================================  =====================================
3      ConsumerGroupMetadataKey (group)            group epoch
5      ConsumerGroupMemberMetadataKey (group,      instance id, rack, client id and host,
       member)                                     subscription (names or regex),
                                                   rebalance timeout, server assignor
6      ConsumerGroupTargetAssignmentMetadataKey    assignment epoch
       (group)
7      ConsumerGroupTargetAssignmentMemberKey      the member's target partitions
       (group, member)
8      ConsumerGroupCurrentMemberAssignmentKey     member epoch, previous epoch, state,
       (group, member)                             assigned and pending-revocation
                                                   partitions, each with the epoch it
                                                   was assigned at (KIP-1251, tagged)
=====  ==========================================  =====================================

Keys use the classic encoding (int16 type, int16-length strings); values start with an int16
version and use Kafka's flexible encoding (unsigned-varint lengths plus one, tagged fields).
A member leaving is three tombstones (types 8, 7, 5); a group deleted is the tombstones of
its members and then of types 6 and 3. Partitions are named by topic id, as Kafka does, so a
topic deleted and re-created under the same name is a different topic.

A member of a consumer group that speaks the classic protocol (online migration) has Kafka's
tagged field 0 of its member metadata, ClassicMemberMetadata: its session timeout and the
protocols of its JoinGroup.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")

GROUP_METADATA_TYPE = 3
PARTITION_METADATA_TYPE = 4  # read and ignored: KIP-1101 replaced it by a hash
MEMBER_METADATA_TYPE = 5
TARGET_METADATA_TYPE = 6
TARGET_MEMBER_TYPE = 7
CURRENT_ASSIGNMENT_TYPE = 8
CONSUMER_GROUP_KEY_TYPES = frozenset({3, 4, 5, 6, 7, 8})

# topic id -> partitions, in a canonical (sorted) order when encoded
Assignment = dict[uuid.UUID, frozenset[int]]
# (topic id, partition) -> the member epoch it was assigned to its member at (KIP-1251); a
# partition missing here was assigned at the member's current epoch (Kafka's default for a
# record written without them).
AssignmentEpochs = dict[tuple[uuid.UUID, int], int]


def spelled_out(
    epochs: AssignmentEpochs, member_epoch: int, *assignments: Assignment
) -> AssignmentEpochs:
    """The assignment epoch of every partition of ``assignments``, the missing ones at
    ``member_epoch``."""
    return {
        (tid, p): epochs.get((tid, p), member_epoch)
        for assignment in assignments
        for tid, parts in assignment.items()
        for p in parts
    }


class ConsumerRecordFormatError(ValueError):
    """A consumer group record we cannot read."""


@dataclass(frozen=True, slots=True)
class ConsumerGroupKey:
    """Any consumer group key: its type, the group, and the member for per-member types."""

    type: int
    group: str
    member_id: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadataValue:
    epoch: int


@dataclass(frozen=True, slots=True)
class ClassicMemberMetadata:
    """Tagged field 0 of the member metadata: set for a member of a consumer group that
    speaks the classic protocol (online migration, rule 38), null for a consumer-protocol
    member."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata) in the member's preference


@dataclass(frozen=True, slots=True)
class ConsumerGroupMemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic: ClassicMemberMetadata | None = None


@dataclass(frozen=True, slots=True)
class TargetAssignmentMetadataValue:
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class TargetAssignmentMemberValue:
    partitions: Assignment = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CurrentMemberAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    epochs: AssignmentEpochs = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionMetadataValue:
    """Type 4, written by Kafka before 4.1: not needed here, kept only to be read."""


ConsumerGroupValue = (
    ConsumerGroupMetadataValue
    | ConsumerGroupMemberMetadataValue
    | TargetAssignmentMetadataValue
    | TargetAssignmentMemberValue
    | CurrentMemberAssignmentValue
    | PartitionMetadataValue
)

_PER_MEMBER = frozenset({MEMBER_METADATA_TYPE, TARGET_MEMBER_TYPE, CURRENT_ASSIGNMENT_TYPE})


# --- keys (classic encoding) -------------------------------------------------------------------


def _classic_str(out: bytearray, s: str) -> None:
    data = s.encode()
    if len(data) > 0x7FFF:
        raise ConsumerRecordFormatError(f"string of {len(data)} bytes is too long")
    out += _I16.pack(len(data))
    out += data


def encode_consumer_key(key: ConsumerGroupKey) -> bytes:
    out = bytearray(_I16.pack(key.type))
    _classic_str(out, key.group)
    if key.type in _PER_MEMBER:
        _classic_str(out, key.member_id or "")
    return bytes(out)


def decode_consumer_key(key_type: int, data: bytes, pos: int) -> ConsumerGroupKey:
    """The key of ``key_type`` whose fields start at ``data[pos:]``."""
    r = _Reader(data, pos)
    group = r.classic_str()
    member = r.classic_str() if key_type in _PER_MEMBER else None
    return ConsumerGroupKey(key_type, group, member)


# --- values (flexible encoding) ----------------------------------------------------------------


def _uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _cstr(out: bytearray, s: str | None) -> None:
    if s is None:
        out.append(0)
        return
    data = s.encode()
    _uvarint(out, len(data) + 1)
    out += data


def _partitions(
    out: bytearray, assignment: Assignment, epochs: AssignmentEpochs | None = None
) -> None:
    """Kafka's []TopicPartitions; with ``epochs``, each topic's tagged field 0
    (AssignmentEpochs, KIP-1251): one epoch per partition, in the partitions' order."""
    items = sorted(assignment.items(), key=lambda kv: kv[0].bytes)
    _uvarint(out, len(items) + 1)
    for topic_id, parts in items:
        out += topic_id.bytes
        ordered = sorted(parts)
        _uvarint(out, len(ordered) + 1)
        for p in ordered:
            out += _I32.pack(p)
        if epochs is None:
            out.append(0)  # no tagged fields
            continue
        tagged = bytearray()
        _uvarint(tagged, len(ordered) + 1)
        for p in ordered:
            tagged += _I32.pack(epochs[(topic_id, p)])
        out.append(1)  # one tagged field: tag 0
        out.append(0)
        _uvarint(out, len(tagged))
        out += tagged


def _classic_metadata(classic: ClassicMemberMetadata) -> bytes:
    # A nullable struct starts with an int8: -1 null, 1 present (Kafka's generated code).
    out = bytearray(_I8.pack(1))
    out += _I32.pack(classic.session_timeout_ms)
    _uvarint(out, len(classic.protocols) + 1)
    for name, metadata in classic.protocols:
        _cstr(out, name)
        _uvarint(out, len(metadata) + 1)
        out += metadata
        out.append(0)  # no tagged fields
    out.append(0)
    return bytes(out)


def encode_consumer_value(value: ConsumerGroupValue) -> bytes:
    out = bytearray(_I16.pack(0))
    if isinstance(value, ConsumerGroupMetadataValue):
        out += _I32.pack(value.epoch)
    elif isinstance(value, ConsumerGroupMemberMetadataValue):
        _cstr(out, value.instance_id)
        _cstr(out, value.rack_id)
        _cstr(out, value.client_id)
        _cstr(out, value.client_host)
        _uvarint(out, len(value.subscribed_topic_names) + 1)
        for name in value.subscribed_topic_names:
            _cstr(out, name)
        _cstr(out, value.subscribed_topic_regex)
        out += _I32.pack(value.rebalance_timeout_ms)
        _cstr(out, value.server_assignor)
        if value.classic is not None:
            tagged = _classic_metadata(value.classic)
            out.append(1)  # one tagged field: tag 0, ClassicMemberMetadata
            out.append(0)
            _uvarint(out, len(tagged))
            out += tagged
            return bytes(out)
    elif isinstance(value, TargetAssignmentMetadataValue):
        out += _I32.pack(value.assignment_epoch)
    elif isinstance(value, TargetAssignmentMemberValue):
        _partitions(out, value.partitions)
    elif isinstance(value, CurrentMemberAssignmentValue):
        out += _I32.pack(value.member_epoch)
        out += _I32.pack(value.previous_member_epoch)
        out += _I8.pack(value.state)
        # Every partition's epoch is written, defaulting to the member epoch as a reader does.
        epochs = spelled_out(
            value.epochs, value.member_epoch, value.assigned, value.pending_revocation
        )
        _partitions(out, value.assigned, epochs)
        _partitions(out, value.pending_revocation, epochs)
    else:
        raise ConsumerRecordFormatError(f"cannot write {type(value).__name__}")
    out.append(0)  # no tagged fields
    return bytes(out)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ConsumerRecordFormatError("record truncated")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def i8(self) -> int:
        return int(_I8.unpack(self.take(1))[0])

    def i16(self) -> int:
        return int(_I16.unpack(self.take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def uvarint(self) -> int:
        n = shift = 0
        while True:
            b = self.take(1)[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 28:
                raise ConsumerRecordFormatError("varint too long")

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise ConsumerRecordFormatError(f"string is not UTF-8: {exc}") from None

    def classic_str(self) -> str:
        n = self.i16()
        if n < 0:
            raise ConsumerRecordFormatError("null where a string is required")
        return self._decode(self.take(n))

    def cstr(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self._decode(self.take(n - 1))

    def required_cstr(self) -> str:
        s = self.cstr()
        if s is None:
            raise ConsumerRecordFormatError("null where a string is required")
        return s

    def count(self) -> int:
        n = self.uvarint()
        return max(n - 1, 0)

    def tags(self) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = self.take(self.uvarint())
        return out

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())

    def partitions(self, epochs: AssignmentEpochs | None = None) -> Assignment:
        """[]TopicPartitions; each topic's assignment epochs (tag 0, KIP-1251) go into
        ``epochs`` when given, else are skipped."""
        out: Assignment = {}
        for _ in range(self.count()):
            topic_id = uuid.UUID(bytes=self.take(16))
            ordered = [self.i32() for _ in range(self.count())]
            tagged = self.tags().get(0)
            if epochs is not None and tagged is not None:
                t = _Reader(tagged)
                n = t.uvarint()  # nullable compact array: 0 is null
                if n and n - 1 != len(ordered):
                    raise ConsumerRecordFormatError("assignment epochs and partitions differ")
                for p in ordered if n else ():
                    epochs[(topic_id, p)] = t.i32()
            if ordered:
                out[topic_id] = out.get(topic_id, frozenset()) | frozenset(ordered)
        return out


def _read_classic(data: bytes) -> ClassicMemberMetadata | None:
    r = _Reader(data)
    if r.i8() < 0:  # a null struct
        return None
    session_timeout = r.i32()
    protocols = []
    for _ in range(r.count()):
        name = r.required_cstr()
        metadata = r.take(r.count())
        r.skip_tags()
        protocols.append((name, metadata))
    r.skip_tags()
    return ClassicMemberMetadata(session_timeout, tuple(protocols))


def decode_consumer_value(key: ConsumerGroupKey, data: bytes) -> ConsumerGroupValue:
    r = _Reader(data)
    version = r.i16()
    if version != 0:
        raise ConsumerRecordFormatError(f"unsupported value version {version} of type {key.type}")
    value: ConsumerGroupValue
    if key.type == GROUP_METADATA_TYPE:
        value = ConsumerGroupMetadataValue(r.i32())
    elif key.type == MEMBER_METADATA_TYPE:
        instance_id = r.cstr()
        rack_id = r.cstr()
        client_id = r.required_cstr()
        client_host = r.required_cstr()
        names = tuple(r.required_cstr() for _ in range(r.count()))
        regex, timeout, assignor = r.cstr(), r.i32(), r.cstr()
        tagged = r.tags().get(0)
        classic = None if tagged is None else _read_classic(tagged)
        return ConsumerGroupMemberMetadataValue(
            instance_id, rack_id, client_id, client_host, names, regex, timeout, assignor, classic
        )
    elif key.type == TARGET_METADATA_TYPE:
        value = TargetAssignmentMetadataValue(r.i32())
    elif key.type == TARGET_MEMBER_TYPE:
        value = TargetAssignmentMemberValue(r.partitions())
    elif key.type == CURRENT_ASSIGNMENT_TYPE:
        epoch, previous, state = r.i32(), r.i32(), r.i8()
        epochs: AssignmentEpochs = {}
        assigned = r.partitions(epochs)
        pending = r.partitions(epochs)
        value = CurrentMemberAssignmentValue(epoch, previous, state, assigned, pending, epochs)
    elif key.type == PARTITION_METADATA_TYPE:
        return PartitionMetadataValue()
    else:
        raise ConsumerRecordFormatError(f"unknown consumer group record type {key.type}")
    r.skip_tags()
    return value
