"""samsa's Kafka client: an asyncio core with synchronous facades.

``Producer`` / ``AsyncProducer`` (idempotent by default, resumable identity, transactions;
``ResumedTransaction`` finishes a transaction another process opened),
``Consumer`` / ``AsyncConsumer`` and ``Admin`` / ``AsyncAdmin``, configured with
confluent-kafka-style property names. Everything else in this package is private.
"""

from samsa.client._accumulator import BatchMetadata
from samsa.client._admin import (
    AlterConfigOp,
    AsyncAdmin,
    ClientQuotaEntity,
    ClientQuotaFilterComponent,
    ConfigEntry,
    ConfigResource,
    ConfigSynonym,
    DeletedRecords,
    FeatureMetadata,
    FeatureUpdate,
    GroupDescription,
    GroupListing,
    GroupMember,
    UpgradeType,
)
from samsa.client._consumer import AsyncConsumer
from samsa.client._errors import (
    AbortableTransactionError,
    BufferExhaustedError,
    ClosedError,
    ConfigError,
    CorruptRecordError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    LogTruncationError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionStateError,
)
from samsa.client._partitioner import murmur2, partition_for_key
from samsa.client._producer import AsyncProducer
from samsa.client._subscription import OffsetAndEpoch
from samsa.client._sync import Admin, Consumer, Producer, ResumedTransaction
from samsa.client._transactions import AsyncResumedTransaction, TransactionState
from samsa.client._types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    NewTopic,
    PartitionMetadata,
    PreparedTransaction,
    ProducerInfo,
    ProducerState,
    ProducerStats,
    RecordMetadata,
    TopicMetadata,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)

__all__ = [
    "AbortableTransactionError",
    "Admin",
    "AlterConfigOp",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncResumedTransaction",
    "BatchMetadata",
    "BufferExhaustedError",
    "ClientQuotaEntity",
    "ClientQuotaFilterComponent",
    "ClosedError",
    "ConfigEntry",
    "ConfigError",
    "ConfigResource",
    "ConfigSynonym",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "CorruptRecordError",
    "DeletedRecords",
    "FeatureMetadata",
    "FeatureUpdate",
    "GroupDescription",
    "GroupListing",
    "GroupMember",
    "KafkaConnectionError",
    "KafkaError",
    "KafkaTimeoutError",
    "LogTruncationError",
    "NewTopic",
    "OffsetAndEpoch",
    "PartitionMetadata",
    "PreparedTransaction",
    "Producer",
    "ProducerFencedError",
    "ProducerInfo",
    "ProducerState",
    "ProducerStats",
    "RecordMetadata",
    "ResumedTransaction",
    "TopicMetadata",
    "TopicPartition",
    "TransactionAbortedError",
    "TransactionDescription",
    "TransactionListing",
    "TransactionState",
    "TransactionStateError",
    "UpgradeType",
    "murmur2",
    "partition_for_key",
]
