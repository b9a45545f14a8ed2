"""DeleteRecords (KIP-107): move each partition's log start offset up; answer the new one."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DELETE_RECORDS
log = logging.getLogger(__name__)


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    results: list[tuple[str, list[tuple[int, ErrorCode, int]]]] = []
    try:
        # The moved starts are checkpointed once, for all the partitions, before the answer.
        with broker.topics.log_dir.grouped_log_starts():
            for t in request.topics:
                deletable = authorized(broker, ctx, Op.DELETE, Res.TOPIC, t.name)  # rule 33
                parts = []
                for p in t.partitions:
                    code, low = (
                        broker.topics.delete_records(t.name, p.partition_index, p.offset)
                        if deletable
                        else (ErrorCode.TOPIC_AUTHORIZATION_FAILED, -1)
                    )
                    parts.append((p.partition_index, code, low))
                results.append((t.name, parts))
    except OSError as exc:
        log.error("DeleteRecords: cannot checkpoint the log start offsets: %s", exc)
        # Moved in memory but not durable: the client cannot count on them (retried at
        # the next checkpoint or at close).
        failed = ErrorCode.KAFKA_STORAGE_ERROR
        results = [
            (
                name,
                [
                    (i, failed, -1) if code == ErrorCode.NONE else (i, code, low)
                    for i, code, low in parts
                ],
            )
            for name, parts in results
        ]
    topics = [
        make(
            K,
            v,
            "DeleteRecordsTopicResult",
            name=name,
            partitions=tuple(
                make(
                    K,
                    v,
                    "DeleteRecordsPartitionResult",
                    partition_index=index,
                    low_watermark=low,
                    error_code=code,
                )
                for index, code, low in parts
            ),
        )
        for name, parts in results
    ]
    return encode_response(
        K, v, make(K, v, "DeleteRecordsResponse", throttle_time=0, topics=tuple(topics))
    )
