"""SASL/OAUTHBEARER, samsa against Apache Kafka configured the same way: a listener with
Kafka's unsecured validator (required scope ``kafka``) and one with KIP-768's validator
(OAuthBearerValidatorCallbackHandler) against the same JWKS file, expected audience and
issuer. The raw SaslHandshake/SaslAuthenticate answers to good and bad tokens (the RFC 7628
error status, the failure after the client's 0x01, Kafka's messages, the session lifetime
from the token's exp) are compared, and Kafka's Java client runs the same cases on both."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _broker import BrokerProcess
from _jwt import AUDIENCE, ISSUER, Keys, claims, initial, keys_and_jwks, unsigned
from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing.kafka import KafkaNode, classpath, free_port
from samsa.testing.oracle import CLOSED, Deviation, Outcome, Rule, Side, Target

Run = Callable[..., Outcome]
MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
PROGRAM = Path(__file__).parent / "java" / "OAuthBearerCheck.java"
# The broker's own login (its unsecured token, unused: brokers talk over PLAINTEXT here).
BROKER_LOGIN = 'unsecuredLoginStringClaim_sub="broker"'
ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls"


class Brokers:
    def __init__(self, keys: Keys, ports: dict[str, dict[str, int]], root: Path) -> None:
        self.keys = keys
        self.ports = ports  # side -> listener -> port
        self.root = root

    def targets(self, listener: str) -> dict[str, Target]:
        return {
            side: Target(side, f"127.0.0.1:{ports[listener]}") for side, ports in self.ports.items()
        }


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    root = tmp_path_factory.mktemp("oauthbearer")
    keys, jwks = keys_and_jwks(root)
    node = KafkaNode(root / "kafka", jvm_args=[f"-D{ALLOWED_URLS}={jwks.as_uri()}"])
    unsecured, signed = free_port(), free_port()
    node.overrides = {
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port},"
            f"UNSECURED://127.0.0.1:{unsecured},SIGNED://127.0.0.1:{signed}"
        ),
        "advertised.listeners": (
            f"PLAINTEXT://127.0.0.1:{node.port},UNSECURED://127.0.0.1:{unsecured},"
            f"SIGNED://127.0.0.1:{signed}"
        ),
        "listener.security.protocol.map": (
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,UNSECURED:SASL_PLAINTEXT,"
            "SIGNED:SASL_PLAINTEXT"
        ),
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.unsecured.oauthbearer.sasl.jaas.config": (
            f'{MODULE} required {BROKER_LOGIN} unsecuredValidatorRequiredScope="kafka";'
        ),
        "listener.name.signed.oauthbearer.sasl.jaas.config": f"{MODULE} required {BROKER_LOGIN};",
        "listener.name.signed.oauthbearer.sasl.server.callback.handler.class": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
        ),
        "sasl.oauthbearer.jwks.endpoint.url": jwks.as_uri(),
        "sasl.oauthbearer.expected.audience": AUDIENCE,
        "sasl.oauthbearer.expected.issuer": ISSUER,
    }
    node.start()
    samsa: BrokerProcess | None = None
    try:
        samsa = BrokerProcess(
            root / "samsa",
            {
                "listeners": "UNSECURED://127.0.0.1:0,SIGNED://127.0.0.1:0",
                "listener.security.protocol.map": (
                    "UNSECURED:SASL_PLAINTEXT,SIGNED:SASL_PLAINTEXT"
                ),
                "sasl.enabled.mechanisms": "OAUTHBEARER",
                "listener.name.unsecured.sasl.oauthbearer.unsecured.validator.required.scope": (
                    "kafka"
                ),
                "listener.name.signed.sasl.oauthbearer.jwks.endpoint.url": jwks.as_uri(),
                "sasl.oauthbearer.expected.audience": AUDIENCE,
                "sasl.oauthbearer.expected.issuer": ISSUER,
            },
        ).start()
        ports = {
            "kafka": {"UNSECURED": unsecured, "SIGNED": signed},
            "samsa": {name: _listener_port(samsa, name) for name in ("UNSECURED", "SIGNED")},
        }
        yield Brokers(keys, ports, root)
    finally:
        if samsa is not None:
            samsa.stop()
        node.stop()


def _listener_port(proc: BrokerProcess, name: str) -> int:
    for line in reversed(proc.log):
        if f"listener {name} (" in line:
            return int(line.split(" on 127.0.0.1:")[1].split(",")[0])
    raise AssertionError(f"no {name} listener in the log")


def _authenticate(s: Side, label: str, token: bytes, *, then: bytes | None = b"\x01") -> None:
    """SaslHandshake, SaslAuthenticate v2 with ``token`` and, when the broker answers with an
    error status, the client's ``then``; every answer, its message and the lifetime noted."""
    conn = s.connect()
    hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="OAUTHBEARER")
    s.call(f"{label}/handshake", ApiKey.SASL_HANDSHAKE, 1, hs, conn=conn)
    resp = _step(s, f"{label}/authenticate", conn, token)
    if resp is not None and resp.auth_bytes and then is not None:
        resp = _step(s, f"{label}/after-status", conn, then)
        s.note(f"{label}/then", _closed(conn))


def _step(s: Side, label: str, conn: BlockingConnection, data: bytes) -> Any:
    req = make_request(ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=data)
    resp = s.call(label, ApiKey.SASL_AUTHENTICATE, 2, req, conn=conn)
    if resp is not None:
        s.note(f"{label}/message", resp.error_message)
        # the token's exp, not the broker's clock, sets it: whole minutes left compare
        s.note(f"{label}/lifetime-min", round(resp.session_lifetime.total_seconds() / 60))
    return resp


