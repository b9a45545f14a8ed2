"""DescribeProducers (KIP-664): the producer state of each partition, for tooling."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_PRODUCERS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    topics = []
    for t in request.topics:
        parts = []
        readable = authorized(broker, ctx, Op.READ, Res.TOPIC, t.name)  # rule 33, as Kafka
        for index in t.partition_indexes:
            partition = broker.topics.get_partition(t.name, index) if readable else None
            if partition is None:
                parts.append(
                    make(
                        K,
                        v,
                        "PartitionResponse",
                        partition_index=index,
                        error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        if readable
                        else ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        error_message=f"unknown partition {t.name}-{index}"
                        if readable
                        else f"not authorized to Read {t.name}",
                        active_producers=(),
                    )
                )
                continue
            producers = tuple(
                make(
                    K,
                    v,
                    "ProducerState",
                    producer_id=e.producer_id,
                    producer_epoch=e.epoch,
                    last_sequence=e.last_seq,
                    last_timestamp=e.last_timestamp_ms,
                    coordinator_epoch=e.coordinator_epoch,
                    current_txn_start_offset=-1
                    if e.current_txn_first_offset is None
                    else e.current_txn_first_offset,
                )
                for e in sorted(partition.log.producer_state.entries(), key=lambda e: e.producer_id)
            )
            parts.append(
                make(
                    K,
                    v,
                    "PartitionResponse",
                    partition_index=index,
                    error_code=ErrorCode.NONE,
                    error_message=None,
                    active_producers=producers,
                )
            )
        topics.append(make(K, v, "TopicResponse", name=t.name, partitions=tuple(parts)))
    return encode_response(
        K, v, make(K, v, "DescribeProducersResponse", throttle_time=0, topics=tuple(topics))
    )
