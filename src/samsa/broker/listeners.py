"""Listeners under Kafka's names: ``listeners``, ``advertised.listeners``,
``listener.security.protocol.map``; TLS contexts from PEM files; the principal of a TLS
client from its certificate (``ssl.principal.mapping.rules``).

Each listener has a security protocol: PLAINTEXT, SSL (TLS; with ``ssl.client.auth`` the
client's certificate names the principal), SASL_PLAINTEXT and SASL_SSL (SASL names it; as
KIP-684 says, SASL_SSL does not ask for client certificates). The first listener's address
is the config's ``host``/``port``, so ``samsa broker --host/--port`` override it.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from samsa.broker.config import BrokerConfig, ConfigError, parse_host_port
from samsa.broker.oauthbearer import OAUTHBEARER, check_jwks_url
from samsa.protocol.sasl import MECHANISMS

SERVER_MECHANISMS = (*MECHANISMS, OAUTHBEARER)

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
ANONYMOUS = "User:ANONYMOUS"
_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    protocol: str
    host: str
    port: int
    advertised_host: str | None = None
    advertised_port: int | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def advertised(self, bound_port: int) -> tuple[str, int]:
        """The address clients that came in here are given (Metadata, FindCoordinator)."""
        return (self.advertised_host or self.host, self.advertised_port or bound_port)


def _entries(setting: str, raw: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, address = item.partition("://")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_]+", name):
            raise ConfigError(f"{setting}: expected NAME://HOST:PORT, got {item!r}")
        host, port = parse_host_port(address)
        if not 0 <= port <= 65535:
            raise ConfigError(f"{setting}: port must be between 0 and 65535, got {port}")
        out.append((name.upper(), host, port))
    if not out:
        raise ConfigError(f"{setting} is empty")
    return out


def _protocol_map(raw: str | None) -> dict[str, str]:
    mapping = {p: p for p in PROTOCOLS}
    if raw:
        for item in raw.split(","):
            name, sep, protocol = item.strip().partition(":")
            if not sep or protocol.upper() not in PROTOCOLS:
                raise ConfigError(
                    f"listener.security.protocol.map: expected NAME:PROTOCOL with PROTOCOL one "
                    f"of {', '.join(PROTOCOLS)}, got {item.strip()!r}"
                )
            mapping[name.strip().upper()] = protocol.upper()
    return mapping


def parse_listeners(config: BrokerConfig) -> list[Listener]:
    protocols = _protocol_map(config.listener_security_protocol_map)
    # Without `listeners`, one PLAINTEXT listener on --host/--port (advertised.listeners may
    # still name its advertised address, as in Kafka).
    entries = (
        _entries("listeners", config.listeners)
        if config.listeners is not None
        else [("PLAINTEXT", config.host, config.port)]
    )
    advertised: dict[str, tuple[str, int]] = {}
    if config.advertised_listeners:
        for name, host, port in _entries("advertised.listeners", config.advertised_listeners):
            if port == 0:
                raise ConfigError(f"advertised.listeners: {name} needs a real port, not 0")
            advertised[name] = (host, port)
    names = [name for name, _h, _p in entries]
    for name in [*names, *advertised]:
        if name not in protocols:
            raise ConfigError(
                f"listener {name} has no security protocol: name one of "
                f"{', '.join(PROTOCOLS)} or map it in listener.security.protocol.map"
            )
    if len(set(names)) != len(names):
        raise ConfigError(f"listeners: each listener name may appear once, got {names}")
    if unknown := set(advertised) - set(names):
        raise ConfigError(f"advertised.listeners names unknown listeners: {sorted(unknown)}")
    ports = [p for _n, _h, p in entries if p]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"listeners: each listener needs its own port, got {ports}")
    out: list[Listener] = []
    for i, (name, host, port) in enumerate(entries):
        if i == 0:  # --host/--port (and the legacy --advertised-listener) speak for the first
            host, port = config.host, config.port
        adv_host, adv_port = advertised.get(name, (None, None))
        if i == 0 and config.advertised_host is not None:
            adv_host, adv_port = config.advertised_host, config.advertised_port
        out.append(Listener(name, protocols[name], host, port, adv_host, adv_port))
    return out


def listener_config(config: BrokerConfig, name: str) -> BrokerConfig:
    """The settings listener ``name`` runs with: the global ones, overridden by its own
    ``listener.name.<name>.<setting>`` (as Kafka; the listener name is case-insensitive)."""
    own = {setting: raw for lst, setting, raw in config.listener_overrides if lst == name.upper()}
    return config.with_properties(own) if own else config


def check_security_config(config: BrokerConfig) -> None:
    """ConfigError for a listener or security setting the broker could not serve."""
    listeners = parse_listeners(config)
    _protocol_map(config.listener_security_protocol_map)  # checked even if unused
    names = {lst.name for lst in listeners}
    if unknown := sorted({lst for lst, _s, _v in config.listener_overrides} - names):
        raise ConfigError(
            f"listener.name.* settings name listeners that are not configured: "
            f"{', '.join(n.lower() for n in unknown)} (listeners: {', '.join(sorted(names))})"
        )
    for lst in listeners:
        _check_listener(listener_config(config, lst.name), lst)


def _check_listener(config: BrokerConfig, lst: Listener) -> None:
    if config.ssl_client_auth not in _CLIENT_AUTH:
        raise ConfigError(
            f"ssl.client.auth must be none, requested or required, got {config.ssl_client_auth!r}"
        )
    for key, value in (
        ("ssl.keystore.type", config.ssl_keystore_type),
        ("ssl.truststore.type", config.ssl_truststore_type),
    ):
        if value.upper() != "PEM":
            raise ConfigError(f"{key}: samsa reads PEM only, got {value!r}")
    mechanisms = enabled_mechanisms(config)
    parse_mapping_rules(config.ssl_principal_mapping_rules)
    if lst.tls:
        has_file = config.ssl_keystore_location is not None
        has_inline = config.ssl_keystore_key is not None
        if has_file == has_inline or has_inline != (
            config.ssl_keystore_certificate_chain is not None
        ):
            raise ConfigError(
                f"{lst.protocol} listener {lst.name} needs ssl.keystore.location, or both "
                "ssl.keystore.key and ssl.keystore.certificate.chain"
            )
    if lst.sasl and not mechanisms:
        raise ConfigError(f"sasl.enabled.mechanisms is empty for SASL listener {lst.name}")
    if config.sasl_oauthbearer_jwks_endpoint_url is not None:
        try:
            check_jwks_url(config.sasl_oauthbearer_jwks_endpoint_url)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def enabled_mechanisms(config: BrokerConfig) -> tuple[str, ...]:
    names = tuple(m.strip().upper() for m in config.sasl_enabled_mechanisms.split(",") if m.strip())
    for m in names:
        if m not in SERVER_MECHANISMS:
            raise ConfigError(
                f"sasl.enabled.mechanisms: {m} is not supported (samsa serves "
                f"{', '.join(SERVER_MECHANISMS)})"
            )
    return names


# -- TLS --------------------------------------------------------------------------------------


def server_context(config: BrokerConfig, *, client_auth: bool) -> ssl.SSLContext:
    """A TLS 1.2+ server context from the PEM keystore; with ``client_auth`` (SSL
    listeners), client certificates are checked against the truststore per ssl.client.auth."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    password = config.ssl_key_password
    try:
        if config.ssl_keystore_location is not None:
            ctx.load_cert_chain(config.ssl_keystore_location, password=password)
        else:
            _load_inline(ctx, config)
        mode = _CLIENT_AUTH[config.ssl_client_auth] if client_auth else ssl.CERT_NONE
        if mode != ssl.CERT_NONE:
            if config.ssl_truststore_location is None:
                raise ConfigError(
                    f"ssl.client.auth={config.ssl_client_auth} needs ssl.truststore.location"
                )
            ctx.load_verify_locations(cafile=config.ssl_truststore_location)
        ctx.verify_mode = mode
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS keystore or truststore: {exc}") from None
    return ctx


