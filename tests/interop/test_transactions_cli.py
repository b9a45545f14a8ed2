"""``samsa transactions list|describe`` as a subprocess against a broker with transactions
in several states."""

from __future__ import annotations

import subprocess
import sys

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from _broker import BrokerProcess


def _cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "samsa",
            "transactions",
            *args,
            "--bootstrap-server",
            broker.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_list_and_describe(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("cli-txn", 2, 1)])["cli-txn"].result(20)
    done = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "cli-done"})
    done.init_transactions(20)
    done.begin_transaction()
    done.produce("cli-txn", b"x", partition=0)
    done.commit_transaction(20)
    open_ = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "cli-open"})
    open_.init_transactions(20)
    open_.begin_transaction()
    open_.produce("cli-txn", b"y", partition=1)
    open_.flush(20)
    empty = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "cli-empty"})
    empty.init_transactions(20)

    out = _cli(broker, "list")
    assert out.returncode == 0, out.stderr
    rows = {line.split("\t")[0]: line.split("\t")[2] for line in out.stdout.splitlines()[1:]}
    assert rows == {"cli-done": "CompleteCommit", "cli-open": "Ongoing", "cli-empty": "Empty"}

    out = _cli(broker, "list", "--state", "Ongoing")
    assert [line.split("\t")[0] for line in out.stdout.splitlines()[1:]] == ["cli-open"]

    out = _cli(broker, "describe", "cli-open")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split("\t")[:4] == ["TRANSACTIONAL_ID", "PRODUCER_ID", "EPOCH", "STATE"]
    fields = row.split("\t")
    assert fields[0] == "cli-open" and fields[2] == "0" and fields[3] == "Ongoing"
    assert fields[6] == "cli-txn-1"

    out = _cli(broker, "describe", "cli-empty")
    fields = out.stdout.splitlines()[1].split("\t")
    assert (fields[3], fields[5], fields[6]) == ("Empty", "-", "-")

    out = _cli(broker, "describe", "nope")
    assert out.returncode == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in out.stderr
    open_.abort_transaction(20)
