"""DescribeCluster: the admin clients' view of the cluster (one broker, its own controller)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import (
    Body,
    Op,
    RequestContext,
    Res,
    authorized,
    authorized_operations,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_CLUSTER


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    host, port = ctx.advertised or broker.config.advertised
    node = broker.node_id
    # Kafka checks nothing here; the KIP-430 field, when asked for, needs Describe.
    cluster_ops = -(2**31)  # not asked for
    if getattr(request, "include_cluster_authorized_operations", False):
        cluster_ops = (
            authorized_operations(broker, ctx, Res.CLUSTER, CLUSTER_NAME)
            if authorized(broker, ctx, Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME)
            else 0
        )
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
                # v2 (KIP-1073) may ask for fenced brokers too: a lone broker is never fenced.
                make(
                    K,
                    v,
                    "DescribeClusterBroker",
                    broker_id=node,
                    host=host,
                    port=port,
                    rack=None,
                    is_fenced=False,
                ),
            ),
            cluster_authorized_operations=cluster_ops,
        ),
    )
