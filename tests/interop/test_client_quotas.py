"""Client quotas end to end (KIP-546, KIP-219): set with the samsa Admin and ``samsa
configs``, kept over a restart, and enforced on kafka-python's producer (a throttled client
waits; another on the same broker does not), with the throttle exported per entity."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from kafka import KafkaConsumer, KafkaProducer

from _broker import BrokerProcess
from samsa.client import Admin, ClientQuotaEntity, ClientQuotaFilterComponent
from samsa.protocol.errors import ErrorCode
from samsa.testing.kafka import free_port

RATE = 100_000  # producer_byte_rate of the throttled client
SENT = 400_000  # what each producer sends


def _configs(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "samsa", "configs", *args, "--bootstrap-server", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _produce(bootstrap: str, client_id: str) -> float:
    """Seconds to send SENT bytes."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id=client_id, linger_ms=5)
    try:
        started = time.monotonic()
        for _ in range(SENT // 1000):
            producer.send("q", b"x" * 1000)
        producer.flush(timeout=60)
        return time.monotonic() - started
    finally:
        producer.close()


def test_quotas_are_stored_kept_and_enforced(
    broker_factory: type[BrokerProcess], caplog: pytest.LogCaptureFixture
) -> None:
    metrics_port = free_port()
    broker = broker_factory(
        overrides={
            "quota.window.num": "2",
            "quota.window.size.seconds": "1",
            "metrics.port": str(metrics_port),
        }
    ).start()
    slow = ClientQuotaEntity.of({"client-id": "slow"})
    alice = ClientQuotaEntity.of({"user": "alice", "client-id": None})
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        admin.create_topic("q")
        bad = ClientQuotaEntity.of({"ip": "10.0.0.1", "user": "u"})
        out = admin.alter_client_quotas(
            {slow: {"producer_byte_rate": RATE}, alice: {"request_percentage": 50.0}, bad: {}}
        )
        assert out[slow] is None and out[alice] is None
        assert out[bad] is not None and out[bad].code == ErrorCode.INVALID_REQUEST
        assert admin.alter_client_quotas({alice: {"producer_byte_rate": 1.5}})[alice] is not None
        assert admin.alter_client_quotas({alice: {"x": 1.0}}, validate_only=True)[alice] is not None
        found = admin.describe_client_quotas()
        assert found == {
            slow: {"producer_byte_rate": float(RATE)},
            alice: {"request_percentage": 50.0},
        }
        default_clients = [ClientQuotaFilterComponent("client-id", None, 1)]
        assert admin.describe_client_quotas(default_clients) == {
            alice: {"request_percentage": 50.0}
        }
    # samsa configs: kafka-configs' flags for users and clients
    user_bob = ("--entity-type", "users", "--entity-name", "bob")
    done = _configs(
        broker.bootstrap, *user_bob, "--alter", "--add-config", "consumer_byte_rate=2048"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Completed updating config for user bob."
    shown = _configs(broker.bootstrap, *user_bob, "--describe")
    assert shown.stdout.splitlines() == [
        "Quota configs for user-principal 'bob' are consumer_byte_rate=2048.0"
    ]
    refused = _configs(
        broker.bootstrap, *user_bob, "--alter", "--add-config", "connection_creation_rate=3"
    )
    assert refused.returncode == 1 and "Invalid configuration key" in refused.stderr
    # A restart keeps them.
    broker.stop()
    broker.start()
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        assert len(admin.describe_client_quotas()) == 3
    # Enforced: the throttled client takes about SENT / RATE seconds; the other does not wait.
    caplog.set_level(logging.WARNING, "kafka")
    fast_s = _produce(broker.bootstrap, "fast")
    assert fast_s < 2.0 and not _throttled(caplog)
    slow_s = _produce(broker.bootstrap, "slow")
    assert _throttled(caplog)  # kafka-python read throttle_time_ms and backed off
    assert slow_s >= (SENT / RATE) * 0.6, slow_s
    # consumer_byte_rate: a throttled consumer still reads everything (D-QUOTA-2), paced.
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        reader = ClientQuotaEntity.of({"client-id": "reader"})
        assert admin.alter_client_quotas({reader: {"consumer_byte_rate": RATE * 2}}) == {
            reader: None
        }
    consumer = KafkaConsumer(
        "q", bootstrap_servers=broker.bootstrap, client_id="reader",
        auto_offset_reset="earliest", consumer_timeout_ms=5000,
    )  # fmt: skip
    try:
        assert sum(1 for _ in consumer) == 2 * SENT // 1000
    finally:
        consumer.close()
    assert any("FetchResponse throttled" in r.getMessage() for r in caplog.records)
    exported = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    assert (
        'samsa_client_quota_throttled_total{client_id="slow",quota="Produce",user=""}' in exported
    )

    # connection_creation_rate of an address: over it, a new connection is closed at once.
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        local = ClientQuotaEntity.of({"ip": "127.0.0.1"})
        assert admin.alter_client_quotas({local: {"connection_creation_rate": 0}}) == {local: None}
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(API_VERSIONS_V0)
        try:
            answer = sock.recv(100)
        except ConnectionResetError:
            answer = b""  # closed before our request was read
        assert answer == b""


# size, api key 18, version 0, correlation id 1, client id "q"
API_VERSIONS_V0 = b"\x00\x00\x00\x0b\x00\x12\x00\x00\x00\x00\x00\x01\x00\x01q"


def _throttled(caplog: pytest.LogCaptureFixture) -> bool:
    return any("throttled by broker" in r.getMessage() for r in caplog.records)
