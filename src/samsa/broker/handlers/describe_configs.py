"""DescribeConfigs: the broker's settings and each topic's, under Kafka's names (read-only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_CONFIGS
TOPIC = 2
BROKER = 4
DEFAULT_CONFIG = 5  # config source: static broker config / default


def _settings(broker: Broker, resource_type: int) -> dict[str, str]:
    c = broker.config
    if resource_type == TOPIC:
        return {
            "segment.bytes": str(c.log_segment_bytes),
            "max.message.bytes": str(c.message_max_bytes),
            "flush.messages": str(c.log_flush_interval_messages),
            "cleanup.policy": "delete",
            "message.timestamp.type": "CreateTime",
        }
    return {
        "num.partitions": str(c.num_partitions),
        "auto.create.topics.enable": str(c.auto_create_topics_enable).lower(),
        "log.segment.bytes": str(c.log_segment_bytes),
        "log.flush.interval.messages": str(c.log_flush_interval_messages),
        "producer.id.expiration.ms": str(c.producer_id_expiration_ms),
        "message.max.bytes": str(c.message_max_bytes),
        "socket.request.max.bytes": str(c.socket_request_max_bytes),
    }


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    results = []
    for res in request.resources:
        code, message, configs = ErrorCode.NONE, None, ()
        if res.resource_type == TOPIC and res.resource_name not in broker.topics.topics:
            code, message = (
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"unknown topic {res.resource_name!r}",
            )
        elif res.resource_type not in (TOPIC, BROKER):
            code, message = (
                ErrorCode.INVALID_REQUEST,
                f"resource type {res.resource_type} not supported",
            )
        else:
            wanted = set(res.configuration_keys) if res.configuration_keys else None
            configs = tuple(
                make(
                    K,
                    v,
                    "DescribeConfigsResourceResult",
                    name=name,
                    value=value,
                    read_only=True,
                    config_source=DEFAULT_CONFIG,
                    is_default=False,
                    is_sensitive=False,
                    synonyms=(),
                    config_type=0,
                    documentation=None,
                )
                for name, value in _settings(broker, res.resource_type).items()
                if wanted is None or name in wanted
            )
        results.append(
            make(
                K,
                v,
                "DescribeConfigsResult",
                error_code=code,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=configs,
            )
        )
    return encode_response(
        K, v, make(K, v, "DescribeConfigsResponse", throttle_time=0, results=tuple(results))
    )
