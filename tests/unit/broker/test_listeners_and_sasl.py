"""Listeners, TLS principals and SASL on the broker, in-process: SCRAM against RFC 7677's
example, PLAIN, Kafka's principal mapping rules, the listener settings, the credential file,
and a server with PLAINTEXT, SSL (mTLS) and SASL_PLAINTEXT listeners answering each client
with its own listener's address."""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from _certs import make_pki
from samsa.broker.config import BrokerConfig, ConfigError
from samsa.broker.listeners import PrincipalMapper, parse_listeners, subject_dn
from samsa.broker.sasl import CREDENTIALS_FILE, PlainUsers, SaslSession, ScramCredentials
from samsa.broker.server import BrokerServer, KafkaConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import frame_request, split_response
from samsa.protocol.messages import (
    ApiKey,
    decode_response,
    encode_request,
    is_flexible,
    make_request,
)
from samsa.protocol.sasl import (
    PlainServer,
    SaslError,
    ScramClient,
    ScramServer,
    client_mechanism,
    make_credential,
)

# RFC 7677 section 3: SCRAM-SHA-256, user "user", password "pencil".
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = "W22ZaJ0SNY7soEsUEjb6gQ=="
RFC_SERVER_FIRST = f"r={RFC_CLIENT_NONCE}{RFC_SERVER_NONCE},s={RFC_SALT},i=4096"
RFC_CLIENT_FINAL = (
    f"c=biws,r={RFC_CLIENT_NONCE}{RFC_SERVER_NONCE},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _rfc_credential() -> Any:
    import base64

    return make_credential("SCRAM-SHA-256", "pencil", 4096, base64.b64decode(RFC_SALT))


def test_scram_client_matches_rfc_7677() -> None:
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first() == f"n,,n=user,r={RFC_CLIENT_NONCE}".encode()
    assert client.step(RFC_SERVER_FIRST.encode()) == RFC_CLIENT_FINAL.encode()
    assert client.step(RFC_SERVER_FINAL.encode()) is None and client.done
    forged = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CLIENT_NONCE)
    forged.step(RFC_SERVER_FIRST.encode())
    with pytest.raises(SaslError, match="signature"):  # a broker that does not know the key
        forged.step(b"v=" + b"A" * 44)


def test_scram_server_matches_rfc_7677() -> None:
    cred = _rfc_credential()
    server = ScramServer("SCRAM-SHA-256", lambda u, m: cred, nonce=RFC_SERVER_NONCE)
    first = server.step(f"n,,n=user,r={RFC_CLIENT_NONCE}".encode())
    assert first == RFC_SERVER_FIRST.encode()
    assert server.step(RFC_CLIENT_FINAL.encode()) == RFC_SERVER_FINAL.encode()
    assert server.complete and server.user == "user"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_refuses_wrong_password_and_unknown_user_alike(mechanism: str) -> None:
    creds = {("alice", mechanism): make_credential(mechanism, "right")}

    def run(user: str, password: str) -> str | None:
        server = ScramServer(mechanism, lambda u, m: creds.get((u, m)))
        client = client_mechanism(mechanism, user, password)
        try:
            reply = server.step(client.first())
            final = client.step(reply)
            assert final is not None
            client.step(server.step(final))
        except SaslError as exc:
            return str(exc)
        assert server.complete and client.done
        return None

    assert run("alice", "right") is None
    assert run("alice", "wrong") == "Authentication failed: Invalid user credentials"
    assert run("mallory", "right") == "Authentication failed: Invalid user credentials"


def test_scram_refuses_a_replayed_or_tampered_final_message() -> None:
    cred = _rfc_credential()
    server = ScramServer("SCRAM-SHA-256", lambda u, m: cred)  # a fresh server nonce
    server.step(f"n,,n=user,r={RFC_CLIENT_NONCE}".encode())
    with pytest.raises(SaslError, match="nonce"):  # the RFC's proof, replayed
        server.step(RFC_CLIENT_FINAL.encode())
    with pytest.raises(SaslError, match="channel binding"):
        ScramServer("SCRAM-SHA-256", lambda u, m: cred).step(b"p=tls-unique,,n=user,r=x")


