"""What every handler shares: the request context and the shape of a handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import Operation as Op
from samsa.broker.authorizer import ResourceType as Res
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

    @property
    def api_key(self) -> int:
        return self.header.api_key

    @property
    def host(self) -> str:
        """The client's address, as ACL hosts name it (no port)."""
        return self.peer.rpartition(":")[0].strip("[]") or self.peer


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
            partitions=tuple(
                make(
                    key,
                    version,
                    f"{prefix}ResponsePartition",
                    partition_index=p.partition_index,
                    error_code=errors[(t.name, p.partition_index)],
                )
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
