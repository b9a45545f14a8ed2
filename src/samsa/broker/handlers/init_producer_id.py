"""InitProducerId without a transactional id: a fresh producer id, epoch 0, every time.

KIP-360 callers (v3+) that send their current producer id and epoch to bump it get a new
producer id as well, which is what Kafka does for a non-transactional producer. Transactional
ids come with the transaction coordinator; until then they are refused with a clear error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.handlers._base import Body, RequestContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.INIT_PRODUCER_ID


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if request.transactional_id is not None:
        code, pid, epoch = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1
    else:
        code, pid, epoch = ErrorCode.NONE, broker.producer_ids.allocate(), 0
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "InitProducerIdResponse",
            throttle_time=0,
            error_code=code,
            producer_id=pid,
            producer_epoch=epoch,
        ),
    )
