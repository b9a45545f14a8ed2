"""ListConfigResources (KIP-714's ListClientMetricsResources, widened by KIP-1142): the names
of config resources. v0 lists the client metrics subscriptions (what
``kafka-client-metrics --list`` shows); v1 lists the types asked for (all when none is):
topics, this broker, client metrics subscriptions and the groups with configs of their own.
As Kafka, DescribeConfigs on the cluster is needed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.client_metrics import CLIENT_METRICS
from samsa.broker.handlers._alter_configs import BROKER, GROUP, TOPIC
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.LIST_CONFIG_RESOURCES


def _names(broker: Broker, resource_type: int) -> list[str]:
    if resource_type == TOPIC:
        return sorted(broker.topics.topics)
    if resource_type == BROKER:
        return [str(broker.node_id)]
    if resource_type == GROUP:
        return sorted(broker.group_configs.groups)
    return sorted(broker.client_metrics.configs.resources)


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    asked = tuple(getattr(request, "resource_types", ())) if v >= 1 else (CLIENT_METRICS,)
    types = asked or (TOPIC, BROKER, CLIENT_METRICS, GROUP)
    code, found = ErrorCode.NONE, []
    if not authorized(broker, ctx, Op.DESCRIBE_CONFIGS, Res.CLUSTER, CLUSTER_NAME):
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    elif any(t not in (TOPIC, BROKER, CLIENT_METRICS, GROUP) for t in types):
        code = ErrorCode.UNSUPPORTED_VERSION
    else:
        found = [
            make(K, v, "ConfigResource", resource_name=name, resource_type=t)
            for t in types
            for name in _names(broker, t)
        ]
    body = make(
        K,
        v,
        "ListConfigResourcesResponse",
        throttle_time=0,
        error_code=code,
        config_resources=tuple(found),
    )
    return encode_response(K, v, body)
