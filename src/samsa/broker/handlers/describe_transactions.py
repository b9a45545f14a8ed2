"""DescribeTransactions: state, producer id/epoch, timeout, start time and partitions of
transactional ids (TRANSACTIONAL_ID_NOT_FOUND for unknown ones)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_TRANSACTIONS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    states = []
    for d in broker.transactions.describe(request.transactional_ids):
        by_topic: dict[str, list[int]] = {}
        for topic, p in d.partitions:
            by_topic.setdefault(topic, []).append(p)
        states.append(
            make(
                K,
                v,
                "TransactionState",
                error_code=d.error,
                transactional_id=d.transactional_id,
                transaction_state=d.state,
                transaction_timeout=d.timeout_ms,
                transaction_start_time=_datetime(d.start_timestamp_ms),
                producer_id=d.producer_id,
                producer_epoch=d.producer_epoch,
                topics=tuple(
                    make(K, v, "TopicData", topic=t, partitions=tuple(ps))
                    for t, ps in by_topic.items()
                ),
            )
        )
    return encode_response(
        K,
        v,
        make(
            K, v, "DescribeTransactionsResponse", throttle_time=0, transaction_states=tuple(states)
        ),
    )


def _datetime(ms: int) -> datetime.datetime:
    # kio's datetime_i64 is an aware datetime; -1 (no transaction) is the epoch minus 1 ms.
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