def test_plain_server() -> None:
    users = {"bob": "pw"}

    def check(u: str, p: str) -> bool:
        return users.get(u) == p

    assert PlainServer(check).step(b"\0bob\0pw") == b""
    for bad in (b"\0bob\0nope", b"\0nobody\0pw", b"bob\0pw", b"eve\0bob\0pw", b"\0\0pw"):
        with pytest.raises(SaslError):
            PlainServer(check).step(bad)


def test_sasl_session_states() -> None:
    session = SaslSession(("PLAIN",), ScramCredentials(Path("/nonexistent")), PlainUsers(None))
    assert session.authenticate(b"x")[0] == ErrorCode.ILLEGAL_SASL_STATE  # no handshake
    session = SaslSession(("PLAIN",), ScramCredentials(Path("/nonexistent")), PlainUsers(None))
    assert session.handshake("SCRAM-SHA-256") == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert session.failed is not None


CERT = {
    "subject": (
        (("countryName", "US"),),
        (("organizationName", "Acme, Inc."),),
        (("organizationalUnitName", "eng"),),
        (("commonName", "alice"),),
    )
}


def test_subject_dn_is_rfc_2253_most_specific_first() -> None:
    assert subject_dn(CERT) == "CN=alice,OU=eng,O=Acme\\, Inc.,C=US"


@pytest.mark.parametrize(
    ("rules", "principal"),
    [
        ("DEFAULT", "User:CN=alice,OU=eng,O=Acme\\, Inc.,C=US"),
        ("RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/,DEFAULT", "User:alice@eng"),
        ("RULE:^CN=(.*?),.*$/$1/U", "User:ALICE"),
        ("RULE:^(.*?)=(.*?),.*$/$2-$1/L", "User:alice-cn"),
        (
            "RULE:^CN=bob,.*$/bob/, RULE:^CN=(.*?),OU=ENG.*$/$1/L,DEFAULT",
            "User:CN=alice,OU=eng,O=Acme\\, Inc.,C=US",
        ),
        ("RULE:^CN=(.*?),OU=(.*?),.*$/$2\\/$1/L", "User:eng/alice"),
    ],
)
def test_principal_mapping_rules(rules: str, principal: str) -> None:
    assert PrincipalMapper(rules).principal(CERT) == principal


def test_principal_mapping_without_a_match_and_bad_rules() -> None:
    with pytest.raises(ValueError, match=r"no ssl\.principal\.mapping\.rules rule applies"):
        PrincipalMapper("RULE:^CN=bob$/bob/").principal(CERT)
    assert PrincipalMapper("DEFAULT").principal(None) == "User:ANONYMOUS"
    for bad in ("RULE:^CN=(.*$/$1/", "NOPE", "RULE:x/y/Q"):
        with pytest.raises(ConfigError, match=r"ssl\.principal\.mapping\.rules"):
            BrokerConfig(ssl_principal_mapping_rules=bad).validate()


def test_listener_settings() -> None:
    c = BrokerConfig().with_properties(
        {
            "listeners": "INTERNAL://127.0.0.1:9093,EXTERNAL://0.0.0.0:9094",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
            "advertised.listeners": "EXTERNAL://kafka.example.com:19094",
        }
    )
    first, second = parse_listeners(c)
    assert (first.name, first.protocol, first.host, first.port) == (
        "INTERNAL",
        "PLAINTEXT",
        "127.0.0.1",
        9093,
    )
    assert (second.protocol, second.advertised(9094)) == ("SASL_SSL", ("kafka.example.com", 19094))
    assert first.advertised(9093) == ("127.0.0.1", 9093)
    # --host/--port speak for the first listener
    assert parse_listeners(c.with_overrides(port=0))[0].port == 0
    for props, message in [
        ({"listeners": "FOO://127.0.0.1:1"}, "listener FOO has no security protocol"),
        ({"listeners": "PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2"}, "may appear once"),
        ({"listeners": "PLAINTEXT://127.0.0.1:1,SSL://127.0.0.1:1"}, "its own port"),
        ({"listeners": "SSL://127.0.0.1:1"}, "needs ssl.keystore.location"),
        ({"listener.security.protocol.map": "A:TLS"}, "expected NAME:PROTOCOL"),
        ({"advertised.listeners": "SSL://h:1", "listeners": "PLAINTEXT://h:2"}, "unknown"),
        ({"sasl.enabled.mechanisms": "GSSAPI"}, "GSSAPI is not supported"),
        ({"listeners": "PLAINTEXT://h:1", "advertised.listeners": "PLAINTEXT://h:0"}, "not 0"),
        ({"ssl.client.auth": "sometimes"}, "ssl.client.auth must be"),
        ({"ssl.keystore.type": "JKS"}, "PEM only"),
    ]:
        with pytest.raises(ConfigError, match=message):
            BrokerConfig().with_properties(props).validate()


