"""ElectLeaders (KIP-460): elect the preferred or an unclean leader of each partition.

samsa is one broker and each partition has one replica, its leader (replication factor 1), so
no election is ever needed: as Kafka's controller answers for a partition that has its
preferred leader (or, for an unclean election, any leader), each named partition gets 84
(ELECTION_NOT_NEEDED), an unknown one 3 (UNKNOWN_TOPIC_OR_PARTITION), and a request for every
partition (``topic_partitions`` null) answers only the partitions where something happened,
that is none. Needs Alter on the cluster (rule 33).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ELECT_LEADERS
PREFERRED, UNCLEAN = 0, 1


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    election_type = int(getattr(request, "election_type", PREFERRED))  # v0: preferred only
    named = request.topic_partitions
    if not authorized(broker, ctx, Op.ALTER, Res.CLUSTER, CLUSTER_NAME):
        top, each = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    elif election_type not in (PREFERRED, UNCLEAN):
        top = each = ErrorCode.INVALID_REQUEST
    else:
        top, each = ErrorCode.NONE, None
    results = []
    for t in named or ():
        topic = broker.topics.topics.get(t.topic)
        parts = []
        for p in t.partitions:
            if each is not None:
                code = each
            elif topic is None or not 0 <= p < len(topic.partitions):
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                code = ErrorCode.ELECTION_NOT_NEEDED
            parts.append(
                make(
                    K,
                    v,
                    "PartitionResult",
                    partition_id=p,
                    error_code=code,
                    error_message=f"No such partition as {t.topic}-{p}"  # Kafka's words
                    if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    else _MESSAGES.get(code),
                )
            )
        results.append(
            make(K, v, "ReplicaElectionResult", topic=t.topic, partition_result=tuple(parts))
        )
    # every partition: none needed an election, so none is listed (as Kafka)
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "ElectLeadersResponse",
            throttle_time=0,
            error_code=top,
            replica_election_results=tuple(results),
        ),
    )


_MESSAGES = {
    ErrorCode.ELECTION_NOT_NEEDED: "the partition's one replica is its leader already",
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: "ElectLeaders needs Alter on the cluster",
    ErrorCode.INVALID_REQUEST: "unknown election type",
}
