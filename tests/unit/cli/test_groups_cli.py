"""``samsa groups list|describe|delete`` as a subprocess against a real broker."""

from __future__ import annotations

import subprocess
import sys
import time

from confluent_kafka import Consumer, Producer

from samsa.client import Admin, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.testing import create_topic


def _samsa(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "samsa", "groups", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_groups_list_describe_with_lag_and_delete(broker_factory: type) -> None:
    broker = broker_factory(overrides={"group.initial.rebalance.delay.ms": "0"}).start()
    bs = ["--bootstrap-server", broker.bootstrap]
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        assert create_topic(conn, "lagged", 2) == 0
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce("lagged", value=b"%d" % i, partition=i % 2)  # 5 per partition
    assert producer.flush(10) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "cli-group",
            "client.id": "lag-watcher",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["lagged"])
    consumed = 0
    deadline = time.monotonic() + 20
    while consumed < 6 and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error() and m.offset() < 3:
            consumer.commit(message=m, asynchronous=False)  # commits offsets 1..3
            consumed += 1
    assert consumed == 6
    try:
        listed = _samsa("list", *bs)
        assert listed.returncode == 0, listed.stderr
        assert "cli-group\tStable\tconsumer" in listed.stdout

        described = _samsa("describe", "cli-group", *bs)
        assert described.returncode == 0, described.stderr
        rows = [line.split("\t") for line in described.stdout.splitlines()[2:]]
        assert [r[:5] for r in rows] == [
            ["lagged", "0", "3", "5", "2"],
            ["lagged", "1", "3", "5", "2"],
        ]
        assert all(r[6] == "lag-watcher" and r[5].startswith("lag-watcher-") for r in rows)
        assert all(r[7] == "-" for r in rows)  # classic members have no epoch
        assert "TYPE classic" in described.stdout.splitlines()[0]

        members = _samsa("describe", "cli-group", "--members", *bs)
        assert members.returncode == 0, members.stderr
        (row,) = [line.split("\t") for line in members.stdout.splitlines()[2:]]
        assert row[1] == "lag-watcher" and row[3:] == ["-", "lagged-0,lagged-1", "-"]

        busy = _samsa("delete", "cli-group", *bs)
        assert busy.returncode == 1 and "NON_EMPTY_GROUP" in busy.stderr
    finally:
        consumer.close()

    deleted = _samsa("delete", "cli-group", *bs)
    assert deleted.returncode == 0, deleted.stderr
    assert "cli-group" not in _samsa("list", *bs).stdout
    missing = _samsa("describe", "cli-group", *bs)
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_groups_describe_a_consumer_protocol_group(broker_factory: type) -> None:
    """A KIP-848 group (confluent-kafka, ``group.protocol=consumer``) is listed with its type
    and described through ConsumerGroupDescribe: not Dead, with member epoch, assignment and
    lag; the samsa Admin describes it the same way."""
    broker = broker_factory(
        overrides={
            "group.consumer.heartbeat.interval.ms": "200",
            "group.consumer.session.timeout.ms": "6000",
        }
    ).start()
    bs = ["--bootstrap-server", broker.bootstrap]
    with BlockingConnection("127.0.0.1", broker.port) as conn:
        assert create_topic(conn, "k848", 2) == 0
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        producer.produce("k848", value=b"%d" % i, partition=i % 2)  # 5 per partition
    assert producer.flush(10) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "k848-group",
            "group.protocol": "consumer",
            "client.id": "k848-watcher",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["k848"])
    consumed = 0
    deadline = time.monotonic() + 40
    while consumed < 6 and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and not m.error() and m.offset() < 3:
            consumer.commit(message=m, asynchronous=False)  # commits offsets 1..3
            consumed += 1
    assert consumed == 6
    try:
        with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
            (listed,) = [g for g in admin.list_groups() if g.group_id == "k848-group"]
            assert (listed.state, listed.group_type) == ("Stable", "consumer")
            (group,) = admin.describe_groups(["k848-group"])
            assert (group.state, group.group_type, group.error) == ("Stable", "consumer", 0)
            assert group.group_epoch >= 1 and group.protocol in ("uniform", "range")
            (member,) = group.members
            assert member.client_id == "k848-watcher" and member.member_epoch >= 1
            both = (TopicPartition("k848", 0), TopicPartition("k848", 1))
            assert member.assignment == both and member.target_assignment == both
            assert admin.list_group_offsets("k848-group") == {tp: 3 for tp in both}
            assert admin.list_offsets(both) == {tp: 5 for tp in both}

        listed_cli = _samsa("list", *bs)
        assert listed_cli.returncode == 0, listed_cli.stderr
        assert "k848-group\tStable\tconsumer\tconsumer" in listed_cli.stdout

        described = _samsa("describe", "k848-group", *bs)
        assert described.returncode == 0, described.stderr
        header = described.stdout.splitlines()[0]
        assert "STATE Stable" in header and "TYPE consumer" in header
        rows = [line.split("\t") for line in described.stdout.splitlines()[2:]]
        assert [r[:5] for r in rows] == [["k848", "0", "3", "5", "2"], ["k848", "1", "3", "5", "2"]]
        assert all(r[5] == member.member_id and r[6] == "k848-watcher" for r in rows)
        assert all(int(r[7]) == member.member_epoch for r in rows)

        members = _samsa("describe", "k848-group", "--members", *bs)
        assert members.returncode == 0, members.stderr
        (row,) = [line.split("\t") for line in members.stdout.splitlines()[2:]]
        assert row[0] == member.member_id and row[1] == "k848-watcher"
        assert int(row[3]) >= 1 and row[4:] == ["k848-0,k848-1", "k848-0,k848-1"]
    finally:
        consumer.close()
