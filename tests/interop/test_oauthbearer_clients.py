"""SASL/OAUTHBEARER with confluent-kafka (librdkafka) against a samsa broker process: an
unsecured-JWT listener (librdkafka's ``enable.sasl.oauthbearer.unsecure.jwt``) and a listener
that checks signed JWTs against a JWKS file (tokens from ``oauth_cb``); a token with the wrong
audience or issuer, an expired one and one with a bad signature are each refused with
SASL_AUTHENTICATION_FAILED, and the broker's log says why."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError as CkError
from confluent_kafka.admin import AdminClient, NewTopic
from test_security import _ck_round_trip

from _broker import BrokerProcess
from _jwt import AUDIENCE, ISSUER, Keys, claims, keys_and_jwks

LISTENER = re.compile(r"listener (\w+) \(\w+\) on 127\.0\.0\.1:(\d+)")


class OAuthBroker:
    def __init__(self, proc: BrokerProcess, keys: Keys) -> None:
        self.proc = proc
        self.keys = keys

    def port(self, listener: str) -> int:
        for line in reversed(self.proc.log):
            m = LISTENER.search(line)
            if m and m[1] == listener:
                return int(m[2])
        raise AssertionError(f"no {listener} listener in the log")

    def unsecured(self, principal: str = "alice") -> dict[str, Any]:
        return {
            "bootstrap.servers": f"127.0.0.1:{self.port('UNSECURED')}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": f"principal={principal}",
        }

    def signed(self, token: Callable[[], str]) -> dict[str, Any]:
        return {
            "bootstrap.servers": f"127.0.0.1:{self.port('SIGNED')}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            # confluent-kafka's oauth_cb: (token, expiry in seconds since the epoch)
            "oauth_cb": lambda _config: (token(), time.time() + 600),
        }


@pytest.fixture(scope="module")
def oauth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthBroker]:
    root = tmp_path_factory.mktemp("oauth")
    keys, jwks = keys_and_jwks(root)
    overrides = {
        "listeners": "UNSECURED://127.0.0.1:0,SIGNED://127.0.0.1:0",
        "listener.security.protocol.map": "UNSECURED:SASL_PLAINTEXT,SIGNED:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.signed.sasl.oauthbearer.jwks.endpoint.url": jwks.as_uri(),
        "listener.name.signed.sasl.oauthbearer.expected.audience": AUDIENCE,
        "listener.name.signed.sasl.oauthbearer.expected.issuer": ISSUER,
        "group.initial.rebalance.delay.ms": "0",
    }
    proc = BrokerProcess(root / "data", overrides).start()
    yield OAuthBroker(proc, keys)
    proc.stop()


def _round_trip(conf: dict[str, Any], n: int = 5) -> list[bytes]:
    topic = f"oauth-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=20)
    return _ck_round_trip(conf, topic, n)


def test_confluent_kafka_with_an_unsecured_jwt(oauth: OAuthBroker) -> None:
    assert _round_trip(oauth.unsecured()) == [b"m-%d" % i for i in range(5)]


def test_confluent_kafka_with_a_signed_jwt_from_oauth_cb(oauth: OAuthBroker) -> None:
    keys = oauth.keys
    assert _round_trip(oauth.signed(lambda: keys.sign(claims()))) == [b"m-%d" % i for i in range(5)]
    # an EC key of the same JWKS
    assert len(_round_trip(oauth.signed(lambda: keys.sign(claims(), kid="e1")), 1)) == 1


def _refused(conf: dict[str, Any]) -> list[CkError]:
    errors: list[CkError] = []
    admin = AdminClient({**conf, "error_cb": errors.append})
    with pytest.raises(Exception, match=r"transport|Authentication|timed out"):
        admin.list_topics(timeout=1)
    admin.poll(1)  # error_cb runs from poll
    return errors


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("audience", "Audience doesn't match"),
        ("issuer", "Invalid issuer"),
        ("expired", "Signature has expired"),
        ("signature", "Signature verification failed"),
        ("unsecured", "algorithm 'none' refused"),
    ],
)
def test_bad_tokens_are_refused_with_their_reason(
    oauth: OAuthBroker, case: str, reason: str
) -> None:
    keys = oauth.keys
    if case == "unsecured":
        conf = {**oauth.unsecured(), "bootstrap.servers": f"127.0.0.1:{oauth.port('SIGNED')}"}
    else:
        token = {
            "audience": lambda: keys.sign(claims(aud="someone-else")),
            "issuer": lambda: keys.sign(claims(iss="https://evil.test")),
            "expired": lambda: keys.sign(claims(exp=int(time.time()) - 120)),
            "signature": lambda: keys.sign(claims(), key=keys.other),
        }[case]
        conf = oauth.signed(token)
    errors = _refused(conf)
    assert any(e.code() == CkError._AUTHENTICATION for e in errors), errors
    # the client is told Kafka's JSON status; the broker's log says why
    assert any("invalid_token" in e.str() for e in errors), errors
    assert oauth.proc.wait_for_log(reason) is not None
