"""IncrementalAlterConfigs (KIP-339): SET, DELETE, APPEND and SUBTRACT on a topic's own
configs or a broker's dynamic set (rule 44); keys not named keep their value."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.client_metrics import CLIENT_METRICS
from samsa.broker.client_metrics import LIST_DEFAULTS as CLIENT_METRICS_LIST_DEFAULTS
from samsa.broker.dynamic_config import LIST_DEFAULTS
from samsa.broker.group_config import LIST_DEFAULTS as GROUP_LIST_DEFAULTS
from samsa.broker.group_config import check_operations
from samsa.broker.handlers._alter_configs import BROKER, GROUP, alter
from samsa.broker.handlers._base import Body, RequestContext
from samsa.broker.topic_config import apply_incremental
from samsa.protocol.messages import ApiKey

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.INCREMENTAL_ALTER_CONFIGS


def _apply(current: dict[str, str], resource: Any) -> dict[str, str]:
    ops = [(c.name, c.config_operation, c.value) for c in resource.configs]
    if resource.resource_type == BROKER:
        return apply_incremental(current, ops, LIST_DEFAULTS)  # rule 44
    if resource.resource_type == GROUP:
        check_operations(ops)
        return apply_incremental(current, ops, GROUP_LIST_DEFAULTS)
    if resource.resource_type == CLIENT_METRICS:
        return apply_incremental(current, ops, CLIENT_METRICS_LIST_DEFAULTS)
    return apply_incremental(current, ops)


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    return alter(broker, K, ctx.version, request, "IncrementalAlterConfigsResponse", _apply, ctx)