def test_credentials_file_written_atomically_and_reread(tmp_path: Path) -> None:
    store = ScramCredentials(tmp_path)
    store.put("alice", "SCRAM-SHA-256", make_credential("SCRAM-SHA-256", "Tr0ub4dor&3"))
    assert (tmp_path / CREDENTIALS_FILE).stat().st_mode & 0o777 == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # none left
    assert "Tr0ub4dor" not in (tmp_path / CREDENTIALS_FILE).read_text()
    reader = ScramCredentials(tmp_path)  # e.g. the broker, while `samsa users` writes
    assert reader.lookup("alice", "SCRAM-SHA-256") is not None
    store.put("bob", "SCRAM-SHA-512", make_credential("SCRAM-SHA-512", "pw2"))
    assert reader.users() == {"alice": {"SCRAM-SHA-256": 4096}, "bob": {"SCRAM-SHA-512": 4096}}
    assert store.delete("alice") and not store.delete("alice")
    assert reader.lookup("alice", "SCRAM-SHA-256") is None
    doc = json.loads((tmp_path / CREDENTIALS_FILE).read_text())
    assert list(doc["users"]) == ["bob"]


def test_plain_users_file(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_text("# comment\nbob = s3cret\n")
    users = PlainUsers(str(path))
    assert users.check("bob", "s3cret") and not users.check("bob", "x")
    assert not users.check("eve", "s3cret") and not PlainUsers(None).check("bob", "s3cret")


# -- a server with three listeners --------------------------------------------------------


def _frame(api_key: int, version: int, entity: Any, cid: int) -> bytes:
    body = encode_request(api_key, version, entity)
    return frame_request(api_key, version, cid, "t", body, is_flexible(api_key, version))


async def _call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: int, version: int, e: Any
) -> Any:
    writer.write(_frame(api_key, version, e, 7))
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    frame = await reader.readexactly(size)
    flexible = is_flexible(api_key, version) and api_key != ApiKey.API_VERSIONS
    cid, offset = split_response(frame, flexible)
    assert cid == 7
    return decode_response(api_key, version, frame, offset)


METADATA = make_request(
    ApiKey.METADATA,
    9,
    "MetadataRequest",
    topics=None,
    allow_auto_topic_creation=False,
    include_cluster_authorized_operations=False,
    include_topic_authorized_operations=False,
)


def _principals(server: BrokerServer) -> set[str]:
    return {c.principal for c in server.limits.connections}


