"""TLS and SASL with real clients: confluent-kafka (librdkafka), kafka-python and samsa's own
client over SASL_SSL with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN, and over SSL with client
certificates; a wrong password is refused with SASL_AUTHENTICATION_FAILED and nothing else is
served on that connection; SCRAM users made with ``samsa users`` before the first start, and
changed while the broker runs, count at once and survive SIGKILL."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import KafkaError as CkError
from confluent_kafka import Producer as CkProducer
from confluent_kafka.admin import AdminClient

from _broker import BrokerProcess
from _certs import Pki, make_pki
from samsa.client import Admin, Consumer, KafkaError, Producer, TopicPartition
from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import frame_request
from samsa.protocol.messages import ApiKey, decode_response, encode_request, make_request
from samsa.testing.proxy import FaultProxy, Faults

LISTENER = re.compile(r"listener (\w+) \(\w+\) on 127\.0\.0\.1:(\d+)")
PASSWORD = "alice-s3cret"
MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]


def samsa_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "samsa", *args], capture_output=True, text=True, timeout=60
    )


class SecureBroker:
    def __init__(self, proc: BrokerProcess, pki: Pki) -> None:
        self.proc = proc
        self.pki = pki

    def port(self, listener: str) -> int:
        for line in reversed(self.proc.log):  # the latest start's
            m = LISTENER.search(line)
            if m and m[1] == listener:
                return int(m[2])
        raise AssertionError(f"no {listener} listener in the log")

    def sasl(self, mechanism: str, password: str = PASSWORD, user: str = "alice") -> dict[str, Any]:
        return {
            "bootstrap.servers": f"127.0.0.1:{self.port('SASL_SSL')}",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": str(self.pki.ca),
        }

    def mtls(self, name: str | None) -> dict[str, Any]:
        conf = {
            "bootstrap.servers": f"127.0.0.1:{self.port('SSL')}",
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.pki.ca),
        }
        if name is not None:
            cert, key = self.pki.client(name)
            conf |= {"ssl.certificate.location": str(cert), "ssl.key.location": str(key)}
        return conf


def start_secure(data_dir: Path, pki: Pki, plain_users: Path) -> BrokerProcess:
    overrides = {
        # The first listener takes --host/--port (BrokerProcess's): SASL_SSL.
        "listeners": "SASL_SSL://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "ssl.keystore.location": str(pki.broker),
        "ssl.truststore.location": str(pki.ca),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=(.*?),OU=.*$/$1/,DEFAULT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "sasl.plain.users.file": str(plain_users),
        "group.initial.rebalance.delay.ms": "0",
    }
    return BrokerProcess(data_dir, overrides).start()


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    root = tmp_path_factory.mktemp("secure")
    pki = make_pki(root / "pki")
    data = root / "data"
    # Before the broker's first start, as `kafka-storage format --add-scram`.
    added = samsa_cli("users", "add", "alice", "--password", PASSWORD, "--data-dir", str(data))
    assert added.returncode == 0, added.stderr
    assert PASSWORD not in added.stdout + added.stderr
    plain = root / "plain-users"
    plain.write_text(f"alice={PASSWORD}\n")
    proc = start_secure(data, pki, plain)
    yield SecureBroker(proc, pki)
    proc.stop()


def _topic(conf: dict[str, Any]) -> str:
    name = f"sec-{uuid.uuid4().hex[:8]}"
    with Admin(conf) as admin:
        admin.create_topic(name, 1)
    return name


def _ck_round_trip(conf: dict[str, Any], topic: str, n: int = 20) -> list[bytes]:
    producer = CkProducer({**conf, "enable.idempotence": True})
    for i in range(n):
        producer.produce(topic, b"m-%d" % i)
    assert producer.flush(20) == 0
    consumer = CkConsumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_over_sasl_ssl(secure: SecureBroker, mechanism: str) -> None:
    conf = secure.sasl(mechanism)
    topic = _topic(conf)
    assert _ck_round_trip(conf, topic) == [b"m-%d" % i for i in range(20)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_wrong_password_is_refused(secure: SecureBroker, mechanism: str) -> None:
    errors: list[CkError] = []
    conf = {**secure.sasl(mechanism, password="guess"), "error_cb": errors.append}
    admin = AdminClient(conf)
    with pytest.raises(Exception, match=r"transport|Authentication|timed out"):
        admin.list_topics(timeout=1)
    admin.poll(1)  # error_cb runs from poll
    assert any(e.code() == CkError._AUTHENTICATION for e in errors), errors
    assert secure.proc.wait_for_log("SASL authentication failed (user 'alice')") is not None
    assert not secure.proc.log_contains("guess")  # passwords are never logged


def test_nothing_else_is_served_after_a_failed_authentication(secure: SecureBroker) -> None:
    with BlockingConnection("127.0.0.1", secure.port("SASL_PLAINTEXT")) as conn:
        hs = make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism="PLAIN")
        auth = make_request(
            ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=b"\0alice\0guess"
        )
        meta = make_request(
            ApiKey.METADATA,
            9,
            "MetadataRequest",
            topics=None,
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        versions = make_request(
            ApiKey.API_VERSIONS,
            3,
            "ApiVersionsRequest",
            client_software_name="t",
            client_software_version="1",
        )
        # All in one write: neither the ApiVersions (served before authentication) nor the
        # Metadata behind the failed step may be answered.
        conn.send_bytes(
            conn.encode(ApiKey.SASL_HANDSHAKE, 1, hs, 1)
            + conn.encode(ApiKey.SASL_AUTHENTICATE, 2, auth, 2)
            + conn.encode(ApiKey.API_VERSIONS, 3, versions, 3)
            + conn.encode(ApiKey.METADATA, 9, meta, 4)
        )
        assert conn.receive(ApiKey.SASL_HANDSHAKE, 1, 1).error_code == ErrorCode.NONE
        resp = conn.receive(ApiKey.SASL_AUTHENTICATE, 2, 2)
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "Invalid username or password" in resp.error_message
        with pytest.raises(ConnectionClosed):
            conn.receive_frame()


def test_confluent_kafka_with_client_certificates(secure: SecureBroker) -> None:
    topic = _topic(secure.sasl("SCRAM-SHA-512"))
    assert _ck_round_trip(secure.mtls("carol"), topic, 5) == [b"m-%d" % i for i in range(5)]
    # No certificate where ssl.client.auth=required: the TLS handshake fails.
    errors: list[CkError] = []
    admin = AdminClient({**secure.mtls(None), "error_cb": errors.append})
    with pytest.raises(Exception, match=r"transport|SSL|timed out"):
        admin.list_topics(timeout=1)
    admin.poll(1)
    assert errors and all(e.code() != CkError.NO_ERROR for e in errors)


def test_kafka_python_over_sasl_ssl(secure: SecureBroker) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    conf = secure.sasl("SCRAM-SHA-256")
    topic = _topic(conf)
    common = {
        "bootstrap_servers": conf["bootstrap.servers"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
        "ssl_cafile": str(secure.pki.ca),
    }
    producer = KafkaProducer(**common)
    for i in range(5):
        producer.send(topic, b"kp-%d" % i)
    producer.flush(20)
    producer.close(5)
    consumer = KafkaConsumer(
        topic, auto_offset_reset="earliest", consumer_timeout_ms=5000, **common
    )
    try:
        got = [m.value for _, m in zip(range(5), consumer, strict=False)]
    finally:
        consumer.close()
    assert got == [b"kp-%d" % i for i in range(5)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_samsa_client_over_sasl_ssl(secure: SecureBroker, mechanism: str) -> None:
    conf = secure.sasl(mechanism)
    topic = _topic(conf)
    with Producer(conf) as p:
        for i in range(5):
            p.send(topic, b"s-%d" % i)
        assert p.flush(20) == 0
    with Consumer({**conf, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, 0)])
        got: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            got += [r.value for r in c.poll(0.5)]
    assert got == [b"s-%d" % i for i in range(5)]
    with pytest.raises(KafkaError) as caught:
        with Admin(
            {**secure.sasl(mechanism, password="guess"), "default.api.timeout.ms": 5000}
        ) as a:
            a.list_topics()
    assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_samsa_client_and_cli_with_client_certificates(
    secure: SecureBroker, tmp_path: Path
) -> None:
    conf = secure.mtls("dora")
    topic = _topic(conf)
    with Admin(conf) as admin:
        assert topic in admin.list_topics()
    props = tmp_path / "client.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in conf.items() if k != "bootstrap.servers"))
    listed = samsa_cli(
        "topics",
        "list",
        "--bootstrap-server",
        conf["bootstrap.servers"],
        "--command-config",
        str(props),
    )
    assert listed.returncode == 0, listed.stderr
    assert topic in listed.stdout.split()
    with Producer(conf) as p:  # idempotent: `samsa producers` finds its last offset raw
        for i in range(3):
            p.send(topic, b"%d" % i)
        assert p.flush(20) == 0
        pid = p.producer_id
    bootstrap = ["--bootstrap-server", conf["bootstrap.servers"], "--command-config", str(props)]
    producers = samsa_cli("producers", topic, *bootstrap)
    assert producers.returncode == 0, producers.stderr
    row = producers.stdout.splitlines()[1].split("\t")
    assert (row[1], row[4]) == (str(pid), "2")  # producer id, last offset
    for command in (["groups", "list"], ["transactions", "list"]):
        done = samsa_cli(*command, *bootstrap)
        assert done.returncode == 0, (command, done.stderr)


def _can_log_in(port: int, user: str, password: str) -> bool:
    conf = {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "default.api.timeout.ms": 5000,
    }
    try:
        with Admin(conf) as admin:
            admin.list_topics()
    except KafkaError as exc:
        assert exc.code == ErrorCode.SASL_AUTHENTICATION_FAILED, exc
        return False
    return True


def test_users_change_at_once_and_survive_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = BrokerProcess(
        data,
        {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "SCRAM-SHA-512"},
    ).start()
    try:
        assert not _can_log_in(proc.port, "erin", "pw-1")
        pw_file = tmp_path / "pw"
        pw_file.write_text("pw-1\n")
        add = ["users", "add", "erin", "--mechanism", "SCRAM-SHA-512", "--data-dir", str(data)]
        assert samsa_cli(*add, "--password-file", str(pw_file)).returncode == 0
        assert _can_log_in(proc.port, "erin", "pw-1")  # while running, at once
        assert samsa_cli(*add, "--password", "pw-2").returncode == 0
        assert not _can_log_in(proc.port, "erin", "pw-1")
        assert _can_log_in(proc.port, "erin", "pw-2")
        frank = ["users", "add", "frank", "--password", "f", "--data-dir", str(data)]
        assert samsa_cli(*frank).returncode == 0
        assert _can_log_in(proc.port, "frank", "f")  # until deleted
        deleted = samsa_cli("users", "delete", "frank", "--data-dir", str(data))
        assert deleted.returncode == 0, deleted.stderr
        assert not _can_log_in(proc.port, "frank", "f")
        proc.kill()
        proc.start()
        assert _can_log_in(proc.port, "erin", "pw-2")
        listed = samsa_cli("users", "list", "--data-dir", str(data))
        assert listed.stdout.splitlines()[1:] == ["erin\tSCRAM-SHA-512\t4096"]
        missing = samsa_cli("users", "delete", "frank", "--data-dir", str(data))
        assert missing.returncode == 1 and "no user 'frank'" in missing.stderr
    finally:
        proc.stop()


# KIP-368 session lifetime for the re-authentication test. librdkafka renews at 90% of it, so
# a request that reaches the broker more than 10% late (each proxy hop runs on this process's
# threads, slow on a loaded machine) finds the session over and the connection is closed, as
# Kafka closes it; and Kafka begins at most one re-authentication a second. At 1 s the margin
# was 100 ms, and the test failed at load average 12-24.
REAUTH_MS = 2500


def test_clients_reauthenticate_before_the_session_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KIP-368: with a short connections.max.reauth.ms, confluent-kafka and samsa's producer
    renew their sessions twice on the same connections and keep producing; none is cut off.
    Each client goes through its own proxy, which counts SaslAuthenticate requests per
    connection."""
    data = tmp_path / "data"
    assert (
        samsa_cli("users", "add", "gina", "--password", "pw", "--data-dir", str(data)).returncode
        == 0
    )
    # proxy -> connection -> SaslAuthenticate frames: the proxy asks _faulty of each request
    # and again of its answer, so a completed round trip counts 2.
    auths: dict[int, dict[int, int]] = {}
    faulty = FaultProxy._faulty

    def count(proxy: FaultProxy, conn: Any, api_key: int) -> bool:
        if api_key == ApiKey.SASL_AUTHENTICATE:
            mine = auths.setdefault(id(proxy), {})
            mine[id(conn)] = mine.get(id(conn), 0) + 1
        return faulty(proxy, conn, api_key)

    def most(proxy: FaultProxy) -> int:
        return max(auths.get(id(proxy), {}).values(), default=0)

    monkeypatch.setattr(FaultProxy, "_faulty", count)
    overrides = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "connections.max.reauth.ms": str(REAUTH_MS),
    }
    proc = BrokerProcess(data, overrides).start()
    upstream = ("127.0.0.1", proc.port)
    # Not decoding every Produce keeps each hop as quick as the proxy can be.
    ck_proxy, our_proxy = (
        FaultProxy(upstream, faults=Faults(), track_produce=False),
        FaultProxy(upstream, faults=Faults(), track_produce=False),
    )
    ck: CkProducer | None = None
    try:
        conf = {
            "bootstrap.servers": proc.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "gina",
            "sasl.password": "pw",
        }
        topic = _topic(conf)
        errors: list[CkError] = []
        ck_proxy.start()
        our_proxy.start()
        ck = CkProducer({**conf, "bootstrap.servers": ck_proxy.address, "error_cb": errors.append})
        failed: list[Any] = []
        with Producer({**conf, "bootstrap.servers": our_proxy.address}) as ours:
            # Until both have renewed twice on one connection (SCRAM's two SaslAuthenticate
            # round trips, then two more at each renewal: 12 frames), and a little after, on
            # the renewed sessions; bounded, for a renewal that never comes.
            deadline = time.monotonic() + 4 * REAUTH_MS / 1000
            sent = 0
            while time.monotonic() < deadline:
                if min(most(ck_proxy), most(our_proxy)) >= 12:
                    deadline = min(deadline, time.monotonic() + 0.5)
                ck.produce(topic, b"ck", on_delivery=lambda e, m: e and failed.append(e))
                ours.send(topic, b"samsa").add_done_callback(
                    lambda f: f.exception() and failed.append(f.exception())
                )
                sent += 1
                ck.poll(0.05)
            assert ck.flush(10) == 0 and ours.flush(10) == 0
        ck_proxy.stop()
        our_proxy.stop()
        closed = [line for line in proc.log if "closing connection" in line]  # the why, if any
        assert (failed, errors, closed) == ([], [], [])
        for proxy in (ck_proxy, our_proxy):
            assert most(proxy) >= 12, auths.get(id(proxy))
            assert proxy.stats.connections <= 4, proxy.stats  # no new connection per session
        with Consumer({**conf, "auto.offset.reset": "earliest"}) as c:
            c.assign([TopicPartition(topic, 0)])
            got = 0
            end = time.monotonic() + 20
            while got < 2 * sent and time.monotonic() < end:
                got += len(c.poll(0.5))
        assert got == 2 * sent
    finally:
        if ck is not None:
            # Closed here, not by a failure's traceback later, which would keep it
            # reconnecting to the stopped broker; purged, so close() flushes nothing.
            ck.purge()
            ck.close()
        ck_proxy.stop()
        our_proxy.stop()
        proc.stop()


