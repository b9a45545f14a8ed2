"""PushTelemetry (KIP-714): a client instance's metrics, judged and kept by
:mod:`samsa.broker.client_metrics` for ``/metrics``. As Kafka, no ACL is needed; every
refusal is the response's error code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.client_metrics import monotonic_ms
from samsa.broker.handlers._base import Body, RequestContext
from samsa.broker.handlers.get_telemetry_subscriptions import client_info
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.PUSH_TELEMETRY


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    code = broker.client_metrics.push(
        request.client_instance_id,
        request.subscription_id,
        request.terminating,
        request.compression_type,
        bytes(request.metrics or b""),
        client_info(ctx),
        monotonic_ms(),
    )
    return encode_response(
        K,
        ctx.version,
        make(K, ctx.version, "PushTelemetryResponse", throttle_time=0, error_code=code),
    )
