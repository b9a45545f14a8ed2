"""The records of ``__share_group_state``: where share groups' record states survive a restart
(KIP-932; Kafka's share coordinator keeps the same topic).

One key per share partition, ``ShareSnapshotKey`` (key version 0: group id, topic id,
partition), its value the whole state of that share partition: the fields of Kafka's
ShareSnapshotValue (snapshot epoch, state epoch, leader epoch, the share-partition start offset
and the state batches after it: first and last offset, state, delivery count) in a fixed-width
encoding of samsa's own (D-SHARE-1). Compaction keeps the latest per key, so a
replay needs only the last value of each. Kafka also writes ``ShareUpdate`` deltas between
snapshots; samsa writes a snapshot every time (a share partition holds at most
``group.share.partition.max.record.locks`` in-flight records, so one is bounded), and reads no
deltas. The topic's partition is Kafka's: the hash of ``group:topicId:partition``.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from samsa.coordinator.offsets_records import partition_for
from samsa.coordinator.share_partition import RecordState, StateBatch

SHARE_STATE_TOPIC = "__share_group_state"
SNAPSHOT_KEY_VERSION = 0

_KEY = struct.Struct(">h")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_BATCH = struct.Struct(">qqbh")
_HEAD = struct.Struct(">hiiiq")  # version, snapshot epoch, state epoch, leader epoch, start


class ShareStateFormatError(ValueError):
    """A ``__share_group_state`` record we cannot read."""


@dataclass(frozen=True, slots=True)
class ShareStateKey:
    group_id: str
    topic_id: uuid.UUID
    partition: int

    def coordinator_key(self) -> str:
        return f"{self.group_id}:{self.topic_id}:{self.partition}"


@dataclass(frozen=True, slots=True)
class ShareSnapshot:
    snapshot_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...]


def state_partition(key: ShareStateKey, num_partitions: int) -> int:
    return partition_for(key.coordinator_key(), num_partitions)


def encode_key(key: ShareStateKey) -> bytes:
    group = key.group_id.encode()
    return (
        _KEY.pack(SNAPSHOT_KEY_VERSION)
        + _I16.pack(len(group))
        + group
        + key.topic_id.bytes
        + _I32.pack(key.partition)
    )


def decode_key(data: bytes) -> ShareStateKey:
    try:
        (version,) = _KEY.unpack_from(data, 0)
        if version != SNAPSHOT_KEY_VERSION:
            raise ShareStateFormatError(f"share state key version {version}")
        (n,) = _I16.unpack_from(data, 2)
        group = data[4 : 4 + n].decode()
        topic_id = uuid.UUID(bytes=data[4 + n : 20 + n])
        (partition,) = _I32.unpack_from(data, 20 + n)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ShareStateFormatError(str(exc)) from None
    return ShareStateKey(group, topic_id, partition)


def encode_snapshot(value: ShareSnapshot) -> bytes:
    out = bytearray(_HEAD.pack(0, value.snapshot_epoch, 0, -1, value.start_offset))
    out += _I32.pack(len(value.batches))
    for b in value.batches:
        out += _BATCH.pack(b.first_offset, b.last_offset, int(b.state), b.delivery_count)
    return bytes(out)


def decode_snapshot(data: bytes) -> ShareSnapshot:
    try:
        _v, epoch, _state_epoch, _leader, start = _HEAD.unpack_from(data, 0)
        (count,) = _I32.unpack_from(data, _HEAD.size)
        pos = _HEAD.size + 4
        batches = []
        for _ in range(count):
            first, last, state, delivered = _BATCH.unpack_from(data, pos)
            batches.append(StateBatch(first, last, RecordState(state), delivered))
            pos += _BATCH.size
    except (struct.error, ValueError) as exc:
        raise ShareStateFormatError(str(exc)) from None
    return ShareSnapshot(epoch, start, tuple(batches))
