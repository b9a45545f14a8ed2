"""UpdateFeatures (KIP-584): change the cluster's finalized feature levels (rule 45).

Needs Alter on the cluster. Every update is checked before any is applied, and the first
refusal (INVALID_UPDATE_VERSION, with Kafka's message) is the top-level answer with no
per-feature results, as Kafka 4 answers; on success v0-1 list each feature with error 0 and v2
lists none. v0's ``allow_downgrade`` is a safe downgrade; v1+ name the ``upgrade_type``.
The domain rules are in :mod:`samsa.broker.features`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.features import SAFE_DOWNGRADE, UPGRADE, FeatureUpdate
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.UPDATE_FEATURES


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    updates = [
        FeatureUpdate(
            u.feature,
            int(u.max_version_level),
            int(u.upgrade_type) if v >= 1 else (SAFE_DOWNGRADE if u.allow_downgrade else UPGRADE),
        )
        for u in request.feature_updates
    ]
    message: str | None
    if not authorized(broker, ctx, Op.ALTER, Res.CLUSTER, CLUSTER_NAME):
        code, message = (
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "UpdateFeatures needs Alter on the cluster",
        )
    else:
        validate_only = bool(getattr(request, "validate_only", False))  # v1+
        code, message = broker.features.update(updates, validate_only)
    fields: dict[str, Any] = {}
    if v < 2:
        names = dict.fromkeys(u.name for u in updates) if code == ErrorCode.NONE else {}
        fields["results"] = tuple(
            make(
                K,
                v,
                "UpdatableFeatureResult",
                feature=n,
                error_code=ErrorCode.NONE,
                error_message=None,
            )
            for n in names
        )
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "UpdateFeaturesResponse",
            throttle_time=0,
            error_code=code,
            error_message=message,
            **fields,
        ),
    )
