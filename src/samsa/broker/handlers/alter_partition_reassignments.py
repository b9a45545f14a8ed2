"""AlterPartitionReassignments (KIP-455; v1 adds KIP-860's allow_replication_factor_change).

samsa is one broker and each partition has its one replica there. As Kafka's controller
(``ReplicationControlManager.alterPartitionReassignments``) answers each partition named: an
unknown topic or partition gets 3 (UNKNOWN_TOPIC_OR_PARTITION); a null target (cancel) gets 85
(NO_REASSIGNMENT_IN_PROGRESS), since none ever is; with ``allow_replication_factor_change``
false, a target of another length than the current one replica gets 38
(INVALID_REPLICATION_FACTOR); an empty target, one naming a broker that is not registered
(any id but ours) or naming a broker twice gets 39 (INVALID_REPLICA_ASSIGNMENT); a target
equal to the current replicas (``[node id]``) is accepted (0) and changes nothing. Needs Alter
on the cluster (else 31, CLUSTER_AUTHORIZATION_FAILED, at the top level and for every
partition, as Kafka's error response).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ALTER_PARTITION_REASSIGNMENTS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    allow_rf_change = bool(getattr(request, "allow_replication_factor_change", True))
    refused: tuple[ErrorCode, str] | None = None
    if not authorized(broker, ctx, Op.ALTER, Res.CLUSTER, CLUSTER_NAME):
        refused = (
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "AlterPartitionReassignments needs Alter on the cluster",
        )
    responses = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            code, message = refused or _check(broker, t.name, p, allow_rf_change)
            parts.append(
                make(
                    K,
                    v,
                    "ReassignablePartitionResponse",
                    partition_index=p.partition_index,
                    error_code=code,
                    error_message=message,
                )
            )
        responses.append(
            make(K, v, "ReassignableTopicResponse", name=t.name, partitions=tuple(parts))
        )
    top, top_message = refused or (ErrorCode.NONE, None)
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "AlterPartitionReassignmentsResponse",
            throttle_time=0,
            allow_replication_factor_change=allow_rf_change,
            error_code=top,
            error_message=top_message,
            responses=tuple(responses),
        ),
    )


def _check(
    broker: Broker, topic_name: str, p: Any, allow_rf_change: bool
) -> tuple[ErrorCode, str | None]:
    """One partition's answer, in the order of Kafka's controller checks."""
    topic = broker.topics.topics.get(topic_name)
    index = int(p.partition_index)
    if topic is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find a topic named {topic_name}."
    if not 0 <= index < len(topic.partitions):
        return (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"Unable to find partition {topic_name}:{index}.",
        )
    target = p.replicas
    if target is None:
        return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress."
    current = (broker.node_id,)
    if not allow_rf_change and len(target) != len(current):
        return (
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"The replication factor is changed from {len(current)} to {len(target)}",
        )
    if not target:
        return ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The target replica list is empty."
    previous = None
    for broker_id in sorted(target):
        if broker_id != broker.node_id:
            return (
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"The target includes broker {broker_id}, which is not registered.",
            )
        if broker_id == previous:
            return (
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"The target includes broker {broker_id} more than once.",
            )
        previous = broker_id
    return ErrorCode.NONE, None  # the target is the current replica set: nothing to move