def test_listeners_tls_principal_and_per_listener_metadata(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    cert, key = pki.client("carol")
    config = BrokerConfig(data_dir=tmp_path / "data", port=0).with_properties(
        {
            "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "advertised.listeners": "SSL://ssl.example.com:19093",
            "ssl.keystore.location": str(pki.broker),
            "ssl.truststore.location": str(pki.ca),
            "ssl.client.auth": "required",
            "ssl.principal.mapping.rules": "RULE:^CN=(.*?),OU=.*$/$1/,DEFAULT",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        }
    )
    config = config.with_overrides(port=0).validate()
    ScramCredentials(config.data_dir).put(
        "dave", "SCRAM-SHA-512", make_credential("SCRAM-SHA-512", "pw")
    )

    async def main() -> None:
        server = BrokerServer(config)
        await server.start()
        try:
            plain, tls, sasl = (e.sockets[0].getsockname()[1] for e in server.endpoints)
            r, w = await asyncio.open_connection("127.0.0.1", plain)
            meta = await _call(r, w, ApiKey.METADATA, 9, METADATA)
            assert [(b.host, b.port) for b in meta.brokers] == [("127.0.0.1", plain)]
            assert _principals(server) == {"User:ANONYMOUS"}
            w.close()

            client_ctx = ssl.create_default_context(cafile=str(pki.ca))
            client_ctx.load_cert_chain(str(cert), str(key))
            r, w = await asyncio.open_connection("127.0.0.1", tls, ssl=client_ctx)
            meta = await _call(r, w, ApiKey.METADATA, 9, METADATA)
            assert [(b.host, b.port) for b in meta.brokers] == [("ssl.example.com", 19093)]
            (conn,) = [c for c in server.limits.connections if c.tls]
            assert conn.principal == "User:carol"
            w.close()

            # No client certificate where one is required: the handshake fails.
            no_cert = ssl.create_default_context(cafile=str(pki.ca))
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                r, w = await asyncio.open_connection("127.0.0.1", tls, ssl=no_cert)
                await _call(r, w, ApiKey.METADATA, 9, METADATA)
            await _sasl_listener(server, sasl)
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


async def _sasl_listener(server: BrokerServer, port: int) -> None:
    # Metadata before authentication: the connection is closed, nothing answered.
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(_frame(ApiKey.METADATA, 9, METADATA, 1))
    assert await r.read() == b""
    w.close()
    # A good SCRAM exchange, then Metadata with the SASL listener's address.
    r, w = await asyncio.open_connection("127.0.0.1", port)
    hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")
    resp = await _call(r, w, ApiKey.SASL_HANDSHAKE, 1, hs)
    assert resp.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert list(resp.mechanisms) == ["SCRAM-SHA-512"]
    assert await r.read() == b""  # and the connection is closed
    r, w = await asyncio.open_connection("127.0.0.1", port)
    hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="SCRAM-SHA-512")
    assert (await _call(r, w, ApiKey.SASL_HANDSHAKE, 1, hs)).error_code == ErrorCode.NONE
    client = client_mechanism("SCRAM-SHA-512", "dave", "pw")
    token: bytes | None = client.first()
    while token is not None:
        auth = make_request(
            ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=token
        )
        resp = await _call(r, w, ApiKey.SASL_AUTHENTICATE, 2, auth)
        assert resp.error_code == ErrorCode.NONE
        token = client.step(resp.auth_bytes)
    meta = await _call(r, w, ApiKey.METADATA, 9, METADATA)
    assert [(b.host, b.port) for b in meta.brokers] == [("127.0.0.1", port)]
    assert "User:dave" in _principals(server)
    w.close()


def test_sasl_handshake_on_a_plaintext_connection_is_illegal(tmp_path: Path) -> None:
    from samsa.broker.broker import Broker

    broker = Broker(BrokerConfig(data_dir=tmp_path))
    try:
        conn = KafkaConnection(broker)
        written: list[bytes] = []

        class T:
            def set_write_buffer_limits(self, high: int) -> None: ...
            def get_extra_info(self, name: str) -> Any:
                return None

            def writelines(self, out: list[bytes]) -> None:
                written.extend(out)

        conn.connection_made(T())  # type: ignore[arg-type]
        hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")
        conn.data_received(_frame(ApiKey.SASL_HANDSHAKE, 1, hs, 3))
        frame = b"".join(written)[4:]
        cid, offset = split_response(frame, False)
        resp = decode_response(ApiKey.SASL_HANDSHAKE, 1, frame, offset)
        assert (cid, resp.error_code) == (3, ErrorCode.ILLEGAL_SASL_STATE)
    finally:
        broker.close()


def _plain_session(reauth_ms: int, tmp_path: Path) -> SaslSession:
    users = tmp_path / "plain"
    users.write_text("bob=pw\ncarl=pw\n")
    return SaslSession(
        ("PLAIN", "SCRAM-SHA-256"), ScramCredentials(tmp_path), PlainUsers(str(users)), reauth_ms
    )


