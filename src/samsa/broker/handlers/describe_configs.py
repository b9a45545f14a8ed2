"""DescribeConfigs: each topic's configs with their source and synonyms
(:mod:`samsa.broker.topic_config`), and the broker's settings under Kafka's names, static and
dynamic (:mod:`samsa.broker.dynamic_config`, rule 44)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.client_metrics import CLIENT_METRICS, ClientMetricsError
from samsa.broker.dynamic_config import DynamicConfigError, describe_broker
from samsa.broker.group_config import GroupConfigError
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.topic_config import DescribedConfig
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_CONFIGS
TOPIC = 2
BROKER = 4
GROUP = 32


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    synonyms = bool(getattr(request, "include_synonyms", False))
    docs = bool(getattr(request, "include_documentation", False))
    results = []
    for res in request.resources:
        code, message, configs = ErrorCode.NONE, "", ()  # Kafka's message when all is well
        try:
            _check_authorized(broker, ctx, res.resource_type, res.resource_name)
            described = _describe(broker, res.resource_type, res.resource_name)
        except _Refused as exc:
            code, message = exc.code, str(exc)
        else:
            wanted = set(res.configuration_keys) if res.configuration_keys else None
            configs = tuple(
                _entry(v, d, synonyms, docs)
                for d in described
                if wanted is None or d.name in wanted
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


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _check_authorized(broker: Broker, ctx: RequestContext, resource_type: int, name: str) -> None:
    """Rule 33: DescribeConfigs on the topic, or on the cluster for a broker."""
    if resource_type == TOPIC and not authorized(broker, ctx, Op.DESCRIBE_CONFIGS, Res.TOPIC, name):
        raise _Refused(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "not authorized")
    if resource_type in (BROKER, CLIENT_METRICS) and not authorized(
        broker, ctx, Op.DESCRIBE_CONFIGS, Res.CLUSTER, CLUSTER_NAME
    ):
        raise _Refused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "not authorized")
    if resource_type == GROUP and not authorized(broker, ctx, Op.DESCRIBE_CONFIGS, Res.GROUP, name):
        raise _Refused(ErrorCode.GROUP_AUTHORIZATION_FAILED, "not authorized")


def _describe(broker: Broker, resource_type: int, name: str) -> list[DescribedConfig]:
    if resource_type == TOPIC:
        topic = broker.topics.topics.get(name)
        if topic is None:
            raise _Refused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        return broker.describe_topic(topic.configs)
    if resource_type == BROKER:
        try:
            return describe_broker(broker.dynamic, broker.config, name)
        except DynamicConfigError as exc:
            raise _Refused(ErrorCode.INVALID_REQUEST, str(exc)) from None
    if resource_type == GROUP:
        try:  # every group has every key, as in Kafka, whether the group exists or not
            return broker.group_configs.describe(name, broker.config)
        except GroupConfigError as exc:
            raise _Refused(ErrorCode.INVALID_REQUEST, str(exc)) from None
    if resource_type == CLIENT_METRICS:
        try:  # as a group's: every key, the subscription existing or not
            return broker.client_metrics.configs.describe(name)
        except ClientMetricsError as exc:
            raise _Refused(ErrorCode.INVALID_REQUEST, str(exc)) from None
    raise _Refused(ErrorCode.INVALID_REQUEST, f"resource type {resource_type} not supported")


def _entry(v: int, d: DescribedConfig, synonyms: bool, docs: bool) -> Any:
    return make(
        K,
        v,
        "DescribeConfigsResourceResult",
        name=d.name,
        value=d.value,
        read_only=d.read_only,
        config_source=int(d.source),
        is_sensitive=d.sensitive,
        synonyms=tuple(
            make(K, v, "DescribeConfigsSynonym", name=s.name, value=s.value, source=int(s.source))
            for s in (d.synonyms if synonyms else ())
        ),
        config_type=int(d.config_type),
        documentation=(d.doc or None) if docs else None,
    )
