"""ApiVersions: which APIs and versions this broker serves."""

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


def _response(version: int, error: ErrorCode) -> bytes:
    entity = make(
        ApiKey.API_VERSIONS,
        version,
        "ApiVersionsResponse",
        error_code=error,
        api_keys=_api_keys(version),
        throttle_time=0,
    )
    return encode_response(ApiKey.API_VERSIONS, version, entity)


def handle(broker: Any, ctx: RequestContext, request: Any) -> Body:
    return _response(ctx.version, ErrorCode.NONE)


def unsupported_version_response() -> bytes:
    """Error 35 in a v0 body, which every client can read, listing what we serve."""
    return _response(0, ErrorCode.UNSUPPORTED_VERSION)