def test_reauthentication_rules(tmp_path: Path) -> None:
    session = _plain_session(1000, tmp_path)
    assert session.handshake("PLAIN") == ErrorCode.NONE
    assert session.authenticate(b"\0bob\0pw")[0] == ErrorCode.NONE
    assert (session.principal, session.lifetime_ms) == ("User:bob", 1000)
    assert session.expires_at is not None
    assert not session.expired(session.expires_at - 0.01) and session.expired(session.expires_at)
    # KIP-368: the same mechanism and principal again renew the session...
    assert session.handshake("PLAIN", now=10.0) == ErrorCode.NONE
    assert session.authenticate(b"\0bob\0pw")[0] == ErrorCode.NONE and session.failed is None
    # ...at most once a second (Kafka's KafkaChannel): sooner, the handshake is refused but
    # nothing fails, and the session is the one renewed...
    assert session.handshake("PLAIN", now=10.9) == ErrorCode.ILLEGAL_SASL_STATE
    assert session.failed is None and session.principal == "User:bob"
    error, message, _ = session.authenticate(b"\0bob\0pw")  # no re-authentication under way
    assert error == ErrorCode.ILLEGAL_SASL_STATE and "after successful" in str(message)
    assert session.failed is None
    # ...and another principal is refused, as is another mechanism.
    assert session.handshake("PLAIN", now=11.0) == ErrorCode.NONE
    error, message, _ = session.authenticate(b"\0carl\0pw")
    assert error == ErrorCode.SASL_AUTHENTICATION_FAILED and "principal" in str(message)
    other = _plain_session(1000, tmp_path)
    other.handshake("PLAIN")
    other.authenticate(b"\0bob\0pw")
    assert other.handshake("SCRAM-SHA-256") == ErrorCode.ILLEGAL_SASL_STATE
    # Without connections.max.reauth.ms a session never ends and is not renewed.
    once = _plain_session(0, tmp_path)
    once.handshake("PLAIN")
    once.authenticate(b"\0bob\0pw")
    assert (once.lifetime_ms, once.expires_at) == (0, None)
    assert once.handshake("PLAIN") == ErrorCode.ILLEGAL_SASL_STATE and once.failed is None


