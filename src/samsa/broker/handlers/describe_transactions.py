"""DescribeTransactions: state, producer id/epoch, timeout, start time and partitions of
transactional ids (TRANSACTIONAL_ID_NOT_FOUND for unknown ones)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized, authorized_names
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_TRANSACTIONS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    states = []
    # Rule 33: Describe on each TransactionalId; only topics the principal may Describe.
    ids = list(request.transactional_ids)
    allowed = authorized_names(broker, ctx, Op.DESCRIBE, Res.TRANSACTIONAL_ID, ids)
    described = {d.transactional_id: d for d in broker.transactions.describe(allowed)}
    for txn_id in ids:
        d = described.get(txn_id)
        by_topic: dict[str, list[int]] = {}
        if d is None:
            states.append(
                make(
                    K,
                    v,
                    "TransactionState",
                    error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    transactional_id=txn_id,
                    transaction_state="",
                    transaction_timeout=0,
                    transaction_start_time=_datetime(0),  # Kafka leaves it 0
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=(),
                )
            )
            continue
        for topic, p in d.partitions:
            if authorized(broker, ctx, Op.DESCRIBE, Res.TOPIC, topic):
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
