"""SaslAuthenticate: one step of the mechanism SaslHandshake chose (KIP-152).

A failure answers SASL_AUTHENTICATION_FAILED with a message and the server then closes the
connection; one on an authenticated connection with no re-authentication under way is
ILLEGAL_SASL_STATE, the connection kept (as Kafka). session_lifetime_ms (v1+), on the step that
completes authentication, is connections.max.reauth.ms or the token's (KIP-368; 0: no deadline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.SASL_AUTHENTICATE


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    session = ctx.session
    lifetime = 0
    if session is None:
        error, message, reply = ErrorCode.ILLEGAL_SASL_STATE, "not a SASL listener", b""
    else:
        error, message, reply = session.authenticate(request.auth_bytes)
        if not error and session.authenticated and not session.renewing:
            # Only the step that completes the (re-)authentication carries it, as Kafka:
            # librdkafka re-arms its re-authentication timer from every answer.
            lifetime = session.lifetime_ms
    return encode_response(
        K,
        ctx.version,
        make(
            K,
            ctx.version,
            "SaslAuthenticateResponse",
            error_code=error,
            error_message=message,
            auth_bytes=reply,
            session_lifetime=lifetime,
        ),
    )
