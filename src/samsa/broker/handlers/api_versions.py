"""ApiVersions: which APIs and versions this broker serves, and (v3+) its features.

The features are ``transaction.version`` (KIP-890 part 2, supported 0..2) and ``group.version``
(KIP-848, 0..1, finalized at 1), at the levels and epoch of :mod:`samsa.broker.features`,
which UpdateFeatures changes (rule 45): every answer after a change reports the new level. A
Java client uses transactions v2 (Produce v12 adding partitions implicitly, EndTxn v5 bumping
the epoch) only when the finalized ``transaction.version`` is 2.
"""

from __future__ import annotations

from typing import Any

from samsa.broker.features import SUPPORTED as SUPPORTED_FEATURES
from samsa.broker.features import Features
from samsa.broker.handlers._base import Api, Body, RequestContext
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

# Filled by handlers/__init__.py once every API is registered.
SUPPORTED: dict[int, Api] = {}


def _api_keys(version: int) -> tuple[Any, ...]:
    return tuple(
        make(
            ApiKey.API_VERSIONS,
            version,
            "ApiVersion",
            api_key=a.key,
            min_version=a.min_version,
            max_version=a.max_version,
        )
        for a in sorted(SUPPORTED.values(), key=lambda a: a.key)
    )


def _features(version: int, features: Features | None) -> dict[str, Any]:
    if version < 3 or features is None:
        return {}
    supported = tuple(
        make(
            ApiKey.API_VERSIONS,
            version,
            "SupportedFeatureKey",
            name=name,
            min_version=lo,
            max_version=hi,
        )
        for name, (lo, hi) in sorted(SUPPORTED_FEATURES.items())
        if version >= 4 or lo > 0  # v3 omits features whose minimum is 0, as Kafka does
    )
    finalized = tuple(
        make(
            ApiKey.API_VERSIONS,
            version,
            "FinalizedFeatureKey",
            name=name,
            max_version_level=level,
            min_version_level=level,
        )
        for name, level in sorted(features.finalized.items())
        if level > 0  # level 0 is the absence of the feature
    )
    return {
        "supported_features": supported,
        "finalized_features_epoch": features.epoch,
        "finalized_features": finalized,
    }


def _response(version: int, error: ErrorCode, features: Features | None = None) -> bytes:
    entity = make(
        ApiKey.API_VERSIONS,
        version,
        "ApiVersionsResponse",
        error_code=error,
        api_keys=_api_keys(version),
        throttle_time=0,
        **_features(version, features),
    )
    return encode_response(ApiKey.API_VERSIONS, version, entity)


def handle(broker: Any, ctx: RequestContext, request: Any) -> Body:
    return _response(ctx.version, ErrorCode.NONE, broker.features)


def unsupported_version_response() -> bytes:
    """Error 35 in a v0 body, which every client can read, listing what we serve."""
    return _response(0, ErrorCode.UNSUPPORTED_VERSION)