def _load_inline(ctx: ssl.SSLContext, config: BrokerConfig) -> None:
    # load_cert_chain reads files only: a private file, removed at once.
    assert config.ssl_keystore_key is not None
    chain = config.ssl_keystore_certificate_chain or ""
    fd, path = tempfile.mkstemp(suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(config.ssl_keystore_key.strip() + "\n" + chain.strip() + "\n")
        ctx.load_cert_chain(path, password=config.ssl_key_password)
    finally:
        os.unlink(path)


# -- principals from certificates -------------------------------------------------------------

# X500Principal.getName() (RFC 2253) keywords; other attributes keep Python's name.
_DN_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def _escape(value: str) -> str:
    out = re.sub(r'([,+"\\<>;])', r"\\\1", value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def subject_dn(peercert: Mapping[str, Any]) -> str:
    """The subject as Java's X500Principal.getName() writes it: RFC 2253, last RDN first."""
    rdns = []
    for rdn in reversed(peercert.get("subject", ())):
        rdns.append("+".join(f"{_DN_KEYWORDS.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        m = self.pattern.fullmatch(dn)
        if m is None:
            return None
        # Java's replacement syntax: $n is a group, \x a literal x.
        out = re.sub(
            r"\\(.)|\$(\d)",
            lambda r: r.group(1) if r.group(1) is not None else (m.group(int(r.group(2))) or ""),
            self.replacement,
        )
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?))\s*(?:,|$)")


def parse_mapping_rules(raw: str) -> tuple[_Rule, ...]:
    """Kafka's ``ssl.principal.mapping.rules``: ``RULE:pattern/replacement/[LU]`` and
    ``DEFAULT``, comma-separated, tried in order."""
    rules: list[_Rule] = []
    pos = 0
    raw = raw.strip()
    while pos < len(raw):
        m = _RULE.match(raw, pos)
        if m is None or m.end() == pos:
            raise ConfigError(f"ssl.principal.mapping.rules: cannot parse {raw[pos:]!r}")
        pos = m.end()
        if m.group(1):
            rules.append(_Rule(None))
            continue
        try:
            pattern = re.compile(m.group(2).replace("\\/", "/"))
        except re.error as exc:
            raise ConfigError(f"ssl.principal.mapping.rules: bad pattern: {exc}") from None
        rules.append(_Rule(pattern, m.group(3).replace("\\/", "/"), m.group(4)))
    return tuple(rules) or (_Rule(None),)


class PrincipalMapper:
    def __init__(self, rules: str) -> None:
        self.rules = parse_mapping_rules(rules)

    def principal(self, peercert: Mapping[str, Any] | None) -> str:
        """``User:<name>`` for a verified client certificate; ANONYMOUS without one.
        ValueError when no rule applies (Kafka fails the connection then)."""
        if not peercert:
            return ANONYMOUS
        dn = subject_dn(peercert)
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return f"User:{name}"
        raise ValueError(f"no ssl.principal.mapping.rules rule applies to {dn!r}")


__all__ = [
    "ANONYMOUS",
    "Listener",
    "PrincipalMapper",
    "check_security_config",
    "enabled_mechanisms",
    "parse_listeners",
    "server_context",
    "subject_dn",
]
