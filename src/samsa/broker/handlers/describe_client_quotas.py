"""DescribeClientQuotas (KIP-546): the client quotas of the entities that match a filter.

As Kafka's broker: DescribeConfigs on the cluster is needed (else 31,
CLUSTER_AUTHORIZATION_FAILED); a filter naming an entity type twice, one other than user,
client-id and ip, or ip with another type is 42 (INVALID_REQUEST). The quotas are those of
broker/quotas.py, as AlterClientQuotas stored them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.quotas import QuotaError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_CLIENT_QUOTAS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    code, message, entries = ErrorCode.NONE, "", None  # Kafka: "" when all is well
    if not authorized(broker, ctx, Op.DESCRIBE_CONFIGS, Res.CLUSTER, CLUSTER_NAME):
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        message = "DescribeClientQuotas needs DescribeConfigs on the cluster"
    else:
        components = [(c.entity_type, c.match_type, c.match) for c in request.components]
        try:
            found = broker.quotas.describe(components, request.strict)
        except QuotaError as exc:
            code, message = ErrorCode.INVALID_REQUEST, str(exc)
        else:
            entries = tuple(
                make(
                    K,
                    ctx.version,
                    "EntryData",
                    entity=tuple(
                        make(K, ctx.version, "EntityData", entity_type=t, entity_name=n)
                        for t, n in entity
                    ),
                    values=tuple(
                        make(K, ctx.version, "ValueData", key=key, value=value)
                        for key, value in sorted(values.items())
                    ),
                )
                for entity, values in found
            )
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
            entries=entries,
        ),
    )
