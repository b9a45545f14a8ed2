"""AddOffsetsToTxn: add the group's ``__consumer_offsets`` partition to the transaction, so
its TxnOffsetCommit offsets are decided by the transaction's marker (rule 15)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ADD_OFFSETS_TO_TXN


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    tp = broker.groups.offsets_partition(request.group_id)
    # Rule 33: Write on the TransactionalId, then Read on the group.
    if not authorized(broker, ctx, Op.WRITE, Res.TRANSACTIONAL_ID, request.transactional_id):
        tp = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif not authorized(broker, ctx, Op.READ, Res.GROUP, request.group_id):
        tp = ErrorCode.GROUP_AUTHORIZATION_FAILED
    code = (
        tp
        if isinstance(tp, ErrorCode)
        else broker.transactions.add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch, [tp]
        )
    )
    return encode_response(
        K, v, make(K, v, "AddOffsetsToTxnResponse", throttle_time=0, error_code=code)
    )