async def _plain_login(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> int:
    hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")
    assert (await _call(r, w, ApiKey.SASL_HANDSHAKE, 1, hs)).error_code == ErrorCode.NONE
    auth = make_request(
        ApiKey.SASL_AUTHENTICATE, 1, "SaslAuthenticateRequest", auth_bytes=b"\0bob\0pw"
    )
    resp = await _call(r, w, ApiKey.SASL_AUTHENTICATE, 1, auth)
    assert resp.error_code == ErrorCode.NONE
    return int(resp.session_lifetime.total_seconds() * 1000)


def _reauth_server(tmp_path: Path, reauth_ms: int) -> BrokerServer:
    users = tmp_path / "plain"
    users.write_text("bob=pw\n")
    config = BrokerConfig(data_dir=tmp_path / "data", port=0).with_properties(
        {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.plain.users.file": str(users),
            "connections.max.reauth.ms": str(reauth_ms),
        }
    )
    return BrokerServer(config.with_overrides(port=0).validate())


def _renewed_once(tmp_path: Path, then: Any) -> None:
    """Runs ``then(server, reader, writer)`` on a connection of a server with 60 s sessions,
    logged in and renewed once already (the first renewal may come at once)."""

    async def main() -> None:
        server = _reauth_server(tmp_path, 60_000)
        await server.start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            assert await _plain_login(r, w) == 60_000
            assert await _plain_login(r, w) == 60_000
            await then(server, r, w)
            w.close()
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_expired_session_closes_the_connection_unless_renewed(tmp_path: Path) -> None:
    """As Kafka's SocketServer: after the session's end a request closes the connection, the
    SASL ones (ApiVersions included) too, unless it is a SaslHandshake beginning a
    re-authentication, which is served however late it comes."""

    async def main() -> None:
        server = _reauth_server(tmp_path, 1000)
        await server.start()
        try:
            port = server.port
            late, stale, probe = [await asyncio.open_connection("127.0.0.1", port) for _ in "123"]
            for r, w in (late, stale, probe):
                assert await _plain_login(r, w) == 1000
            await _call(*stale, ApiKey.METADATA, 9, METADATA)  # within the session
            await asyncio.sleep(1.1)
            assert await _plain_login(*late) == 1000  # renewed after the end: served
            await _call(*late, ApiKey.METADATA, 9, METADATA)
            stale[1].write(_frame(ApiKey.METADATA, 9, METADATA, 1))
            versions = make_request(ApiKey.API_VERSIONS, 0, "ApiVersionsRequest")
            probe[1].write(_frame(ApiKey.API_VERSIONS, 0, versions, 1))
            for r, w in (stale, probe):
                assert await r.read() == b""  # expired: closed, not answered
                w.close()
            late[1].close()
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_handshake_that_begins_no_reauthentication_is_refused_on_an_open_connection(
    tmp_path: Path,
) -> None:
    """As Kafka: a SaslHandshake within a second of the last re-authentication's start begins
    none (KafkaChannel), and is answered ILLEGAL_SASL_STATE with no mechanisms, as is a
    SaslAuthenticate with no handshake (KafkaApis); the session and the connection stay."""

    async def then(server: BrokerServer, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")
        refused = await _call(r, w, ApiKey.SASL_HANDSHAKE, 1, hs)
        assert (refused.error_code, list(refused.mechanisms)) == (ErrorCode.ILLEGAL_SASL_STATE, [])
        auth = make_request(
            ApiKey.SASL_AUTHENTICATE, 1, "SaslAuthenticateRequest", auth_bytes=b"\0bob\0pw"
        )
        resp = await _call(r, w, ApiKey.SASL_AUTHENTICATE, 1, auth)
        assert resp.error_code == ErrorCode.ILLEGAL_SASL_STATE
        assert resp.session_lifetime.total_seconds() == 0
        meta = await _call(r, w, ApiKey.METADATA, 9, METADATA)  # still open, still bob's
        assert meta.brokers and _principals(server) == {"User:bob"}

    _renewed_once(tmp_path, then)


def test_a_request_in_the_middle_of_a_reauthentication_closes_the_connection(
    tmp_path: Path,
) -> None:
    """As Kafka's SaslServerAuthenticator ("Unexpected Kafka request ... during SASL
    authentication"): between a re-authentication's SaslHandshake and its last
    SaslAuthenticate, any other request closes the connection; after it, requests are served."""

    async def then(server: BrokerServer, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _call(r, w, ApiKey.METADATA, 9, METADATA)  # after a whole renewal: served
        await asyncio.sleep(1.0)  # Kafka begins at most one re-authentication a second
        hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")
        assert (await _call(r, w, ApiKey.SASL_HANDSHAKE, 1, hs)).error_code == ErrorCode.NONE
        w.write(_frame(ApiKey.METADATA, 9, METADATA, 7))
        assert await r.read() == b""  # closed, not answered

    _renewed_once(tmp_path, then)


def test_tls_listener_keeps_the_connection_limits(tmp_path: Path) -> None:
    """A client that opens a TLS connection and never shakes hands holds its slot only for
    socket.request.read.timeout.ms; max.connections.per.ip counts TLS connections too."""
    pki = make_pki(tmp_path / "pki")
    config = BrokerConfig(data_dir=tmp_path / "data", port=0).with_properties(
        {
            "listeners": "SSL://127.0.0.1:0",
            "ssl.keystore.location": str(pki.broker),
            "socket.request.read.timeout.ms": "300",
            "max.connections.per.ip": "1",
        }
    )
    config = config.with_overrides(port=0).validate()

    async def main() -> None:
        server = BrokerServer(config)
        await server.start()
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", server.port)  # no handshake
            await asyncio.sleep(0.05)
            assert server.limits.accepted == 1
            r2, w2 = await asyncio.open_connection("127.0.0.1", server.port)
            assert await asyncio.wait_for(r2.read(), 5) == b""  # over the per-ip limit
            assert await asyncio.wait_for(r1.read(), 5) == b""  # handshake timed out
            await asyncio.sleep(0.05)
            assert server.limits.accepted == 0
            ctx = ssl.create_default_context(cafile=str(pki.ca))
            r3, w3 = await asyncio.open_connection("127.0.0.1", server.port, ssl=ctx)
            meta = await _call(r3, w3, ApiKey.METADATA, 9, METADATA)
            assert meta.brokers[0].port == server.port
            for w in (w1, w2, w3):
                w.close()
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_failed_authentication_answers_then_cuts_a_client_that_does_not_read(
    tmp_path: Path,
) -> None:
    """The answer to a failed authentication is held for connection.failed.authentication.delay.ms
    with reading stopped (as Kafka), then sent, then the connection is closed; a client that does
    not read is cut after the read timeout."""
    from samsa.broker.broker import Broker

    broker = Broker(
        BrokerConfig(
            data_dir=tmp_path,
            socket_request_read_timeout_ms=50,
            connection_failed_authentication_delay_ms=150,
        )
    )
    calls: list[str] = []
    answered: list[tuple[int, float]] = []  # correlation id, when written

    class T:
        def set_write_buffer_limits(self, high: int) -> None: ...
        def get_extra_info(self, name: str) -> Any:
            return None

        def writelines(self, out: list[bytes]) -> None:
            calls.append("write")
            data = b"".join(out)
            while data:
                (size,) = struct.unpack(">i", data[:4])
                answered.append((struct.unpack(">i", data[4:8])[0], time.monotonic()))
                data = data[4 + size :]

        def pause_reading(self) -> None:
            calls.append("pause")

        def resume_reading(self) -> None:
            calls.append("resume")

        def close(self) -> None:
            calls.append("close")

        def abort(self) -> None:
            calls.append("abort")

    async def main() -> None:
        conn = KafkaConnection(broker)
        conn.connection_made(T())  # type: ignore[arg-type]
        conn.core.session = _plain_session(0, tmp_path)
        hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")
        bad = make_request(
            ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=b"\0bob\0no"
        )
        sent_at = time.monotonic()
        conn.data_received(
            _frame(ApiKey.SASL_HANDSHAKE, 1, hs, 1)
            + _frame(ApiKey.SASL_AUTHENTICATE, 2, bad, 2)
            + _frame(ApiKey.METADATA, 9, METADATA, 3)
        )
        while "close" not in calls:
            await asyncio.sleep(0.01)
        # The handshake's answer may leave at once (a loaded machine can end the connection's
        # turn after it, as Kafka answers each step before reading the next); the failed
        # step's answer waits out the delay with reading paused, then the connection closes
        # and the Metadata behind it is never answered.
        assert [cid for cid, _ in answered] == [1, 2]
        assert answered[1][1] - sent_at >= 0.15
        assert "pause" in calls and "resume" not in calls
        assert calls[-2:] == ["write", "close"]
        deadline = time.monotonic() + 5  # the 50 ms read timeout; slow on a loaded machine
        while "abort" not in calls and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert calls[-3:] == ["write", "close", "abort"]

    try:
        asyncio.run(main())
    finally:
        broker.close()


def test_alter_and_describe_scram_credentials(tmp_path: Path) -> None:
    from samsa.broker.sasl import alter_credentials, describe_credentials
    from samsa.protocol.sasl import salted_password

    store = ScramCredentials(tmp_path)
    salt = b"0123456789abcdef"
    salted = salted_password("SCRAM-SHA-512", "pw", salt, 4096)
    ok = ("kim", 2, 4096, salt, salted)
    assert alter_credentials(store, [], [ok]) == [("kim", ErrorCode.NONE, None)]
    # The stored keys are those of the password: a SCRAM login with it succeeds.
    cred = store.lookup("kim", "SCRAM-SHA-512")
    assert cred == make_credential("SCRAM-SHA-512", "pw", 4096, salt)
    assert describe_credentials(store, None) == [("kim", ErrorCode.NONE, None, [(2, 4096)])]
    codes = [
        alter_credentials(store, [("kim", 2)], [ok])[0][1],  # twice in one request
        alter_credentials(store, [], [("kim", 3, 4096, salt, salted)])[0][1],
        alter_credentials(store, [], [("kim", 1, 16385, salt, salted)])[0][1],
        alter_credentials(store, [], [("", 1, 4096, salt, salted)])[0][1],
        alter_credentials(store, [("kim", 1)], [])[0][1],
    ]
    assert codes == [
        ErrorCode.DUPLICATE_RESOURCE,
        ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        ErrorCode.UNACCEPTABLE_CREDENTIAL,
        ErrorCode.UNACCEPTABLE_CREDENTIAL,
        ErrorCode.RESOURCE_NOT_FOUND,
    ]
    # One change per user and request, whatever the mechanisms, as Kafka's controller:
    # both mechanisms at once (kafka-configs' two SCRAM-SHA-* in one --add-config) fail.
    both = [("ned", 1, 4096, salt, salted), ("ned", 2, 4096, salt, salted)]
    assert alter_credentials(store, [], both) == [
        ("ned", ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in "
         "the same request"),
    ]  # fmt: skip
    assert store.lookup("ned", "SCRAM-SHA-256") is None
    # A user's changes are all or nothing: the bad deletion kept the good upsertion out.
    mixed = alter_credentials(store, [("lou", 1)], [("lou", 2, 4096, salt, salted)])
    assert mixed[0][1] == ErrorCode.RESOURCE_NOT_FOUND
    assert store.lookup("lou", "SCRAM-SHA-512") is None
    described = describe_credentials(store, ["kim", "kim", "nobody"])
    assert [r[1] for r in described] == [
        ErrorCode.DUPLICATE_RESOURCE,
        ErrorCode.DUPLICATE_RESOURCE,
        ErrorCode.RESOURCE_NOT_FOUND,
    ]
    assert alter_credentials(store, [("kim", 2)], []) == [("kim", ErrorCode.NONE, None)]
    assert store.users() == {}


def test_credential_writers_take_turns(tmp_path: Path) -> None:
    """`samsa users` and a running broker may write at once: each waits for the other's
    lock and rereads, so neither change is lost."""
    import fcntl
    import os
    import threading

    first, second = ScramCredentials(tmp_path), ScramCredentials(tmp_path)
    first.put("a", "SCRAM-SHA-256", make_credential("SCRAM-SHA-256", "x"))
    second.lookup("a", "SCRAM-SHA-256")  # second's view is now cached
    fd = os.open(tmp_path / f".{CREDENTIALS_FILE}.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as if another process were writing
    done = threading.Event()
    writer = threading.Thread(
        target=lambda: (
            second.put("b", "SCRAM-SHA-256", make_credential("SCRAM-SHA-256", "y")),
            done.set(),
        )
    )
    writer.start()
    assert not done.wait(0.3)  # blocked on the lock
    first.users()  # the other process's change, made under its lock:
    first._users["c"] = {"SCRAM-SHA-256": make_credential("SCRAM-SHA-256", "z")}
    first._write()
    os.close(fd)
    assert done.wait(5)
    writer.join(5)
    assert set(ScramCredentials(tmp_path).users()) == {"a", "b", "c"}


def test_listener_prefixed_settings_override_the_global_ones(tmp_path: Path) -> None:
    """Kafka's listener.name.<listener>.<setting>: the SASL_SSL listener's keystore and the
    SASL_PLAINTEXT listener's mechanisms are its own; the other listener keeps the global."""
    pki = make_pki(tmp_path / "pki")
    config = BrokerConfig(data_dir=tmp_path / "data", port=0).with_properties(
        {
            "listeners": "SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            # no global keystore: only the SASL_SSL listener has one
            "listener.name.sasl_ssl.ssl.keystore.location": str(pki.broker),
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        }
    )
    config = config.with_overrides(port=0).validate()
    handshake = make_request(
        ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="SCRAM-SHA-512"
    )

    async def main() -> None:
        server = BrokerServer(config)
        await server.start()
        try:
            tls, sasl = (e.sockets[0].getsockname()[1] for e in server.endpoints)
            client_ctx = ssl.create_default_context(cafile=str(pki.ca))
            r, w = await asyncio.open_connection("127.0.0.1", tls, ssl=client_ctx)
            resp = await _call(r, w, ApiKey.SASL_HANDSHAKE, 1, handshake)
            assert (resp.error_code, list(resp.mechanisms)) == (0, ["SCRAM-SHA-512"])
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", sasl)
            resp = await _call(r, w, ApiKey.SASL_HANDSHAKE, 1, handshake)
            assert resp.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
            assert list(resp.mechanisms) == ["PLAIN"]
            w.close()
        finally:
            await server.stop()

    asyncio.run(main())

    listeners = {"listeners": "SASL_SSL://127.0.0.1:1,SASL_PLAINTEXT://127.0.0.1:2"}
    for props, message in [
        ({"listener.name.sasl_plaintext.log.retention.ms": "1"}, "ssl.*, sasl.*"),
        ({"listener.name.sasl_plaintext.ssl.kestore.location": "x"}, "ssl.*, sasl.*"),
        ({"listener.name.external.sasl.enabled.mechanisms": "PLAIN"}, "external"),
        ({"listener.name.sasl_ssl.sasl.enabled.mechanisms": "GSSAPI"}, "GSSAPI"),
        ({"listener.name.sasl_ssl.connections.max.reauth.ms": "soon"}, "reauth"),
        (
            {
                "ssl.keystore.location": "k",
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "",
            },
            "empty for SASL listener SASL_PLAINTEXT",
        ),
        ({}, "SASL_SSL listener SASL_SSL needs ssl.keystore.location"),
    ]:
        with pytest.raises(ConfigError, match=message):
            BrokerConfig().with_properties({**listeners, **props}).validate()
