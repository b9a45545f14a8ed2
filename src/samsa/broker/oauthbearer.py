"""SASL/OAUTHBEARER on the broker (RFC 7628, KIP-255, KIP-768): the client's initial
response, the two token validators Kafka ships, and the JWKS the signed one checks against.

The exchange is Kafka's: the client sends ``n,[a=authzid],\\x01auth=Bearer <jwt>\\x01...\\x01``.
A good token completes it; a refused one is answered (without an error) by the RFC 7628 JSON
status, ``{"status":"invalid_token"}``, the client then sends a lone ``\\x01`` and only that
gets SASL_AUTHENTICATION_FAILED, carrying the same JSON. Why a token was refused goes to the
broker's log, not to the client (as Kafka).

- Without ``sasl.oauthbearer.jwks.endpoint.url``: Kafka's default unsecured validator: the
  JWT's ``alg`` must be ``none`` and its signature empty; for tests and development only.
- With it: KIP-768's validator: a signed JWT (never ``none``) checked by PyJWT against the
  keys of the JWKS, with ``exp`` and ``iat`` required, expected audience/issuer, clock skew,
  the principal from ``sasl.oauthbearer.sub.claim.name``.

The JWKS is read from a ``file://`` path or fetched from ``http://`` on loopback, at most
``JWKS_MAX_BYTES`` and ``JWKS_FETCH_TIMEOUT_S``, in a worker thread, before the listener
serves and every ``sasl.oauthbearer.jwks.endpoint.refresh.ms`` after; a token naming a key id
the set lacks asks for an early refresh (at most one per ``JWKS_MIN_REFRESH_S``) and is
refused meanwhile, as Kafka's RefreshingHttpsJwks does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from samsa.broker.config import BrokerConfig
from samsa.protocol.sasl import SaslError, ServerMechanism

if TYPE_CHECKING:
    import jwt

log = logging.getLogger(__name__)

OAUTHBEARER = "OAUTHBEARER"
JWKS_MAX_BYTES = 1 << 20
JWKS_FETCH_TIMEOUT_S = 10.0
JWKS_MIN_REFRESH_S = 1.0  # between refreshes a client's unknown key id may ask for
JWKS_RETRY_BACKOFF_S = (0.1, 10.0)  # Kafka's jwks.endpoint.retry.backoff(.max).ms defaults
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# Never "none" (RFC 8725 3.1), nor HMAC: a JWKS holds public keys.
SIGNED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"}
)

_SEPARATOR = "\x01"
# RFC 7628 section 3.1 as Kafka's OAuthBearerClientInitialResponse reads it.
_SASLNAME = r"(?:[\x01-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+"
_INITIAL_RESPONSE = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,{_SEPARATOR}"
    rf"(?P<kvpairs>(?:[A-Za-z]+=[\x21-\x7E \t\r\n]+{_SEPARATOR})*){_SEPARATOR}"
)
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_.a-zA-Z0-9]+)")


@dataclass(frozen=True, slots=True)
class BearerToken:
    principal: str
    expires_ms: int  # the token's exp, in ms since the epoch: the credential's end (KIP-368)
    scope: frozenset[str] = frozenset()


class TokenRefused(Exception):
    """A token the validator does not accept; the message says why (for the broker's log)."""

    def __init__(self, reason: str, scope: str | None = None) -> None:
        super().__init__(reason)
        self.scope = scope

    def status_json(self) -> str:
        """RFC 7628 section 3.2.2's error, as Kafka writes it."""
        status = "insufficient_scope" if self.scope is not None else "invalid_token"
        out = f'{{"status":"{status}"'
        if self.scope is not None:
            out += f', "scope":"{self.scope}"'
        return out + "}"


class AuthenticationRefused(SaslError):
    """SaslError whose ``detail`` says more than the client is told."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class TokenValidator(Protocol):
    def validate(self, token: str) -> BearerToken: ...


def parse_initial_response(data: bytes) -> tuple[str, str]:
    """(authorization id, token) of a client's initial response; SaslError if malformed."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslError("Invalid OAUTHBEARER client first message: not UTF-8") from None
    m = _INITIAL_RESPONSE.fullmatch(text)
    if m is None:
        raise SaslError("Invalid OAUTHBEARER client first message")
    pairs = dict(
        kv.split("=", 1) for kv in m.group("kvpairs").split(_SEPARATOR) if kv
    )  # extensions other than auth are accepted and ignored, as by Kafka's validators
    auth = pairs.get("auth")
    if auth is None:
        raise SaslError("Invalid OAUTHBEARER client first message: 'auth' not specified")
    a = _AUTH.fullmatch(auth)
    if a is None:
        raise SaslError("Invalid OAUTHBEARER client first message: invalid 'auth' format")
    if a.group("scheme").lower() != "bearer":
        raise SaslError(f"Invalid scheme in OAUTHBEARER client first message: {a['scheme']}")
    authzid = (m.group("authzid") or "").replace("=2C", ",").replace("=3D", "=")
    return authzid, a.group("token")


def _scope(value: Any) -> frozenset[str]:
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list):
        return frozenset(str(v) for v in value)
    return frozenset()


