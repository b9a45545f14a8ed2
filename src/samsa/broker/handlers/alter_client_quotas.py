"""AlterClientQuotas (KIP-546): set or remove client quotas, per entity.

As Kafka: AlterConfigs on the cluster is needed (else 31 for every entity); each entity is
checked on its own (42, INVALID_REQUEST, with Kafka's message: an unknown or repeated entity
type, ip with another type, a key the entity cannot have, a fractional byte rate, a key twice);
the entities that pass are stored together, on disk before the answer (broker/quotas.py), and
apply from the next request. ``validate_only`` checks and stores nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.quotas import Entity, QuotaError, check_value, entity_of
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.ALTER_CLIENT_QUOTAS
log = logging.getLogger("samsa.quotas")


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    allowed = authorized(broker, ctx, Op.ALTER_CONFIGS, Res.CLUSTER, CLUSTER_NAME)
    outcomes: list[tuple[int, str | None]] = []
    accepted: list[tuple[Entity, dict[str, float | None]]] = []
    where: list[int] = []  # index in outcomes of each accepted alteration
    for entry in request.entries:
        if not allowed:
            outcomes.append((ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None))
            continue
        try:
            entity = entity_of((e.entity_type, e.entity_name) for e in entry.entity)
            ops: dict[str, float | None] = {}
            for op in entry.ops:
                if op.key in ops:
                    raise QuotaError(f"Duplicate quota key {op.key}")
                if not op.remove:
                    check_value(entity, op.key, op.value)
                ops[op.key] = None if op.remove else op.value
        except QuotaError as exc:
            outcomes.append((ErrorCode.INVALID_REQUEST, str(exc)))
            continue
        where.append(len(outcomes))
        outcomes.append((ErrorCode.NONE, None))
        accepted.append((entity, ops))
    if accepted:
        try:
            broker.quotas.alter(accepted, validate_only=request.validate_only)
        except QuotaError as exc:
            for i in where:
                outcomes[i] = (ErrorCode.POLICY_VIOLATION, str(exc))
        except OSError as exc:
            log.error("cannot write the client quotas: %s", exc)
            for i in where:
                outcomes[i] = (ErrorCode.KAFKA_STORAGE_ERROR, "cannot write the client quotas")
        else:
            if not request.validate_only:
                log.info("client quotas altered: %s", accepted)
    return _response(ctx, request, outcomes)


def _response(ctx: RequestContext, request: Any, outcomes: list[tuple[int, str | None]]) -> Body:
    return encode_response(
        K,
        ctx.version,
        make(
            K,
            ctx.version,
            "AlterClientQuotasResponse",
            throttle_time=0,
            entries=tuple(
                make(
                    K,
                    ctx.version,
                    "EntryData",
                    error_code=code,
                    error_message=message,
                    entity=tuple(
                        make(
                            K,
                            ctx.version,
                            "EntityData",
                            entity_type=e.entity_type,
                            entity_name=e.entity_name,
                        )
                        for e in entry.entity
                    ),
                )
                for entry, (code, message) in zip(request.entries, outcomes, strict=True)
            ),
        ),
    )
