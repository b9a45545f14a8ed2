"""FindCoordinator: this broker coordinates every group and every transactional id.

v0-3 ask about one key; v4+ batch them in ``coordinator_keys``. Asking for a group
coordinator creates ``__consumer_offsets`` on first use, as Kafka does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.coordinator.ports import StoreUnavailable
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.FIND_COORDINATOR
GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    key_type = getattr(request, "key_type", GROUP_KEY_TYPE)
    error = ErrorCode.NONE
    message: str | None = None
    if key_type == GROUP_KEY_TYPE:
        try:
            broker.groups.ensure_topic()
        except StoreUnavailable as exc:
            error, message = ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc)
    elif key_type != TRANSACTION_KEY_TYPE:
        error, message = ErrorCode.INVALID_REQUEST, f"unknown key type {key_type}"
    host, port = ctx.advertised or broker.config.advertised
    # Rule 33: Describe on the group or the TransactionalId, per key.
    denied = _denied(broker, ctx, key_type, request) if error == ErrorCode.NONE else set()
    node = broker.node_id if error == ErrorCode.NONE else -1
    if v < 4 and denied:
        error, message, node = _AUTH_ERRORS[key_type], "not authorized", -1
    if v < 4:
        response = make(
            K,
            v,
            "FindCoordinatorResponse",
            throttle_time=0,
            error_code=error,
            error_message=message,
            node_id=node,
            host=host if node >= 0 else "",
            port=port if node >= 0 else -1,
        )
    else:
        coordinators = tuple(
            make(
                K,
                v,
                "Coordinator",
                key=key,
                node_id=-1 if key in denied else node,
                host=host if node >= 0 and key not in denied else "",
                port=port if node >= 0 and key not in denied else -1,
                error_code=_AUTH_ERRORS[key_type] if key in denied else error,
                error_message="not authorized" if key in denied else message,
            )
            for key in request.coordinator_keys
        )
        response = make(K, v, "FindCoordinatorResponse", throttle_time=0, coordinators=coordinators)
    return encode_response(K, v, response)


_AUTH_ERRORS = {
    GROUP_KEY_TYPE: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    TRANSACTION_KEY_TYPE: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def _denied(broker: Broker, ctx: RequestContext, key_type: int, request: Any) -> set[str]:
    rtype = Res.GROUP if key_type == GROUP_KEY_TYPE else Res.TRANSACTIONAL_ID
    keys = [request.key] if ctx.version < 4 else list(request.coordinator_keys)
    return {k for k in keys if not authorized(broker, ctx, Op.DESCRIBE, rtype, k)}
