"""IncrementalAlterConfigs (KIP-339): SET, DELETE, APPEND and SUBTRACT on a topic's own
configs; keys not named keep their value."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._alter_configs import alter
from samsa.broker.handlers._base import Body, RequestContext
from samsa.broker.topic_config import apply_incremental
from samsa.protocol.messages import ApiKey

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.INCREMENTAL_ALTER_CONFIGS


def _apply(current: dict[str, str], resource: Any) -> dict[str, str]:
    return apply_incremental(
        current, [(c.name, c.config_operation, c.value) for c in resource.configs]
    )


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    return alter(broker, K, ctx.version, request, "IncrementalAlterConfigsResponse", _apply, ctx)
