"""DescribeClientQuotas (KIP-546): the client quotas that match a filter.

samsa enforces no client quotas and stores none (AlterClientQuotas is not served), so every
valid filter matches nothing: ``kafka-configs --describe --entity-type users`` works and
shows the users' SCRAM credentials alone. As Kafka's broker: DescribeConfigs on the cluster
is needed (else 31, CLUSTER_AUTHORIZATION_FAILED); a filter naming an entity type twice or
one other than user, client-id and ip is 42 (INVALID_REQUEST).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_CLIENT_QUOTAS
ENTITY_TYPES = ("user", "client-id", "ip")


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    code, message = ErrorCode.NONE, None
    types = [c.entity_type for c in request.components]
    if not authorized(broker, ctx, Op.DESCRIBE_CONFIGS, Res.CLUSTER, CLUSTER_NAME):
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        message = "DescribeClientQuotas needs DescribeConfigs on the cluster"
    elif len(set(types)) != len(types):
        code, message = ErrorCode.INVALID_REQUEST, "Duplicate entity type in the filter"
    elif any(t not in ENTITY_TYPES for t in types):
        code = ErrorCode.INVALID_REQUEST
        message = f"Entity types must be among {', '.join(ENTITY_TYPES)}"
    return encode_response(
        K,
        ctx.version,
        make(
            K,
            ctx.version,
            "DescribeClientQuotasResponse",
            throttle_time=0,
            error_code=code,
            error_message=message,
            entries=() if code == ErrorCode.NONE else None,
        ),
    )
