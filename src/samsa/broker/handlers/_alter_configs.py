"""What AlterConfigs and IncrementalAlterConfigs share: per-resource checks and answers, for
a topic's configs and a broker's dynamic configs (rule 44)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.client_metrics import CLIENT_METRICS, ClientMetricsError
from samsa.broker.dynamic_config import DynamicConfigError
from samsa.broker.group_config import GroupConfigError
from samsa.broker.handlers._base import Op, Res, authorized
from samsa.broker.topic_config import InvalidConfigError, UnknownOperationError
from samsa.broker.topics import TopicError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker
    from samsa.broker.handlers._base import RequestContext

TOPIC = 2
BROKER = 4
GROUP = 32


def alter(
    broker: Broker,
    key: int,
    version: int,
    request: Any,
    response_class: str,
    new_configs: Callable[[dict[str, str], Any], dict[str, str]],
    ctx: RequestContext | None = None,
) -> bytes:
    """Answer each resource of ``request``: a topic's configs, or a broker's dynamic set,
    become ``new_configs(current, resource)``, validated and, unless ``validate_only``,
    persisted and applied. Errors are per resource, as in Kafka."""
    counts = Counter((r.resource_type, r.resource_name) for r in request.resources)
    responses = []
    for res in request.resources:
        code, message = ErrorCode.NONE, None
        names = [c.name for c in res.configs]
        try:
            if counts[(res.resource_type, res.resource_name)] > 1:
                code, message = ErrorCode.INVALID_REQUEST, "resource named twice in one request"
            elif len(set(names)) != len(names):
                code, message = ErrorCode.INVALID_REQUEST, "config named twice for one resource"
            elif ctx is not None and (refused := _unauthorized(broker, ctx, res)) is not None:
                code, message = refused, "not authorized to AlterConfigs"
            elif res.resource_type == BROKER:
                _alter_broker(broker, res, new_configs, request.validate_only)
            elif res.resource_type == GROUP:
                own = broker.group_configs
                configs = new_configs(own.get(res.resource_name), res)
                own.alter(res.resource_name, configs, request.validate_only)
            elif res.resource_type == CLIENT_METRICS:
                _alter_client_metrics(broker, res, new_configs, request.validate_only)
            elif res.resource_type != TOPIC:
                code = ErrorCode.INVALID_REQUEST
                message = f"resource type {res.resource_type} not supported"
            else:
                topic = broker.topics.topics.get(res.resource_name)
                if topic is None:
                    raise TopicError(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        f"unknown topic {res.resource_name!r}",
                    )
                configs = new_configs(dict(topic.configs), res)
                broker.topics.alter_configs(res.resource_name, configs, request.validate_only)
        except UnknownOperationError as exc:
            code, message = ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)
        except InvalidConfigError as exc:
            code, message = ErrorCode.INVALID_CONFIG, str(exc)
        except DynamicConfigError as exc:
            code, message = ErrorCode.INVALID_REQUEST, str(exc)
        except ClientMetricsError as exc:
            invalid = ErrorCode.INVALID_CONFIG if exc.invalid_config else ErrorCode.INVALID_REQUEST
            code, message = invalid, str(exc)
        except GroupConfigError as exc:
            invalid = ErrorCode.INVALID_REQUEST if exc.invalid_request else ErrorCode.INVALID_CONFIG
            code, message = invalid, str(exc)
        except TopicError as exc:
            code, message = exc.code, str(exc)
        responses.append(
            make(
                key,
                version,
                "AlterConfigsResourceResponse",
                error_code=code,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return encode_response(
        key,
        version,
        make(key, version, response_class, throttle_time=0, responses=tuple(responses)),
    )


def _alter_broker(
    broker: Broker,
    res: Any,
    new_configs: Callable[[dict[str, str], Any], dict[str, str]],
    validate_only: bool,
) -> None:
    """Rule 44: a BROKER resource's dynamic set; every refusal is INVALID_REQUEST, as Kafka's
    ConfigAdminManager answers (KAFKA-13609)."""
    current = broker.dynamic.level(res.resource_name)
    try:
        configs = new_configs(current, res)
    except InvalidConfigError as exc:
        raise DynamicConfigError(str(exc)) from None
    broker.alter_broker_configs(res.resource_name, configs, validate_only)


def _alter_client_metrics(
    broker: Broker,
    res: Any,
    new_configs: Callable[[dict[str, str], Any], dict[str, str]],
    validate_only: bool,
) -> None:
    """KIP-714: a client metrics subscription's set; clients see a change at their next
    request (their subscription id changes)."""
    manager = broker.client_metrics
    try:
        configs = new_configs(manager.configs.get(res.resource_name), res)
    except UnknownOperationError:
        raise  # as Kafka's controller: UNKNOWN_SERVER_ERROR, as for a topic or a group
    except InvalidConfigError as exc:
        raise ClientMetricsError(str(exc)) from None
    if manager.configs.alter(res.resource_name, configs, validate_only):
        manager.subscriptions_changed()


def _unauthorized(broker: Broker, ctx: RequestContext, res: Any) -> ErrorCode | None:
    """Rule 33: AlterConfigs on the topic, or on the cluster for a broker (or its loggers)."""
    if res.resource_type == TOPIC:
        if not authorized(broker, ctx, Op.ALTER_CONFIGS, Res.TOPIC, res.resource_name):
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    elif res.resource_type == GROUP:
        if not authorized(broker, ctx, Op.ALTER_CONFIGS, Res.GROUP, res.resource_name):
            return ErrorCode.GROUP_AUTHORIZATION_FAILED
    elif not authorized(broker, ctx, Op.ALTER_CONFIGS, Res.CLUSTER, CLUSTER_NAME):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    return None
