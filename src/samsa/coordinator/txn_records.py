"""Kafka's ``__transaction_state`` record formats, so Kafka's own tooling can read our topic.

Theory of operation
-------------------
One record per transactional id and transition; the topic is compacted on the key, so the
latest record of a key is the id's durable state and a null value (tombstone) removes the id.

- Key: int16 version 0, then TransactionLogKey ``(transactional_id: string)`` in the classic
  encoding (int16 length + UTF-8).
- Value: int16 version, then TransactionLogValue:

  ``producer_id int64, producer_epoch int16, transaction_timeout_ms int32, status int8,
  partitions [topic string, [partition int32]] (nullable), last_update_timestamp_ms int64,
  start_timestamp_ms int64``.

  Version 0 uses the classic encoding (int32 array counts, -1 for null). Version 1 is
  *flexible*: compact strings and arrays (unsigned varint of length + 1, 0 for null), a
  tagged-field section after every struct, and at the top level the tags 0
  ``previous_producer_id`` (int64, default -1), 1 ``next_producer_id`` (int64, -1),
  2 ``client_transaction_version`` (int16, 0) and 3 ``next_producer_epoch`` (int16, -1).
  Tags holding their default are not written; tags we do not know are skipped on read.

Like a TV1 Kafka coordinator we write version 0, except when a tagged field carries
information (a previous producer id after a producer-id rotation): then version 1, so that
a KIP-360 retry spanning a restart is still recognised. Status ids are Kafka's
(:class:`~samsa.coordinator.transaction.TxnState`). An Empty transaction has no partition
list (null), as Kafka writes it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from samsa.protocol.framing import uvarint

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")

KEY_VERSION = 0
VALUE_VERSIONS = (0, 1)

TAG_PREVIOUS_PRODUCER_ID = 0
TAG_NEXT_PRODUCER_ID = 1
TAG_CLIENT_TRANSACTION_VERSION = 2
TAG_NEXT_PRODUCER_EPOCH = 3


class TxnRecordFormatError(ValueError):
    """A record of ``__transaction_state`` we cannot read."""


Partitions = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    status: int  # TxnState id
    partitions: Partitions | None  # None (null) for an Empty transaction
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0
    next_producer_epoch: int = -1

    @property
    def needs_flexible(self) -> bool:
        return (
            self.previous_producer_id != -1
            or self.next_producer_id != -1
            or self.client_transaction_version != 0
            or self.next_producer_epoch != -1
        )


# -- key ---------------------------------------------------------------------------------------


def encode_key(transactional_id: str) -> bytes:
    raw = transactional_id.encode()
    return _I16.pack(KEY_VERSION) + _I16.pack(len(raw)) + raw


def decode_key(data: bytes) -> str:
    r = _Reader(data)
    version = r.i16()
    if version != KEY_VERSION:
        raise TxnRecordFormatError(f"unknown transaction log key version {version}")
    txn_id = r.string()
    if txn_id is None:
        raise TxnRecordFormatError("null transactional id in key")
    return txn_id


# -- value -------------------------------------------------------------------------------------


def encode_value(value: TransactionLogValue, version: int | None = None) -> bytes:
    """``version`` None picks 0 unless a tagged field needs version 1."""
    if version is None:
        version = 1 if value.needs_flexible else 0
    if version not in VALUE_VERSIONS:
        raise ValueError(f"unsupported transaction log value version {version}")
    flexible = version >= 1
    out = bytearray(_I16.pack(version))
    out += _I64.pack(value.producer_id)
    out += _I16.pack(value.producer_epoch)
    out += _I32.pack(value.transaction_timeout_ms)
    out += _I8.pack(value.status)
    parts = value.partitions
    if flexible:
        if parts is None:
            out += uvarint(0)
        else:
            out += uvarint(len(parts) + 1)
            for topic, ids in parts:
                raw = topic.encode()
                out += uvarint(len(raw) + 1) + raw
                out += uvarint(len(ids) + 1)
                for p in ids:
                    out += _I32.pack(p)
                out += uvarint(0)  # the nested struct's (empty) tagged fields
    elif parts is None:
        out += _I32.pack(-1)
    else:
        out += _I32.pack(len(parts))
        for topic, ids in parts:
            raw = topic.encode()
            out += _I16.pack(len(raw)) + raw
            out += _I32.pack(len(ids))
            for p in ids:
                out += _I32.pack(p)
    out += _I64.pack(value.last_update_timestamp_ms)
    out += _I64.pack(value.start_timestamp_ms)
    if flexible:
        tags: list[tuple[int, bytes]] = []
        if value.previous_producer_id != -1:
            tags.append((TAG_PREVIOUS_PRODUCER_ID, _I64.pack(value.previous_producer_id)))
        if value.next_producer_id != -1:
            tags.append((TAG_NEXT_PRODUCER_ID, _I64.pack(value.next_producer_id)))
        if value.client_transaction_version != 0:
            tags.append(
                (TAG_CLIENT_TRANSACTION_VERSION, _I16.pack(value.client_transaction_version))
            )
        if value.next_producer_epoch != -1:
            tags.append((TAG_NEXT_PRODUCER_EPOCH, _I16.pack(value.next_producer_epoch)))
        out += uvarint(len(tags))
        for tag, data in tags:
            out += uvarint(tag) + uvarint(len(data)) + data
    elif value.needs_flexible:
        raise ValueError("tagged fields need value version 1")
    return bytes(out)


def decode_value(data: bytes | None) -> TransactionLogValue | None:
    """The value, or None for a tombstone."""
    if data is None:
        return None
    r = _Reader(data)
    version = r.i16()
    if version not in VALUE_VERSIONS:
        raise TxnRecordFormatError(f"unknown transaction log value version {version}")
    flexible = version >= 1
    producer_id = r.i64()
    epoch = r.i16()
    timeout = r.i32()
    status = r.i8()
    parts: list[tuple[str, tuple[int, ...]]] | None
    count = r.uvarint() - 1 if flexible else r.i32()
    if count < 0:
        parts = None
    else:
        parts = []
        for _ in range(count):
            topic = r.compact_string() if flexible else r.string()
            if topic is None:
                raise TxnRecordFormatError("null topic in transaction partitions")
            n = r.uvarint() - 1 if flexible else r.i32()
            ids = tuple(r.i32() for _ in range(max(n, 0)))
            if flexible:
                r.skip_tagged_fields()
            parts.append((topic, ids))
    last_update = r.i64()
    start = r.i64()
    extra = {
        "previous_producer_id": -1,
        "next_producer_id": -1,
        "client_transaction_version": 0,
        "next_producer_epoch": -1,
    }
    if flexible:
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            size = r.uvarint()
            payload = r.take(size)
            if tag == TAG_PREVIOUS_PRODUCER_ID:
                extra["previous_producer_id"] = _I64.unpack(payload)[0]
            elif tag == TAG_NEXT_PRODUCER_ID:
                extra["next_producer_id"] = _I64.unpack(payload)[0]
            elif tag == TAG_CLIENT_TRANSACTION_VERSION:
                extra["client_transaction_version"] = _I16.unpack(payload)[0]
            elif tag == TAG_NEXT_PRODUCER_EPOCH:
                extra["next_producer_epoch"] = _I16.unpack(payload)[0]
    return TransactionLogValue(
        producer_id,
        epoch,
        timeout,
        status,
        None if parts is None else tuple(parts),
        last_update,
        start,
        **extra,
    )


# -- decoding helpers --------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise TxnRecordFormatError("truncated transaction log record")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(out)

    def _unpack(self, s: struct.Struct) -> int:
        return int(s.unpack(self.take(s.size))[0])

    def i8(self) -> int:
        return self._unpack(_I8)

    def i16(self) -> int:
        return self._unpack(_I16)

    def i32(self) -> int:
        return self._unpack(_I32)

    def i64(self) -> int:
        return self._unpack(_I64)

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            if shift > 28:
                raise TxnRecordFormatError("varint too long")
            b = self.take(1)[0]
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def string(self) -> str | None:
        n = self.i16()
        return None if n < 0 else self._utf8(self.take(n))

    def compact_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._utf8(self.take(n))

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    @staticmethod
    def _utf8(raw: bytes) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise TxnRecordFormatError(f"invalid UTF-8: {exc}") from None
