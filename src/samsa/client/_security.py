"""The client's side of listeners' security, under confluent-kafka's names:
``security.protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``sasl.mechanism`` (PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER), ``sasl.username``/``sasl.password``,
for OAUTHBEARER ``oauth_cb`` (called with ``sasl.oauthbearer.config``, returns the token and
its expiry, as confluent-kafka's) or ``enable.sasl.oauthbearer.unsecure.jwt`` (an unsigned
JWT from ``sasl.oauthbearer.config``'s ``principal=... scope=... lifeSeconds=...``),
``ssl.ca.location``, ``ssl.certificate.location``/``ssl.key.location``/``ssl.key.password``
(mTLS) and ``ssl.endpoint.identification.algorithm`` (``https``: the broker's name is
checked, or ``none``).

The SASL exchange itself (SaslHandshake v1, then SaslAuthenticate until the mechanism is
done) is :func:`sasl_steps`, a generator the async and the blocking connection both drive.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from samsa.client._errors import ConfigError, KafkaError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.sasl import MECHANISMS, ClientMechanism, SaslError, client_mechanism

OAUTHBEARER = "OAUTHBEARER"
CLIENT_MECHANISMS = (*MECHANISMS, OAUTHBEARER)

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# Fatal for the client, as Java's AuthenticationException: a retry would fail the same way.
AUTHENTICATION_ERRORS = frozenset(
    {
        ErrorCode.SASL_AUTHENTICATION_FAILED,
        ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        ErrorCode.ILLEGAL_SASL_STATE,
    }
)

DEFAULTS: dict[str, Any] = {
    "security.protocol": "PLAINTEXT",
    "sasl.mechanism": "GSSAPI",  # as Kafka's clients; samsa speaks PLAIN and SCRAM only
    "sasl.username": None,
    "sasl.password": None,
    "ssl.ca.location": None,
    "ssl.certificate.location": None,
    "ssl.key.location": None,
    "ssl.key.password": None,
    "ssl.endpoint.identification.algorithm": "https",
    "oauth.cb": None,  # given as oauth_cb, as confluent-kafka names it
    "sasl.oauthbearer.config": None,
    "enable.sasl.oauthbearer.unsecure.jwt": False,
}
ALIASES = {"sasl.mechanisms": "sasl.mechanism", "sasl.user": "sasl.username"}


@dataclass(frozen=True, slots=True)
class Security:
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str = ""
    password: str = ""
    ssl_context: ssl.SSLContext | None = None
    check_hostname: bool = True
    # OAUTHBEARER: called for each (re-)authentication with sasl.oauthbearer.config
    oauth_cb: Callable[[str | None], Any] | None = None
    oauth_config: str | None = None

    def __repr__(self) -> str:  # never the password
        return f"Security({self.protocol}, {self.mechanism}, user={self.username!r})"

    @property
    def sasl(self) -> bool:
        return self.mechanism is not None

    def server_hostname(self, host: str) -> str | None:
        return host if self.ssl_context is not None else None


PLAINTEXT = Security()


def from_config(values: Mapping[str, Any]) -> Security:
    protocol = str(values.get("security.protocol") or "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"security.protocol must be one of {', '.join(PROTOCOLS)}, got {protocol}"
        )
    ctx = None
    check = str(values.get("ssl.endpoint.identification.algorithm") or "none").lower() == "https"
    if protocol in ("SSL", "SASL_SSL"):
        ctx = ssl.create_default_context(cafile=values.get("ssl.ca.location"))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = check
        cert, key = values.get("ssl.certificate.location"), values.get("ssl.key.location")
        if cert is not None:
            try:
                ctx.load_cert_chain(cert, key, password=values.get("ssl.key.password"))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load ssl.certificate.location {cert}: {exc}") from None
        elif key is not None:
            raise ConfigError("ssl.key.location needs ssl.certificate.location")
    mechanism = None
    if protocol.startswith("SASL_"):
        mechanism = str(values.get("sasl.mechanism") or "GSSAPI").upper()
        if mechanism not in CLIENT_MECHANISMS:
            raise ConfigError(
                f"sasl.mechanism {mechanism} is not supported (samsa speaks "
                f"{', '.join(CLIENT_MECHANISMS)})"
            )
        if mechanism == OAUTHBEARER:
            return _oauth_security(protocol, values, ctx, check)
        if not values.get("sasl.username") or values.get("sasl.password") is None:
            raise ConfigError(f"sasl.mechanism {mechanism} needs sasl.username and sasl.password")
    return Security(
        protocol,
        mechanism,
        str(values.get("sasl.username") or ""),
        str(values.get("sasl.password") or ""),
        ctx,
        check,
    )


def _oauth_security(
    protocol: str, values: Mapping[str, Any], ctx: ssl.SSLContext | None, check: bool
) -> Security:
    callback = values.get("oauth.cb")
    config = values.get("sasl.oauthbearer.config")
    unsecure = str(values.get("enable.sasl.oauthbearer.unsecure.jwt")).lower() == "true"
    if callback is None and unsecure:
        unsecured_jwt(config)  # bad settings fail now, not at the first connection
        callback = unsecured_jwt
    if not callable(callback):
        raise ConfigError(
            "sasl.mechanism OAUTHBEARER needs oauth_cb (a callable returning the token and its "
            "expiry) or enable.sasl.oauthbearer.unsecure.jwt=true"
        )
    return Security(protocol, OAUTHBEARER, "", "", ctx, check, callback, config)


def unsecured_jwt(config: str | None) -> tuple[str, float]:
    """An unsigned JWT (``alg`` none) and its expiry from ``sasl.oauthbearer.config``, as
    librdkafka's unsecure JWT: ``principal=NAME [scope=A,B] [lifeSeconds=N]
    [principalClaimName=sub] [scopeClaimName=scope]``. For tests and development only."""
    opts: dict[str, str] = {}
    for item in (config or "").split():
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"sasl.oauthbearer.config: expected key=value, got {item!r}")
        opts[key] = value
    principal = opts.get("principal")
    if not principal:
        raise ConfigError("sasl.oauthbearer.config needs principal=... for an unsecure JWT")
    try:
        life = int(opts.get("lifeSeconds", "3600"))
    except ValueError:
        raise ConfigError("sasl.oauthbearer.config: lifeSeconds must be an integer") from None
    now = int(time.time())  # whole seconds, as librdkafka: iat never after the broker's now
    claims: dict[str, Any] = {
        opts.get("principalClaimName", "sub"): principal,
        "iat": now,
        "exp": now + life,
    }
    if opts.get("scope"):
        claims[opts.get("scopeClaimName", "scope")] = opts["scope"].split(",")

    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none'})}.{part(claims)}.", now + life


class OAuthBearerClient(ClientMechanism):
    """RFC 7628's client: the token in the initial response; an error status from the broker
    is acknowledged with a lone 0x01, after which the broker fails the exchange."""

    def __init__(self, token: str) -> None:
        self._token = token

    def first(self) -> bytes:
        return f"n,,\x01auth=Bearer {self._token}\x01\x01".encode()

    def step(self, reply: bytes) -> bytes | None:
        if self.done:
            raise SaslError(f"OAUTHBEARER: unexpected broker message after {reply!r}")
        self.done = True
        return b"\x01" if reply else None


def _mechanism(security: Security) -> ClientMechanism:
    if security.mechanism != OAUTHBEARER:
        assert security.mechanism is not None
        return client_mechanism(security.mechanism, security.username, security.password)
    assert security.oauth_cb is not None
    # A fresh token each time: re-authentication (KIP-368) must not resend an expired one.
    got = security.oauth_cb(security.oauth_config)
    token = got[0] if isinstance(got, tuple) else got
    if not isinstance(token, str) or not token:
        raise KafkaError(ErrorCode.SASL_AUTHENTICATION_FAILED, "oauth_cb returned no token")
    return OAuthBearerClient(token)


# One step: (api key, version, request entity) to send; the response is sent back in.
Step = tuple[int, int, Any]


def sasl_steps(security: Security, authenticate_version: int) -> Generator[Step, Any, None]:
    """SaslHandshake, then SaslAuthenticate rounds; KafkaError when the broker refuses."""
    assert security.mechanism is not None
    handshake = make_request(
        ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism=security.mechanism
    )
    resp = yield (ApiKey.SASL_HANDSHAKE, 1, handshake)
    if resp.error_code:
        offered = ", ".join(resp.mechanisms)
        raise KafkaError(
            resp.error_code, f"SASL mechanism {security.mechanism}; broker offers: {offered}"
        )
    mech = _mechanism(security)
    token: bytes | None = mech.first()
    while token is not None:
        req = make_request(
            ApiKey.SASL_AUTHENTICATE,
            authenticate_version,
            "SaslAuthenticateRequest",
            auth_bytes=token,
        )
        resp = yield (ApiKey.SASL_AUTHENTICATE, authenticate_version, req)
        if resp.error_code:
            raise KafkaError(resp.error_code, resp.error_message or "")
        try:
            token = mech.step(resp.auth_bytes)
        except SaslError as exc:
            raise KafkaError(ErrorCode.SASL_AUTHENTICATION_FAILED, str(exc)) from None
