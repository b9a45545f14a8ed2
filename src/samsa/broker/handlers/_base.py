"""What every handler shares: the request context and the shape of a handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from samsa.protocol.framing import RequestHeader

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

# A response body (or pieces of one), an awaitable of it, or None for "no response".
Body = bytes | list[bytes]
HandlerResult = Body | Awaitable[Body] | None
Handler = Callable[["Broker", "RequestContext", Any], HandlerResult]


@dataclass(frozen=True, slots=True)
class RequestContext:
    header: RequestHeader
    version: int
    peer: str

    @property
    def api_key(self) -> int:
        return self.header.api_key


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handler: Handler
