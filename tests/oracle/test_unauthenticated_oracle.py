"""Before SASL authentication, samsa against Apache Kafka on the same raw requests: the frame
limit (sasl.server.max.receive.size) and the failed-authentication delay are Kafka's; the
unknown SCRAM user, the authentication deadline and the per-address limit of a SASL listener
are samsa's deviations (docs/semantics.md, D-SEC-1 to 3), each asserted here as it is."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from _broker import BrokerProcess
from samsa.broker.sasl import ScramCredentials
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import frame_request, split_response
from samsa.protocol.messages import (
    ApiKey,
    decode_response,
    encode_request,
    is_flexible,
    make_request,
)
from samsa.protocol.sasl import make_credential
from samsa.testing import read_frame
from samsa.testing.kafka import KafkaNode, free_port

PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_bob="pw";'
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
ITERATIONS = 8192  # alice's, on both brokers


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, int]]:
    """The SASL_PLAINTEXT port of a Kafka node and of a samsa broker, each with PLAIN user
    bob/pw and SCRAM-SHA-256 user alice."""
    root = tmp_path_factory.mktemp("unauthenticated")
    node = KafkaNode(root / "kafka")
    sasl_port = free_port()
    node.overrides = {
        "listeners": (
            f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port},"
            f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
        ),
        "advertised.listeners": (
            f"PLAINTEXT://127.0.0.1:{node.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
        ),
        "listener.security.protocol.map": (
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
        ),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
    }
    node.start()
    samsa: BrokerProcess | None = None
    try:
        admin = AdminClient({"bootstrap.servers": node.bootstrap})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, ITERATIONS)
        upsert = UserScramCredentialUpsertion("alice", info, b"pw")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        data = root / "samsa"
        ScramCredentials(data).put(
            "alice", "SCRAM-SHA-256", make_credential("SCRAM-SHA-256", "pw", ITERATIONS)
        )
        users = root / "plain-users"
        users.write_text("bob=pw\n")
        samsa = BrokerProcess(
            data,
            {
                "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
                "sasl.plain.users.file": str(users),
            },
        ).start()
        yield {"kafka": sasl_port, "samsa": samsa.port}
    finally:
        if samsa is not None:
            samsa.stop()
        node.stop()


def _frame(api_key: int, version: int, entity: Any) -> bytes:
    body = encode_request(api_key, version, entity)
    return frame_request(api_key, version, 7, "t", body, is_flexible(api_key, version))


def _call(sock: socket.socket, api_key: int, version: int, entity: Any) -> Any:
    sock.sendall(_frame(api_key, version, entity))
    return _response(sock, api_key, version)


def _response(sock: socket.socket, api_key: int, version: int) -> Any:
    frame = read_frame(sock)
    flexible = is_flexible(api_key, version) and api_key != ApiKey.API_VERSIONS
    _cid, offset = split_response(frame, flexible)
    return decode_response(api_key, version, frame, offset)


def _closed_unanswered(sock: socket.socket, timeout: float = 10) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def _api_versions(sock: socket.socket) -> bool:
    try:
        request = make_request(ApiKey.API_VERSIONS, 0, "ApiVersionsRequest")
        return _call(sock, ApiKey.API_VERSIONS, 0, request).error_code == 0
    except OSError:
        return False


@contextlib.contextmanager
def _connect(port: int, n: int = 1) -> Iterator[list[socket.socket]]:
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    try:
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _handshake(sock: socket.socket, mechanism: str) -> None:
    entity = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism=mechanism)
    assert _call(sock, ApiKey.SASL_HANDSHAKE, 1, entity).error_code == 0


def _token(token: bytes) -> Any:
    return make_request(ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=token)


def _plain_frame(size: int, password: bytes = b"wrong") -> bytes:
    """A SaslAuthenticate frame of ``size`` bytes after its prefix (PLAIN, bob, a wrong
    password padded to fit)."""
    pad = 0
    for _ in range(3):  # the token's length prefix grows with it
        frame = _frame(ApiKey.SASL_AUTHENTICATE, 2, _token(b"\0bob\0" + password + b"x" * pad))
        pad += size - (len(frame) - 4)
    assert len(frame) - 4 == size
    return frame


@pytest.mark.parametrize("broker", ["kafka", "samsa"])
def test_a_frame_before_authentication_is_at_most_524288_bytes(
    brokers: dict[str, int], broker: str
) -> None:
    with _connect(brokers[broker], 2) as (fits, over):
        _handshake(fits, "PLAIN")
        fits.sendall(_plain_frame(524288))
        assert _response(fits, ApiKey.SASL_AUTHENTICATE, 2).error_code == (
            ErrorCode.SASL_AUTHENTICATION_FAILED
        )
        _handshake(over, "PLAIN")
        over.sendall(_plain_frame(524289))
        assert _closed_unanswered(over)


@pytest.mark.parametrize("broker", ["kafka", "samsa"])
def test_a_failed_authentication_is_answered_after_100_ms(
    brokers: dict[str, int], broker: str
) -> None:
    took = []
    for _ in range(3):
        with _connect(brokers[broker]) as [sock]:
            _handshake(sock, "PLAIN")
            start = time.monotonic()
            resp = _call(sock, ApiKey.SASL_AUTHENTICATE, 2, _token(b"\0bob\0wrong"))
            took.append(time.monotonic() - start)
            assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert _closed_unanswered(sock)
    assert min(took) >= 0.095, took


def _scram_first(port: int, user: str) -> tuple[int, dict[str, str]]:
    with _connect(port) as [sock]:
        _handshake(sock, "SCRAM-SHA-256")
        resp = _call(sock, ApiKey.SASL_AUTHENTICATE, 2, _token(f"n,,n={user},r=abc".encode()))
        attrs = dict(p.split("=", 1) for p in resp.auth_bytes.decode().split(",") if "=" in p)
        return int(resp.error_code), attrs


def test_d_sec_1_an_unknown_scram_user_is_refused_at_once_by_kafka_and_mocked_by_samsa(
    brokers: dict[str, int],
) -> None:
    for broker in ("kafka", "samsa"):  # a real user: the salt and iteration count
        error, alice = _scram_first(brokers[broker], "alice")
        assert (error, alice["i"]) == (0, str(ITERATIONS))
    # Kafka fails the unknown user's first message, which tells that it does not exist.
    assert _scram_first(brokers["kafka"], "mallory")[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    # samsa answers as for a real user: a salt of its own, the same every time, the real
    # users' iteration count; the exchange fails at the proof, like a wrong password.
    error, first = _scram_first(brokers["samsa"], "mallory")
    assert (error, first["i"]) == (0, str(ITERATIONS))
    assert _scram_first(brokers["samsa"], "mallory")[1]["s"] == first["s"]
    assert first["s"] != _scram_first(brokers["samsa"], "alice")[1]["s"]


def test_d_sec_2_kafka_keeps_an_unauthenticated_connection_that_samsa_closes(
    brokers: dict[str, int],
) -> None:
    with _connect(brokers["kafka"]) as [kafka], _connect(brokers["samsa"]) as [samsa]:
        start = time.monotonic()
        assert _closed_unanswered(samsa, timeout=15)
        assert 4.5 < time.monotonic() - start < 10  # sasl.server.authentication.timeout.ms
        assert _api_versions(kafka)  # Kafka's is still served


def test_d_sec_3_kafka_takes_more_connections_from_one_address_than_samsa(
    brokers: dict[str, int],
) -> None:
    with _connect(brokers["kafka"], 257) as kafka:
        assert _api_versions(kafka[0]) and _api_versions(kafka[-1])
    with _connect(brokers["samsa"], 257) as samsa:
        assert _api_versions(samsa[0]) and _api_versions(samsa[255])
        assert _closed_unanswered(samsa[256])  # sasl.max.connections.per.ip (256)
