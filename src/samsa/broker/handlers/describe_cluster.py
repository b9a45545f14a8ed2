"""DescribeCluster: the admin clients' view of the cluster (one broker, its own controller)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_CLUSTER


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    host, port = ctx.advertised or broker.config.advertised
    node = broker.node_id
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "DescribeClusterResponse",
            throttle_time=0,
            error_code=ErrorCode.NONE,
            error_message=None,
            endpoint_type=1,
            cluster_id=broker.cluster_id,
            controller_id=node,
            brokers=(
                make(
                    K, v, "DescribeClusterBroker", broker_id=node, host=host, port=port, rack=None
                ),
            ),
            cluster_authorized_operations=-2147483648,
        ),
    )
