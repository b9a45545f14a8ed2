"""ListTransactions: transactional ids with their producer id and state, filtered by state
names, producer ids, (v1) minimum running duration and (v2) a transactional id pattern."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.LIST_TRANSACTIONS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    error, unknown, listings = broker.transactions.list(
        request.state_filters,
        request.producer_id_filters,
        getattr(request, "duration_filter", -1),
        getattr(request, "transactional_id_pattern", None),
    )
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "ListTransactionsResponse",
            throttle_time=0,
            error_code=error,
            unknown_state_filters=tuple(unknown),
            transaction_states=tuple(
                make(
                    K,
                    v,
                    "TransactionState",
                    transactional_id=t.transactional_id,
                    producer_id=t.producer_id,
                    transaction_state=t.state,
                )
                for t in listings
                # Rule 33: only the TransactionalIds the principal may Describe.
                if authorized(broker, ctx, Op.DESCRIBE, Res.TRANSACTIONAL_ID, t.transactional_id)
            ),
        ),
    )
