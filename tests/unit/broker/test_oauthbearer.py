"""SASL/OAUTHBEARER on the broker, in-process: RFC 7628's initial response, Kafka's unsecured
validator, KIP-768's signed-JWT validator against a JWKS (file:// and http:// on loopback),
the error-status round trip, session lifetime from the token's exp (KIP-368), and samsa's
client against a broker with OAUTHBEARER listeners."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from _jwt import Keys, claims, initial, unsigned
from samsa.broker import oauthbearer
from samsa.broker.config import BrokerConfig, ConfigError
from samsa.broker.listeners import check_security_config
from samsa.broker.oauthbearer import (
    Jwks,
    JwtValidator,
    OAuthBearerServer,
    TokenRefused,
    UnsecuredValidator,
    parse_initial_response,
)
from samsa.broker.sasl import PlainUsers, SaslSession, ScramCredentials
from samsa.broker.server import BrokerServer
from samsa.client import Admin, KafkaError
from samsa.client._security import unsecured_jwt
from samsa.protocol.errors import ErrorCode
from samsa.protocol.sasl import SaslError

NOW = 1_800_000_000.0


# -- the client's initial response --------------------------------------------------------


def test_initial_response_parsing() -> None:
    assert parse_initial_response(initial("abc.def.")) == ("", "abc.def.")
    assert parse_initial_response(initial("t", "bob=2Cx")) == ("bob,x", "t")
    ext = b"n,,\x01auth=bearer t-1\x01traceId=42\x01\x01"  # scheme is case-insensitive
    assert parse_initial_response(ext) == ("", "t-1")
    for bad in (
        b"",
        b"y,,\x01auth=Bearer t\x01\x01",
        b"n,,\x01auth=Bearer t\x01",  # no final separator
        b"n,,\x01foo=bar\x01\x01",  # no auth
        b"n,,\x01auth=Basic dXNlcg\x01\x01",
        b"n,,\x01auth=Bearer a b\x01\x01",
        b"\xff\xfe",
    ):
        with pytest.raises(SaslError):
            parse_initial_response(bad)


# -- the unsecured validator (Kafka's default) ---------------------------------------------


def test_unsecured_validator() -> None:
    v = UnsecuredValidator(clock=lambda: NOW)
    good = {"sub": "alice", "iat": NOW - 10, "exp": NOW + 60, "scope": "a b"}
    token = v.validate(unsigned(good))
    assert (token.principal, token.expires_ms, token.scope) == (
        "alice",
        int((NOW + 60) * 1000),
        frozenset({"a", "b"}),
    )
    cases = {
        "'none' for an algorithm": unsigned(good, {"alg": "RS256"}),
        "must not contain a digital signature": unsigned(good, sig="c2ln"),
        "No expiration time": unsigned({"sub": "alice"}),
        "No principal name in JWT claim: sub": unsigned({"exp": NOW + 60}),
        "on or after the Expiration Time": unsigned({**good, "exp": NOW}),
        "Issued At value": unsigned({**good, "iat": NOW + 5}),
        "3 dot-separated": "abc.def",
        "'..'": "abc..",
        "malformed": "!!!.e30.",
        "not of type Number": unsigned({**good, "exp": "soon"}),
    }
    for reason, bad in cases.items():
        with pytest.raises(TokenRefused, match=reason) as info:
            v.validate(bad)
        assert info.value.status_json() == '{"status":"invalid_token"}'
    # allowable clock skew, principal claim name, required scope
    skewed = UnsecuredValidator(
        "client_id", "scp", ["read", "write"], clock_skew_ms=2000, clock=lambda: NOW
    )
    ok = {"client_id": "svc", "exp": NOW - 1, "scp": ["read", "write", "x"]}
    assert skewed.validate(unsigned(ok)).principal == "svc"
    with pytest.raises(TokenRefused) as info:
        skewed.validate(unsigned({**ok, "scp": ["read"]}))
    assert info.value.status_json() == ('{"status":"insufficient_scope", "scope":"[read, write]"}')


# -- the signed-JWT validator (KIP-768) ------------------------------------------------------


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


def _claims(**over: Any) -> dict[str, Any]:
    return claims(**{"iss": "https://idp", **over})


def _file_jwks(tmp_path: Path, doc: dict[str, Any]) -> Jwks:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(doc))
    jwks = Jwks(path.as_uri(), 3_600_000)
    asyncio.run(jwks.refresh())
    return jwks


def test_signed_jwt_validator(tmp_path: Path, keys: Keys) -> None:
    jwks = _file_jwks(tmp_path, keys.jwks())
    v = JwtValidator(jwks, ["kafka"], "https://idp", clock_skew_s=30)
    assert v.validate(keys.sign(_claims())).principal == "alice"
    assert v.validate(keys.sign(_claims(sub="bob"), kid="e1")).principal == "bob"
    # without a kid, the keys of the algorithm's type are tried (RSA first in the set)
    no_kid = jwt.encode(_claims(sub="carl"), keys.ec, algorithm="ES256")
    assert v.validate(no_kid).principal == "carl"
    assert v.validate(keys.sign(_claims(exp=int(time.time()) - 10))).principal == "alice"  # skew
    cases = {
        "Audience doesn.t match": keys.sign(_claims(aud="other")),
        "Invalid issuer": keys.sign(_claims(iss="https://evil")),
        "Signature has expired": keys.sign(_claims(exp=int(time.time()) - 60)),
        "Signature verification failed": keys.sign(_claims(), key=keys.other),
        "algorithm 'none' refused": unsigned(_claims()),
        "no key with kid 'nope'": keys.sign(_claims(), kid="nope", key=keys.rsa),
        'missing the "iat" claim': keys.sign({k: v for k, v in _claims().items() if k != "iat"}),
        "sub value must be non-null": keys.sign(_claims(sub=" ")),
    }
    for reason, bad in cases.items():
        with pytest.raises(TokenRefused, match=reason) as info:
            v.validate(bad)
        assert info.value.status_json() == '{"status":"invalid_token"}'
    assert jwks._wake.is_set()  # the unknown kid asked for an early refresh
    # Without an expected audience, a token that names one is refused (as jose4j).
    with pytest.raises(TokenRefused, match="audience"):
        JwtValidator(jwks).validate(keys.sign(_claims()))
    # Another claim names the principal.
    other = JwtValidator(jwks, ["kafka"], sub_claim="client_id")
    assert other.validate(keys.sign(_claims(client_id="svc"))).principal == "svc"


def test_jwks_url_bounds(tmp_path: Path, keys: Keys) -> None:
    for url in ("https://idp.example/jwks", "http://10.0.0.1/jwks", "ftp://127.0.0.1/x"):
        with pytest.raises(ValueError, match="loopback"):
            Jwks(url, 1000)
        config = BrokerConfig(data_dir=tmp_path).with_properties(
            {
                "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                "sasl.enabled.mechanisms": "OAUTHBEARER",
                "sasl.oauthbearer.jwks.endpoint.url": url,
            }
        )
        with pytest.raises(ConfigError, match="loopback"):
            check_security_config(config)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (oauthbearer.JWKS_MAX_BYTES + 1) + json.dumps(keys.jwks()).encode())
    with pytest.raises(ValueError, match="larger than"):
        asyncio.run(Jwks(big.as_uri(), 1000).refresh())
    bad = tmp_path / "bad.json"
    bad.write_text('{"keys": 7}')
    with pytest.raises(ValueError, match="bad JWKS"):
        asyncio.run(Jwks(bad.as_uri(), 1000).refresh())


@pytest.fixture
def jwks_server(keys: Keys) -> Iterator[tuple[str, dict[str, Any]]]:
    """An http:// JWKS endpoint on loopback; the dict is what it serves."""
    served: dict[str, Any] = {"doc": keys.jwks(with_ec=False), "hits": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served["hits"] += 1
            body = json.dumps(served["doc"]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None: ...

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/jwks", served
    httpd.shutdown()
    httpd.server_close()


def test_jwks_over_http_refreshes_for_an_unknown_key(
    keys: Keys, jwks_server: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, served = jwks_server
    monkeypatch.setattr(oauthbearer, "JWKS_MIN_REFRESH_S", 0.05)

    async def main() -> None:
        jwks = Jwks(url, 3_600_000)
        await jwks.start()
        try:
            v = JwtValidator(jwks, ["kafka"], "https://idp")
            assert v.validate(keys.sign(_claims())).principal == "alice"
            served["doc"] = keys.jwks()  # the IdP rotates in a new key...
            ec_token = keys.sign(_claims(), kid="e1")
            with pytest.raises(TokenRefused, match="no key with kid 'e1'"):
                v.validate(ec_token)  # ...refused once, and the set refreshed in the background
            for _ in range(100):
                if jwks.keys is not None and len(jwks.keys) == 2:
                    break
                await asyncio.sleep(0.02)
            assert v.validate(ec_token).principal == "alice"
            assert served["hits"] == 2
            # Bounded: tokens naming unknown keys as fast as they come make at most one fetch
            # per JWKS_MIN_REFRESH_S, not one each.
            unknown = keys.sign(_claims(), kid="nope", key=keys.rsa)
            refused, end = 0, time.monotonic() + 0.5
            while time.monotonic() < end:
                with pytest.raises(TokenRefused):
                    v.validate(unknown)
                refused += 1
                await asyncio.sleep(0.001)
            assert refused > 20 and served["hits"] - 2 <= 0.5 / 0.05 + 2
        finally:
            jwks.close()

    asyncio.run(asyncio.wait_for(main(), 20))


# -- the mechanism and the session -----------------------------------------------------------


def _session(tmp_path: Path, validator: Any, reauth_ms: int = 0) -> SaslSession:
    return SaslSession(
        ("OAUTHBEARER",), ScramCredentials(tmp_path), PlainUsers(None), reauth_ms, oauth=validator
    )


def test_refused_token_answers_the_status_then_fails_on_the_dummy_message(
    tmp_path: Path,
) -> None:
    session = _session(tmp_path, UnsecuredValidator())
    assert session.handshake("OAUTHBEARER") == ErrorCode.NONE
    expired = unsigned({"sub": "alice", "exp": time.time() - 5})
    # RFC 7628: no error yet, the JSON status as the challenge...
    assert session.authenticate(initial(expired)) == (
        ErrorCode.NONE,
        "",
        b'{"status":"invalid_token"}',
    )
    assert session.failed is None and not session.authenticated
    # ...and the client's 0x01 gets the failure, with Kafka's message; the log says why.
    error, message, _ = session.authenticate(b"\x01")
    assert (error, message) == (ErrorCode.SASL_AUTHENTICATION_FAILED, '{"status":"invalid_token"}')
    assert "Expiration Time" in str(session.failed)


def test_malformed_message_and_authzid(tmp_path: Path) -> None:
    session = _session(tmp_path, UnsecuredValidator())
    session.handshake("OAUTHBEARER")
    error, message, _ = session.authenticate(b"n,,\x01auth=Bearer\x01\x01")
    assert error == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert message == (
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism OAUTHBEARER"
    )
    assert "invalid 'auth' format" in str(session.failed)
    other = _session(tmp_path, UnsecuredValidator())
    other.handshake("OAUTHBEARER")
    token = unsigned({"sub": "alice", "exp": time.time() + 60})
    error, message, _ = other.authenticate(initial(token, authzid="bob"))
    assert error == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "authorization id (bob)" in str(message)


def test_session_lifetime_is_the_tokens_unless_reauth_ms_is_shorter(tmp_path: Path) -> None:
    exp = time.time() + 100
    token = initial(unsigned({"sub": "alice", "exp": exp}))
    for reauth_ms, low, high in ((0, 99_000, 100_000), (5_000, 5_000, 5_000)):
        session = _session(tmp_path, UnsecuredValidator(), reauth_ms)
        session.handshake("OAUTHBEARER")
        assert session.authenticate(token) == (ErrorCode.NONE, "", b"")
        assert session.principal == "User:alice"
        assert low <= session.lifetime_ms <= high and session.expires_at is not None
        # KIP-368: re-authentication with a fresh token renews the session, same principal
        assert session.handshake("OAUTHBEARER") == ErrorCode.NONE
        assert session.authenticate(token)[0] == ErrorCode.NONE
        # (the next re-authentication a second later: Kafka begins at most one a second)
        assert session.handshake("OAUTHBEARER", now=time.monotonic() + 1) == ErrorCode.NONE
        bob = initial(unsigned({"sub": "bob", "exp": exp}))
        error, message, _ = session.authenticate(bob)
        assert error == ErrorCode.SASL_AUTHENTICATION_FAILED and "principal" in str(message)


def test_server_mechanism_rejects_steps_after_completion() -> None:
    mech = OAuthBearerServer(UnsecuredValidator())
    assert mech.step(initial(unsigned({"sub": "a", "exp": time.time() + 9}))) == b""
    with pytest.raises(SaslError):
        mech.step(b"\x01")


# -- a broker with OAUTHBEARER listeners, samsa's client -----------------------------------


def _serve(server: BrokerServer, run: Callable[[int], None]) -> None:
    """Start ``server``, run the blocking ``run(port)`` in a thread, stop the server."""

    async def main() -> None:
        await server.start()
        try:
            await asyncio.to_thread(run, server.port)
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_samsa_client_over_oauthbearer(tmp_path: Path, keys: Keys) -> None:
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps(keys.jwks()))
    config = BrokerConfig(data_dir=tmp_path / "data", port=0).with_properties(
        {
            "listeners": "UNSECURED://127.0.0.1:0,SIGNED://127.0.0.1:0",
            "listener.security.protocol.map": "UNSECURED:SASL_PLAINTEXT,SIGNED:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "OAUTHBEARER",
            "listener.name.signed.sasl.oauthbearer.jwks.endpoint.url": jwks_file.as_uri(),
            "listener.name.signed.sasl.oauthbearer.expected.audience": "kafka",
            "listener.name.signed.sasl.oauthbearer.expected.issuer": "https://idp",
        }
    )
    config = config.with_overrides(port=0).validate()
    server = BrokerServer(config)

    def run(port: int) -> None:
        unsecured = {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": "principal=alice scope=a,b",
        }
        with Admin(unsecured) as admin:
            admin.create_topic("oauth-t", 1)
        signed_port = server.endpoints[1].advertised[1]  # type: ignore[index]
        signed = {
            "bootstrap.servers": f"127.0.0.1:{signed_port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": lambda _cfg: (keys.sign(_claims()), time.time() + 600),
        }
        with Admin(signed) as admin:
            assert "oauth-t" in admin.list_topics()
        # The unsecured listener refuses the signed token, the signed one the unsecured token.
        for conf in (
            {**unsecured, "bootstrap.servers": f"127.0.0.1:{signed_port}"},
            {**signed, "bootstrap.servers": f"127.0.0.1:{port}"},
        ):
            with pytest.raises(KafkaError) as info, Admin(conf) as admin:
                admin.list_topics()
            assert info.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert '{"status":"invalid_token"}' in str(info.value)

    _serve(server, run)


def test_unsecured_jwt_of_the_client() -> None:
    token, expiry = unsecured_jwt("principal=svc scope=x,y lifeSeconds=30")
    found = UnsecuredValidator().validate(token)
    assert (found.principal, found.scope) == ("svc", frozenset({"x", "y"}))
    assert abs(expiry - time.time() - 30) < 2


def test_samsa_client_reauthenticates_before_the_token_expires(tmp_path: Path) -> None:
    """KIP-368 with no connections.max.reauth.ms: the token's exp ends the session, and samsa's
    client re-authenticates on the same connection with a fresh token from oauth_cb."""
    config = BrokerConfig(data_dir=tmp_path / "data", port=0).with_properties(
        {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "OAUTHBEARER"}
    )
    config = config.with_overrides(port=0).validate()
    tokens: list[str] = []

    def oauth_cb(_config: str | None) -> tuple[str, float]:
        # Sessions of 2-3 s (exp is whole seconds): renewals a second or more apart, as Kafka
        # begins at most one re-authentication a second.
        token, expiry = unsecured_jwt("principal=alice lifeSeconds=3")
        tokens.append(token)
        return token, expiry

    server = BrokerServer(config)

    def run(port: int) -> None:
        conf = {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "oauth_cb": oauth_cb,
        }
        with Admin(conf) as admin:
            admin.list_topics()
            before = set(server.limits.connections)
            time.sleep(3.5)  # past the first token's exp
            admin.list_topics()
            assert set(server.limits.connections) == before  # the same connections
        assert len(tokens) >= 2 * len(before)

    _serve(server, run)
