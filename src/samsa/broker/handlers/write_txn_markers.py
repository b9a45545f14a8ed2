"""WriteTxnMarkers: write COMMIT or ABORT markers to partitions, as a transaction coordinator
does (rule 16). samsa's own coordinator writes its markers in-process; clients send this for
``kafka-transactions abort`` (KIP-664), which closes a hanging transaction on a partition.

As Kafka's broker: ClusterAction on the cluster is needed (else 31,
CLUSTER_AUTHORIZATION_FAILED, for every partition); an unknown partition answers 3; a marker
from an older producer epoch or coordinator epoch is refused by the log (47
INVALID_PRODUCER_EPOCH, 52 TRANSACTION_COORDINATOR_FENCED) and writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.WRITE_TXN_MARKERS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    allowed = authorized(broker, ctx, Op.CLUSTER_ACTION, Res.CLUSTER, CLUSTER_NAME)
    markers = []
    for m in request.markers:
        topics = []
        for t in m.topics:
            parts = []
            for index in t.partition_indexes:
                if not allowed:
                    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                else:
                    code = broker.write_txn_marker(
                        t.name,
                        index,
                        m.producer_id,
                        m.producer_epoch,
                        m.coordinator_epoch,
                        bool(m.transaction_result),
                    )
                parts.append(
                    make(
                        K,
                        v,
                        "WritableTxnMarkerPartitionResult",
                        partition_index=index,
                        error_code=code,
                    )
                )
            topics.append(
                make(K, v, "WritableTxnMarkerTopicResult", name=t.name, partitions=tuple(parts))
            )
        markers.append(
            make(K, v, "WritableTxnMarkerResult", producer_id=m.producer_id, topics=tuple(topics))
        )
    return encode_response(K, v, make(K, v, "WriteTxnMarkersResponse", markers=tuple(markers)))
