"""ListGroups: every group this coordinator knows, classic, consumer (KIP-848) and share
(KIP-932, protocol type "share") ones (v4+ filter by state, v5+ by type)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.LIST_GROUPS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    # Rule 33: Describe on the cluster lists every group, else those the principal may Describe.
    everything = authorized(broker, ctx, Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME)
    states = list(getattr(request, "states_filter", ()) or ())
    # As Kafka: no listing while some groups are still being loaded (it would miss them).
    error = broker.groups.loading()
    listed: list[tuple[str, str, str, str]] = []
    if not error:
        coord = broker.groups
        listed += [(gid, pt, state, "classic") for gid, pt, state in coord.list_groups(states)]
        listed += [
            (gid, "consumer", state, "consumer")
            for gid, state in coord.list_consumer_groups(states)
        ]
        listed += [(gid, "share", state, "share") for gid, state in coord.list_share_groups(states)]
    groups = tuple(
        make(
            K,
            v,
            "ListedGroup",
            group_id=gid,
            protocol_type=ptype,
            group_state=state,
            group_type=gtype,
        )
        for gid, ptype, state, gtype in listed
        if (not types or gtype in types)
        and (everything or authorized(broker, ctx, Op.DESCRIBE, Res.GROUP, gid))
    )
    return encode_response(
        K,
        v,
        make(K, v, "ListGroupsResponse", throttle_time=0, error_code=error, groups=groups),
    )
