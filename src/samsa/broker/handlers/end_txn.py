"""EndTxn: commit or abort. Answered once the Prepare record is durable; the markers and the
Complete record follow in the background (rule 16). v5 is transactions v2 (rule 36): the
epoch is bumped at every commit and abort and the response names the client's new producer
id and epoch; v0-4 (TV1) keep the epoch."""

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
    pid = epoch = -1
    if not authorized(broker, ctx, Op.WRITE, Res.TRANSACTIONAL_ID, request.transactional_id):
        code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED  # rule 33
    elif v >= 5:
        result = broker.transactions.end_txn_v2(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed
        )
        code, pid, epoch = result.error, result.producer_id, result.producer_epoch
    else:
        code = broker.transactions.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed
        )
    extra = {"producer_id": pid, "producer_epoch": epoch} if v >= 5 else {}
    return encode_response(
        K, v, make(K, v, "EndTxnResponse", throttle_time=0, error_code=code, **extra)
    )
