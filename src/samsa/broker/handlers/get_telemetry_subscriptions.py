"""GetTelemetrySubscriptions (KIP-714): a client instance's id (assigned on its first
request) and the metrics it is asked to push, how often and how compressed
(:mod:`samsa.broker.client_metrics`). As Kafka, no ACL is needed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.client_metrics import ACCEPTED_COMPRESSION, ClientInfo, monotonic_ms
from samsa.broker.handlers._base import Body, RequestContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.GET_TELEMETRY_SUBSCRIPTIONS


def client_info(ctx: RequestContext) -> ClientInfo:
    """What a subscription's ``match`` can select this connection's client by."""
    host, _, port = ctx.peer.rpartition(":")
    return ClientInfo(ctx.header.client_id or "", host.strip("[]"), port, *ctx.software)


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    manager = broker.client_metrics
    answer = manager.get_subscriptions(request.client_instance_id, client_info(ctx), monotonic_ms())
    ok = answer.error == ErrorCode.NONE
    return encode_response(
        K,
        ctx.version,
        make(
            K,
            ctx.version,
            "GetTelemetrySubscriptionsResponse",
            throttle_time=0,
            error_code=answer.error,
            client_instance_id=answer.instance_id if ok else None,  # as Kafka's error answer
            subscription_id=answer.subscription_id,
            accepted_compression_types=ACCEPTED_COMPRESSION if ok else (),
            push_interval=answer.interval_ms if ok else 0,
            telemetry_max_bytes=manager.max_bytes if ok else 0,
            delta_temporality=ok,
            requested_metrics=answer.metrics,
        ),
    )
