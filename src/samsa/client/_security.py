"""The client's side of listeners' security, under confluent-kafka's names:
``security.protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``sasl.mechanism`` (PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512), ``sasl.username``/``sasl.password``, ``ssl.ca.location``,
``ssl.certificate.location``/``ssl.key.location``/``ssl.key.password`` (mTLS) and
``ssl.endpoint.identification.algorithm`` (``https``: the broker's name is checked, or
``none``).

The SASL exchange itself (SaslHandshake v1, then SaslAuthenticate until the mechanism is
done) is :func:`sasl_steps`, a generator the async and the blocking connection both drive.
"""

from __future__ import annotations

import ssl
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from samsa.client._errors import ConfigError, KafkaError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.sasl import MECHANISMS, SaslError, client_mechanism

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
        if mechanism not in MECHANISMS:
            raise ConfigError(
                f"sasl.mechanism {mechanism} is not supported (samsa speaks "
                f"{', '.join(MECHANISMS)})"
            )
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
    mech = client_mechanism(security.mechanism, security.username, security.password)
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
