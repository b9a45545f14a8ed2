"""What every handler shares: the request context and the shape of a handler."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import Operation as Op
from samsa.broker.authorizer import ResourceType as Res
from samsa.broker.quotas import QUOTA_TYPES, Muting, user_name
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import RequestHeader
from samsa.protocol.messages import ApiKey, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker
    from samsa.broker.sasl import SaslSession

# A response body (or pieces of one), an awaitable of it, or None for "no response".
Body = bytes | list[Sized]  # pieces: bytes, or FileSlice when ctx.zero_copy
HandlerResult = Body | Awaitable[Body] | None
Handler = Callable[["Broker", "RequestContext", Any], HandlerResult]


@dataclass(frozen=True, slots=True)
class RequestContext:
    header: RequestHeader
    version: int
    peer: str
    principal: str = "User:ANONYMOUS"
    # The listener's address for this client (Metadata, FindCoordinator, DescribeCluster).
    advertised: tuple[str, int] | None = None
    session: SaslSession | None = None  # on SASL listeners only
    # The connection can send record bytes straight from segment files (os.sendfile): Fetch
    # may answer with pinned FileSlice pieces, which the server releases once written.
    zero_copy: bool = False
    # What the client's ApiVersions named (KIP-511); client metrics select on it (KIP-714).
    software: tuple[str, str] = ("", "")
    size: int = 0  # the request's frame, in bytes (Produce byte-rate quotas)
    # The connection's throttle owed to client quotas (broker/quotas.py); None in tests.
    muting: Muting | None = None

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def host(self) -> str:
        """The client's address, as ACL hosts name it (no port)."""
        return self.peer.rpartition(":")[0].strip("[]") or self.peer


def throttle(broker: Broker, ctx: RequestContext, key: str, value: float) -> int:
    """Charge ``value`` to the client's quota for ``key`` (Kafka's resolution order); the
    throttle time in ms it earned, which the connection then owes (muted that long)."""
    quotas = broker.quotas
    if key not in quotas.keys:
        return 0  # no entity sets this quota: the common case stops here
    charge = quotas.quota_for(key, user_name(ctx.principal), ctx.header.client_id or "")
    if charge is None:
        return 0
    ms = quotas.record(charge, value, time.monotonic())
    if ms:
        if ctx.muting is not None:
            ctx.muting.owe(ms)
        broker.metrics.throttled(QUOTA_TYPES[key], charge.user, charge.client_id, ms)
    return ms


def authorized(broker: Broker, ctx: RequestContext, op: Op, rtype: Res, name: str) -> bool:
    """May this request's principal do ``op`` on the resource? Always, without an authorizer.
    Each handler states here what Kafka's KafkaApis checks for its API (rule 33)."""
    auth = broker.authorizer
    return auth is None or auth.authorize(ctx.principal, ctx.host, op, rtype, name)


def authorized_any(broker: Broker, ctx: RequestContext, op: Op, rtype: Res) -> bool:
    """May the principal do ``op`` on some resource of the type (authorizeByResourceType)?"""
    auth = broker.authorizer
    return auth is None or auth.authorize_any(ctx.principal, ctx.host, op, rtype)


# The operations Kafka reports for each resource type in authorized-operations bit fields.
_REPORTED_OPERATIONS: dict[Res, tuple[Op, ...]] = {
    Res.TOPIC: (
        Op.READ,
        Op.WRITE,
        Op.CREATE,
        Op.DELETE,
        Op.ALTER,
        Op.DESCRIBE,
        Op.DESCRIBE_CONFIGS,
        Op.ALTER_CONFIGS,
    ),
    Res.GROUP: (Op.READ, Op.DELETE, Op.DESCRIBE),
    Res.CLUSTER: (
        Op.CREATE,
        Op.ALTER,
        Op.DESCRIBE,
        Op.CLUSTER_ACTION,
        Op.DESCRIBE_CONFIGS,
        Op.ALTER_CONFIGS,
        Op.IDEMPOTENT_WRITE,
    ),
}


def authorized_operations(broker: Broker, ctx: RequestContext, rtype: Res, name: str) -> int:
    """Kafka's authorized-operations field (KIP-430): bit n is set when the principal may do
    the operation whose code is n on the resource; every operation without an authorizer."""
    return sum(
        1 << op for op in _REPORTED_OPERATIONS[rtype] if authorized(broker, ctx, op, rtype, name)
    )


