"""DescribeConfigs: each topic's configs with their source and synonyms
(:mod:`samsa.broker.topic_config`), and the broker's static settings, under Kafka's names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.config import SENSITIVE, broker_settings
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.topic_config import (
    ConfigSource,
    ConfigType,
    DescribedConfig,
    Synonym,
    describe_topic_configs,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_CONFIGS
TOPIC = 2
BROKER = 4


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    synonyms = bool(getattr(request, "include_synonyms", False))
    docs = bool(getattr(request, "include_documentation", False))
    results = []
    for res in request.resources:
        code, message, configs = ErrorCode.NONE, None, ()
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
    if resource_type == BROKER and not authorized(
        broker, ctx, Op.DESCRIBE_CONFIGS, Res.CLUSTER, CLUSTER_NAME
    ):
        raise _Refused(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "not authorized")


def _describe(broker: Broker, resource_type: int, name: str) -> list[DescribedConfig]:
    if resource_type == TOPIC:
        topic = broker.topics.topics.get(name)
        if topic is None:
            raise _Refused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        return describe_topic_configs(broker.config, topic.configs)
    if resource_type == BROKER:
        if name == "":
            return []  # the cluster-wide dynamic defaults: samsa has none
        if name != str(broker.node_id):
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                f"unexpected broker id {name!r}: expected {broker.node_id} or an empty string",
            )
        out = []
        for key, value, is_default in broker_settings(broker.config):
            source = (
                ConfigSource.DEFAULT_CONFIG if is_default else ConfigSource.STATIC_BROKER_CONFIG
            )
            sensitive = key in SENSITIVE
            shown = None if sensitive else value
            out.append(
                DescribedConfig(
                    key,
                    shown,
                    source,
                    ConfigType.PASSWORD if sensitive else ConfigType.UNKNOWN,
                    (Synonym(key, shown, source),),
                    "",
                    read_only=True,  # static: set in the properties file or on the command line
                    sensitive=sensitive,
                )
            )
        return out
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
