"""The Kafka-aware fault proxy itself: address rewriting, each fault, stats, the CLI.

* Metadata and FindCoordinator (v0-3 and v4+) answers name the proxy, never the broker.
* A broker advertising another address than the bootstrap one gets a listener of its own,
  and clients reach the broker through it.
* A lost response (drop rate 1) means the broker acted and the client never heard; a reset
  (reset rate 1) means the request never reached the broker. The first requests of each
  connection pass unharmed (grace), ``apis`` limits the faults to some request types, and
  delays hold every frame.
* ``samsa proxy`` serves clients until SIGTERM and prints its counters.
* The lying modes: a replayed Produce answer tells the client an old offset for records the
  broker wrote elsewhere; a faked acknowledgement tells it an offset for records the broker
  never got (the next offset, which the next real record then takes).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from samsa.client import Admin, Consumer, Producer, TopicPartition
from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing import (
    FaultProxy,
    Faults,
    create_topic,
    fetch_request,
    idempotent_batch,
    produce_one,
    read_topic,
)
from samsa.testing.proxy import parse_address

ROOT = Path(__file__).resolve().parents[2]


def _conn(address: str) -> BlockingConnection:
    host, port = parse_address(address)
    return BlockingConnection(host, port, timeout=10)


def _metadata_brokers(conn: BlockingConnection, version: int = 12) -> list[tuple[str, int]]:
    req = make_request(
        ApiKey.METADATA,
        version,
        "MetadataRequest",
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    resp = conn.request(ApiKey.METADATA, version, req)
    return [(b.host, int(b.port)) for b in resp.brokers]


def _coordinator(conn: BlockingConnection, version: int) -> tuple[str, int]:
    if version < 4:
        req = make_request(
            ApiKey.FIND_COORDINATOR, version, "FindCoordinatorRequest", key="g", key_type=0
        )
        resp = conn.request(ApiKey.FIND_COORDINATOR, version, req)
        return resp.host, int(resp.port)
    req = make_request(
        ApiKey.FIND_COORDINATOR,
        version,
        "FindCoordinatorRequest",
        key_type=0,
        coordinator_keys=("g",),
    )
    resp = conn.request(ApiKey.FIND_COORDINATOR, version, req)
    c = resp.coordinators[0]
    return c.host, int(c.port)


def _topics(bootstrap: str) -> list[str]:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        return admin.list_topics()


def test_metadata_and_coordinator_answers_name_the_proxy(broker) -> None:  # type: ignore[no-untyped-def]
    with FaultProxy(broker.bootstrap).start() as proxy, _conn(proxy.address) as conn:
        own = parse_address(proxy.address)
        assert _metadata_brokers(conn) == [own]
        assert _metadata_brokers(conn, 1) == [own]
        for version in (1, 3, 4):
            assert _coordinator(conn, version) == own
        stats = proxy.stats
        assert stats.rewritten_responses == 5 and stats.listeners == 1, stats


def test_other_advertised_address_gets_its_own_listener(broker_factory) -> None:  # type: ignore[no-untyped-def]
    # "127.1" is 127.0.0.1 written another way (numeric: no name lookup, never IPv6): it
    # reaches the broker but is not the bootstrap address the proxy was given.
    b = broker_factory(overrides={}).start()
    b.stop()
    b.overrides = {"advertised.listeners": f"PLAINTEXT://127.1:{b.port}"}
    b.start()
    with FaultProxy(b.bootstrap).start() as proxy:
        with _conn(proxy.address) as conn:
            [(host, port)] = _metadata_brokers(conn)
        assert host == "127.0.0.1" and port != proxy.port
        assert proxy.listeners[f"127.0.0.1:{port}"] == f"127.1:{b.port}"
        topic = f"adv-{uuid.uuid4().hex[:6]}"
        with Admin({"bootstrap.servers": proxy.address}) as admin:
            admin.create_topic(topic, 1)
        with Producer({"bootstrap.servers": proxy.address}) as p:
            md = p.send(topic, b"v").result(20)
        assert md.offset == 0
        assert proxy.stats.listeners == 2
        assert proxy.stats.connections >= 3  # bootstrap + the second listener's


def test_lost_response_means_the_broker_acted(broker) -> None:  # type: ignore[no-untyped-def]
    faults = Faults(drop_response_rate=1.0, grace_requests=0)
    topic = f"lost-{uuid.uuid4().hex[:6]}"
    with FaultProxy(broker.bootstrap, faults=faults, seed=1).start() as proxy:
        with _conn(proxy.address) as conn, pytest.raises((ConnectionClosed, OSError)):
            create_topic(conn, topic)
        assert proxy.stats.dropped_responses == 1 and proxy.stats.responses == 0
    assert topic in _topics(broker.bootstrap)


def test_reset_means_the_request_never_arrived(broker) -> None:  # type: ignore[no-untyped-def]
    faults = Faults(reset_rate=1.0)
    topic = f"reset-{uuid.uuid4().hex[:6]}"
    with FaultProxy(broker.bootstrap, faults=faults, seed=1).start() as proxy:
        with _conn(proxy.address) as conn, pytest.raises((ConnectionClosed, OSError)):
            create_topic(conn, topic)
        assert proxy.stats.resets == 1 and proxy.stats.requests == 1
    assert topic not in _topics(broker.bootstrap)


def test_grace_requests_pass_then_faults_start(broker) -> None:  # type: ignore[no-untyped-def]
    faults = Faults(reset_rate=1.0, grace_requests=2)
    with FaultProxy(broker.bootstrap, faults=faults, seed=1).start() as proxy:
        for connection in (1, 2):  # the grace is per connection
            with _conn(proxy.address) as conn:
                assert _metadata_brokers(conn) == [parse_address(proxy.address)]
                assert _metadata_brokers(conn) == [parse_address(proxy.address)]
                with pytest.raises((ConnectionClosed, OSError)):
                    _metadata_brokers(conn)
            assert (proxy.stats.requests, proxy.stats.resets) == (3 * connection, connection)


def test_api_filter_and_delay(broker) -> None:  # type: ignore[no-untyped-def]
    # faults only on Produce: metadata and topic creation go through untouched
    faults = Faults(drop_response_rate=1.0, apis=frozenset({ApiKey.PRODUCE}), delay_ms=20)
    topic = f"apis-{uuid.uuid4().hex[:6]}"
    rounds = 10
    with FaultProxy(broker.bootstrap, faults=faults, seed=3).start() as proxy:
        with _conn(proxy.address) as conn:
            assert create_topic(conn, topic) == 0
            t0 = time.monotonic()
            for _ in range(rounds):
                _metadata_brokers(conn)
            elapsed = time.monotonic() - t0
            assert proxy.stats.dropped_responses == 0
            # Each frame waits a uniform [0, 20] ms: 2 * rounds frames, 10 ms each on average
            # (202 ms in all with this seed); half of that is 4 standard deviations below.
            frames = 2 * rounds
            assert frames * 0.005 <= elapsed < frames * 0.02 + 2.0, elapsed
            # A Produce is subject to faults: the broker writes it, the answer is lost.
            with pytest.raises((ConnectionClosed, OSError)):
                produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1))
        assert proxy.stats.dropped_responses == 1
        assert proxy.stats.delayed_frames == 2 * (rounds + 1) + 1  # the lost answer: none
        proxy.set_faults()  # all off, delay kept
        assert proxy.faults.delay_ms == 20 and proxy.faults.drop_response_rate == 0
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): 0}))
    assert int(resp.responses[0].partitions[0].high_watermark) == 1
    with pytest.raises(ValueError, match="drop_response_rate"):
        FaultProxy(broker.bootstrap, faults=Faults(drop_response_rate=2))


def test_replayed_produce_answer_gives_an_old_offset(broker) -> None:  # type: ignore[no-untyped-def]
    faults = Faults(replay_rate=1.0, grace_requests=0)
    topic = f"replay-{uuid.uuid4().hex[:6]}"
    with _conn(broker.bootstrap) as direct:
        assert create_topic(direct, topic) == 0
    with FaultProxy(broker.bootstrap, faults=faults, seed=1).start() as proxy:
        with _conn(proxy.address) as conn:
            answers = [produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1, 2)) for _ in "abc"]
        # The first answer is true (nothing to replay yet); the later ones repeat it.
        assert answers == [(0, 0), (0, 0), (0, 0)]
        assert proxy.stats.replayed_responses == 2 and proxy.stats.faults == 2
    assert len(read_topic(broker.bootstrap, topic)) == 6  # every batch was written


def test_faked_ack_means_never_written(broker) -> None:  # type: ignore[no-untyped-def]
    faults = Faults(fake_ack_rate=1.0, grace_requests=1)
    topic = f"fake-{uuid.uuid4().hex[:6]}"
    with _conn(broker.bootstrap) as direct:
        assert create_topic(direct, topic) == 0
    with FaultProxy(broker.bootstrap, faults=faults, seed=1).start() as proxy:
        with _conn(proxy.address) as conn:
            # grace: the first Produce passes and teaches the proxy the next offset (3)
            assert produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1, 3)) == (0, 0)
            assert produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1, 2)) == (0, 3)
            assert produce_one(conn, topic, 0, idempotent_batch(-1, -1, -1, 2)) == (0, 3)
        assert proxy.stats.faked_acks == 2
    assert len(read_topic(broker.bootstrap, topic)) == 3  # the acknowledged 4 never arrived


def test_cli_proxy_serves_until_sigterm_and_prints_stats(broker) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "samsa",
            "proxy",
            "--bootstrap-server",
            broker.bootstrap,
            "--listen",
            "127.0.0.1:0",
            "--reset-rate",
            "0.2",
            "--grace-requests",
            "3",  # ApiVersions, Metadata, InitProducerId: Producer() does not retry them
            "--seed",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("samsa proxy ready on 127.0.0.1:"), line
        address = line.split()[4]
        topic = f"cli-{uuid.uuid4().hex[:6]}"
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            admin.create_topic(topic, 1)
        with Producer({"bootstrap.servers": address, "linger.ms": 1}) as p:
            futures = []
            for chunk in range(10):  # ten Produce requests at least, each may be reset
                futures += [p.send(topic, b"%d" % i) for i in range(20 * chunk, 20 * chunk + 20)]
                assert p.flush(30) == 0
        assert sorted(f.result().offset for f in futures) == list(range(200))
        with Consumer({"bootstrap.servers": address, "auto.offset.reset": "earliest"}) as c:
            c.assign([TopicPartition(topic, 0)])
            got = []
            deadline = time.monotonic() + 20
            while len(got) < 200 and time.monotonic() < deadline:
                got += c.poll(0.5)
        assert [r.offset for r in got] == list(range(200))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()  # never leave it running
            proc.communicate()
            raise
    assert proc.returncode == 0, err
    assert "proxy stats: connections=" in err and "rewritten_responses=" in err
    # The clients above went through resets (each closes a connection they reopened).
    final = [line for line in err.splitlines() if line.startswith("proxy stats: ")][-1]
    stats = {k: int(v) for k, v in (kv.split("=") for kv in final.split()[2:])}
    assert stats["connections"] > stats["resets"] >= 1, stats


def test_cli_proxy_bad_address() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "samsa", "proxy", "--bootstrap-server", "nohost"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "expected HOST:PORT" in proc.stderr