def authorized_names(
    broker: Broker, ctx: RequestContext, op: Op, rtype: Res, names: Iterable[str]
) -> set[str]:
    """The names among ``names`` the principal may do ``op`` on."""
    auth = broker.authorizer
    if auth is None:
        return set(names)
    return {n for n in names if auth.authorize(ctx.principal, ctx.host, op, rtype, n)}


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handler: Handler


def partition_errors(
    key: ApiKey,
    version: int,
    prefix: str,
    topics: Iterable[Any],
    errors: Mapping[tuple[str, int], ErrorCode],
) -> tuple[Any, ...]:
    """The ``<prefix>ResponseTopic`` entries answering every partition of the request's
    ``topics`` (``name``, ``partitions[].partition_index``) with its error from ``errors``."""
    return tuple(
        make(
            key,
            version,
            f"{prefix}ResponseTopic",
            name=t.name,
            topic_id=getattr(t, "topic_id", None),
            partitions=tuple(
                _partition_error(key, version, prefix, t.name, p.partition_index, errors)
                for p in t.partitions
            ),
        )
        for t in topics
    )


def outside_transaction(code: ErrorCode, abortable: bool) -> ErrorCode:
    """A transactional write refused because its partition is not in the open transaction
    (rule 19): as Kafka, TRANSACTION_ABORTABLE to the clients that know it (Produce v11+,
    TxnOffsetCommit v4+), INVALID_TXN_STATE to older ones."""
    if abortable and code == ErrorCode.INVALID_TXN_STATE:
        return ErrorCode.TRANSACTION_ABORTABLE
    return code


def _partition_error(
    key: ApiKey,
    version: int,
    prefix: str,
    topic: str,
    index: int,
    errors: Mapping[tuple[str, int], ErrorCode],
) -> Any:
    return make(
        key,
        version,
        f"{prefix}ResponsePartition",
        partition_index=index,
        error_code=errors[(topic, index)],
    )


def unknown_partitions(broker: Broker, pairs: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
    """The (topic, partition) pairs that name no partition of an existing topic."""
    out = set()
    for name, index in pairs:
        topic = broker.topics.topics.get(name)
        if topic is None or not 0 <= index < len(topic.partitions):
            out.add((name, index))
    return out


def refused_first(
    key: ApiKey,
    version: int,
    prefix: str,
    topics: Iterable[Any],
    errors: Mapping[tuple[str, int], ErrorCode],
    refused: Collection[tuple[str, int]],
) -> tuple[Any, ...]:
    """As :func:`partition_errors`, in the order Kafka's offset commits answer: the partitions
    refused before the coordinator (``refused``) first, then the coordinator's, each topic
    once, in the order it first appears."""
    topics = list(topics)
    ids = {t.name: getattr(t, "topic_id", None) for t in topics}
    by_topic: dict[str, list[Any]] = {}
    for first in (True, False):
        for t in topics:
            for p in t.partitions:
                if ((t.name, p.partition_index) in refused) == first:
                    by_topic.setdefault(t.name, []).append(
                        _partition_error(key, version, prefix, t.name, p.partition_index, errors)
                    )
    return tuple(
        make(
            key,
            version,
            f"{prefix}ResponseTopic",
            name=name,
            topic_id=ids[name],
            partitions=tuple(parts),
        )
        for name, parts in by_topic.items()
    )


@dataclass(frozen=True, slots=True)
class NamedTopic:
    """A request topic named by its id (KIP-516: Produce v13, OffsetCommit and OffsetFetch
    v10), with the name of the topic that has it; an id no topic has gets a name no topic can
    have, so the name-keyed checks pass it by (``known`` False: the caller answers
    UNKNOWN_TOPIC_ID). Its other fields are the request topic's."""

    name: str
    known: bool
    entry: Any  # the request's topic entry

    def __getattr__(self, field: str) -> Any:
        return getattr(self.entry, field)


def unknown_id(topic: Any) -> bool:
    """Whether a request topic named an id no topic has (only a :class:`NamedTopic` can)."""
    return isinstance(topic, NamedTopic) and not topic.known


def topic_id_of(broker: Broker, name: str) -> uuid.UUID | None:
    topic = broker.topics.topics.get(name)
    return None if topic is None else topic.topic_id


def resolve_topic_ids(broker: Broker, topics: Iterable[Any]) -> list[NamedTopic]:
    out = []
    for t in topics:
        topic = broker.topics.topics_by_id.get(t.topic_id) if t.topic_id is not None else None
        name = topic.name if topic is not None else f"<unknown topic id {t.topic_id}>"
        out.append(NamedTopic(name, topic is not None, t))
    return out
