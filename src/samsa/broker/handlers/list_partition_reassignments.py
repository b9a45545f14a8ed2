"""ListPartitionReassignments (KIP-455): the partitions being moved between brokers.

samsa is one broker and each partition has its one replica there, so nothing is ever being
reassigned: as Kafka's controller answers, the list is empty, whether every partition is asked
for (``topics`` null) or some are named; named topics or partitions that do not exist are
skipped without an error, as Kafka's controller skips them. Needs Describe on the cluster
(else 31, CLUSTER_AUTHORIZATION_FAILED, at the top level).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.LIST_PARTITION_REASSIGNMENTS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if authorized(broker, ctx, Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME):
        code, message = ErrorCode.NONE, None
    else:
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        message = "ListPartitionReassignments needs Describe on the cluster"
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "ListPartitionReassignmentsResponse",
            throttle_time=0,
            error_code=code,
            error_message=message,
            topics=(),  # no reassignment is ever in progress on one broker
        ),
    )
