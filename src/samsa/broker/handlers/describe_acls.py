"""DescribeAcls: the bindings a filter matches, grouped by resource pattern (rule 33). Needs
Describe on the cluster, as in Kafka; without an authorizer, SECURITY_DISABLED."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import (
    CLUSTER_NAME,
    AclBinding,
    AclError,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    enum_or_unknown,
)
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_ACLS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    auth = broker.authorizer
    code, message, found = ErrorCode.NONE, None, []
    if auth is None:
        code, message = ErrorCode.SECURITY_DISABLED, "no authorizer is configured"
    elif not authorized(broker, ctx, Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME):
        code, message = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "not authorized"
    else:
        try:
            found = auth.describe(
                acl_filter(
                    request.resource_type_filter,
                    request.resource_name_filter,
                    request.pattern_type_filter,
                    request.principal_filter,
                    request.host_filter,
                    request.operation,
                    request.permission_type,
                )
            )
        except AclError as exc:
            code, message = exc.code, str(exc)
    by_resource: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in found:
        by_resource.setdefault((b.resource_type, b.name, b.pattern_type), []).append(b)
    resources = tuple(
        make(
            K,
            v,
            "DescribeAclsResource",
            resource_type=rtype,
            resource_name=name,
            pattern_type=pattern,
            acls=tuple(
                make(
                    K,
                    v,
                    "AclDescription",
                    principal=b.principal,
                    host=b.host,
                    operation=int(b.operation),
                    permission_type=int(b.permission),
                )
                for b in bindings
            ),
        )
        for (rtype, name, pattern), bindings in by_resource.items()
    )
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "DescribeAclsResponse",
            throttle_time=0,
            error_code=code,
            error_message=message,
            resources=resources,
        ),
    )


def acl_filter(
    rtype: int,
    name: str | None,
    pattern: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission: int,
) -> AclFilter:
    return AclFilter(
        enum_or_unknown(ResourceType, rtype),
        name,
        enum_or_unknown(PatternType, pattern),
        principal,
        host,
        enum_or_unknown(Operation, operation),
        enum_or_unknown(Permission, permission),
    )
