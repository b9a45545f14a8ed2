"""DeleteAcls: remove the bindings each filter matches, durably (rule 33). Needs Alter on the
cluster, as in Kafka; without an authorizer, SECURITY_DISABLED."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME, AclBinding, AclError
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.handlers.describe_acls import acl_filter
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DELETE_ACLS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    auth = broker.authorizer
    n = len(request.filters)
    outcome: list[list[AclBinding] | AclError]
    if auth is None:
        outcome = [AclError("no authorizer is configured", ErrorCode.SECURITY_DISABLED)] * n
    elif not authorized(broker, ctx, Op.ALTER, Res.CLUSTER, CLUSTER_NAME):
        refused = AclError(
            "not authorized to Alter the cluster", ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        )
        outcome = [refused] * n
    else:
        try:
            outcome = auth.delete(
                [
                    acl_filter(
                        f.resource_type_filter,
                        f.resource_name_filter,
                        f.pattern_type_filter,
                        f.principal_filter,
                        f.host_filter,
                        f.operation,
                        f.permission_type,
                    )
                    for f in request.filters
                ]
            )
        except OSError as exc:  # nothing was removed
            outcome = [AclError(f"cannot store ACLs: {exc}", ErrorCode.KAFKA_STORAGE_ERROR)] * n
    results = tuple(
        make(
            K,
            v,
            "DeleteAclsFilterResult",
            error_code=o.code if isinstance(o, AclError) else ErrorCode.NONE,
            error_message=str(o) if isinstance(o, AclError) else None,
            matching_acls=()
            if isinstance(o, AclError)
            else tuple(
                make(
                    K,
                    v,
                    "DeleteAclsMatchingAcl",
                    error_code=ErrorCode.NONE,
                    error_message=None,
                    resource_type=int(b.resource_type),
                    resource_name=b.name,
                    pattern_type=int(b.pattern_type),
                    principal=b.principal,
                    host=b.host,
                    operation=int(b.operation),
                    permission_type=int(b.permission),
                )
                for b in o
            ),
        )
        for o in outcome
    )
    return encode_response(
        K, v, make(K, v, "DeleteAclsResponse", throttle_time=0, filter_results=results)
    )
