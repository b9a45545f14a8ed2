"""samsa's Kafka client: an asyncio core with synchronous facades.

``Producer`` / ``AsyncProducer`` (idempotent by default, resumable identity),
``Consumer`` / ``AsyncConsumer`` and ``Admin`` / ``AsyncAdmin``, configured with
confluent-kafka-style property names. Everything else in this package is private.
"""

from samsa.client._admin import AsyncAdmin, GroupDescription, GroupListing, GroupMember
from samsa.client._consumer import AsyncConsumer
from samsa.client._errors import (
    ClosedError,
    ConfigError,
    CorruptRecordError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
)
from samsa.client._partitioner import murmur2, partition_for_key
from samsa.client._producer import AsyncProducer
from samsa.client._sync import Admin, Consumer, Producer
from samsa.client._types import (
    ConsumerRecord,
    NewTopic,
    PartitionMetadata,
    ProducerInfo,
    ProducerState,
    RecordMetadata,
    TopicMetadata,
    TopicPartition,
)

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "ClosedError",
    "ConfigError",
    "Consumer",
    "ConsumerRecord",
    "CorruptRecordError",
    "GroupDescription",
    "GroupListing",
    "GroupMember",
    "KafkaConnectionError",
    "KafkaError",
    "KafkaTimeoutError",
    "NewTopic",
    "PartitionMetadata",
    "Producer",
    "ProducerFencedError",
    "ProducerInfo",
    "ProducerState",
    "RecordMetadata",
    "TopicMetadata",
    "TopicPartition",
    "murmur2",
    "partition_for_key",
]
