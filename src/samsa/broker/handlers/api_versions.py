"""ApiVersions: which APIs and versions this broker serves, and (v3+) its features.

The one feature is ``transaction.version`` (KIP-890 part 2): supported 0..2, finalized at the
broker setting of that name. A Java client uses transactions v2 (Produce v12 adding partitions
implicitly, EndTxn v5 bumping the epoch) only when the finalized level is 2.
"""

from __future__ import annotations

from typing import Any

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


TRANSACTION_VERSION = "transaction.version"
MAX_TRANSACTION_VERSION = 2
# Kafka's epoch counts feature changes; the level here changes only with a restart.
FINALIZED_FEATURES_EPOCH = 1


def _features(version: int, transaction_version: int) -> dict[str, Any]:
    if version < 3:
        return {}
    supported = ()
    if version >= 4:  # v3 omits features whose minimum is 0, as Kafka does
        supported = (
            make(
                ApiKey.API_VERSIONS,
                version,
                "SupportedFeatureKey",
                name=TRANSACTION_VERSION,
                min_version=0,
                max_version=MAX_TRANSACTION_VERSION,
            ),
        )
    finalized = ()
    if transaction_version > 0:  # level 0 is the absence of the feature
        finalized = (
            make(
                ApiKey.API_VERSIONS,
                version,
                "FinalizedFeatureKey",
                name=TRANSACTION_VERSION,
                max_version_level=transaction_version,
                min_version_level=transaction_version,
            ),
        )
    return {
        "supported_features": supported,
        "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
        "finalized_features": finalized,
    }


def _response(version: int, error: ErrorCode, transaction_version: int = 0) -> bytes:
    entity = make(
        ApiKey.API_VERSIONS,
        version,
        "ApiVersionsResponse",
        error_code=error,
        api_keys=_api_keys(version),
        throttle_time=0,
        **_features(version, transaction_version),
    )
    return encode_response(ApiKey.API_VERSIONS, version, entity)


def handle(broker: Any, ctx: RequestContext, request: Any) -> Body:
    return _response(ctx.version, ErrorCode.NONE, broker.config.transaction_version)


def unsupported_version_response() -> bytes:
    """Error 35 in a v0 body, which every client can read, listing what we serve."""
    return _response(0, ErrorCode.UNSUPPORTED_VERSION)
