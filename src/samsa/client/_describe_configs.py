"""The DescribeConfigs request, built in one place for the Admin (describe_configs) and the
producer (a topic's max.message.bytes for produce_batch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from samsa.protocol.messages import ApiKey, make_request

# Kafka's ConfigResource.Type codes
TOPIC = 2
BROKER = 4
VERSIONS = (1, 4)  # v1: synonyms; v3: documentation; v4: flexible
REQUEST = "DescribeConfigsRequest"


def describe_configs_body(
    resource_type: int,
    resource_name: str,
    keys: tuple[str, ...] | None = None,
    *,
    include_synonyms: bool,
) -> Callable[[int], dict[str, Any]]:
    """The request's fields for one resource at version ``v`` (as ``Cluster.send`` takes
    them); ``keys`` None asks for every config."""

    def body(v: int) -> dict[str, Any]:
        resource = make_request(
            ApiKey.DESCRIBE_CONFIGS,
            v,
            "DescribeConfigsResource",
            resource_type=resource_type,
            resource_name=resource_name,
            configuration_keys=keys,
        )
        return {
            "resources": (resource,),
            "include_synonyms": include_synonyms,
            "include_documentation": False,
        }

    return body
