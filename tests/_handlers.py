"""Requests answered in-process by the broker's handlers, without a socket: a ``Broker`` (not a
server) and one request at a time, as a connection would dispatch it, from ``host`` as
``principal``. Tests import it as ``from _handlers import handle``."""

from __future__ import annotations

import asyncio
from typing import Any

from samsa.broker.broker import Broker
from samsa.broker.handlers import APIS, RequestContext
from samsa.protocol.framing import RequestHeader
from samsa.protocol.messages import decode_response


def handle(broker: Broker, principal: str, key: int, v: int, request: Any, host: str) -> Any:
    """The decoded response of the handler of API ``key`` version ``v`` to ``request``."""
    ctx = RequestContext(RequestHeader(key, v, 1, "test", 0), v, f"{host}:40000", principal)
    out = APIS[key].handler(broker, ctx, request)
    if not isinstance(out, bytes | list):
        out = asyncio.new_event_loop().run_until_complete(out)  # type: ignore[arg-type]
    body = out if isinstance(out, bytes) else b"".join(bytes(p) for p in out)  # type: ignore[arg-type]
    return decode_response(key, v, body, 0)
