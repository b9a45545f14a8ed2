"""SaslHandshake: the client names its SASL mechanism; the answer lists those enabled.

v1 only: v0 would mean raw SASL tokens outside Kafka framing, which today's clients no
longer send. On a listener without SASL (or after authentication) it is ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.SASL_HANDSHAKE


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    session = ctx.session
    if session is None:
        error, mechanisms = ErrorCode.ILLEGAL_SASL_STATE, ()
    else:
        error, mechanisms = session.handshake(request.mechanism), session.mechanisms
    return encode_response(
        K,
        ctx.version,
        make(K, ctx.version, "SaslHandshakeResponse", error_code=error, mechanisms=mechanisms),
    )