def _b64_json(part: str) -> dict[str, Any]:
    try:
        doc = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (binascii.Error, ValueError):
        raise TokenRefused("malformed Base64 URL encoded value or JSON") from None
    if not isinstance(doc, dict):
        raise TokenRefused("malformed JSON")
    return doc


def _number(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise TokenRefused(f"The '{name}' claim was not of type Number: {value!r}")
    return value


class UnsecuredValidator:
    """Kafka's OAuthBearerUnsecuredValidatorCallbackHandler: an unsigned JWT (``alg`` none,
    empty signature) with ``exp`` and the principal claim; ``iat`` if present must not be in
    the future, the required scope must be in the token's."""

    def __init__(
        self,
        principal_claim: str = "sub",
        scope_claim: str = "scope",
        required_scope: Iterable[str] = (),
        clock_skew_ms: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.principal_claim = principal_claim.strip() or "sub"
        self.scope_claim = scope_claim.strip() or "scope"
        self.required_scope = list(required_scope)
        self.clock_skew_ms = clock_skew_ms
        self.clock = clock

    def validate(self, token: str) -> BearerToken:
        if ".." in token:
            raise TokenRefused("Malformed compact serialization contains '..'")
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenRefused(
                "Unsecured JWS compact serializations must have 3 dot-separated "
                "Base64URL-encoded values"
            )
        header, claims = _b64_json(parts[0]), _b64_json(parts[1])
        if header.get("alg") != "none":
            raise TokenRefused("Unsecured JWS must have 'none' for an algorithm")
        if parts[2]:
            raise TokenRefused("Unsecured JWS must not contain a digital signature")
        exp, iat = _number(claims, "exp"), _number(claims, "iat")
        if exp is None:
            raise TokenRefused("No expiration time in JWT")
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal:
            raise TokenRefused(f"No principal name in JWT claim: {self.principal_claim}")
        now_ms, skew = int(self.clock() * 1000), self.clock_skew_ms
        if iat is not None and 1000 * iat > now_ms + skew:
            raise TokenRefused(
                f"The Issued At value ({iat:f} seconds) was after the indicated time "
                f"({now_ms} ms) plus allowable clock skew ({skew} ms)"
            )
        if now_ms - skew >= 1000 * exp:
            raise TokenRefused(
                f"The indicated time ({now_ms} ms) minus allowable clock skew ({skew} ms) was "
                f"on or after the Expiration Time value ({exp:f} seconds)"
            )
        if iat is not None and exp <= iat:
            raise TokenRefused(
                f"The Expiration Time time ({exp:f} seconds) was not after the Issued At "
                f"time ({iat:f} seconds)"
            )
        scope = _scope(claims.get(self.scope_claim))
        for wanted in self.required_scope:
            if wanted not in scope:
                # Java's List.toString, as Kafka puts it in the JSON status
                raise TokenRefused(
                    f"The provided scope ({sorted(scope)}) was missing a required scope "
                    f"({wanted}). All required scope elements: {self.required_scope}",
                    scope=f"[{', '.join(self.required_scope)}]",
                )
        return BearerToken(principal, int(exp * 1000), scope)


def check_jwks_url(url: str) -> None:
    """ValueError unless ``url`` is a file:// path or an http:// URL on loopback."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        return
    if parsed.scheme == "http" and parsed.hostname in LOOPBACK_HOSTS:
        return
    raise ValueError(
        f"sasl.oauthbearer.jwks.endpoint.url must be file:// or http:// on loopback "
        f"(127.0.0.1, localhost, ::1), got {url!r}"
    )


def _fetch(url: str) -> bytes:
    """The JWKS document, at most JWKS_MAX_BYTES; OSError or ValueError on failure."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        with open(urllib.parse.unquote(parsed.path), "rb") as f:
            data = f.read(JWKS_MAX_BYTES + 1)
    else:
        from urllib import request  # here: http.client and email cost every broker start

        opener = request.build_opener(request.ProxyHandler({}))  # loopback only
        with opener.open(url, timeout=JWKS_FETCH_TIMEOUT_S) as resp:
            data = resp.read(JWKS_MAX_BYTES + 1)
    if len(data) > JWKS_MAX_BYTES:
        raise ValueError(f"JWKS larger than {JWKS_MAX_BYTES} bytes")
    return data


class Jwks:
    """The key set of ``sasl.oauthbearer.jwks.endpoint.url``, refreshed in the background."""

    def __init__(self, url: str, refresh_ms: int) -> None:
        check_jwks_url(url)
        self.url = url
        self.refresh_s = refresh_ms / 1000
        self.keys: list[jwt.PyJWK] | None = None  # None: never fetched successfully
        self.fetched_at = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def load(self, data: bytes) -> None:
        import jwt  # PyJWT (and its crypto) only where OAUTHBEARER is on: ~45 ms of start-up

        try:
            doc = json.loads(data)
            keys = [k for k in jwt.PyJWKSet.from_dict(doc).keys if k.public_key_use != "enc"]
        except (ValueError, TypeError, jwt.PyJWKSetError) as exc:
            raise ValueError(f"bad JWKS: {exc}") from None
        self.keys = keys
        self.fetched_at = time.monotonic()

    async def refresh(self) -> None:
        data = await asyncio.wait_for(asyncio.to_thread(_fetch, self.url), JWKS_FETCH_TIMEOUT_S)
        self.load(data)

    async def start(self) -> None:
        """The first fetch (so tokens are checked from the start), then the refresher."""
        try:
            await self.refresh()
            log.info("OAUTHBEARER: %d keys from %s", len(self.keys or ()), self.url)
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("OAUTHBEARER: cannot read the JWKS %s (retrying): %s", self.url, exc)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def expedite(self) -> None:
        """A token named a key id the set lacks: refresh soon (rate-limited)."""
        self._wake.set()

    async def _run(self) -> None:
        backoff = JWKS_RETRY_BACKOFF_S[0]
        while True:
            wait = self.refresh_s if self.keys is not None else backoff
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass
            self._wake.clear()
            since = time.monotonic() - self.fetched_at
            if since < JWKS_MIN_REFRESH_S:
                await asyncio.sleep(JWKS_MIN_REFRESH_S - since)
            try:
                await self.refresh()
                backoff = JWKS_RETRY_BACKOFF_S[0]
            except (OSError, ValueError, TimeoutError) as exc:
                backoff = min(backoff * 2, JWKS_RETRY_BACKOFF_S[1])
                log.warning("OAUTHBEARER: cannot refresh the JWKS %s: %s", self.url, exc)


class JwtValidator:
    """KIP-768's OAuthBearerValidatorCallbackHandler: a signed JWT checked against the JWKS."""

    def __init__(
        self,
        jwks: Jwks,
        audiences: Iterable[str] = (),
        issuer: str | None = None,
        clock_skew_s: int = 30,
        sub_claim: str = "sub",
        scope_claim: str = "scope",
    ) -> None:
        self.jwks = jwks
        self.audiences = [a for a in audiences if a] or None
        self.issuer = issuer
        self.clock_skew_s = clock_skew_s
        self.sub_claim = sub_claim
        self.scope_claim = scope_claim

    def validate(self, token: str) -> BearerToken:
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise TokenRefused(f"Could not validate the access token: {exc}") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in SIGNED_ALGORITHMS:
            raise TokenRefused(f"Could not validate the access token: algorithm {alg!r} refused")
        keys = self.jwks.keys
        if keys is None:
            raise TokenRefused(f"Could not validate the access token: no JWKS from {self.jwks.url}")
        kty = "EC" if alg.startswith("ES") else "RSA"  # as jose4j's VerificationJwkSelector
        candidates = [k for k in keys if (kid is None or k.key_id == kid) and k.key_type == kty]
        if not candidates:
            self.jwks.expedite()
            raise TokenRefused(f"Could not validate the access token: no key with kid {kid!r}")
        claims: dict[str, Any] | None = None
        problem: Exception | None = None
        for key in candidates:
            try:
                claims = jwt.decode(
                    token,
                    key.key,
                    algorithms=[alg],
                    audience=self.audiences,
                    issuer=self.issuer,
                    leeway=self.clock_skew_s,
                    options={"require": ["exp", "iat"]},
                )
                break
            except jwt.InvalidSignatureError as exc:
                problem = exc  # another key of the same kid (or none) may fit
            except (jwt.InvalidTokenError, jwt.PyJWKError, ValueError, TypeError) as exc:
                raise TokenRefused(f"Could not validate the access token: {exc}") from None
        if claims is None:
            raise TokenRefused(f"Could not validate the access token: {problem}")
        sub = claims.get(self.sub_claim)
        if not isinstance(sub, str) or not sub.strip():
            raise TokenRefused(f"{self.sub_claim} value must be non-null")
        return BearerToken(
            sub.strip(), int(claims["exp"] * 1000), _scope(claims.get(self.scope_claim))
        )


class OAuthBearerServer(ServerMechanism):
    """The broker's side of one OAUTHBEARER exchange (Kafka's OAuthBearerSaslServer)."""

    def __init__(self, validator: TokenValidator, *, reauthenticating: bool = False) -> None:
        self.validator = validator
        self.expires_ms: int | None = None  # the token's exp once complete
        self._error: TokenRefused | None = None
        during = "re-authentication" if reauthenticating else "authentication"
        # What Kafka tells a client whose message it could not parse (no detail: none leaks).
        self._generic = (
            f"Authentication failed during {during} due to invalid credentials with SASL "
            f"mechanism {OAUTHBEARER}"
        )

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslError("OAUTHBEARER exchange already complete")
        if token == _SEPARATOR.encode() and self._error is not None:
            # The client acknowledged the error status: now the exchange fails, with it.
            raise AuthenticationRefused(self._error.status_json(), str(self._error))
        self._error = None
        try:
            authzid, bearer = parse_initial_response(token)
        except SaslError as exc:
            raise AuthenticationRefused(self._generic, str(exc)) from None
        try:
            found = self.validator.validate(bearer)
        except TokenRefused as exc:
            self._error = exc
            log.debug("OAUTHBEARER token refused: %s", exc)
            return exc.status_json().encode()
        if authzid and authzid != found.principal:
            raise SaslError(
                f"Authentication failed: Client requested an authorization id ({authzid}) that "
                f"is different from the token's principal name ({found.principal})"
            )
        self.user = found.principal
        self.expires_ms = found.expires_ms
        self.complete = True
        return b""


def validator_for(config: BrokerConfig) -> UnsecuredValidator | JwtValidator:
    """A listener's validator from its sasl.oauthbearer.* settings: KIP-768's when a JWKS
    is named, else the unsecured one (Kafka's default)."""
    if config.sasl_oauthbearer_jwks_endpoint_url is None:
        required = config.sasl_oauthbearer_unsecured_validator_required_scope
        return UnsecuredValidator(
            config.sasl_oauthbearer_unsecured_validator_principal_claim_name,
            config.sasl_oauthbearer_unsecured_validator_scope_claim_name,
            required.replace(",", " ").split(),  # Kafka's option is space-delimited
            config.sasl_oauthbearer_unsecured_validator_allowable_clock_skew_ms,
        )
    return JwtValidator(
        Jwks(
            config.sasl_oauthbearer_jwks_endpoint_url,
            config.sasl_oauthbearer_jwks_endpoint_refresh_ms,
        ),
        [a.strip() for a in config.sasl_oauthbearer_expected_audience.split(",")],
        config.sasl_oauthbearer_expected_issuer,
        config.sasl_oauthbearer_clock_skew_seconds,
        config.sasl_oauthbearer_sub_claim_name,
        config.sasl_oauthbearer_scope_claim_name,
    )
