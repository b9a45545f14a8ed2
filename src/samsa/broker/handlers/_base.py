"""What every handler shares: the request context and the shape of a handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
