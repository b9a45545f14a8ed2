"""One module per Kafka API; each handler translates a request into domain calls.

The table below is what ApiVersions advertises. Version ranges cover what today's clients
negotiate (confluent-kafka 2.16, kafka-python 3.0, aiokafka 0.14), bounded by what kio's
schemas define.
"""

from __future__ import annotations

from samsa.broker.handlers import (
    api_versions,
    create_topics,
    delete_topics,
    describe_cluster,
    describe_configs,
    describe_producers,
    fetch,
    init_producer_id,
    list_offsets,
    metadata,
    produce,
)
from samsa.broker.handlers._base import Api, RequestContext
from samsa.protocol.messages import ApiKey

APIS: dict[int, Api] = {
    a.key: a
    for a in (
        Api(ApiKey.PRODUCE, 3, 11, produce.handle),
        Api(ApiKey.FETCH, 4, 12, fetch.handle),
        Api(ApiKey.LIST_OFFSETS, 1, 8, list_offsets.handle),
        Api(ApiKey.METADATA, 0, 12, metadata.handle),
        Api(ApiKey.API_VERSIONS, 0, 4, api_versions.handle),
        Api(ApiKey.CREATE_TOPICS, 2, 7, create_topics.handle),
        Api(ApiKey.DELETE_TOPICS, 1, 6, delete_topics.handle),
        Api(ApiKey.INIT_PRODUCER_ID, 0, 5, init_producer_id.handle),
        Api(ApiKey.DESCRIBE_CONFIGS, 1, 4, describe_configs.handle),
        Api(ApiKey.DESCRIBE_CLUSTER, 0, 1, describe_cluster.handle),
        Api(ApiKey.DESCRIBE_PRODUCERS, 0, 0, describe_producers.handle),
    )
}
api_versions.SUPPORTED.update(APIS)

unsupported_api_versions_response = api_versions.unsupported_version_response

__all__ = ["APIS", "Api", "RequestContext", "unsupported_api_versions_response"]
