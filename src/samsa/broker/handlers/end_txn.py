"""EndTxn: commit or abort. Answered once the Prepare record is durable; the markers and the
Complete record follow in the background (rule 16). TV1 only: the epoch is not bumped, so
the response's producer id/epoch (v5) are not used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.END_TXN


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if not authorized(broker, ctx, Op.WRITE, Res.TRANSACTIONAL_ID, request.transactional_id):
        code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED  # rule 33
    else:
        code = broker.transactions.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed
        )
    return encode_response(K, v, make(K, v, "EndTxnResponse", throttle_time=0, error_code=code))
