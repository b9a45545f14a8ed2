"""SaslHandshake: the client names its SASL mechanism; the answer lists those enabled.

After v1 the tokens come in SaslAuthenticate requests; after v0 (KIP-43's first form) they
come as bare size-prefixed frames and are answered likewise (broker/server.py). On a
listener without SASL, or after authentication when it does not begin a re-authentication
(KIP-368: the session ends, and the last one began at least a second ago), it is
ILLEGAL_SASL_STATE and the connection stays open.
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
        error, mechanisms = session.handshake(request.mechanism, ctx.version), session.mechanisms
        if error == ErrorCode.ILLEGAL_SASL_STATE and session.failed is None:
            # Refused on an authenticated connection (not a re-authentication): as Kafka's
            # KafkaApis, no mechanisms listed, the connection kept.
            mechanisms = ()
    return encode_response(
        K,
        ctx.version,
        make(K, ctx.version, "SaslHandshakeResponse", error_code=error, mechanisms=mechanisms),
    )
