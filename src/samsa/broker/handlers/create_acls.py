"""CreateAcls: store ACL bindings, durably, effective at once (rule 33). Needs Alter on the
cluster, as in Kafka; without an authorizer, SECURITY_DISABLED."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import (
    CLUSTER_NAME,
    AclBinding,
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

K = ApiKey.CREATE_ACLS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    auth = broker.authorizer
    results: list[tuple[ErrorCode, str | None]]
    if auth is None:
        results = [(ErrorCode.SECURITY_DISABLED, "no authorizer is configured")] * len(
            request.creations
        )
    elif not authorized(broker, ctx, Op.ALTER, Res.CLUSTER, CLUSTER_NAME):
        results = [(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "not authorized to Alter the cluster")]
        results *= len(request.creations)
    else:
        try:
            outcome = auth.create([binding(c) for c in request.creations])
            results = [(ErrorCode.NONE, None) if e is None else (e.code, str(e)) for e in outcome]
        except OSError as exc:  # nothing was stored
            results = [(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot store ACLs: {exc}")]
            results *= len(request.creations)
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "CreateAclsResponse",
            throttle_time=0,
            results=tuple(
                make(K, v, "AclCreationResult", error_code=code, error_message=message)
                for code, message in results
            ),
        ),
    )


def binding(c: Any) -> AclBinding:
    return AclBinding(
        enum_or_unknown(ResourceType, c.resource_type),
        c.resource_name,
        enum_or_unknown(PatternType, c.resource_pattern_type),
        c.principal,
        c.host,
        enum_or_unknown(Operation, c.operation),
        enum_or_unknown(Permission, c.permission_type),
    )
