"""AlterConfigs (the legacy API): a topic's own configs, or a broker's dynamic set (rule 44),
become exactly the given set; keys left out go back to their inherited value, as in Kafka."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._alter_configs import alter
from samsa.broker.handlers._base import Body, RequestContext
from samsa.broker.topic_config import InvalidConfigError
from samsa.protocol.messages import ApiKey

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ALTER_CONFIGS


def _replace(current: dict[str, str], resource: Any) -> dict[str, str]:
    out = {}
    for c in resource.configs:
        if c.value is None:
            raise InvalidConfigError(f"config {c.name} has no value")
        out[c.name] = c.value
    return out


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    return alter(broker, K, ctx.version, request, "AlterConfigsResponse", _replace, ctx)