def _answer(s: Side, token: bytes) -> Any:
    """The error and message a first message is answered with, or CLOSED."""
    conn = s.connect()
    hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="OAUTHBEARER")
    conn.request(ApiKey.SASL_HANDSHAKE, 1, hs)
    req = make_request(ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=token)
    try:
        resp = conn.request(ApiKey.SASL_AUTHENTICATE, 2, req)
    except (OSError, ConnectionClosed):
        return CLOSED
    return [ErrorCode(resp.error_code).name, resp.error_message]


def _closed(conn: BlockingConnection) -> str:
    """Whether the broker closes a connection whose authentication failed."""
    req = make_request(ApiKey.API_VERSIONS, 0, "ApiVersionsRequest")
    try:
        conn.request(ApiKey.API_VERSIONS, 0, req)
    except (OSError, ConnectionClosed):
        return "closed"
    return "open"


RULES = {"session_lifetime": Rule.DROP}


def test_unsecured_tokens(differential: Run, brokers: Brokers) -> None:
    """Kafka's unsecured validator: a good token (scope kafka) completes with the token's
    lifetime; expired, missing scope, signed (alg not none), malformed and another
    authorization id are each refused as Kafka refuses them."""
    now = time.time()
    good = {"sub": "alice", "iat": now, "exp": now + 600, "scope": ["kafka"]}

    def scenario(s: Side) -> None:
        _authenticate(s, "good", initial(unsigned(good)))
        _authenticate(s, "expired", initial(unsigned({**good, "exp": now - 60})))
        _authenticate(s, "no-scope", initial(unsigned({**good, "scope": ["other"]})))
        _authenticate(s, "alg-rs256", initial(unsigned(good, {"alg": "RS256"})))
        _authenticate(s, "no-sub", initial(unsigned({"exp": now + 600, "scope": "kafka"})))
        _authenticate(s, "malformed", b"n,,\x01auth=Bearer\x01\x01")
        s.note("not-bearer", _answer(s, b"n,,\x01auth=Basic abc\x01\x01"))
        _authenticate(s, "authzid", initial(unsigned(good), authzid="bob"))
        # after the status the client may try again instead of 0x01 (RFC 7628 lets it)
        _authenticate(s, "retry", initial(unsigned({**good, "exp": 1})), then=None)

    # Kafka's parser fails on another scheme than Bearer with an IllegalArgumentException (it
    # asks the wrong matcher for the scheme), not a SaslException, and so drops the connection
    # unanswered; samsa answers its message for a malformed first message.
    generic = (
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism OAUTHBEARER"
    )
    deviation = Deviation("not-bearer", ["SASL_AUTHENTICATION_FAILED", generic], CLOSED, "D-SEC-4")
    differential(scenario, rules=RULES, deviations=[deviation], **brokers.targets("UNSECURED"))


def test_signed_tokens(differential: Run, brokers: Brokers) -> None:
    """KIP-768's validator against the same JWKS: RSA and EC keys accepted; wrong audience,
    wrong issuer, expired, a key the JWKS lacks, a bad signature, an unsigned token and one
    without iat each answered {"status":"invalid_token"}, then SASL_AUTHENTICATION_FAILED."""
    keys = brokers.keys

    def scenario(s: Side) -> None:
        _authenticate(s, "rsa", initial(keys.sign(claims())))
        _authenticate(s, "ec", initial(keys.sign(claims(), kid="e1")))
        _authenticate(s, "audience", initial(keys.sign(claims(aud="other"))))
        _authenticate(s, "issuer", initial(keys.sign(claims(iss="https://evil.test"))))
        _authenticate(s, "expired", initial(keys.sign(claims(exp=int(time.time()) - 120))))
        _authenticate(s, "signature", initial(keys.sign(claims(), key=keys.other)))
        _authenticate(s, "unknown-kid", initial(keys.sign(claims(), kid="zz", key=keys.rsa)))
        _authenticate(s, "unsigned", initial(unsigned(claims())))
        no_iat = {k: v for k, v in claims().items() if k != "iat"}
        _authenticate(s, "no-iat", initial(keys.sign(no_iat)))

    differential(scenario, rules=RULES, **brokers.targets("SIGNED"))


def test_java_client_over_oauthbearer(brokers: Brokers) -> None:
    """kafka-clients' unsecured login handler and its FileJwtRetriever (a signed token in a
    file) work on both brokers; a badly signed token and an unsigned one on the signed
    listener fail on both, with the same error."""
    keys = brokers.keys
    good, bad = brokers.root / "good.jwt", brokers.root / "bad.jwt"
    good.write_text(keys.sign(claims(exp=int(time.time()) + 3600)))
    bad.write_text(keys.sign(claims(exp=int(time.time()) + 3600), key=keys.other))
    suffix = uuid.uuid4().hex[:8]
    results: dict[str, dict[str, Any]] = {}

    def run(side: str) -> None:
        ports = brokers.ports[side]
        cmd = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1",
               f"-D{ALLOWED_URLS}={good.as_uri()},{bad.as_uri()}", "-cp", classpath(),
               str(PROGRAM), f"127.0.0.1:{ports['UNSECURED']}", f"127.0.0.1:{ports['SIGNED']}",
               str(good), str(bad), suffix]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
        results[side] = {line["case"]: line for line in lines}

    threads = [threading.Thread(target=run, args=(side,)) for side in ("kafka", "samsa")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results) == {"kafka", "samsa"}
    kafka, samsa = results["kafka"], results["samsa"]
    assert kafka["unsecured"].get("result") == {"brokers": 1, "offset": 0, "read": "v"}, kafka
    assert kafka["signed"].get("result") == {"brokers": 1, "offset": 0, "read": "v"}, kafka
    assert "error" in kafka["signed-bad-signature"], kafka
    assert samsa == kafka