def test_confluent_kafka_admin_manages_scram_users(secure: SecureBroker) -> None:
    """KIP-554: alter_user_scram_credentials / describe_user_scram_credentials, the new user
    logs in at once, a deleted one no longer can; Kafka's error codes for bad requests."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(secure.sasl("SCRAM-SHA-512"))
    sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
    upsert = UserScramCredentialUpsertion("hank", sha256, b"hank-pw")
    admin.alter_user_scram_credentials([upsert])["hank"].result(10)
    described = admin.describe_user_scram_credentials(["hank"])["hank"].result(10)
    infos = [(i.mechanism, i.iterations) for i in described.scram_credential_infos]
    assert infos == [(ScramMechanism.SCRAM_SHA_256, 8192)]
    everyone = admin.describe_user_scram_credentials().result(10)
    assert {"alice", "hank"} <= set(everyone)
    with pytest.raises(KafkaException) as missing:
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(10)
    assert missing.value.args[0].code() == CkError.RESOURCE_NOT_FOUND

    ours = {**secure.sasl("SCRAM-SHA-256", password="hank-pw", user="hank")}
    with Admin(ours) as a:  # a new user logs in at once
        a.list_topics()
    deletion = UserScramCredentialDeletion("hank", ScramMechanism.SCRAM_SHA_256)
    admin.alter_user_scram_credentials([deletion])["hank"].result(10)
    with pytest.raises(KafkaError) as refused, Admin(ours) as a:
        a.list_topics()
    assert refused.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED

    for alteration, code in [
        (deletion, CkError.RESOURCE_NOT_FOUND),  # deleted already
        (
            UserScramCredentialUpsertion(
                "ivy", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 100), b"x"
            ),
            CkError.UNACCEPTABLE_CREDENTIAL,
        ),
    ]:
        with pytest.raises(KafkaException) as bad:
            admin.alter_user_scram_credentials([alteration])[alteration.user].result(10)
        assert bad.value.args[0].code() == code


def _raw_call(sock: socket.socket, api_key: int, version: int, cid: int, request: Any) -> Any:
    """One Kafka request on a bare socket (non-flexible header), its decoded response."""
    body = encode_request(api_key, version, request)
    sock.sendall(frame_request(api_key, version, cid, "raw", body, False))
    frame = _read_frame(sock)
    assert frame is not None and int.from_bytes(frame[:4], "big") == cid
    return decode_response(api_key, version, frame, 4)


def _read_frame(sock: socket.socket) -> bytes | None:
    """A size-prefixed frame; None if the broker closed the connection instead."""
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    return data[4:]


@pytest.mark.parametrize("password", [PASSWORD, "guess"])
def test_sasl_handshake_v0_then_bare_tokens(secure: SecureBroker, password: str) -> None:
    """After SaslHandshake v0 the PLAIN token goes as a bare size-prefixed frame and comes
    back as one (empty), as Kafka's SaslServerAuthenticator does; then requests are served.
    A wrong password closes the connection with no answer (v0 cannot carry an error)."""
    with socket.create_connection(("127.0.0.1", secure.port("SASL_PLAINTEXT")), 5) as sock:
        sock.settimeout(5)
        hs = make_request(ApiKey.SASL_HANDSHAKE, 0, "SaslHandshakeRequest", mechanism="PLAIN")
        resp = _raw_call(sock, ApiKey.SASL_HANDSHAKE, 0, 1, hs)
        assert resp.error_code == 0 and "PLAIN" in resp.mechanisms
        token = b"\0alice\0" + password.encode()
        sock.sendall(len(token).to_bytes(4, "big") + token)
        reply = _read_frame(sock)
        if password != PASSWORD:
            assert reply is None
            return
        assert reply == b""
        meta = make_request(ApiKey.METADATA, 1, "MetadataRequest", topics=None)
        assert [b.node_id for b in _raw_call(sock, ApiKey.METADATA, 1, 2, meta).brokers] == [0]


def test_kafka_python_authenticates_with_sasl_handshake_v0(secure: SecureBroker) -> None:
    """kafka-python told it talks to Kafka 0.10.2 uses SaslHandshake v0 and bare tokens."""
    from kafka import KafkaConsumer

    topic = _topic(secure.sasl("PLAIN"))
    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{secure.port('SASL_PLAINTEXT')}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password=PASSWORD,
        api_version=(0, 10, 2),  # before SaslAuthenticate (Kafka 1.0)
        request_timeout_ms=10_000,
    )
    # kafka-python keeps retrying a failed login (its timeouts do not bound that): wait for
    # it in a thread, bounded.
    found: list[set[str]] = []
    worker = threading.Thread(target=lambda: found.append(consumer.topics()), daemon=True)
    worker.start()
    worker.join(20)
    if not worker.is_alive():
        consumer.close()
    assert found and topic in found[0], "kafka-python did not log in within 20 s"
