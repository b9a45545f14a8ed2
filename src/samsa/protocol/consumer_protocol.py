"""The ``consumer`` embedded protocol of classic groups: one codec for the client and the
coordinator.

A classic consumer's JoinGroup carries a ConsumerProtocolSubscription (topics, owned
partitions, generation, rack) and its SyncGroup answer a ConsumerProtocolAssignment. The
client writes both as Kafka's ``ConsumerProtocol`` does (the highest version, 3) and its
group leader reads every member's subscription. The coordinator reads and writes them only
to migrate a group between the classic and the consumer protocol (docs/semantics.md, rule
38): a classic member of a consumer group gets its server-side assignment in this form. The
formats are kio's (Kafka's schemas); versions are forward compatible, so a version newer
than kio knows is read with the newest schema. Bytes that cannot be read raise
:class:`ConsumerProtocolError`.

This module is pure.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.consumer_protocol_assignment.v0 import ConsumerProtocolAssignment as AssignV0
from kio.schema.consumer_protocol_assignment.v0.data import TopicPartition as AssignTP
from kio.schema.consumer_protocol_subscription.v0 import ConsumerProtocolSubscription as SubV0
from kio.schema.consumer_protocol_subscription.v1 import ConsumerProtocolSubscription as SubV1
from kio.schema.consumer_protocol_subscription.v2 import ConsumerProtocolSubscription as SubV2
from kio.schema.consumer_protocol_subscription.v3 import ConsumerProtocolSubscription as SubV3
from kio.schema.consumer_protocol_subscription.v3.data import TopicPartition as SubTP
from kio.serial import entity_reader, entity_writer

PROTOCOL_TYPE = "consumer"
# What Kafka's ConsumerProtocol writes: the highest versions (assignment v1-v3 are v0's
# fields; v1 marks a member that may use the cooperative protocol).
SUBSCRIPTION_VERSION = 3
ASSIGNMENT_VERSION = 3

_VERSION = struct.Struct(">h")
_SUB_READERS = [entity_reader(s) for s in (SubV0, SubV1, SubV2, SubV3)]
_write_subscription = entity_writer(SubV3)
_write_assignment = entity_writer(AssignV0)
_read_assignment = entity_reader(AssignV0)


class ConsumerProtocolError(ValueError):
    """Embedded protocol bytes we cannot read."""


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: tuple[str, ...]
    owned: dict[str, frozenset[int]]  # topic name -> partitions (empty before v1)
    rack_id: str | None


def encode_subscription(
    topics: Iterable[str],
    owned: Iterable[tuple[str, int]] = (),
    *,
    generation: int = -1,
    rack_id: str | None = None,
) -> bytes:
    """A subscription at :data:`SUBSCRIPTION_VERSION`, no user data; ``owned`` are (topic,
    partition) pairs."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in owned:
        by_topic.setdefault(topic, []).append(partition)
    buf = io.BytesIO()
    buf.write(_VERSION.pack(SUBSCRIPTION_VERSION))
    _write_subscription(
        buf,
        SubV3(
            topics=tuple(sorted(topics)),  # type: ignore[arg-type]
            user_data=None,
            owned_partitions=tuple(
                SubTP(topic=t, partitions=tuple(sorted(ps)))  # type: ignore[arg-type]
                for t, ps in sorted(by_topic.items())
            ),
            generation_id=generation,  # type: ignore[arg-type]
            rack_id=rack_id,
        ),
    )
    return buf.getvalue()


def decode_subscription(data: bytes) -> Subscription:
    try:
        (version,) = _VERSION.unpack_from(data, 0)
        if version < 0:
            raise ConsumerProtocolError(f"subscription version {version}")
        sub: Any
        sub, _ = _SUB_READERS[min(version, len(_SUB_READERS) - 1)](data, 2)
    except ConsumerProtocolError:
        raise
    except Exception as exc:  # kio raises struct/Value/Index errors on short input
        raise ConsumerProtocolError(f"malformed subscription: {exc}") from None
    owned: dict[str, frozenset[int]] = {}
    for tp in getattr(sub, "owned_partitions", ()):
        owned[str(tp.topic)] = owned.get(str(tp.topic), frozenset()) | frozenset(tp.partitions)
    return Subscription(tuple(str(t) for t in sub.topics), owned, getattr(sub, "rack_id", None))


def encode_assignment(partitions: Mapping[str, Iterable[int]], *, version: int = 0) -> bytes:
    """An assignment, no user data: version 0 by default (every client reads it), the
    client's leader writes :data:`ASSIGNMENT_VERSION` (the fields are the same)."""
    buf = io.BytesIO()
    buf.write(_VERSION.pack(version))
    _write_assignment(
        buf,
        AssignV0(
            assigned_partitions=tuple(
                AssignTP(topic=t, partitions=tuple(sorted(ps)))  # type: ignore[arg-type]
                for t, ps in sorted((t, frozenset(ps)) for t, ps in partitions.items())
                if ps
            ),
            user_data=None,
        ),
    )
    return buf.getvalue()


def decode_assignment(data: bytes) -> dict[str, frozenset[int]]:
    """An assignment of any version (its first fields are v0's); empty bytes: nothing."""
    if not data:
        return {}
    try:
        (version,) = _VERSION.unpack_from(data, 0)
        if version < 0:
            raise ConsumerProtocolError(f"assignment version {version}")
        assignment: Any
        assignment, _ = _read_assignment(data, 2)
    except ConsumerProtocolError:
        raise
    except Exception as exc:
        raise ConsumerProtocolError(f"malformed assignment: {exc}") from None
    out: dict[str, frozenset[int]] = {}
    for tp in assignment.assigned_partitions:
        out[str(tp.topic)] = out.get(str(tp.topic), frozenset()) | frozenset(tp.partitions)
    return out
